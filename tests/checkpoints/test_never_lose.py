"""A committed checkpoint is never lost and a resume is never silently wrong: one test per data-loss path
found by trying the faults a user meets (an unreadable manifest, a folder that cannot be listed once, clocks
that disagree, two machines on one folder, a close() before the upload ended, a failed save)."""
import json
import os
import socket
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

import colabkit
import colabkit.checkpoints.uploader as uploader
from colabkit.checkpoints import FolderInUse
from colabkit.checkpoints.folder import LEASE_NAME, CheckpointFolder
from colabkit.checkpoints.manifest import MANIFEST_NAME
from tests.waiting import wait_for


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(uploader, "BACKOFF_START", 0.1)
    monkeypatch.setattr(uploader, "BACKOFF_MAX", 0.5)


def steps(folder):
    return sorted(c.step for c in CheckpointFolder(folder).committed())


def commit(dest, local, steps_, **kw):
    with colabkit.Checkpoints(str(dest), local_dir=local, **kw) as ckpt:
        restored = ckpt.restore()
        for step in steps_:
            assert restored is None or step > restored.step
            ckpt.save(step, {"w": np.full(8, float(step))}, wait=True)


def in_subprocess(code, env, *args, check=True):
    done = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, capture_output=True, text=True)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def test_an_unreadable_manifest_while_pruning_deletes_nothing(tmp_path, ck_env):
    dest = tmp_path / "dest"
    commit(dest, tmp_path / "vm1", [1, 2, 3], keep=3)
    manifest = CheckpointFolder(dest).committed()[-1].path / MANIFEST_NAME
    good = manifest.read_bytes()
    with colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm1", keep=3) as ckpt:
        assert ckpt.restore().step == 3
        manifest.unlink()
        manifest.symlink_to(manifest.name)  # reading it now fails with an OSError (ELOOP), as EIO would
        ckpt.save(4, {"w": np.full(8, 4.0)}, wait=True)
    manifest.unlink()
    manifest.write_bytes(good)
    assert steps(dest) == [1, 2, 3, 4], "step 3 could not be read, so it is not known to be a leftover"
    commit(dest, tmp_path / "vm1", [5], keep=3)
    assert steps(dest) == [3, 4, 5], "once everything reads again, retention catches up"


def test_a_restore_that_cannot_read_the_destination_raises_instead_of_starting_over(tmp_path, ck_env):
    dest = tmp_path / "dest"
    commit(dest, tmp_path / "vm1", [100, 200, 300])
    dest.rename(tmp_path / "away")
    ckpt = colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm2", read_timeout=1)
    dest.write_text("not a folder")        # listing fails with ENOTDIR (an OSError, like ENOTCONN)
    with pytest.raises(colabkit.CheckpointError, match=r"cannot read the list of checkpoints from .*dest.*re-run"):
        ckpt.restore()
    ckpt.close()
    dest.unlink()
    (tmp_path / "away").rename(dest)
    assert steps(dest) == [100, 200, 300]


def test_a_folder_that_is_missing_is_empty_not_an_error(tmp_path, ck_env):
    with colabkit.Checkpoints(str(tmp_path / "never-made"), local_dir=tmp_path / "vm", read_timeout=1) as ckpt:
        assert ckpt.restore() is None


@pytest.mark.fuse
@pytest.mark.parametrize("drive_mount", [None], indirect=True)
def test_a_fresh_vm_retries_a_listing_that_fails_once_and_resumes(tmp_path, ck_env, drive_mount):
    dest = drive_mount.my_drive / "run"
    commit(dest, tmp_path / "vm1", [100, 200, 300])
    drive_mount.set_fault("enotconn")
    heal = threading.Timer(1.0, drive_mount.set_fault, ["ok"])   # the mount comes back while restore retries
    heal.start()
    try:
        with colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm2", read_timeout=60) as ckpt:
            restored = ckpt.restore()
            assert restored is not None and restored.step == 300 and restored.state["w"][0] == 300.0
            ckpt.save(301, {"w": np.full(8, 301.0)}, wait=True)
    finally:
        heal.cancel()
    # keep=3, plus the one before the newest while the mount may still be uploading it
    assert steps(drive_mount.backing / "MyDrive" / "run") == [100, 200, 300, 301]


@pytest.mark.fuse
@pytest.mark.parametrize("drive_mount", [None], indirect=True)
def test_a_mount_that_stays_down_makes_restore_raise_and_loses_nothing(tmp_path, ck_env, drive_mount):
    dest = drive_mount.my_drive / "run"
    commit(dest, tmp_path / "vm1", [100, 200, 300])
    drive_mount.set_fault("enotconn")
    with colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm2", read_timeout=1.5) as ckpt:
        with pytest.raises(colabkit.CheckpointError, match="Transport endpoint is not connected"):
            ckpt.restore()
    drive_mount.set_fault("ok")
    assert steps(drive_mount.backing / "MyDrive" / "run") == [100, 200, 300]


SKEWED = """
import sys, time, numpy as np, colabkit
real = time.time
time.time = lambda: real() + float(sys.argv[3])     # this VM's clock is off
with colabkit.Checkpoints(sys.argv[1], local_dir=sys.argv[2], keep=3) as ckpt:
    r = ckpt.restore()
    for step in map(int, sys.argv[4:]):
        ckpt.save(step, {"w": np.full(8, float(step))}, wait=True)
"""


def test_retention_ranks_by_step_whatever_the_machines_clocks_say(tmp_path, ck_env):
    dest = tmp_path / "dest"
    in_subprocess(SKEWED, ck_env, dest, tmp_path / "vm1", 3600, 100, 200, 300)   # an hour ahead
    in_subprocess(SKEWED, ck_env, dest, tmp_path / "vm2", 0, 301, 302)
    assert steps(dest) == [300, 301, 302]
    in_subprocess(SKEWED, ck_env, dest, tmp_path / "vm3", -7200, 303)             # two hours behind
    assert steps(dest) == [301, 302, 303]


HOLDER = """
import sys, time, numpy as np, colabkit
ckpt = colabkit.Checkpoints(sys.argv[1], local_dir=sys.argv[2])
ckpt.restore()
ckpt.save(int(sys.argv[3]), {"w": np.zeros(3)}, wait=True)
print("READY", flush=True)
time.sleep(120)
"""


@pytest.fixture
def holder(ck_env):
    started = []

    def start(dest, local, step=1):
        p = subprocess.Popen([sys.executable, "-c", HOLDER, str(dest), str(local), str(step)], env=ck_env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(p)
        assert p.stdout.readline().strip() == "READY", p.stderr.read()
        return p
    yield start
    for p in started:
        p.kill()
        p.communicate()


def test_a_writer_with_another_staging_folder_is_refused_by_the_destinations_lease(tmp_path, ck_env, holder):
    dest = tmp_path / "dest"
    p = holder(dest, tmp_path / "vm1")                       # another VM: its own local staging
    ckpt = colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm2")
    assert ckpt.restore().step == 1, "reading is allowed"
    with pytest.raises(FolderInUse, match=rf"process {p.pid} on host {socket.gethostname()} is already writing "
                                          rf"checkpoints to .*dest.*renewed \d+s ago"):
        ckpt.save(2, {"w": np.ones(3)})
    p.kill()
    p.wait()                                                  # gone: its lease is taken over at once
    assert ckpt.save(2, {"w": np.ones(3)}, wait=True)
    ckpt.close()
    assert steps(dest) == [1, 2]
    assert not (dest / LEASE_NAME).exists(), "close() removes the lease"


def _lease_of_another_machine(dest, renewed_ago):
    dest.mkdir(parents=True, exist_ok=True)
    now = time.time()
    (dest / LEASE_NAME).write_text(json.dumps({
        "token": "0" * 16, "host": "colab-vm-1", "machine": "colab-vm-1/boot", "pid": 4242,
        "started": now - 3600, "renewed": now - renewed_ago, "beat": 7, "location": str(dest)}))


def test_a_lease_write_that_failed_halfway_is_this_writers_own_and_does_not_hold_up_the_upload(
        tmp_path, ck_env, monkeypatch, caplog):
    """The first write of the lease record fails after Drive's mount truncated the file (an I/O error mid-write):
    the empty record it leaves is this writer's own, taken back at the retry, not a stranger's record watched
    for two renewal periods (60 s) and then taken over with a warning about another writer."""
    import errno

    import colabkit.checkpoints.folder as folder_module
    real_write, failed = folder_module.write_bytes, []

    def write_failing_once(path, data):
        if path.name == LEASE_NAME and not failed:
            failed.append(path)
            path.write_bytes(b"")   # opened with O_TRUNC, then the data write failed
            raise OSError(errno.EIO, "Input/output error", str(path))
        real_write(path, data)

    monkeypatch.setattr(folder_module, "write_bytes", write_failing_once)
    dest = tmp_path / "dest"
    with warnings.catch_warnings(record=True) as caught, caplog.at_level("WARNING", logger="colabkit"):
        warnings.simplefilter("always")
        with colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm") as ckpt:
            assert ckpt.save(1, {"w": np.ones(3)}, wait=45), "committed at the retry, not after a 60 s watch"
    assert failed, "the lease write was attempted"
    said = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "taking over" in m or "watching it" in m], said
    assert steps(dest) == [1]


def test_a_live_lease_of_another_machine_refuses_and_a_stale_one_is_taken_over(tmp_path, ck_env):
    dest = tmp_path / "dest"
    _lease_of_another_machine(dest, renewed_ago=20)
    with colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm") as ckpt:
        with pytest.raises(FolderInUse, match="process 4242 on host colab-vm-1"):
            ckpt.save(1, {"w": np.ones(3)})
    _lease_of_another_machine(dest, renewed_ago=600)         # a VM reclaimed ten minutes ago
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm") as ckpt:
            assert ckpt.save(1, {"w": np.ones(3)}, wait=True)
    assert any("taking over" in str(w.message) and "colab-vm-1" in str(w.message) for w in caught)
    assert steps(dest) == [1]


def test_a_lease_of_a_machine_the_cluster_saw_die_is_taken_over_once_it_goes_unrenewed(tmp_path, ck_env,
                                                                                        monkeypatch):
    from colabkit.checkpoints import lease
    monkeypatch.setattr(lease, "RENEW_S", 1.0)   # taken over after 2 s of silence instead of TIMEOUT_S
    dest = tmp_path / "dest"
    _lease_of_another_machine(dest, renewed_ago=0)
    monkeypatch.setenv("COLABKIT_DEAD_MACHINES", "other-box/boot")   # another dead machine: no effect
    with colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm") as ckpt:
        with pytest.raises(FolderInUse, match="process 4242 on host colab-vm-1"):
            ckpt.save(1, {"w": np.ones(3)})
    # what `colabkit run --cluster` sets for the next attempt of a job whose machine died
    monkeypatch.setenv("COLABKIT_DEAD_MACHINES", f"other-box/boot,colab-vm-1/boot,{lease.machine_id()}")

    # dead to Ray, but its writer still renews (a network cut): a live writer, refused
    stop = threading.Event()

    def renew():
        beat = 7
        while not stop.wait(0.3):
            beat += 1
            record = json.loads((dest / LEASE_NAME).read_text())
            (dest / "lease.tmp").write_text(json.dumps(dict(record, renewed=time.time(), beat=beat)))
            os.replace(dest / "lease.tmp", dest / LEASE_NAME)   # whole: a torn record would read as none
    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    try:
        with colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm") as ckpt:
            with pytest.raises(FolderInUse, match="still renews the lease"):
                ckpt.save(1, {"w": np.ones(3)})
    finally:
        stop.set()
        renewer.join()
    assert steps(dest) == []

    # a live process of this machine is never taken over because the cluster named this machine
    (dest / LEASE_NAME).write_text(json.dumps({
        "token": "1" * 16, "host": socket.gethostname(), "machine": lease.machine_id(), "pid": os.getppid(),
        "started": time.time(), "renewed": time.time() - 30, "beat": 1, "location": str(dest)}))
    with colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm") as ckpt:
        with pytest.raises(FolderInUse, match=f"process {os.getppid()}"):
            ckpt.save(1, {"w": np.ones(3)})

    # silent since it was last renewed: taken over after two renewal periods, long before TIMEOUT_S
    _lease_of_another_machine(dest, renewed_ago=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm") as ckpt:
            assert ckpt.save(1, {"w": np.ones(3)}, wait=True)
    assert any("left the cluster" in str(w.message) and "colab-vm-1" in str(w.message) for w in caught)
    assert steps(dest) == [1]


def test_a_writer_whose_lease_was_taken_over_stops_uploading_and_keeps_its_checkpoints(tmp_path, ck_env,
                                                                                        monkeypatch):
    from colabkit.checkpoints import lease
    monkeypatch.setattr(lease, "RENEW_S", 0.1)
    dest = tmp_path / "dest"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm", keep=1)
        assert ckpt.save(1, {"w": np.ones(3)}, wait=True)
        _lease_of_another_machine(dest, renewed_ago=0)       # another machine took the folder over
        assert wait_for(lambda: any("took over" in str(w.message) for w in caught), timeout=10)
        ckpt.save(2, {"w": np.full(3, 2.0)})
        assert not ckpt.wait(1.0)
        assert ckpt.status.last_local.step == 2 and "took over" in ckpt.status.last_error
        ckpt.close(timeout=1)
    assert steps(dest) == [1], "nothing is uploaded or pruned under another writer's lease"
    assert json.loads((dest / LEASE_NAME).read_text())["host"] == "colab-vm-1", "their lease is left alone"


@pytest.mark.fuse
def test_close_keeps_the_claim_while_an_upload_runs_past_its_timeout(tmp_path, ck_env, drive_mount_factory):
    mount = drive_mount_factory(rate=4e6)
    dest = mount.my_drive / "run"
    ckpt = colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm")
    ckpt.save(1, {"w": np.zeros(2 << 20)})                  # 16 MB at 4 MB/s
    ckpt.close(timeout=0.2)
    claim = "import sys, colabkit; colabkit.Checkpoints(sys.argv[1], local_dir=sys.argv[2]).claim()"
    busy = in_subprocess(claim, ck_env, dest, tmp_path / "vm", check=False)
    assert busy.returncode != 0 and "FolderInUse" in busy.stderr, "the upload still runs: the folder is claimed"
    assert wait_for(lambda: steps(mount.backing / "MyDrive" / "run") == [1], timeout=60)
    assert wait_for(lambda: in_subprocess(claim, ck_env, dest, tmp_path / "vm", check=False).returncode == 0,
                    timeout=20), "the claim is released once the upload ended"


def test_a_save_that_fails_on_the_training_thread_leaves_nothing_behind(tmp_path, ck_env):
    tf = pytest.importorskip("tensorflow")

    class Unsaveable(tf.Module):
        def __init__(self):
            super().__init__()
            self.v = tf.Variable(1.0)

        def _serialize_to_tensors(self):
            raise OSError("No space left on device")

    local = tmp_path / "vm"
    with colabkit.Checkpoints(str(tmp_path / "dest"), local_dir=local) as ckpt:
        ckpt.save(1, {"w": np.zeros(3)}, wait=True)
        with pytest.raises(OSError, match="No space"):
            ckpt.save(2, {"m": Unsaveable()})
        assert ckpt.save(3, {"w": np.ones(3)}, wait=True)
    assert sorted(p.name.split("-")[1] for p in local.iterdir() if p.name.startswith("ckpt-")) == \
        ["000000000001", "000000000003"]
    assert steps(tmp_path / "dest") == [1, 3]


@pytest.mark.fuse
@pytest.mark.parametrize("drive_mount", [None], indirect=True)
def test_on_a_drive_mount_the_previous_checkpoint_stays_while_the_newest_may_still_be_uploading(
        tmp_path, ck_env, drive_mount):
    commit(drive_mount.my_drive / "run", tmp_path / "vm", [1, 2, 3, 4], keep=1)
    assert steps(drive_mount.backing / "MyDrive" / "run") == [2, 3, 4], \
        "with keep=1, the two checkpoints superseded in the last 30 minutes stay too"
    commit(tmp_path / "plain", tmp_path / "vm2", [1, 2, 3], keep=1)
    assert steps(tmp_path / "plain") == [3], "a local folder has nothing in flight once written"


def test_a_first_save_that_cannot_read_the_folder_uploads_nothing_over_an_earlier_runs_newer_steps(
        tmp_path, ck_env):
    dest = tmp_path / "dest"
    commit(dest, tmp_path / "vm1", [100, 200, 300])
    dest.rename(tmp_path / "away")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm2")
        dest.write_text("not a folder")                   # the mount is down when the new run starts
        assert ckpt.save(1, {"w": np.ones(8)}), "training goes on while the destination is down"
        dest.unlink()
        (tmp_path / "away").rename(dest)                  # it comes back, with the earlier run in it
        assert not ckpt.wait(10)
        assert "holds step 300 of an earlier run" in ckpt.status.last_error
        ckpt.close(timeout=1)
    assert any("holds step 300" in str(w.message) for w in caught)
    assert steps(dest) == [100, 200, 300]
    assert [c.step for c in CheckpointFolder(tmp_path / "vm2").committed()] == [1], "kept on local disk"


def test_a_commit_whose_folder_cannot_be_listed_writes_no_manifest(tmp_path, monkeypatch):
    """A directory read that fails (EIO on a mount) while committing: no manifest naming fewer files than were
    written (which would pass verification and restore as damaged), but an error, and the folder stays
    uncommitted."""
    import errno
    from colabkit.checkpoints import folder as folder_module
    ckpt_dir = tmp_path / "ckpt-000000000004-abcdef"
    ckpt_dir.mkdir()
    (ckpt_dir / "state.json").write_text("{}")
    real = os.scandir

    def scandir(path="."):
        if os.fspath(path) == os.fspath(ckpt_dir):
            raise OSError(errno.EIO, "Input/output error", os.fspath(path))
        return real(path)
    monkeypatch.setattr(folder_module.os, "scandir", scandir)
    with pytest.raises(OSError):
        CheckpointFolder(tmp_path).commit(ckpt_dir, step=4, written={"state.json": ("0" * 64, 2)})
    assert not (ckpt_dir / MANIFEST_NAME).exists()
