#!/usr/bin/env python3
"""A local stand-in for Google Drive as Colab mounts it: a FUSE filesystem passing through to a backing folder.

Usage::

    python tests/standins/drivefs.py BACKING MOUNTPOINT [--rate BYTES_PER_S] [--read-rate BYTES_PER_S]
                                     [--burst BYTES] [--open-latency S] [--control FILE] [--foreground] [--debug]

What it reproduces of Colab's Drive mount (see shared/docs/colab-facts.md, "Google Drive as mounted on Colab"):

* slow writes: the data of every ``write()`` goes through a token bucket (``--rate``, default 20e6 bytes/s;
  0 = unthrottled). Reads are unthrottled unless ``--read-rate`` is given;
* a round trip per file: ``--open-latency`` seconds (default 0) are spent in every ``open()``/``create()``,
  as a network filesystem fetches a file's metadata and first bytes (other opens go on meanwhile);
* no links: ``symlink()`` fails with EOPNOTSUPP (errno 95), ``link()`` with ENOSYS (errno 38);
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

Everything else is a plain passthrough: getattr, readdir, open, create, read, write, flush, fsync, release,
truncate, statfs, chmod, utimens, mkdir, rmdir, unlink, rename, access, readlink. There are no extended
attributes and no chown (the kernel answers EOPNOTSUPP / ENOSYS). Kernel attribute and entry caching is
off (timeouts 0) so that a fault takes effect on the very next operation. The mount shows in /proc/mounts
as ``drive MOUNTPOINT fuse.drive``, as Colab's does.

Without ``--foreground`` the process daemonizes once mounted. Unmount with ``fusermount3 -u MOUNTPOINT`` (or
send SIGTERM / SIGINT to the foreground process). For tests use ``drive_mount.mounted_drive`` (same folder).
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
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

FAULT_MODES = ("ok", "enotconn", "enospc", "readonly", "fail-after")

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT

log = logging.getLogger("drivefs")


def _oserror(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def parse_fault(text: str) -> tuple[str, int | None]:
    """``(mode, bytes)`` for the contents of a control file; ValueError if they mean nothing."""
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
        if mode in FAULT_MODES and len(words) == 1:
            return mode, None
        raise ValueError(f"unknown fault {line!r}; expected one of: ok, enotconn, enospc, readonly, fail-after N")
    return "ok", None


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
    """The fault named by the control file, re-read only when the file's stat changes."""

    def __init__(self, path: str | None):
        self.path = path
        self._lock = threading.Lock()
        self._key: object = ("unread",)
        self.mode = "ok"
        self._remaining: int | None = None
        self._dropped = False
        self._bad: str | None = None

    def _refresh(self) -> None:
        if self.path is None:
            return
        try:
            st = os.stat(self.path)
            key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except FileNotFoundError:
            key = None
        if key == self._key:
            return
        with self._lock:
            if key == self._key:
                return
            text = ""
            if key is not None:
                try:
                    with open(self.path, encoding="utf-8") as fh:
                        text = fh.read()
                except FileNotFoundError:
                    key = None
            try:
                mode, limit = parse_fault(text)
                self._bad = None
            except ValueError as exc:
                mode, limit = "ok", None
                self._bad = str(exc)
                log.error("drivefs: control file %s: %s (every operation fails with EIO)", self.path, exc)
            self.mode, self._remaining, self._dropped = mode, limit, False
            self._key = key

    def check(self, kind: str) -> None:
        """Raise the injected error for an operation of ``kind``: 'op' (any), 'mutate', 'space' (needs space)."""
        self._refresh()
        if self._bad is not None:
            raise _oserror(errno.EIO)
        mode = self.mode
        if mode == "ok":
            return
        if mode == "enotconn" or self._dropped:
            raise _oserror(errno.ENOTCONN)
        if mode == "readonly" and kind in ("mutate", "space"):
            raise _oserror(errno.EROFS)
        if mode == "enospc" and kind == "space":
            raise _oserror(errno.ENOSPC)

    def no_space(self) -> bool:
        return self.mode == "enospc" and not self._dropped

    def write_allowance(self, n: int) -> int:
        """How many of ``n`` bytes a write may store (call after ``check('space')``); raises once dropped."""
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
                 control: str | None = None, open_latency: float = 0.0):
        self.root = os.path.realpath(root)
        self.open_latency = open_latency
        self.write_bucket = TokenBucket(rate, burst)
        self.read_bucket = TokenBucket(read_rate, burst)
        self.faults = FaultControl(control)

    # -- helpers -------------------------------------------------------------------------------------------
    def _full(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def init_with_config(self, conn_info, config_3) -> None:
        if conn_info is not None:
            conn_info.max_write = MAX_WRITE
            conn_info.max_readahead = max(conn_info.max_readahead, MAX_WRITE)

    # -- metadata ------------------------------------------------------------------------------------------
    def getattr(self, path, fh=None):
        self.faults.check("op")
        st = os.fstat(fh) if fh is not None else os.lstat(self._full(path))
        return {key: getattr(st, key) for key in (
            "st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blocks", "st_blksize")} | {
            "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

    def access(self, path, amode):
        self.faults.check("op")
        if not os.access(self._full(path), amode):
            raise _oserror(errno.EACCES)
        return 0

    def readdir(self, path, fh):
        self.faults.check("op")
        return [".", "..", *os.listdir(self._full(path))]

    def readlink(self, path):
        self.faults.check("op")
        return os.readlink(self._full(path))

    def statfs(self, path):
        self.faults.check("op")
        sv = os.statvfs(self._full(path))
        out = {key: getattr(sv, key) for key in (
            "f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree", "f_favail",
            "f_flag", "f_namemax")}
        if self.faults.no_space():
            out["f_bfree"] = out["f_bavail"] = 0
        return out

    def chmod(self, path, mode):
        self.faults.check("mutate")
        os.chmod(self._full(path), mode)
        return 0

    def utimens(self, path, times=None):
        self.faults.check("mutate")
        if times is None:
            os.utime(self._full(path))
        else:
            os.utime(self._full(path), ns=(int(times[0]), int(times[1])))
        return 0

    def truncate(self, path, length, fh=None):
        self.faults.check("op")
        full = self._full(path) if path is not None else None
        size = os.fstat(fh).st_size if fh is not None else os.stat(full).st_size
        self.faults.check("space" if length > size else "mutate")
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(full, length)
        return 0

    # -- namespace -----------------------------------------------------------------------------------------
    def mkdir(self, path, mode):
        self.faults.check("space")
        os.mkdir(self._full(path), mode)
        return 0

    def rmdir(self, path):
        self.faults.check("mutate")
        os.rmdir(self._full(path))
        return 0

    def unlink(self, path):
        self.faults.check("mutate")
        os.unlink(self._full(path))
        return 0

    def rename(self, old, new):
        self.faults.check("mutate")
        os.rename(self._full(old), self._full(new))
        return 0

    def symlink(self, target, source):
        self.faults.check("mutate")
        raise _oserror(errno.EOPNOTSUPP)  # Drive: [Errno 95] Operation not supported

    def link(self, target, source):
        self.faults.check("mutate")
        raise _oserror(errno.ENOSYS)  # Drive: [Errno 38] Function not implemented

    # -- file data -----------------------------------------------------------------------------------------
    def open(self, path, flags):
        self.faults.check("mutate" if flags & _WRITE_FLAGS else "op")
        if self.open_latency:
            time.sleep(self.open_latency)
        return os.open(self._full(path), flags)

    def create(self, path, mode, flags=os.O_WRONLY | os.O_CREAT):
        self.faults.check("space")
        if self.open_latency:
            time.sleep(self.open_latency)
        return os.open(self._full(path), flags | os.O_CREAT, mode)

    def read(self, path, size, offset, fh):
        self.faults.check("op")
        data = os.pread(fh, size, offset)
        self.read_bucket.take(len(data))
        return data

    def write(self, path, data, offset, fh):
        self.faults.check("space")
        n = self.faults.write_allowance(len(data))
        self.write_bucket.take(n)
        view = memoryview(data)[:n]
        done = 0
        while done < n:
            done += os.pwrite(fh, view[done:], offset + done)
        return n

    def flush(self, path, fh):
        self.faults.check("op")
        os.close(os.dup(fh))
        return 0

    def fsync(self, path, datasync, fh):
        self.faults.check("op")
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
    parser.add_argument("--foreground", action="store_true", help="do not daemonize")
    parser.add_argument("--debug", action="store_true", help="libfuse debug output (implies --foreground)")
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
    if args.control:
        parse_fault(open(args.control, encoding="utf-8").read() if os.path.exists(args.control) else "")
    ops = DriveFS(backing, rate=args.rate, read_rate=args.read_rate, burst=args.burst,
                  open_latency=args.open_latency, control=os.path.abspath(args.control) if args.control else None)
    mfusepy.FUSE(ops, mountpoint, foreground=args.foreground or args.debug, debug=args.debug,
                 fsname="drive", subtype="drive", attr_timeout=0, entry_timeout=0, negative_timeout=0,
                 max_threads=args.max_threads, max_idle_threads=args.max_threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
