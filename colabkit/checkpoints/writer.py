"""One writing process per checkpoint folder on this machine.

Two runs writing one folder prune and resume each other's checkpoints (a `colabkit run` sweep whose jobs all
save to "drive:runs/mnist" would). Before it writes, a process claims the folder's local staging directory with
an advisory lock (flock) on a file beside it, which the OS releases when the process dies: a crash or a kill
never leaves a stale claim. The lock file is opened without following links and truncated only once locked.
Several Checkpoints objects in one process (a notebook cell run twice) share the claim. Writers on other
machines are seen through the destination's lease (lease.py); where flock is unavailable nothing is checked here.
"""
from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from .folder import CheckpointError
from .lease import FolderInUse, in_use_message

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

LOCK_SUFFIX = ".colabkit-writer.lock"


def lock_path(staging: Path) -> Path:
    """The lock file, beside the staging folder (which then holds checkpoints only, and need not exist)."""
    staging = Path(staging).absolute()
    return staging.parent / f".{staging.name}{LOCK_SUFFIX}"

_claims: dict[str, tuple[int, set]] = {}   # staging dir -> (locked fd, ids of the objects holding the claim)
_mutex = threading.Lock()


def claim(staging: Path, owner: object, destination) -> None:
    """Claim ``staging`` for this process on behalf of ``owner`` (again: no-op); FolderInUse when another process
    holds it."""
    if fcntl is None:
        return
    key = str(Path(staging).absolute())
    with _mutex:
        if key in _claims:
            _claims[key][1].add(id(owner))
            return
        lock = lock_path(Path(key))
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = _open_lock_file(lock, Path(key))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise FolderInUse(in_use_message(holder, destination, " on this machine")) from None
        except OSError:  # this filesystem has no flock: nothing to check
            os.close(fd)
            return
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()}\n".encode(), 0)
        _claims[key] = (fd, {id(owner)})


def _open_lock_file(lock: Path, staging: Path) -> int:
    """The lock file, opened without following a link: in a folder others can write to (local_dir under /tmp),
    a link planted at its name would make this process lock and overwrite the file it points to."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if not lock.is_symlink():
            raise
        raise CheckpointError(
            f"{lock} is a symbolic link (to {os.readlink(lock)}), where colabkit keeps the writer lock of "
            f"{staging}; it does not follow links there, so that no file can be overwritten through one. Remove "
            f"the link, or pass local_dir= a folder that only you can write to.") from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:   # a FIFO, or a hard link to someone's file
        os.close(fd)
        raise CheckpointError(f"{lock}, where colabkit keeps its writer lock, is not a plain file of its own "
                              f"({'a hard link' if stat.S_ISREG(info.st_mode) else 'not a regular file'}); remove "
                              f"it, or pass local_dir= a folder that only you can write to.")
    return fd


def holds(staging: Path, owner: object) -> bool:
    """Whether ``owner`` holds the claim on ``staging`` (always False where flock is unavailable)."""
    with _mutex:
        held = _claims.get(str(Path(staging).absolute()))
        return held is not None and id(owner) in held[1]


def release(staging: Path, owner: object) -> None:
    """``owner`` is done writing (also when it never claimed); the lock goes when no object in this process
    holds the claim."""
    key = str(Path(staging).absolute())
    with _mutex:
        held = _claims.get(key)
        if held is None:
            return
        held[1].discard(id(owner))
        if not held[1]:
            del _claims[key]
            os.close(held[0])   # closing the descriptor drops the flock
