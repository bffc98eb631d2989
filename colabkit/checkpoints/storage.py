"""Filesystem operations for checkpoint folders, written for slow, failure-prone mounts (Drive on Colab).

No symlinks, no hard links, no reliance on rename being atomic: files are written in place and fsynced;
completeness is decided by the manifest alone (see manifest.py).
"""
from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

from . import digest as _digest

_CHUNK = 4 << 20
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | _CLOEXEC
_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC


class UnsafeEntry(Exception):
    """A file of a checkpoint that is not a regular file inside its folder: a symbolic link (to anywhere), a
    FIFO, a device or a folder. Checkpoint folders can come from other people; colabkit never makes these."""


def open_inside(root: Path, rel: str) -> int:
    """A read-only descriptor of the regular file ``rel`` ("/"-separated) inside ``root``, reached without
    following a symbolic link below ``root``. Raises UnsafeEntry for a link, FIFO, device or folder, and
    FileNotFoundError for a missing file. Never blocks: a FIFO is refused, not waited on."""
    *folders, name = rel.split("/")
    where = Path(root, rel)
    if os.open in os.supports_dir_fd:
        fd = os.open(root, _DIR_FLAGS)
        try:
            for part in folders:
                inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = inner
            file_fd = os.open(name, _FILE_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR):
                raise UnsafeEntry(f"{where} is reached through a symbolic link or a file; it is not read") from None
            raise
        finally:
            os.close(fd)
    else:   # no openat (Windows): check each part, then open
        for depth in range(1, len(folders) + 2):
            part = Path(root, *rel.split("/")[:depth])
            if stat.S_ISLNK(os.lstat(part).st_mode):
                raise UnsafeEntry(f"{part} is a symbolic link; it is not followed")
        file_fd = os.open(where, _FILE_FLAGS)
    if not stat.S_ISREG(os.fstat(file_fd).st_mode):
        os.close(file_fd)
        raise UnsafeEntry(f"{where} is not a regular file (a FIFO, device or folder); it is not read")
    return file_fd


def fsync_dir(path: Path) -> None:
    """Best effort: some FUSE mounts and Windows refuse fsync on a directory."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def copy_file(src, dst: Path, *, durable: bool = True, digest: bool = True,
              hash_name: str = _digest.HASH) -> tuple[str | None, int]:
    """Copy in chunks, hashing on the way (unless ``digest`` is False: None is returned for it); fsync when
    ``durable``. Returns (hex digest of the kind ``hash_name``, size). ``src``: a path, or an open descriptor
    (closed here).

    Raises OSError (ENOSPC, ENOTCONN, ...) as is.
    """
    hasher, written = _digest.hasher(hash_name) if digest else None, 0
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(_CHUNK):
            if hasher is not None:
                hasher.update(chunk)
            fout.write(chunk)
            written += len(chunk)
        fout.flush()
        if durable:
            os.fsync(fout.fileno())
    return None if hasher is None else hasher.hexdigest(), written


def remove_tree(path: Path) -> None:
    """Delete a folder; a folder that is already gone is fine."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        pass

