"""SIGKILL at random moments (during training, saves and uploads); every restart resumes from a committed
checkpoint, never a partial one."""
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from pathlib import Path

from colabkit.checkpoints.folder import CheckpointFolder

HERE = Path(__file__).parent

pytestmark = [pytest.mark.slow, pytest.mark.subprocess_kill]


def _start(args, env):
    return subprocess.Popen([sys.executable, str(HERE / "workers.py"), *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_cycle(args, env, rng, kills, low, high):
    """Start, kill after a random delay, repeat; returns the (resumed, last uploaded) history."""
    history = []
    for _ in range(kills):
        proc = _start(args, env)
        time.sleep(rng.uniform(low, high))
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate()
        assert "INCONSISTENT" not in out and "Traceback" not in err, (out, err)
        resumed = [int(line.split()[1]) for line in out.splitlines() if line.startswith("RESUMED")]
        uploaded = [int(line.split()[1]) for line in out.splitlines() if line.startswith("UPLOADED")]
        history.append((resumed[0] if resumed else None, uploaded[-1] if uploaded else None))
    return history


def test_numpy_state_survives_20_random_kills(tmp_path, ck_env):
    rng = random.Random(int(os.environ.get("COLABKIT_TEST_SEED", "1234")))
    dest = tmp_path / "dest"
    # 16 MB of state, a save every 5 steps: kills land in snapshots, local writes and uploads alike
    args = ["numpy", dest, 400, 16_000_000, 5]
    history = _kill_cycle(args, ck_env, rng, kills=20, low=0.3, high=1.6)
    floor = 0
    for resumed, uploaded in history:
        if resumed is not None:
            assert resumed >= floor, f"resumed at {resumed}, but step {floor} had been committed: {history}"
        if uploaded is not None:
            floor = max(floor, uploaded)
    assert any(r for r, _ in history[1:]), f"no restart ever resumed: {history}"
    proc = _start(args, ck_env)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "DONE 400" in out


def test_keras_training_survives_random_kills_and_matches_uninterrupted_run(tmp_path, ck_env):
    """Kill a Keras run 4 times at random moments; the final weights and the per-batch counter equal an
    uninterrupted run's."""
    pytest.importorskip("keras")
    rng = random.Random(int(os.environ.get("COLABKIT_TEST_SEED", "99")))
    reference = tmp_path / "reference.npz"
    ref_args = ["keras", tmp_path / "ref", 6, 2, reference, "--sleep", "0.05"]
    proc = subprocess.run([sys.executable, str(HERE / "workers.py"), *map(str, ref_args)], env=ck_env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    dest, out = tmp_path / "dest", tmp_path / "resumed.npz"
    args = ["keras", dest, 6, 2, out, "--sleep", "0.05"]
    resumed_steps = []
    folder = CheckpointFolder(dest)
    for _ in range(4):
        before = {c.name for c in folder.committed()}
        p = _start(args, ck_env)
        # TF takes seconds to start (far more on a loaded machine), and training then runs ~4 s: wait for this
        # run's first checkpoint, then kill somewhere inside the training
        deadline = time.monotonic() + 120
        while p.poll() is None and time.monotonic() < deadline and not {c.name for c in folder.committed()} - before:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 2.0))
        p.send_signal(signal.SIGKILL)
        stdout, err = p.communicate()
        assert "Traceback" not in err, err
        resumed_steps += [int(line.split()[4]) for line in stdout.splitlines() if "resumed from step" in line]
    p = subprocess.run([sys.executable, str(HERE / "workers.py"), *map(str, args)], env=ck_env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    resumed_steps += [int(line.split()[4]) for line in p.stdout.splitlines() if "resumed from step" in line]
    assert resumed_steps == sorted(resumed_steps) and any(0 < s < 72 for s in resumed_steps), resumed_steps
    ref, got = np.load(reference), np.load(out)
    assert int(got["counter"]) == int(ref["counter"]) == 6 * 12
    for key in ref.files:
        if key.startswith("arr_"):
            np.testing.assert_allclose(got[key], ref[key], rtol=1e-5, atol=1e-6)
