"""One writing process per checkpoint folder on this machine: a second one is refused, a dead one frees it."""
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import colabkit
from colabkit.checkpoints import CheckpointError, FolderInUse
from colabkit.checkpoints.folder import CheckpointFolder

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock")

HOLDER = """
import sys, time, numpy as np, colabkit
ckpt = colabkit.Checkpoints(sys.argv[1], local_dir=sys.argv[3] if len(sys.argv) > 3 else None)
if sys.argv[2] == "save":
    ckpt.save(1, {"w": np.zeros(3)}, wait=True)
else:
    ckpt.claim()
print("READY", flush=True)
time.sleep(120)
"""


@pytest.fixture
def other_writer(ck_env, tmp_path):
    """Start another process that saves to a folder and keeps running; returns start(location) -> Popen."""
    started = []

    def start(location, how="save", *local_dir):
        p = subprocess.Popen([sys.executable, "-c", HOLDER, location, how, *local_dir], env={**os.environ, **ck_env},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(p)
        assert p.stdout.readline().strip() == "READY", p.stderr.read()
        return p
    yield start
    for p in started:
        p.kill()
        p.communicate()


def test_a_second_process_is_refused_until_the_first_dies(other_writer, tmp_path, ck_env):
    holder = other_writer("drive:runs/shared")
    ckpt = colabkit.Checkpoints("drive:runs/shared")
    assert ckpt.restore().step == 1, "reading is allowed"
    with pytest.raises(FolderInUse) as info:
        ckpt.save(2, {"w": np.ones(3)})
    message = str(info.value)
    assert f"process {holder.pid} is already writing checkpoints to drive:runs/shared on this machine" in message
    assert "COLABKIT_JOB" in message and isinstance(info.value, CheckpointError)
    holder.send_signal(signal.SIGKILL)     # a crash leaves no stale claim
    holder.wait()
    assert ckpt.save(2, {"w": np.ones(3)}, wait=True)
    ckpt.close()
    assert [c.step for c in CheckpointFolder(tmp_path / "drive" / "runs" / "shared").committed()] == [1, 2]


def test_objects_in_one_process_share_the_claim_and_close_frees_it(other_writer, ck_env):
    a, b = colabkit.Checkpoints("drive:runs/mine"), colabkit.Checkpoints("drive:runs/mine")  # a cell run twice
    assert a.save(1, {"w": np.zeros(3)}, wait=True) and b.save(2, {"w": np.ones(3)}, wait=True)
    a.close()
    with pytest.raises(FolderInUse):
        _claim_in_another_process("drive:runs/mine", ck_env)
    b.close()
    _claim_in_another_process("drive:runs/mine", ck_env)   # free once every object let go
    other_writer("drive:runs/other")                         # other folders are independent
    with colabkit.Checkpoints("drive:runs/mine2") as third:
        third.claim()


def _claim_in_another_process(location, env):
    code = "import sys, colabkit; colabkit.Checkpoints(sys.argv[1]).claim()"
    done = subprocess.run([sys.executable, "-c", code, location], env={**os.environ, **env}, capture_output=True,
                          text=True)
    if "FolderInUse" in done.stderr:
        raise FolderInUse(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr


def test_autoresume_refuses_a_folder_another_run_writes(other_writer, ck_env, tmp_path):
    keras = pytest.importorskip("keras")
    from tests.checkpoints import workers
    holder = other_writer("drive:runs/sweep", how="claim")
    model, _ = workers.build_model(keras)
    x, y = workers.data(np)
    auto = colabkit.keras.AutoResume("drive:runs/sweep", deadline=None)
    with pytest.raises(FolderInUse, match=f"process {holder.pid}"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[auto])
    holder.kill()
    holder.wait()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[auto])
    assert auto.restored is None and CheckpointFolder(tmp_path / "drive" / "runs" / "sweep").committed()
    _claim_in_another_process("drive:runs/sweep", ck_env)   # training is over and uploaded: the folder is free


def test_a_folder_written_in_place_stays_claimed_when_its_lock_file_is_deleted(other_writer, tmp_path, ck_env):
    run = tmp_path / "run"
    holder = other_writer(str(run), "save", str(run))          # local_dir == directory: written in place
    from colabkit.checkpoints.writer import lock_path
    lock_path(run).unlink()                                     # someone tidies up the "stray" lock file
    ckpt = colabkit.Checkpoints(str(run), local_dir=run, keep=1)
    with pytest.raises(FolderInUse, match=f"process {holder.pid}"):
        ckpt.save(5, {"w": np.ones(3)})
    assert [c.step for c in CheckpointFolder(run).committed()] == [1], "the first writer's checkpoint stays"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert ckpt.save(5, {"w": np.ones(3)}, wait=True)           # its writer is gone: the folder is free
    ckpt.close()
    assert [c.step for c in CheckpointFolder(run).committed()] == [5]


def test_a_symlink_planted_as_the_lock_file_is_refused_and_its_target_is_untouched(tmp_path, ck_env):
    from colabkit.checkpoints.writer import lock_path
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    staging = tmp_path / "shared-tmp" / "staging"
    staging.parent.mkdir()
    lock_path(staging).symlink_to(victim)
    ckpt = colabkit.Checkpoints(str(tmp_path / "run"), local_dir=staging)
    with pytest.raises(CheckpointError, match=r"symbolic link.*victim\.txt") as info:
        ckpt.save(1, {"w": np.ones(3)})
    assert str(lock_path(staging)) in str(info.value)
    assert not isinstance(info.value, FolderInUse)
    assert victim.read_text() == "precious"
    assert not (tmp_path / "run").exists()
