"""Start / stop the Drive stand-in (``drivefs.py``, same folder) around a test.

    from tests.standins.drive_mount import fuse_available, mounted_drive

    with mounted_drive(tmp_path, rate=20e6) as drive:
        (drive.mountpoint / "x.bin").write_bytes(b"...")   # throttled, through FUSE
        drive.set_fault("enotconn")                           # the mount "drops"
        drive.set_fault("ok")
        assert (drive.backing / "x.bin").exists()              # what reached "Drive"

The pytest fixtures built on this are in ``pytest_drive.py``.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

DRIVEFS = Path(__file__).resolve().with_name("drivefs.py")
FUSERMOUNT = "fusermount3"
MOUNT_TIMEOUT = 20.0
EXIT_TIMEOUT = 10.0


def _drivefs_module():
    """drivefs.py loaded by path (this folder may be imported as 'standins', 'tests.standins' or not at all)."""
    name = "_colabkit_test_drivefs"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, DRIVEFS)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def fuse_unavailable_reason() -> str | None:
    """Why the stand-in cannot be mounted here, or None if it (probably) can."""
    if not sys.platform.startswith("linux"):
        return f"FUSE stand-in needs Linux (this is {sys.platform})"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as exc:
        return f"cannot open /dev/fuse: {exc}"
    if shutil.which(FUSERMOUNT) is None:
        return f"{FUSERMOUNT} is not installed (Debian/Ubuntu: apt-get install fuse3)"
    module = _drivefs_module()
    if module.mfusepy is None:
        return f"mfusepy / libfuse3 unavailable: {module._IMPORT_ERROR}"
    return None


def fuse_available() -> bool:
    """True where /dev/fuse, fusermount3 and mfusepy (with libfuse) are all usable."""
    return fuse_unavailable_reason() is None


def is_mounted(path: os.PathLike | str) -> bool:
    """Whether ``path`` is a mount point according to /proc/self/mounts (works on a dead FUSE mount too)."""
    target = os.path.realpath(path)
    try:
        with open("/proc/self/mounts", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return os.path.ismount(target)
    for line in lines:
        fields = line.split()
        if len(fields) > 1 and _unescape_mount_path(fields[1]) == target:
            return True
    return False


def _unescape_mount_path(text: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as \040, \011, \012, \134
    return text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


@dataclass
class DriveMount:
    """A live stand-in mount. ``mountpoint`` is the FUSE mount, ``backing`` the folder playing Google's
    servers (look there to see what "reached Drive"), ``control`` the fault-injection file."""

    mountpoint: Path
    backing: Path
    control: Path
    log: Path
    rate: float | None
    process: subprocess.Popen | None = None
    trash: Path | None = None          # Drive's Trash, when mounted with trash=True
    _mtime_ns: int = field(default=0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def my_drive(self) -> Path:
        """``<mountpoint>/MyDrive``, created at mount time as on Colab."""
        return self.mountpoint / "MyDrive"

    def set_fault(self, text: str) -> None:
        """Switch the fault mode: "ok", "enotconn", "enospc", "readonly", "fail-after BYTES", "fail-op K ERR",
        "drop-at K ERR" or "kill-at K" (see drivefs.py).
        Takes effect for the next filesystem operation; a new "fail-after" restarts its byte count."""
        _drivefs_module().parse_fault(text)  # ValueError here rather than EIO in the filesystem
        with self._lock:
            tmp = self.control.with_name(self.control.name + ".tmp")
            tmp.write_text(text.rstrip("\n") + "\n", encoding="utf-8")
            # A fresh, strictly increasing mtime: the filesystem notices the change even if the inode number is
            # reused and the size is the same within one timestamp tick.
            self._mtime_ns = max(time.time_ns(), self._mtime_ns + 1_000_000)
            os.utime(tmp, ns=(self._mtime_ns, self._mtime_ns))
            os.replace(tmp, self.control)

    def stderr(self) -> str:
        """What the filesystem process has written to stderr so far."""
        try:
            return self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None and is_mounted(self.mountpoint)


def _start(drive: DriveMount, read_rate: float | None, extra_args: list[str]) -> None:
    args = [sys.executable, str(DRIVEFS), str(drive.backing), str(drive.mountpoint),
            "--rate", repr(float(drive.rate or 0)), "--control", str(drive.control), "--foreground"]
    if read_rate:
        args += ["--read-rate", repr(float(read_rate))]
    args += extra_args
    with open(drive.log, "ab") as log:
        drive.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=True)  # a ^C to pytest must not kill it first
    deadline = time.monotonic() + MOUNT_TIMEOUT
    while True:
        if os.path.ismount(drive.mountpoint):
            return
        code = drive.process.poll()
        if code is not None:
            raise RuntimeError(f"drivefs exited with status {code} before mounting {drive.mountpoint}:\n"
                               f"{drive.stderr()}")
        if time.monotonic() > deadline:
            _stop(drive)
            raise RuntimeError(f"drivefs did not mount {drive.mountpoint} within {MOUNT_TIMEOUT:.0f} s:\n"
                               f"{drive.stderr()}")
        time.sleep(0.02)


def unmount(mountpoint: os.PathLike | str) -> str | None:
    """``fusermount3 -u``, falling back to a lazy ``-uz`` if the mount is busy (an open file, a cwd inside).
    Returns the flags that worked, None if nothing was mounted there."""
    if not is_mounted(mountpoint):
        return None
    for flags in ("-u", "-uz"):
        done = subprocess.run([FUSERMOUNT, flags, str(mountpoint)], capture_output=True, text=True)
        if done.returncode == 0 or not is_mounted(mountpoint):
            return flags
    raise RuntimeError(f"could not unmount {mountpoint}: {done.stderr.strip()}")


def _stop(drive: DriveMount) -> None:
    errors = []
    if drive.process is not None and drive.process.poll() is None:
        with contextlib.suppress(OSError, ValueError):
            drive.set_fault("ok")  # an unmount must not meet an injected fault
    how = None
    try:
        how = unmount(drive.mountpoint)
    except (OSError, RuntimeError) as exc:
        errors.append(str(exc))
    proc = drive.process
    if proc is not None:
        try:
            # A plain unmount ends fuse_main(); after a lazy one the kernel keeps the connection (and the process
            # blocked) until the last open file / cwd inside goes, so do not wait long for that.
            proc.wait(timeout=EXIT_TIMEOUT if how == "-u" else 1.0)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if is_mounted(drive.mountpoint):  # the process died some other way and left a dead mount behind
        with contextlib.suppress(OSError, RuntimeError):
            unmount(drive.mountpoint)
    if errors:
        raise RuntimeError("; ".join(errors) + f"\ndrivefs stderr:\n{drive.stderr()}")


@contextlib.contextmanager
def mounted_drive(tmp_path: os.PathLike | str, rate: float | None = 20e6, *, read_rate: float | None = None,
                  mountpoint: os.PathLike | str | None = None, backing: os.PathLike | str | None = None,
                  fault: str = "ok", my_drive: bool = True, extra_args: list[str] | tuple = (),
                  trash: bool = False) -> Iterator[DriveMount]:
    """Mount the Drive stand-in for the duration of the ``with`` block.

    ``rate``: write throughput in bytes/s (None or 0: unthrottled). ``read_rate``: likewise for reads (default
    unthrottled). ``mountpoint`` / ``backing`` default to ``<tmp_path>/drivefs/mnt`` and
    ``<tmp_path>/drivefs/backing``; the backing folder may already hold files (a "remount" sees them).
    ``my_drive`` creates ``MyDrive/`` in it, as Colab shows. ``fault`` is the initial fault mode. ``trash``:
    deletes go to Drive's Trash, the folder ``drive.trash`` (drivefs ``--trash``; ``drivefs.read_trash``).
    Raises RuntimeError (with the filesystem's stderr) if the mount does not come up.
    """
    base = Path(tmp_path) / "drivefs"
    base.mkdir(parents=True, exist_ok=True)
    mnt = Path(mountpoint).absolute() if mountpoint else base / "mnt"
    tag = "drivefs" if not mountpoint else f"{mnt.name}-{hashlib.sha1(str(mnt).encode()).hexdigest()[:8]}"
    drive = DriveMount(mountpoint=mnt, backing=Path(backing).absolute() if backing else base / "backing",
                       control=base / f"{tag}.control", log=base / f"{tag}.log", rate=rate)
    drive.backing.mkdir(parents=True, exist_ok=True)
    drive.mountpoint.mkdir(parents=True, exist_ok=True)
    if my_drive:
        (drive.backing / "MyDrive").mkdir(exist_ok=True)
    if trash:
        drive.trash = base / f"{tag}.trash"
        extra_args = [*extra_args, "--trash", str(drive.trash)]
    drive.set_fault(fault)
    _start(drive, read_rate, list(extra_args))
    try:
        yield drive
    finally:
        _stop(drive)
