"""Tests of the Google Drive stand-in itself (tests/standins/drivefs.py and its fixtures), not of colabkit."""
from __future__ import annotations

import contextlib
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


# -- operation-granular faults (fail-op / drop-at / kill-at) and the operation count ------------------------

@pytest.mark.parametrize("text, expected", [
    ("fail-op 1 EIO", ("fail-op", (1, errno.EIO))),
    ("FAIL-OP 17 enotconn", ("fail-op", (17, errno.ENOTCONN))),
    ("drop-at 3 ENOSPC", ("drop-at", (3, errno.ENOSPC))),
    ("drop-at 3 ETIMEDOUT", ("drop-at", (3, errno.ETIMEDOUT))),
    ("fail-op 2 EROFS", ("fail-op", (2, errno.EROFS))),
    ("fail-op 2 EACCES", ("fail-op", (2, errno.EACCES))),  # any name of the errno module
    ("fail-op 2 28", ("fail-op", (2, 28))),
    ("# campaign\nkill-at 5\n", ("kill-at", 5)),
])
def test_parse_fault_operation_modes(text, expected):
    assert drivefs.parse_fault(text) == expected


@pytest.mark.parametrize("text", ["fail-op", "fail-op 1", "fail-op 0 EIO", "fail-op -1 EIO", "fail-op x EIO",
                                  "fail-op 1 ENOSUCH", "fail-op 1 errorcode", "fail-op 1 0", "fail-op 1 EIO x",
                                  "drop-at 1", "drop-at 0 EIO", "kill-at", "kill-at 0", "kill-at 1 EIO",
                                  "fail-after 10 EIO"])
def test_parse_fault_rejects_bad_operation_modes(text):
    with pytest.raises(ValueError):
        drivefs.parse_fault(text)


def _set_control(path, text: str, _state=[0]) -> None:  # noqa: B006 - a strictly increasing mtime, as set_fault
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    _state[0] = max(time.time_ns(), _state[0] + 1_000_000)
    os.utime(tmp, ns=(_state[0], _state[0]))
    os.replace(tmp, path)


def test_operation_count_without_fuse(tmp_path):
    control = tmp_path / "c"
    _set_control(control, "fail-op 3 ENOSPC")
    (tmp_path / "root").mkdir()
    fs = drivefs.DriveFS(str(tmp_path / "root"), rate=0, control=str(control), log_ops=True)
    assert drivefs.read_count(control) == 0
    fs.mkdir("/d", 0o755)
    fs.getattr("/d")
    assert _errno_of(fs.mkdir, "/e", 0o755) == errno.ENOSPC  # op 3
    fs.mkdir("/e", 0o755)  # op 4: once only
    fs.statfs("/")
    assert drivefs.read_count(control) == 5
    assert drivefs.read_ops(control) == [(1, "mkdir", "/d"), (2, "getattr", "/d"), (3, "mkdir", "/e"),
                                         (4, "mkdir", "/e"), (5, "statfs", "/")]
    fh = fs.create("/f", 0o644, os.O_WRONLY | os.O_CREAT)
    fs.release("/f", fh)  # release is not counted
    assert drivefs.read_count(control) == 6
    _set_control(control, "drop-at 2 EROFS")  # a change resets the count and the log
    fs.getattr("/d")
    assert _errno_of(fs.getattr, "/d") == _errno_of(fs.readdir, "/", None) == errno.EROFS
    assert drivefs.read_count(control) == 3 and [k for k, _, _ in drivefs.read_ops(control)] == [1, 2, 3]
    _set_control(control, "kill-at 1")  # no FUSE, so no caller to kill: the operation just fails with EIO
    assert _errno_of(fs.getattr, "/d") == errno.EIO
    fs.getattr("/d")
    _set_control(control, "ok")
    assert drivefs.read_count(control) == 2  # not re-read until the next operation
    fs.getattr("/d")
    assert drivefs.read_count(control) == 1 and drivefs.read_ops(control) == [(1, "getattr", "/d")]


def test_kill_at_logic_without_fuse(tmp_path, monkeypatch):
    """kill-at's bookkeeping, with the FUSE context played by a stub: the K-th operation SIGKILLs its caller and
    fails; later operations of that process fail too (not performed); other processes' pass."""
    control = tmp_path / "c"
    _set_control(control, "kill-at 2")
    fs = drivefs.DriveFS(str(tmp_path), rate=0, control=str(control))
    fs.init_with_config(None, None)  # as libfuse does once mounted: from now on the context is trusted
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        caller = [victim.pid]
        monkeypatch.setattr(drivefs, "_caller_pid", lambda: caller[0])
        fs.mkdir("/a", 0o755)  # op 1
        assert _errno_of(fs.mkdir, "/b", 0o755) == errno.EIO  # op 2: kill, and not performed
        assert victim.wait(timeout=30) == -signal.SIGKILL
        assert _errno_of(fs.mkdir, "/c", 0o755) == errno.EIO  # op 3 from the killed process: refused
        caller[0] = os.getpid()
        fs.mkdir("/d", 0o755)  # op 4 from somebody else: performed
        assert sorted(os.listdir(tmp_path)) == ["a", "c", "c.count", "d"]
        _set_control(control, "kill-at 1")
        assert _errno_of(fs.getattr, "/") == errno.EIO  # its own process: never killed, the op just fails
        assert drivefs.read_count(control) == 1
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()


def test_operation_count_is_thread_safe(tmp_path):
    control = tmp_path / "c"
    _set_control(control, "fail-op 5000 EIO")
    fs = drivefs.DriveFS(str(tmp_path), rate=0, control=str(control), log_ops=True)
    failures = []

    def worker():
        for _ in range(1000):
            try:
                fs.getattr("/")
            except OSError as exc:
                failures.append(exc.errno)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == [errno.EIO]  # exactly one operation, the 5000th, failed
    assert drivefs.read_count(control) == 8000
    assert [k for k, _, _ in drivefs.read_ops(control)] == list(range(1, 8001))


# A deterministic single-threaded workload through the mount, made of steps; each step's outcome is recorded
# (None or the errno name) and, with the count file, which operations it issued.
_STEPS = ("create", "write", "fsync", "close", "read", "listdir", "unlink")


def _workload(drive) -> tuple[list[tuple[str, str | None]], list[int]]:
    path = drive.my_drive / "w.bin"
    outcomes, ends = [], []

    def step(name, fn):
        try:
            result = fn()
            outcomes.append((name, None))
        except OSError as exc:
            result = None
            outcomes.append((name, errno.errorcode.get(exc.errno, str(exc.errno))))
        ends.append(drivefs.read_count(drive.control))  # ops counted up to the end of this step
        return result

    def read_back():
        with open(path, "rb") as fh:
            return fh.read()

    fd = step("create", lambda: os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
    if fd is not None:
        step("write", lambda: os.write(fd, b"x" * 4096))
        step("fsync", lambda: os.fsync(fd))
        step("close", lambda: os.close(fd))  # closes the fd even when its flush fails
    step("read", read_back)
    step("listdir", lambda: os.listdir(drive.my_drive))
    step("unlink", lambda: os.unlink(path))
    return outcomes, ends


def _reset(drive) -> None:
    """Back to "ok" and to the state the workload starts from (set the control file afterwards: this counts
    operations too). Through the mount, so that the kernel's dentry
    cache is the same as before (a file deleted behind its back would cost an extra lookup next time)."""
    drive.set_fault("ok")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(drive.my_drive / "w.bin")
    assert os.listdir(drive.my_drive) == []


def _reference(drive):
    """Op log, per-step op ranges and count of the workload without faults; checks that it is deterministic."""
    runs = []
    for _ in range(3):
        _reset(drive)
        drive.set_fault("ok")  # count from here
        outcomes, ends = _workload(drive)
        assert outcomes == [(name, None) for name in _STEPS]
        runs.append((drivefs.read_ops(drive.control), ends, drivefs.read_count(drive.control)))
    assert runs[0] == runs[1] == runs[2], "the same workload gave different operation sequences"
    ops, ends, count = runs[0]
    assert count == len(ops) == ends[-1] and [k for k, _, _ in ops] == list(range(1, count + 1))
    step_of = {}  # op number -> the step that issued it
    start = 0
    for name, end in zip(_STEPS, ends):
        for k in range(start + 1, end + 1):
            step_of[k] = name
        start = end
    return [(name, path) for _, name, path in ops], step_of


@pytest.fixture
def campaign_drive(drive_mount_factory):
    return drive_mount_factory(rate=None, extra_args=["--log-ops"])


@pytest.mark.fuse
@needs_fuse
def test_count_file_counts_the_operations_of_a_known_workload(campaign_drive):
    drive = campaign_drive
    ops, step_of = _reference(drive)
    kinds = {name for name, _ in ops}
    count = {kind: sum(1 for name, _ in ops if name == kind) for kind in kinds}
    # What the syscalls themselves ask for (the rest are the kernel's lookups / attribute refreshes: getattr)
    assert {k: v for k, v in count.items() if k != "getattr"} == {
        "create": 1, "write": 1, "fsync": 1, "flush": 2, "open": 1, "read": 1, "readdir": 1, "unlink": 1}
    assert kinds == {"getattr", *count} and count["getattr"] >= 5  # at least one lookup per path resolution
    assert [step_of[k] for k, (name, _) in enumerate(ops, 1) if name != "getattr"] == [
        "create", "write", "fsync", "close", "read", "read", "read", "listdir", "unlink"]
    assert all(path in ("/MyDrive", "/MyDrive/w.bin") for _, path in ops)
    assert drivefs.read_count(drive.control) == len(ops)
    drive.set_fault("ok")  # a change of the control file (here: the same text again) resets the count...
    assert drivefs.read_count(drive.control) == len(ops)  # ...when the next operation arrives
    os.statvfs(drive.mountpoint)  # the mount's root needs no lookup: one statfs
    assert drivefs.read_count(drive.control) == 1 and drivefs.read_ops(drive.control) == [(1, "statfs", "/")]
    drive.set_fault("enospc")  # every mode counts
    os.statvfs(drive.mountpoint)
    os.statvfs(drive.mountpoint)
    assert drivefs.read_count(drive.control) == 2


@pytest.mark.fuse
@needs_fuse
def test_count_file_without_log_ops(drive_mount_factory):
    plain, logged = drive_mount_factory(rate=None), drive_mount_factory(rate=None, extra_args=["--log-ops"])
    for drive in (plain, logged):
        drive.set_fault("ok")
        os.statvfs(drive.mountpoint)
        os.listdir(drive.mountpoint)
    assert [name for _, name, _ in drivefs.read_ops(logged.control)] == ["statfs", "getattr", "readdir"]
    assert drivefs.read_count(plain.control) == drivefs.read_count(logged.control) == 3
    assert not os.path.exists(drivefs.ops_path(plain.control))


@pytest.mark.fuse
@needs_fuse
def test_fail_op_fails_exactly_the_kth_operation_for_every_k(campaign_drive):
    drive = campaign_drive
    ops, step_of = _reference(drive)
    surfaced = set()
    for k in range(1, len(ops) + 2):
        _reset(drive)
        drive.set_fault(f"fail-op {k} ETIMEDOUT")  # an errno nothing else here produces
        outcomes, _ = _workload(drive)
        log = [(name, path) for _, name, path in drivefs.read_ops(drive.control)]
        assert log[:k] == ops[:k], f"k={k}: the operations up to the fault differ from the reference"
        failed = [(name, err) for name, err in outcomes if err is not None]
        if k > len(ops):
            assert failed == [], f"k={k} is past the workload, yet: {failed}"
            continue
        timed_out = [name for name, err in failed if err == "ETIMEDOUT"]
        # The k-th operation failed (its step saw it, unless the kernel or Python retried / ignored it) and
        # only it: nothing else got the injected errno, and no step before it failed at all.
        assert timed_out in ([], [step_of[k]]), f"k={k} ({ops[k - 1]}): {outcomes}"
        assert all(outcome == (name, None) for outcome, name in zip(outcomes, _STEPS)
                   if _STEPS.index(name) < _STEPS.index(step_of[k])), f"k={k}: {outcomes}"
        others = [(name, err) for name, err in failed if err != "ETIMEDOUT"]
        assert all(err == "ENOENT" for _, err in others), f"k={k}: {outcomes}"  # no file if create failed
        if ops[k - 1][0] == "read" and not timed_out:  # a failed page read is retried by the kernel
            assert log[k] == ops[k - 1], f"k={k}: the failed read was neither reported nor retried: {log}"
        elif ops[k - 1][0] != "getattr":  # what the syscall itself asked for: its error reaches the caller
            assert timed_out == [step_of[k]], f"k={k} ({ops[k - 1]}): {outcomes}"
        if timed_out:
            surfaced.add(ops[k - 1][0])
        os.listdir(drive.my_drive)  # the fault was once only
    assert surfaced >= {"create", "write", "fsync", "flush", "open", "readdir", "unlink"}
    _reset(drive)


@pytest.mark.fuse
@needs_fuse
def test_fail_op_on_an_open_file(campaign_drive):
    drive = campaign_drive
    fd = os.open(drive.my_drive / "f.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        drive.set_fault("fail-op 2 ENOSPC")
        assert os.write(fd, b"a" * 100) == 100  # op 1
        assert _errno_of(os.write, fd, b"b" * 100) == errno.ENOSPC  # op 2
        assert os.write(fd, b"c" * 100) == 100  # op 3
        assert [name for _, name, _ in drivefs.read_ops(drive.control)] == ["write", "write", "write"]
    finally:
        os.close(fd)
    assert (drive.backing / "MyDrive" / "f.bin").read_bytes() == b"a" * 100 + b"c" * 100  # op 2 not performed


@pytest.mark.fuse
@needs_fuse
def test_drop_at_fails_the_kth_and_every_later_operation(campaign_drive):
    drive = campaign_drive
    ops, step_of = _reference(drive)
    for k in range(1, len(ops) + 2):
        _reset(drive)
        drive.set_fault(f"drop-at {k} ENOTCONN")
        outcomes, ends = _workload(drive)
        log = drivefs.read_ops(drive.control)
        assert [(name, path) for _, name, path in log[:k]] == ops[:k], f"k={k}"
        if k > len(ops):
            assert outcomes == [(name, None) for name in _STEPS]
            continue
        first = _STEPS.index(step_of[k])
        for name, err in outcomes:
            if _STEPS.index(name) < first:
                assert err is None, f"k={k}: {outcomes}"
            else:  # the step with op k and every one after it
                assert err == "ENOTCONN", f"k={k}: {outcomes}"
        assert drivefs.read_count(drive.control) == ends[-1]
        assert _errno_of(os.stat, drive.mountpoint) == errno.ENOTCONN  # still dropped...
        assert drivefs.read_count(drive.control) == ends[-1] + 1  # ...and still counting (getattr /)
        assert _errno_of(os.listdir, drive.my_drive) == errno.ENOTCONN
    drive.set_fault("ok")  # ...until the control file changes
    assert os.listdir(drive.my_drive) == []


_KILL_CHILD = r"""
import os, sys, threading

def loop():
    print(os.getpid(), threading.get_native_id(), flush=True)
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for i in range(100):
        os.write(fd, b"%08d\n" % i)
    os.close(fd)
    print("survived", flush=True)

if sys.argv[2] == "thread":  # the kernel names the calling thread, not the process: both must die
    t = threading.Thread(target=loop)
    t.start()
    t.join()
else:
    loop()
"""


@pytest.mark.fuse
@needs_fuse
@pytest.mark.parametrize("where", ["main-thread", "thread"])
def test_kill_at_kills_the_caller_at_the_kth_operation(campaign_drive, where):
    drive = campaign_drive
    target = drive.my_drive / "loop.txt"

    def child():
        return subprocess.run([sys.executable, "-c", _KILL_CHILD, str(target), where], capture_output=True,
                              text=True, timeout=60, cwd=os.path.dirname(drive.mountpoint))

    drive.set_fault("ok")
    done = child()
    assert done.returncode == 0 and "survived" in done.stdout, done.stderr
    ops = drivefs.read_ops(drive.control)
    writes = [k for k, name, _ in ops if name == "write"]
    assert len(writes) == 100
    os.unlink(target)
    k = writes[40]  # the 41st write: lines 0..39 reach "Drive", nothing after
    drive.set_fault(f"kill-at {k}")
    done = child()
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr)
    pid, tid = map(int, done.stdout.split()[:2])
    assert "survived" not in done.stdout
    assert (where == "thread") == (pid != tid)
    assert f"kill-at {k} (write /MyDrive/loop.txt): SIGKILL to process {pid} (thread {tid})" in drive.stderr()
    assert (drive.backing / "MyDrive" / "loop.txt").read_bytes() == b"".join(b"%08d\n" % i for i in range(40))
    log = drivefs.read_ops(drive.control)
    assert log[:k] == ops[:k]
    assert {name for _, name, _ in log[k:]} <= {"flush"}  # only the dying process closing its file (refused)
    # The mount keeps working for everybody else, still under the same control content.
    (drive.my_drive / "after.txt").write_text("fine")
    assert (drive.my_drive / "after.txt").read_text() == "fine"
    assert sorted(os.listdir(drive.my_drive)) == ["after.txt", "loop.txt"]
    assert drive.alive()
