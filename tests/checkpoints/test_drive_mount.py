"""Checkpoints on a FUSE mount that behaves like Colab's Drive mount: 20 MB/s, no links, drops (ENOTCONN),
fills up (ENOSPC), goes read-only, and can die in the middle of a write."""
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import colabkit
import colabkit.checkpoints.uploader as uploader
from colabkit.checkpoints.folder import CheckpointFolder
from tests.waiting import wait_for

HERE = Path(__file__).parent
pytestmark = [pytest.mark.fuse, pytest.mark.slow]


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(uploader, "BACKOFF_START", 0.1)
    monkeypatch.setattr(uploader, "BACKOFF_MAX", 0.5)


def state(step, mb=4):
    return {"w": np.full(mb * 131072, float(step)), "step": step}


def test_save_returns_before_the_slow_upload_finishes(tmp_path, ck_env, drive_mount):
    ckpt = colabkit.Checkpoints(str(drive_mount.my_drive / "run"), local_dir=tmp_path / "local")
    started = time.monotonic()
    ckpt.save(1, state(1, mb=40))            # 40 MB at 20 MB/s: about 2 s of upload
    returned = time.monotonic() - started
    assert ckpt.status.last_uploaded is None, "save() must not wait for the upload"
    assert ckpt.wait(60)
    upload = ckpt.status.last_upload_s
    assert upload > 1.5 and returned < upload / 4, (returned, upload)
    ckpt.close()
    [info] = CheckpointFolder(drive_mount.backing / "MyDrive" / "run").committed()
    CheckpointFolder(info.path.parent).verify(info)


@pytest.mark.parametrize("fault", ["enotconn", "enospc", "readonly"])
def test_mount_fault_mid_run_keeps_local_copies_and_recovers(tmp_path, ck_env, drive_mount, fault):
    dest = drive_mount.my_drive / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = colabkit.Checkpoints(str(dest), local_dir=tmp_path / "local", keep=2)
        ckpt.save(1, state(1), wait=True)
        drive_mount.set_fault(fault)
        for step in (2, 3, 4):
            ckpt.save(step, state(step))      # training goes on
            time.sleep(0.2)
        assert not ckpt.wait(1.0)
        # set by the uploader thread: "uploading" during each attempt (a FUSE round trip), "retrying" in between
        status = ckpt.status
        assert wait_for(lambda: status.state == "retrying" and status.last_local.step == 4), status
        assert [c.step for c in CheckpointFolder(tmp_path / "local").committed()][-1] == 4
        drive_mount.set_fault("ok")
        assert ckpt.wait(30), ckpt.status
        ckpt.close()
    messages = [str(w.message) for w in caught if "could not upload" in str(w.message)]
    assert len(messages) == 1 and "Errno" in messages[0], messages
    committed = CheckpointFolder(drive_mount.backing / "MyDrive" / "run").committed()
    assert committed[-1].step == 4 and 1 in [c.step for c in committed]


def test_mount_dying_mid_write_leaves_nothing_that_restore_trusts(tmp_path, ck_env, drive_mount):
    dest = drive_mount.my_drive / "run"
    ckpt = colabkit.Checkpoints(str(dest), local_dir=tmp_path / "local")
    ckpt.save(1, state(1), wait=True)
    drive_mount.set_fault("fail-after 2000000")   # the mount drops 2 MB into the next upload
    ckpt.save(2, state(2))
    assert not ckpt.wait(2.0)
    ckpt.close(timeout=1)
    drive_mount.set_fault("ok")
    backing = drive_mount.backing / "MyDrive" / "run"
    partial = [p for p in backing.iterdir() if p.name.startswith("ckpt-000000000002")]
    assert partial and not (partial[0] / "MANIFEST.json").exists()
    # a fresh VM: no local copies; only what reached Drive
    fresh = colabkit.Checkpoints(str(dest), local_dir=tmp_path / "fresh-local")
    restored = fresh.restore()
    assert restored.step == 1 and np.all(restored.state["w"] == 1.0)
    fresh.close()


def test_keras_training_continues_while_the_mount_is_down(tmp_path, ck_env, drive_mount):
    keras = pytest.importorskip("keras")
    import importlib.util
    spec = importlib.util.spec_from_file_location("ck_workers", HERE / "workers.py")
    workers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workers)
    model, counter = workers.build_model(keras)
    x, y = workers.data(np)
    flip = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: drive_mount.set_fault("enotconn" if epoch == 1 else "ok"))
    auto = colabkit.keras.AutoResume(str(drive_mount.my_drive / "k"), save_freq=4, deadline=None,
                                     local_dir=tmp_path / "local")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[flip, auto])
    assert int(counter.count.numpy()) == 36
    newest = CheckpointFolder(drive_mount.backing / "MyDrive" / "k").committed()[-1]
    assert (newest.epoch, newest.batch) == (3, 0)


def test_kill_during_uploads_to_the_slow_mount(tmp_path, ck_env, drive_mount):
    """SIGKILL a writer while its uploads crawl over the 20 MB/s mount; each restart resumes from what
    was committed on the mount or locally, never from a partial checkpoint."""
    import random
    rng = random.Random(5)
    args = [sys.executable, str(HERE / "workers.py"), "numpy", drive_mount.my_drive / "kill", 300, 24_000_000, 10]
    args = [str(a) for a in args]
    floor = 0
    for _ in range(4):
        p = subprocess.Popen(args, env=ck_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(1.0, 3.0))
        p.send_signal(signal.SIGKILL)
        out, err = p.communicate()
        assert "INCONSISTENT" not in out and "Traceback" not in err, (out, err)
        resumed = [int(line.split()[1]) for line in out.splitlines() if line.startswith("RESUMED")]
        uploaded = [int(line.split()[1]) for line in out.splitlines() if line.startswith("UPLOADED")]
        if resumed:
            assert resumed[0] >= floor
        if uploaded:
            floor = max(floor, uploaded[-1])
    # the VM is gone: only the mount's committed checkpoints count
    for c in CheckpointFolder(drive_mount.backing / "MyDrive" / "kill").committed():
        CheckpointFolder(c.path.parent).verify(c)
