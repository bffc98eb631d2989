"""Filesystem operations for checkpoint folders, written for slow, failure-prone mounts (Drive on Colab).

No symlinks, no hard links, no reliance on rename being atomic: files are written in place and fsynced;
completeness is decided by the manifest alone (see manifest.py).
"""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

_CHUNK = 4 << 20


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


def copy_file(src: Path, dst: Path, *, durable: bool = True, digest: bool = True) -> tuple[str | None, int]:
    """Copy in chunks, hashing on the way (unless ``digest`` is False: None is returned for it); fsync when
    ``durable``. Returns (sha256 hex, size).

    Raises OSError (ENOSPC, ENOTCONN, ...) as is.
    """
    hasher, written = hashlib.sha256() if digest else None, 0
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

