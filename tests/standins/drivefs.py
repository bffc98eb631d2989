#!/usr/bin/env python3
"""A local stand-in for Google Drive as Colab mounts it: a FUSE filesystem passing through to a backing folder.

Usage::

    python tests/standins/drivefs.py BACKING MOUNTPOINT [--rate BYTES_PER_S] [--read-rate BYTES_PER_S]
                                     [--burst BYTES] [--open-latency S] [--control FILE [--log-ops]]
                                     [--trash DIR] [--foreground] [--debug]

What it reproduces of Colab's Drive mount (see shared/docs/colab-facts.md, "Google Drive as mounted on Colab"):

* slow writes: the data of every ``write()`` goes through a token bucket (``--rate``, default 20e6 bytes/s;
  0 = unthrottled). Reads are unthrottled unless ``--read-rate`` is given;
* a round trip per file: ``--open-latency`` seconds (default 0) are spent in every ``open()``/``create()``,
  as a network filesystem fetches a file's metadata and first bytes (other opens go on meanwhile);
* no links: ``symlink()`` fails with EOPNOTSUPP (errno 95), ``link()`` with ENOSYS (errno 38);
* deleted files go to Drive's Trash (with ``--trash DIR``, a folder outside the mount): ``unlink()`` moves the
  file to ``DIR/N`` and ``rmdir()`` leaves an empty ``DIR/N``, and each appends a line to ``DIR/index.jsonl``,
  ``{"n": N, "path": "/MyDrive/...", "kind": "file"|"folder", "size": BYTES}`` (N counts from 1). An entry is in
  Trash while ``DIR/N`` exists: emptying Trash (``drive_api.DriveServer.link_mount`` does it for files the API
  deletes for good) removes it. ``read_trash(DIR)`` lists what is in Trash. Without ``--trash`` a delete is
  final;
* ``rename()`` works (it does on Drive; the stand-in's is atomic because the backing folder's is, so a test
  passing here does not prove a protocol relies on nothing more than Drive gives);
* a mount that fails, driven by a control file outside the mount (re-read whenever its inode, size, mtime or
  ctime changes; checked on every operation). Its first line that is not blank and not a ``#`` comment:

  ``ok``              normal operation (also when the file is missing or empty)
  ``enotconn``        every operation fails with ENOTCONN (errno 107, "Transport endpoint is not
                      connected"), as after the mount dropped
  ``enospc``          write(), create(), mkdir() and growing truncate() fail with ENOSPC; statfs() reports
                      no free space
  ``readonly``        every mutation (create, write, open for writing, truncate, mkdir, rmdir, unlink,
                      rename, chmod, utimens, symlink, link) fails with EROFS
  ``fail-after N``    the next N bytes of write() data succeed; the write that would go past them "drops the
                      mount": it stores only what is left of the N bytes (a short write; nothing if none is
                      left, failing with ENOTCONN) and from then on EVERY operation fails with ENOTCONN, until
                      the control file changes again. Net effect: a file written through the mount ends up
                      holding exactly N more bytes in the backing folder, and the writer gets ENOTCONN
  ``fail-op K ERR``   operation number K (see "Counted operations" below; the first is 1) fails with errno
                      ERR, without being performed, once; every other operation passes (a transient fault)
  ``drop-at K ERR``   operation K and every later one fail with ERR, until the control file changes (the
                      mount drops mid-cycle)
  ``kill-at K``       operation K sends SIGKILL to the process that made it and fails with EIO without being
                      performed; the operations that process still makes (e.g. the flush of its open files
                      as it dies) fail with EIO too. The mount goes on working for every other process. If no
                      process is known (pid 0) or it is drivefs itself, nothing is killed and K fails with EIO

  ERR is a name of the errno module, any case (EIO, ENOTCONN, ENOSPC, ETIMEDOUT, EROFS, EACCES, ...), or a
  positive number. K is a decimal integer >= 1. ``parse_fault()`` turns a control text into ``(mode,
  argument)``; ``drive_mount.DriveMount.set_fault(text)`` writes one (atomically, with a fresh mtime).

Counted operations (for a fault campaign in the style of SQLite's I/O-error tests: for k = 1..N, run a workload
with ``fail-op k ...`` / ``drop-at k ...`` / ``kill-at k`` and check what survives):

* Operation = one call of a FUSE callback that consults the control file: getattr, access, readdir,
  readlink, statfs, chmod, utimens, truncate, mkdir, rmdir, unlink, rename, symlink, link, open, create,
  read, write, flush, fsync. NOT release (always performed: the fd must be closed), nor opendir / releasedir /
  xattrs / anything libfuse or the kernel answers without a callback here. They are numbered 1, 2, 3, ... in
  the order they reach one lock (libfuse is multi-threaded), from the first operation after the control
  content changed (any change of inode, size, mtime or ctime, even to the same text: ``set_fault("ok")``
  again resets). Every mode counts, ``ok`` included.
* The count is kept in ``CONTROL.count`` (next to the control file, so outside the mount): the decimal number
  of operations counted since the control content last changed, rewritten (pwrite on an fd held open) before
  each counted operation is performed, so it is current once the syscall that caused it returns. It is 0 from
  start-up until the first operation; after a change it still shows the old count until the next operation
  arrives (that is when the change is noticed). ``read_count(CONTROL)`` reads it.
* With ``--log-ops``, ``CONTROL.ops`` gets one line per counted operation, ``K NAME PATH`` (PATH is what
  libfuse passes; for rename the old path; a backslash doubled, a newline written as backslash-n),
  emptied when the count resets. ``read_ops(CONTROL)`` parses it. Off by default (one more write per op).
* The kernel makes operations of its own on a caller's behalf, and they are counted: with attribute and entry
  timeouts 0 every path lookup sends one getattr per component below the mount's root, and opening a file or
  directory, fstat() and reading up to EOF each refresh attributes (getattr). Measured (Linux 6.18, libfuse
  3, one thread): create + write 4 KiB + fsync + close, open + read back + close, listdir, unlink of
  ``MyDrive/w.bin`` = 22 operations: getattr x13, create, write, fsync, flush x2, open, read, readdir,
  unlink; the same sequence on every run (checked over 100 runs, and over 30 runs of a 4 MiB variant: 56 or
  116 operations, depending on the write size per syscall).
* What makes the count of a single-threaded workload differ between runs, or after a fault:
  - the kernel's dentry cache: a name it has seen whose file then vanished behind its back (deleted in the
    backing folder) costs two lookups next time (a failed revalidation, then a fresh lookup) instead of one.
    Reset state between runs THROUGH the mount (unlink there), or use fresh names;
  - a failed lookup revalidation (a fault injected into such a getattr) is retried by the kernel with a fresh
    lookup (+1 operation, usually invisible to the caller), and a failed page read is retried (+1 read; the
    caller sees the error only if the retry fails too). Python's open() ignores fstat() errors. So not every
    fault reaches the caller, and operations after K may differ from the fault-free run: that is the point;
  - reads larger than the kernel's readahead window are split into several read operations (32 for 4 MiB
    here), and asynchronous readahead may still be in flight when read() returns; small files are not
    affected. Writes of more than 1 MiB per syscall are split into 1 MiB write operations;
  - anything else touching the mount (another process, a second thread) adds operations in its own order.

Everything else is a plain passthrough: getattr, readdir, open, create, read, write, flush, fsync, release,
truncate, statfs, chmod, utimens, mkdir, rmdir, unlink (without ``--trash``), rename, access, readlink. There
are no extended attributes and no chown (the kernel answers EOPNOTSUPP / ENOSYS). Kernel attribute and entry caching is
off (timeouts 0) so that a fault takes effect on the very next operation. The mount shows in /proc/mounts
as ``drive MOUNTPOINT fuse.drive``, as Colab's does
(``--subtype mergerfs`` makes it ``fuse.mergerfs``: a FUSE filesystem over a local disk, which colabkit
writes directly rather than staging).

Note on kill-at: the kernel reports the calling THREAD's id (``fuse_get_context()`` in a libfuse worker);
kill() of a thread id signals its whole thread group, and SIGKILL ends the whole process (checked by the tests
with a non-main thread). The caller is blocked waiting for this operation's reply when it is killed, so it
runs no more of its own code. Outside libfuse's worker threads ``fuse_get_context()`` returns garbage, so the
context is only used after libfuse has called ``init``.

Without ``--foreground`` the process daemonizes once mounted. Unmount with ``fusermount3 -u MOUNTPOINT`` (or
send SIGTERM / SIGINT to the foreground process). For tests use ``drive_mount.mounted_drive`` (same folder).
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import signal
import sys
import threading
import time

try:  # kept importable without FUSE, so that drive_mount can use parse_fault() / skip cleanly
    import mfusepy
    _Operations = mfusepy.Operations
    _IMPORT_ERROR = None
except (ImportError, OSError) as exc:  # OSError: mfusepy found no libfuse
    mfusepy = None
    _Operations = object
    _IMPORT_ERROR = exc

DEFAULT_RATE = 20e6
DEFAULT_BURST = 1 << 20
MAX_WRITE = 1 << 20  # libfuse 3 caps max_write at 256 pages (1 MiB on x86)
TRASH_INDEX = "index.jsonl"   # in the --trash folder: one JSON line per deleted file or folder

FAULT_MODES = ("ok", "enotconn", "enospc", "readonly", "fail-after", "fail-op", "drop-at", "kill-at")
_USAGE = "ok, enotconn, enospc, readonly, fail-after N, fail-op K ERRNAME, drop-at K ERRNAME, kill-at K"

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT

log = logging.getLogger("drivefs")


def _oserror(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def parse_errno(word: str) -> int:
    """The errno named by ``word``: a name of the errno module (EIO, ENOTCONN, ENOSPC, ETIMEDOUT, EROFS, ...; any
    case) or a positive number. ValueError otherwise."""
    if word.isdigit() and int(word) > 0:
        return int(word)
    code = getattr(errno, word.upper(), None)
    if not word.upper().startswith("E") or not isinstance(code, int) or code <= 0:
        raise ValueError(f"not an errno name: {word!r} (expected e.g. EIO, ENOTCONN, ENOSPC, ETIMEDOUT, EROFS)")
    return code


def _parse_op_number(word: str) -> int:
    try:
        k = int(word)
    except ValueError:
        raise ValueError(f"not an operation number: {word!r}") from None
    if k < 1:
        raise ValueError(f"operation numbers start at 1: {k}")
    return k


def parse_fault(text: str) -> tuple[str, object]:
    """``(mode, argument)`` for the contents of a control file; ValueError if they mean nothing.

    The argument is None (ok, enotconn, enospc, readonly), the number of bytes (fail-after N), the operation
    number (kill-at K) or ``(K, errno)`` (fail-op K ERRNAME, drop-at K ERRNAME)."""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        mode = words[0].lower()
        if mode == "fail-after":
            if len(words) != 2:
                raise ValueError(f"'fail-after' takes one argument, a number of bytes: {line!r}")
            try:
                limit = int(float(words[1])) if any(c in words[1] for c in ".eE") else int(words[1])
            except ValueError:
                raise ValueError(f"not a number of bytes: {words[1]!r}") from None
            if limit < 0:
                raise ValueError(f"negative number of bytes: {limit}")
            return mode, limit
        if mode in ("fail-op", "drop-at"):
            if len(words) != 3:
                raise ValueError(f"{mode!r} takes two arguments, an operation number and an errno name: {line!r}")
            return mode, (_parse_op_number(words[1]), parse_errno(words[2]))
        if mode == "kill-at":
            if len(words) != 2:
                raise ValueError(f"'kill-at' takes one argument, an operation number: {line!r}")
            return mode, _parse_op_number(words[1])
        if mode in FAULT_MODES and len(words) == 1 and mode != "fail-after":
            return mode, None
        raise ValueError(f"unknown fault {line!r}; expected one of: {_USAGE}")
    return "ok", None


def count_path(control: os.PathLike | str) -> str:
    """The file where the filesystem keeps the number of operations counted since the control content changed."""
    return os.fspath(control) + ".count"


def ops_path(control: os.PathLike | str) -> str:
    """The file where ``--log-ops`` appends one line ``K NAME PATH`` per counted operation."""
    return os.fspath(control) + ".ops"


def read_count(control: os.PathLike | str) -> int:
    """The operation count the filesystem of ``control`` last wrote (0 before its first operation)."""
    for _ in range(100):  # a reset truncates before it writes: an empty file is a count caught mid-reset
        try:
            with open(count_path(control), "rb") as fh:
                text = fh.read()
        except FileNotFoundError:
            return 0
        if text:
            return int(text)
        time.sleep(0.001)
    return 0


def read_ops(control: os.PathLike | str) -> list[tuple[int, str, str]]:
    """``[(k, name, path), ...]`` from the ``--log-ops`` file of ``control`` (paths unescaped)."""
    out = []
    try:
        with open(ops_path(control), encoding="utf-8", errors="surrogateescape") as fh:
            lines = fh.read().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        k, name, path = line.split(" ", 2)
        out.append((int(k), name, _unescape_path(path)))
    return out


def read_trash(trash: os.PathLike | str) -> list[dict]:
    """What the mount's deletes put in Drive's Trash and is still there: the ``index.jsonl`` entries of
    ``trash`` (``n``, ``path``, ``kind``, ``size``) whose ``trash/N`` still exists, in the order of deletion."""
    import json
    try:
        with open(os.path.join(trash, TRASH_INDEX), encoding="utf-8") as fh:
            entries = [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []
    return [e for e in entries if os.path.lexists(os.path.join(trash, str(e["n"])))]


def _escape_path(path: str | None) -> str:
    if path is None:
        return "-"
    return path.replace("\\", "\\\\").replace("\n", "\\n")


def _unescape_path(text: str) -> str:
    return re.sub(r"\\(\\|n)", lambda m: "\n" if m.group(1) == "n" else "\\", text)


def _tgid(pid: int) -> int:
    """The process (thread group) of thread ``pid``; ``pid`` itself if /proc does not say."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return pid


def _caller_pid() -> int:
    """The thread id of the process whose request is being served (0 if unknown). Only in a libfuse worker."""
    if mfusepy is None:
        return 0
    try:
        return int(mfusepy.fuse_get_context()[2])
    except (ValueError, OSError, AttributeError):  # ValueError: NULL context (not in a FUSE worker thread)
        return 0


class TokenBucket:
    """Thread-safe throttle (GCRA form of a token bucket): ``take(n)`` sleeps until n bytes may pass."""

    def __init__(self, rate: float, burst: float = DEFAULT_BURST):
        self.rate = float(rate or 0)
        self.burst = max(float(burst), 0.0)
        self._lock = threading.Lock()
        self._tat = time.monotonic()  # when the bucket would be full again

    def take(self, n: int) -> None:
        if self.rate <= 0 or n <= 0:
            return
        with self._lock:
            now = time.monotonic()
            self._tat = max(self._tat, now) + n / self.rate
            wait = self._tat - now - self.burst / self.rate
        if wait > 0:
            time.sleep(wait)


class FaultControl:
    """The fault named by the control file, re-read only when the file's stat changes; counts operations.

    ``check(kind, op, path)`` is called once at the start of every counted FUSE callback: it notices a changed
    control file (which resets the count), counts the operation, writes the count to ``count_path(control)``
    (and, with ``log_ops``, a line to ``ops_path(control)``) and raises the injected error, if any. All of that
    happens under one lock, so operations are numbered in the order they reach it."""

    def __init__(self, path: str | None, log_ops: bool = False):
        self.path = path
        self._lock = threading.Lock()
        self._key: object = ("unread",)
        self.mode = "ok"
        self.arg: object = None
        self._remaining: int | None = None
        self._dropped = False
        self._bad: str | None = None
        self.count = 0
        self._killed: set[int] = set()  # kill-at: the processes (tgids) killed under this control content
        self._count_fd = self._ops_fd = None
        self.in_fuse = False  # set once libfuse calls init: only then is fuse_get_context() meaningful
        self._count_len = 0
        if path is not None:
            self._count_fd = os.open(count_path(path), os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            self._write_count()
            if log_ops:
                self._ops_fd = os.open(ops_path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
                                       | os.O_CLOEXEC, 0o644)

    # -- under self._lock ----------------------------------------------------------------------------------
    @staticmethod
    def _stat_key(st: os.stat_result) -> tuple:
        return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def _refresh(self) -> None:
        if self.path is None:
            return
        try:
            key = self._stat_key(os.stat(self.path))
        except FileNotFoundError:
            key = None
        if key == self._key:
            return
        text = ""
        if key is not None:
            try:
                with open(self.path, "rb") as fh:
                    key = self._stat_key(os.fstat(fh.fileno()))  # the key of exactly what is read
                    text = fh.read().decode("utf-8", errors="replace")
            except FileNotFoundError:
                key, text = None, ""
            if key == self._key:
                return
        try:
            mode, arg = parse_fault(text)
            self._bad = None
        except ValueError as exc:
            mode, arg = "ok", None
            self._bad = str(exc)
            log.error("drivefs: control file %s: %s (every operation fails with EIO)", self.path, exc)
        self.mode, self.arg, self._dropped = mode, arg, False
        self._remaining = arg if mode == "fail-after" else None
        self._killed = set()
        self._key = key
        self.count = 0
        if self._ops_fd is not None:
            os.ftruncate(self._ops_fd, 0)

    def _write_count(self) -> None:
        if self._count_fd is None:
            return
        data = str(self.count).encode()
        if len(data) < self._count_len:
            os.ftruncate(self._count_fd, 0)  # readers see "" (read_count retries), never "0" + stale digits
        os.pwrite(self._count_fd, data, 0)
        self._count_len = len(data)

    # -- the operations' entry points ----------------------------------------------------------------------
    def check(self, kind: str, op: str | None = None, path: str | None = None) -> None:
        """Count operation ``op`` (on ``path``) and raise the injected error for an operation of ``kind``:
        'op' (any), 'mutate', 'space' (needs space). Call it once per FUSE callback (``check_more`` after)."""
        with self._lock:
            self._refresh()
            self.count += 1
            k = self.count
            self._write_count()
            if self._ops_fd is not None:
                os.write(self._ops_fd, f"{k} {op or kind} {_escape_path(path)}\n".encode("utf-8", "surrogateescape"))
            mode, arg, bad = self.mode, self.arg, self._bad
            victim = self._victim() if mode == "kill-at" and k == arg and bad is None else None
            killed = set(self._killed)
        if bad is not None:
            raise _oserror(errno.EIO)
        if mode == "fail-op":
            if k == arg[0]:
                log.info("drivefs: fail-op: operation %d (%s %s) fails with errno %d", k, op, path, arg[1])
                raise _oserror(arg[1])
            return
        if mode == "drop-at":
            if k >= arg[0]:
                raise _oserror(arg[1])
            return
        if mode == "kill-at":
            if k == arg:
                self._kill(victim, k, op, path)
                raise _oserror(errno.EIO)
            if killed and _tgid(self._caller_pid()) in killed:  # e.g. the flush of its files as it exits
                raise _oserror(errno.EIO)
            return
        self.check_more(kind)

    def check_more(self, kind: str) -> None:
        """Apply the mode's rule for ``kind`` again within the same (already counted) operation."""
        mode = self.mode
        if self._bad is not None:
            raise _oserror(errno.EIO)
        if mode == "ok" or mode in ("fail-op", "drop-at", "kill-at"):
            return
        if mode == "enotconn" or self._dropped:
            raise _oserror(errno.ENOTCONN)
        if mode == "readonly" and kind in ("mutate", "space"):
            raise _oserror(errno.EROFS)
        if mode == "enospc" and kind == "space":
            raise _oserror(errno.ENOSPC)

    def _victim(self) -> tuple[int, int] | None:
        """(thread id, process id) of the caller, recorded as killed (under the lock, so that every later-numbered
        operation sees it); None if there is no process to kill."""
        pid = self._caller_pid()  # the calling THREAD's id; kill() on a thread id signals its whole process
        tgid = _tgid(pid) if pid > 0 else 0
        if tgid <= 1 or tgid == os.getpid():
            return None
        self._killed.add(tgid)
        return pid, tgid

    def _kill(self, victim: tuple[int, int] | None, k: int, op: str | None, path: str | None) -> None:
        if victim is None:
            log.warning("drivefs: kill-at %d (%s %s): no process to kill; failing it with EIO", k, op, path)
            return
        pid, tgid = victim
        log.warning("drivefs: kill-at %d (%s %s): SIGKILL to process %d (thread %d)", k, op, path, tgid, pid)
        try:
            os.kill(pid, signal.SIGKILL)  # SIGKILL is process-wide: the whole of ``tgid`` dies
        except ProcessLookupError:
            pass

    def _caller_pid(self) -> int:
        """The thread id of the process whose request is being served; 0 if unknown (called outside libfuse:
        there fuse_get_context() reads another library's thread-local data and returns garbage)."""
        return _caller_pid() if self.in_fuse else 0

    def no_space(self) -> bool:
        return self.mode == "enospc" and not self._dropped

    def write_allowance(self, n: int) -> int:
        """How many of ``n`` bytes a write may store (call after ``check``); raises once dropped."""
        if self.mode != "fail-after":
            return n
        with self._lock:
            if self._dropped:
                raise _oserror(errno.ENOTCONN)
            remaining = self._remaining or 0
            if n > remaining:
                self._dropped = True  # this write is the one that crosses the limit: the mount goes away
                log.info("drivefs: fail-after limit reached, the mount is now dropped (ENOTCONN)")
            allowed = min(n, remaining)
            self._remaining = remaining - allowed
            if allowed == 0:
                raise _oserror(errno.ENOTCONN)
            return allowed


class DriveFS(_Operations):
    """Passthrough to ``root`` with Drive's limits and injectable faults (see the module docstring)."""

    use_ns = True  # utimens() gets and getattr() returns nanoseconds

    def __init__(self, root: str, rate: float = DEFAULT_RATE, read_rate: float = 0, burst: float = DEFAULT_BURST,
                 control: str | None = None, open_latency: float = 0.0, log_ops: bool = False,
                 trash: str | None = None):
        self.root = os.path.realpath(root)
        self.trash = trash               # deletes go to Drive's Trash there (see the module docstring)
        self._trash_lock = threading.Lock()
        self.open_latency = open_latency
        self.write_bucket = TokenBucket(rate, burst)
        self.read_bucket = TokenBucket(read_rate, burst)
        self.faults = FaultControl(control, log_ops=log_ops)

    # -- helpers -------------------------------------------------------------------------------------------
    def _full(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def init_with_config(self, conn_info, config_3) -> None:
        self.faults.in_fuse = True
        if conn_info is not None:
            conn_info.max_write = MAX_WRITE
            conn_info.max_readahead = max(conn_info.max_readahead, MAX_WRITE)

    # -- metadata ------------------------------------------------------------------------------------------
    def getattr(self, path, fh=None):
        self.faults.check("op", "getattr", path)
        st = os.fstat(fh) if fh is not None else os.lstat(self._full(path))
        return {key: getattr(st, key) for key in (
            "st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks", "st_blksize")} | {
            "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

    def access(self, path, amode):
        self.faults.check("op", "access", path)
        if not os.access(self._full(path), amode):
            raise _oserror(errno.EACCES)
        return 0

    def readdir(self, path, fh):
        self.faults.check("op", "readdir", path)
        return [".", "..", *os.listdir(self._full(path))]

    def readlink(self, path):
        self.faults.check("op", "readlink", path)
        return os.readlink(self._full(path))

    def statfs(self, path):
        self.faults.check("op", "statfs", path)
        sv = os.statvfs(self._full(path))
        out = {key: getattr(sv, key) for key in (
            "f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail",
            "f_flag", "f_namemax")}
        if self.faults.no_space():
            out["f_bfree"] = out["f_bavail"] = 0
        return out

    def chmod(self, path, mode):
        self.faults.check("mutate", "chmod", path)
        os.chmod(self._full(path), mode)
        return 0

    def utimens(self, path, times=None):
        self.faults.check("mutate", "utimens", path)
        if times is None:
            os.utime(self._full(path))
        else:
            os.utime(self._full(path), ns=(int(times[0]), int(times[1])))
        return 0

    def truncate(self, path, length, fh=None):
        self.faults.check("op", "truncate", path)
        full = self._full(path) if path is not None else None
        size = os.fstat(fh).st_size if fh is not None else os.stat(full).st_size
        self.faults.check_more("space" if length > size else "mutate")
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(full, length)
        return 0

    # -- namespace -----------------------------------------------------------------------------------------
    def mkdir(self, path, mode):
        self.faults.check("space", "mkdir", path)
        os.mkdir(self._full(path), mode)
        return 0

    def rmdir(self, path):
        self.faults.check("mutate", "rmdir", path)
        os.rmdir(self._full(path))
        if self.trash:
            self._to_trash(path, "folder", lambda stored: os.mkdir(stored))
        return 0

    def unlink(self, path):
        self.faults.check("mutate", "unlink", path)
        full = self._full(path)
        if not self.trash:
            os.unlink(full)
            return 0
        size = os.lstat(full).st_size
        self._to_trash(path, "file", lambda stored: os.rename(full, stored), size)
        return 0

    def _to_trash(self, path: str, kind: str, store, size: int = 0) -> None:
        """Drive's Trash: ``store(TRASH/N)`` puts the item there, then its index line is appended."""
        import json
        with self._trash_lock:
            index = os.path.join(self.trash, TRASH_INDEX)
            try:
                with open(index, encoding="utf-8") as fh:
                    n = sum(1 for line in fh if line.strip()) + 1
            except FileNotFoundError:
                n = 1
            store(os.path.join(self.trash, str(n)))
            with open(index, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"n": n, "path": path, "kind": kind, "size": size}) + "\n")

    def rename(self, old, new):
        self.faults.check("mutate", "rename", old)
        os.rename(self._full(old), self._full(new))
        return 0

    def symlink(self, target, source):
        self.faults.check("mutate", "symlink", target)
        raise _oserror(errno.EOPNOTSUPP)  # Drive: [Errno 95] Operation not supported

    def link(self, target, source):
        self.faults.check("mutate", "link", target)
        raise _oserror(errno.ENOSYS)  # Drive: [Errno 38] Function not implemented

    # -- file data -----------------------------------------------------------------------------------------
    def open(self, path, flags):
        self.faults.check("mutate" if flags & _WRITE_FLAGS else "op", "open", path)
        if self.open_latency:
            time.sleep(self.open_latency)
        return os.open(self._full(path), flags)

    def create(self, path, mode, flags=os.O_WRONLY | os.O_CREAT):
        self.faults.check("space", "create", path)
        if self.open_latency:
            time.sleep(self.open_latency)
        return os.open(self._full(path), flags | os.O_CREAT, mode)

    def read(self, path, size, offset, fh):
        self.faults.check("op", "read", path)
        data = os.pread(fh, size, offset)
        self.read_bucket.take(len(data))
        return data

    def write(self, path, data, offset, fh):
        self.faults.check("space", "write", path)
        n = self.faults.write_allowance(len(data))
        self.write_bucket.take(n)
        view = memoryview(data)[:n]
        done = 0
        while done < n:
            done += os.pwrite(fh, view[done:], offset + done)
        return n

    def flush(self, path, fh):
        self.faults.check("op", "flush", path)
        os.close(os.dup(fh))
        return 0

    def fsync(self, path, datasync, fh):
        self.faults.check("op", "fsync", path)
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)
        return 0

    def release(self, path, fh):
        os.close(fh)  # always: the kernel ignores release errors, and the fd must not leak
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("backing", help="folder holding the files ('Drive')")
    parser.add_argument("mountpoint", help="empty folder to mount on (created if missing)")
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE,
                        help="write throughput in bytes/s (default %(default).0f; 0 = unthrottled)")
    parser.add_argument("--read-rate", type=float, default=0, help="read throughput in bytes/s (0 = unthrottled)")
    parser.add_argument("--burst", type=float, default=DEFAULT_BURST,
                        help="token bucket size in bytes (default %(default).0f)")
    parser.add_argument("--open-latency", type=float, default=0.0, metavar="SECONDS",
                        help="time spent in every open()/create(), like a network round trip (default 0)")
    parser.add_argument("--control", help="fault-injection control file (outside the mount)")
    parser.add_argument("--log-ops", action="store_true",
                        help="append 'K NAME PATH' for every counted operation to CONTROL.ops (needs --control)")
    parser.add_argument("--trash", help="folder (outside the mount) playing Drive's Trash: deletes move there")
    parser.add_argument("--foreground", action="store_true", help="do not daemonize")
    parser.add_argument("--debug", action="store_true", help="libfuse debug output (implies --foreground)")
    parser.add_argument("--subtype", default="drive",
                        help="filesystem type shown in /proc/mounts: fuse.SUBTYPE (default %(default)s)")
    parser.add_argument("--max-threads", type=int, default=32, help="libfuse worker threads (default %(default)s)")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if mfusepy is None:
        print(f"drivefs: cannot load mfusepy / libfuse: {_IMPORT_ERROR}", file=sys.stderr)
        return 2
    backing = os.path.abspath(args.backing)
    mountpoint = os.path.abspath(args.mountpoint)
    if args.control and os.path.realpath(args.control).startswith(os.path.realpath(mountpoint) + os.sep):
        parser.error("the control file must be outside the mount")
    os.makedirs(backing, exist_ok=True)
    os.makedirs(mountpoint, exist_ok=True)
    trash = os.path.abspath(args.trash) if args.trash else None
    if trash and os.path.realpath(trash).startswith(os.path.realpath(mountpoint) + os.sep):
        parser.error("the trash folder must be outside the mount")
    if trash:
        os.makedirs(trash, exist_ok=True)
    if args.log_ops and not args.control:
        parser.error("--log-ops needs --control (the log is CONTROL.ops)")
    if args.control:
        parse_fault(open(args.control, encoding="utf-8").read() if os.path.exists(args.control) else "")
    ops = DriveFS(backing, rate=args.rate, read_rate=args.read_rate, burst=args.burst,
                  open_latency=args.open_latency, control=os.path.abspath(args.control) if args.control else None,
                  log_ops=args.log_ops, trash=trash)
    mfusepy.FUSE(ops, mountpoint, foreground=args.foreground or args.debug, debug=args.debug,
                 fsname="drive", subtype=args.subtype, attr_timeout=0, entry_timeout=0, negative_timeout=0,
                 max_threads=args.max_threads, max_idle_threads=args.max_threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
