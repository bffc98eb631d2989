"""Tests of the Google Drive stand-in itself (tests/standins/drivefs.py and its fixtures), not of colabkit."""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.standins.drive_mount import (_drivefs_module, fuse_available, fuse_unavailable_reason, is_mounted,
                                         mounted_drive)
from tests.standins.pytest_drive import drive_mount, drive_mount_factory  # noqa: F401 (until conftest loads it)

drivefs = _drivefs_module()

needs_fuse = pytest.mark.skipif(not fuse_available(), reason=f"Drive stand-in unavailable: {fuse_unavailable_reason()}")

MB = 1_000_000
MiB = 1 << 20


def _errno_of(fn, *args, **kwargs) -> int:
    with pytest.raises(OSError) as info:
        fn(*args, **kwargs)
    return info.value.errno


def _write_bytes_os(path, data: bytes, chunk: int = MiB) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view[:chunk]):]
    finally:
        os.close(fd)


# -- pieces that need no FUSE --------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("", ("ok", None)),
    ("ok\n", ("ok", None)),
    ("# a comment\n\n  ENOTCONN  \n", ("enotconn", None)),
    ("enospc", ("enospc", None)),
    ("readonly", ("readonly", None)),
    ("fail-after 1048576", ("fail-after", 1048576)),
    ("fail-after 2e6", ("fail-after", 2_000_000)),
    ("fail-after 0", ("fail-after", 0)),
])
def test_parse_fault(text, expected):
    assert drivefs.parse_fault(text) == expected


@pytest.mark.parametrize("text", ["enotconnected", "fail-after", "fail-after x", "fail-after -1", "ok please"])
def test_parse_fault_rejects_nonsense(text):
    with pytest.raises(ValueError):
        drivefs.parse_fault(text)


def test_token_bucket_paces_writes_across_threads():
    bucket = drivefs.TokenBucket(rate=4 * MB, burst=0)
    start = time.monotonic()
    threads = [threading.Thread(target=lambda: [bucket.take(MB // 4) for _ in range(4)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 0.9 < time.monotonic() - start < 3  # 4 MB at 4 MB/s: 1 s


def test_link_handler_answers_enosys_and_symlink_eopnotsupp(tmp_path):
    fs = drivefs.DriveFS(str(tmp_path), rate=0)
    assert _errno_of(fs.link, "/b", "/a") == errno.ENOSYS == 38
    assert _errno_of(fs.symlink, "/b", "/a") == errno.EOPNOTSUPP == 95


# -- through a real mount -------------------------------------------------------------------------------------

@pytest.mark.fuse
@needs_fuse
def test_throttled_write_of_20mb_takes_about_a_second(drive_mount):
    assert drive_mount.rate == 20e6
    data = os.urandom(20 * MB)
    start = time.monotonic()
    _write_bytes_os(drive_mount.mountpoint / "big.bin", data)
    elapsed = time.monotonic() - start
    assert 0.8 < elapsed < 5, f"20 MB at 20e6 B/s took {elapsed:.2f} s"
    assert (drive_mount.backing / "big.bin").read_bytes() == data


@pytest.mark.fuse
@needs_fuse
@pytest.mark.parametrize("drive_mount", [None], indirect=True)
def test_unthrottled_mount_is_much_faster(drive_mount):
    data = os.urandom(64 * MB)
    start = time.monotonic()
    _write_bytes_os(drive_mount.mountpoint / "big.bin", data)
    elapsed = time.monotonic() - start
    assert elapsed < 64 / 40, f"unthrottled: {64 / elapsed:.0f} MB/s"
    assert (drive_mount.mountpoint / "big.bin").read_bytes() == data


@pytest.mark.fuse
@needs_fuse
def test_concurrent_writers_share_the_throttle(drive_mount):
    payloads = {f"f{i}.bin": os.urandom(5 * MB) for i in range(4)}
    errors = []

    def writer(name, data):
        try:
            _write_bytes_os(drive_mount.my_drive / name, data, chunk=256 * 1024)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    start = time.monotonic()
    threads = [threading.Thread(target=writer, args=item) for item in payloads.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    assert not errors
    assert 0.8 < elapsed < 5, f"4 x 5 MB at 20e6 B/s took {elapsed:.2f} s"
    for name, data in payloads.items():
        assert (drive_mount.backing / "MyDrive" / name).read_bytes() == data


@pytest.mark.fuse
@needs_fuse
def test_passthrough_operations(drive_mount):
    root = drive_mount.my_drive
    assert root.is_dir()
    (root / "d").mkdir()
    (root / "d" / "a.txt").write_text("hello")
    assert sorted(os.listdir(root / "d")) == ["a.txt"]
    os.rename(root / "d" / "a.txt", root / "d" / "b.txt")  # rename works on Drive (not atomically there)
    (root / "d" / "c.txt").write_text("other")
    os.replace(root / "d" / "c.txt", root / "d" / "b.txt")
    assert (drive_mount.backing / "MyDrive" / "d" / "b.txt").read_text() == "other"
    os.chmod(root / "d" / "b.txt", 0o600)
    os.utime(root / "d" / "b.txt", ns=(1_000_000_000, 2_000_000_000))
    st = os.stat(root / "d" / "b.txt")
    assert (st.st_mode & 0o777, st.st_mtime_ns) == (0o600, 2_000_000_000)
    with open(root / "d" / "b.txt", "r+b") as fh:
        fh.truncate(2)
        fh.flush()
        os.fsync(fh.fileno())
    assert (root / "d" / "b.txt").read_bytes() == b"ot"
    os.truncate(root / "d" / "b.txt", 0)
    assert os.path.getsize(root / "d" / "b.txt") == 0
    assert shutil.disk_usage(root).total > 0
    os.unlink(root / "d" / "b.txt")
    os.rmdir(root / "d")
    assert os.listdir(root) == []


@pytest.mark.fuse
@needs_fuse
def test_no_symlinks_and_no_hard_links(drive_mount):
    target = drive_mount.mountpoint / "t.txt"
    target.write_text("x")
    assert _errno_of(os.symlink, "t.txt", drive_mount.mountpoint / "s") == errno.EOPNOTSUPP  # 95, as on Drive
    # drivefs answers ENOSYS (38, what Colab shows), but Linux >= 6.15 (and stable backports, 2025) turns a FUSE
    # link()'s ENOSYS into EPERM before it reaches the caller; code must not rely on the exact errno.
    assert _errno_of(os.link, target, drive_mount.mountpoint / "h") in (errno.ENOSYS, errno.EPERM)
    assert sorted(os.listdir(drive_mount.mountpoint)) == ["MyDrive", "t.txt"]


@pytest.mark.fuse
@needs_fuse
def test_fault_enotconn_fails_every_operation(drive_mount):
    mnt = drive_mount.mountpoint
    (mnt / "f.bin").write_bytes(b"data")
    fd = os.open(mnt / "f.bin", os.O_RDWR)
    try:
        drive_mount.set_fault("enotconn")
        for call, args in [(os.stat, (mnt / "f.bin",)), (os.listdir, (mnt,)), (os.open, (mnt / "f.bin", os.O_RDONLY)),
                           (os.open, (mnt / "new", os.O_WRONLY | os.O_CREAT)), (os.mkdir, (mnt / "d",)),
                           (os.unlink, (mnt / "f.bin",)), (os.rename, (mnt / "f.bin", mnt / "g.bin")),
                           (os.write, (fd, b"more")), (os.fsync, (fd,)), (os.statvfs, (mnt,))]:
            code = _errno_of(call, *args)
            assert code == errno.ENOTCONN == 107, f"{call.__name__}{args}: errno {code}"
        with pytest.raises(OSError, match=r"\[Errno 107\] Transport endpoint is not connected"):
            (mnt / "f.bin").read_bytes()
        assert not os.path.ismount(mnt)  # as on Colab after the drop: the mountpoint cannot even be stat()ed
        assert is_mounted(mnt)
    finally:
        drive_mount.set_fault("ok")
        os.close(fd)
    assert (mnt / "f.bin").read_bytes() == b"data"


@pytest.mark.fuse
@needs_fuse
def test_fault_enospc(drive_mount):
    mnt = drive_mount.mountpoint
    (mnt / "f.bin").write_bytes(b"data")
    fd = os.open(mnt / "f.bin", os.O_WRONLY | os.O_APPEND)
    try:
        drive_mount.set_fault("enospc")
        assert _errno_of(os.write, fd, b"more") == errno.ENOSPC
        assert _errno_of(os.open, mnt / "new", os.O_WRONLY | os.O_CREAT) == errno.ENOSPC
        assert _errno_of(os.mkdir, mnt / "d") == errno.ENOSPC
        assert shutil.disk_usage(mnt).free == 0
        assert (mnt / "f.bin").read_bytes() == b"data"  # reading, listing, deleting still work
        os.unlink(mnt / "f.bin")
    finally:
        drive_mount.set_fault("ok")
        os.close(fd)
    assert shutil.disk_usage(mnt).free > 0


@pytest.mark.fuse
@needs_fuse
def test_fault_readonly(drive_mount):
    mnt = drive_mount.mountpoint
    (mnt / "f.bin").write_bytes(b"data")
    (mnt / "d").mkdir()
    drive_mount.set_fault("readonly")
    for call, args in [(os.open, (mnt / "new", os.O_WRONLY | os.O_CREAT)), (os.open, (mnt / "f.bin", os.O_WRONLY)),
                       (os.open, (mnt / "f.bin", os.O_RDWR)), (os.truncate, (mnt / "f.bin", 0)),
                       (os.mkdir, (mnt / "e",)), (os.rmdir, (mnt / "d",)), (os.unlink, (mnt / "f.bin",)),
                       (os.rename, (mnt / "f.bin", mnt / "g.bin")), (os.chmod, (mnt / "f.bin", 0o600)),
                       (os.utime, (mnt / "f.bin",))]:
        code = _errno_of(call, *args)
        assert code == errno.EROFS, f"{call.__name__}{args}: errno {code}"
    assert (mnt / "f.bin").read_bytes() == b"data"
    assert sorted(os.listdir(mnt)) == ["MyDrive", "d", "f.bin"]


@pytest.mark.fuse
@needs_fuse
def test_fail_after_drops_the_mount_mid_write(drive_mount):
    mnt = drive_mount.mountpoint
    data = os.urandom(10 * MiB)
    drive_mount.set_fault("fail-after 3000000")
    with pytest.raises(OSError) as info:
        with open(mnt / "ckpt.bin", "wb") as fh:
            fh.write(data)
    assert info.value.errno == errno.ENOTCONN
    written = (drive_mount.backing / "ckpt.bin").read_bytes()
    assert written == data[:3_000_000]  # exactly the allowance reached "Drive": a truncated file
    assert _errno_of(os.stat, mnt) == errno.ENOTCONN  # and the mount stays dropped...
    assert _errno_of(os.listdir, mnt) == errno.ENOTCONN
    drive_mount.set_fault("ok")  # ...until "remounted"
    assert os.path.getsize(mnt / "ckpt.bin") == 3_000_000


@pytest.mark.fuse
@needs_fuse
def test_fail_after_counts_from_each_new_setting(drive_mount):
    mnt = drive_mount.mountpoint
    drive_mount.set_fault("fail-after 1000")
    _write_bytes_os(mnt / "a", b"x" * 1000)  # exactly the allowance: fine
    drive_mount.set_fault("fail-after 1000")  # same text again: a fresh allowance
    _write_bytes_os(mnt / "b", b"y" * 600)
    fd = os.open(mnt / "c", os.O_WRONLY | os.O_CREAT)
    try:
        assert os.write(fd, b"z" * 600) == 400  # crosses the limit: cut short, and the mount drops
        assert _errno_of(os.write, fd, b"z" * 200) == errno.ENOTCONN
    finally:
        with pytest.raises(OSError):  # close() flushes through the dropped mount
            os.close(fd)
    drive_mount.set_fault("ok")
    assert [(mnt / n).stat().st_size for n in "abc"] == [1000, 600, 400]


@pytest.mark.fuse
@needs_fuse
def test_garbage_in_control_file_makes_operations_fail_with_eio(drive_mount):
    drive_mount.control.write_text("bogus\n")
    assert _errno_of(os.listdir, drive_mount.mountpoint) == errno.EIO
    assert "bogus" in drive_mount.stderr()
    with pytest.raises(ValueError):
        drive_mount.set_fault("bogus")
    drive_mount.set_fault("ok")
    os.listdir(drive_mount.mountpoint)


def _mount_lines(path) -> list[str]:
    with open("/proc/mounts", encoding="utf-8") as fh:
        return [line for line in fh if f" {os.path.realpath(path)} " in line]


@pytest.mark.fuse
@needs_fuse
@pytest.mark.parametrize("situation", ["idle", "file-open", "cwd-inside", "fault-active", "process-killed"])
def test_mounted_drive_cleans_up(tmp_path, situation):
    fd = None
    old_cwd = os.getcwd()
    with mounted_drive(tmp_path, rate=None) as drive:
        mnt = drive.mountpoint
        assert os.path.ismount(mnt) and drive.alive()
        line, = _mount_lines(mnt)
        assert line.startswith("drive ") and " fuse.drive " in line  # as Colab's mount shows up
        if situation == "file-open":  # a busy mount: plain unmount fails, the lazy one is needed
            fd = os.open(mnt / "open.bin", os.O_WRONLY | os.O_CREAT)
        elif situation == "cwd-inside":
            os.chdir(mnt)
        elif situation == "fault-active":
            drive.set_fault("enotconn")
        elif situation == "process-killed":  # leaves a dead mount behind ("Transport endpoint is not connected")
            os.kill(drive.process.pid, signal.SIGKILL)
            drive.process.wait()
            assert _errno_of(os.stat, mnt) == errno.ENOTCONN
    try:
        assert _mount_lines(mnt) == []
        assert not is_mounted(mnt)
        assert drive.process.poll() is not None
    finally:
        os.chdir(old_cwd)
        if fd is not None:  # its flush meets the dead connection: ENOTCONN, as on Colab after a drop
            with pytest.raises(OSError):
                os.close(fd)


@pytest.mark.fuse
@needs_fuse
def test_mount_failure_reports_the_filesystems_stderr(tmp_path):
    with pytest.raises(RuntimeError, match="unrecognized arguments: --no-such-option"):
        with mounted_drive(tmp_path, extra_args=["--no-such-option"]):
            pass  # pragma: no cover
    assert _mount_lines(tmp_path / "drivefs" / "mnt") == []


@pytest.mark.fuse
@needs_fuse
def test_factory_mounts_several_and_remount_sees_the_same_files(drive_mount_factory, tmp_path):
    first = drive_mount_factory(rate=None)
    (first.my_drive / "keep.txt").write_text("survives")
    second = drive_mount_factory(rate=None, backing=first.backing)
    assert second.mountpoint != first.mountpoint
    assert (second.my_drive / "keep.txt").read_text() == "survives"


@pytest.mark.fuse
@needs_fuse
def test_open_latency_delays_each_open_but_not_other_opens(tmp_path):
    with mounted_drive(tmp_path, rate=None, extra_args=["--open-latency", "0.3"]) as drive:
        for i in range(8):
            (drive.my_drive / f"f{i}").write_bytes(b"x")
        start = time.monotonic()
        assert (drive.my_drive / "f0").read_bytes() == b"x"
        one = time.monotonic() - start
        start = time.monotonic()
        threads = [threading.Thread(target=(drive.my_drive / f"f{i}").read_bytes) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        eight = time.monotonic() - start
    assert one >= 0.3 and eight >= 0.3
    assert eight < 8 * 0.3, "opens are served one at a time"   # the mount is multi-threaded, like Drive's


def test_script_help_runs_without_mounting():
    done = subprocess.run([sys.executable, drivefs.__file__, "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--rate" in done.stdout and "--control" in done.stdout
