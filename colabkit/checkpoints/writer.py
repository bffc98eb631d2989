"""One writing process per checkpoint folder on this machine.

Two runs writing one folder prune and resume each other's checkpoints (a `colabkit run` sweep whose jobs all
save to "drive:runs/mnist" would). Before it writes, a process claims the folder's local staging directory with
an advisory lock (flock) on a file beside it, which the OS releases when the process dies: a crash or a kill
never leaves a stale claim. Several Checkpoints objects in one process (a notebook cell run twice) share the claim. Writers on other
machines are seen through the destination's lease (lease.py); where flock is unavailable nothing is checked here.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from .lease import FolderInUse, in_use_message  # noqa: F401 - FolderInUse is raised from here

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
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
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
