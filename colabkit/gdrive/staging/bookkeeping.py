"""Where stage keeps its bookkeeping, and that it and the staged folder are this user's own.

The bookkeeping (what was staged, the journal of an unfinished copy, downloads and extraction in progress) lives
beside the staged folder, in ``<dst>.colabkit-stage/`` (see state_dir), so the staged folder holds the source's
files and nothing else. Safe in a folder other users can write (/tmp): the bookkeeping folder is made private
(0700), and an existing one, or an existing dst, must be this user's own (check_own_folder), else stage refuses
before writing anything. The files written here are created anew with O_EXCL|O_NOFOLLOW and renamed into place,
so a symbolic link planted at a name is replaced, never written through; reads do not follow links either.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import stat
from pathlib import Path

from ... import config as _config
from ..links import new_file

log = logging.getLogger("colabkit")

STATE_SUFFIX = ".colabkit-stage"    # <dst>.colabkit-stage/: the bookkeeping, beside the staged folder
STATE_DIR = ".colabkit-stage"       # where versions before it lived: inside the staged folder (moved out when met)
O_BINARY = getattr(os, "O_BINARY", 0)   # Windows opens descriptors in text mode without it
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)   # a link at the name fails the open (ELOOP) instead of being followed


def state_dir(dst: Path) -> Path:
    """Where stage keeps its bookkeeping for the staged folder ``dst``: beside it, ``<dst>.colabkit-stage/``;
    where that folder's parent is not writable (dst is a mount point, say), in the cache dir under a name
    derived from dst's path. An existing one of the two is used."""
    dst = Path(dst)
    beside = dst.with_name(dst.name + STATE_SUFFIX) if dst.name else dst / STATE_SUFFIX
    keyed = (_config.load().resolved_cache_dir() / "stage-state" /
             f"{dst.name or 'root'}-{hashlib.sha1(str(dst).encode(errors='surrogateescape')).hexdigest()[:12]}")
    if beside.is_dir() or keyed.is_dir():
        return beside if beside.is_dir() else keyed
    parent = beside.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return beside if os.access(parent, os.W_OK) else keyed


def _user_name(uid: int) -> str:
    try:
        import pwd
        return f"{pwd.getpwuid(uid).pw_name}, uid {uid}"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_own_folder(path: Path, *, bookkeeping_for: Path | None = None) -> None:
    """Refuse (PermissionError) a folder at ``path`` that another user could have planted or can change: it
    must be this user's own and writable by no one else. For the bookkeeping folder (``bookkeeping_for``: the
    staged folder it belongs to) also a real folder, not a symbolic link, and not group-writable (colabkit
    makes it 0700). dst may be a link of this user's to a folder of theirs, and group-writable (a user's own
    folders are, under the common umask 002, and nothing in it is written through a link)."""
    what = f"the folder where stage keeps its bookkeeping for {bookkeeping_for}" if bookkeeping_for else \
        "the folder to stage into"
    elsewhere = "stage elsewhere: another dst, in a folder only you can write (under your home folder, say)"
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        if bookkeeping_for is not None:
            raise PermissionError(f"{path} ({what}) is a symbolic link (to {os.readlink(path)}), not a folder "
                                  f"colabkit made; it was not followed. Remove the link, or {elsewhere}.")
        if hasattr(os, "geteuid") and st.st_uid not in (os.geteuid(), 0):
            raise PermissionError(f"{path} ({what}) is a symbolic link owned by {_user_name(st.st_uid)}, not by "
                                  f"you: that user can point it elsewhere at any time. Remove it, or {elsewhere}.")
        st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        if bookkeeping_for is None:
            return                             # a file at dst: stage's own check names it
        raise PermissionError(f"{path} ({what}) is not a folder. Remove it, or {elsewhere}.")
    if not hasattr(os, "geteuid"):             # Windows: no POSIX owner and mode bits to check
        return
    if st.st_uid != os.geteuid():
        raise PermissionError(f"colabkit will not stage through {path} ({what}): it belongs to "
                              f"{_user_name(st.st_uid)}, not to you ({_user_name(os.geteuid())}), so that user could "
                              f"read or replace what is staged, or make stage overwrite files of yours through "
                              f"links. Have it removed (by its owner or root), or {elsewhere}.")
    others = 0o022 if bookkeeping_for is not None else 0o002
    if st.st_mode & others:
        raise PermissionError(f"colabkit will not stage through {path} ({what}): other users can write into it "
                              f"(mode {stat.S_IMODE(st.st_mode):04o}). If everything in it is yours, make it private "
                              f"(chmod {'700' if bookkeeping_for else 'o-w'} {path}); else remove it, or {elsewhere}.")


def _make_own_folder(path: Path, mode: int, *, bookkeeping_for: Path | None = None) -> None:
    """Make the folder ``path`` with ``mode`` (its parents as usual) unless it exists; then check it is ours
    (an existing one, or one another user made just before us, is refused)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    check_own_folder(path, bookkeeping_for=bookkeeping_for)


def claim(dst: Path, state: Path) -> None:
    """Make dst and its private bookkeeping folder, recording which folder the bookkeeping is for (its inode)."""
    _make_own_folder(dst, 0o755)
    _make_own_folder(state, 0o700, bookkeeping_for=dst)
    write_json(state / "folder.json", {"folder": str(dst), "inode": dst.stat().st_ino})


def _owns(state: Path, dst: Path) -> bool:
    """The bookkeeping is dst's: dst is the folder it was written for (not one deleted, then made again)."""
    if not dst.is_dir():
        return False
    record = read_json(state / "folder.json")
    return record is None or record.get("inode") == dst.stat().st_ino


def adopt_state(dst: Path, state: Path) -> None:
    """Bookkeeping of an older version (inside dst) moves beside it; stale bookkeeping (dst gone) is dropped."""
    legacy = dst / STATE_DIR
    if legacy.is_dir() and not legacy.is_symlink():
        if state.is_dir():                     # both: the one beside is this version's own
            shutil.rmtree(legacy)
        else:
            state.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(legacy), str(state))
            os.chmod(state, 0o700)
            claim(dst, state)
            log.info("colabkit: moved the staging bookkeeping out of %s, to %s", dst, state)
    if state.is_dir() and not _owns(state, dst):
        shutil.rmtree(state)


def read_text(path: Path) -> str | None:
    """The text of the file at ``path``; None when there is none, or a symbolic link is there (not followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | O_NOFOLLOW | O_BINARY)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read().decode("utf-8", errors="surrogateescape")


def write_text(path: Path, text: str) -> None:
    """Replace the file at ``path`` atomically, through a temporary file created anew (never through a link)."""
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(new_file(tmp, 0o600), "wb") as fh:
        fh.write(text.encode("utf-8", errors="surrogateescape"))
    os.replace(tmp, path)                      # a rename replaces a link at ``path``, it does not follow it


def read_json(path: Path):
    try:
        return json.loads(read_text(path) or "")
    except ValueError:
        return None


def write_json(path: Path, data) -> None:
    write_text(path, json.dumps(data))
