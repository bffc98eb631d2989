"""A job stopped (SIGSTOP) for a hot GPU that ends while stopped: killed from outside, or its queue stopped by
SIGTERM. `colabkit run` must end, and leave no stopped process behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.jobs.test_thermal_pause import _summary
from tests.waiting import wait_for

JOB = textwrap.dedent("""
    import os, pathlib, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])   # a data-loader worker
    pathlib.Path("pids").write_text(f"{os.getpid()} {child.pid}")
    while True:
        time.sleep(0.05)
""")


def _state(pid: int) -> str | None:
    """The process's state letter from /proc ("T": stopped, "Z": zombie), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _start_paused(fake_gpus, tmp_path, monkeypatch):
    fake_gpus("hot_office")
    monkeypatch.setenv("COLABKIT_THERMAL_SLOWDOWN_FOR", "0")
    (tmp_path / "train.py").write_text(JOB)
    run_dir = tmp_path / "run"
    runner = subprocess.Popen([sys.executable, "-m", "colabkit", "run", "--gpus", "0,", "--grace", "2",
                               "--run-dir", str(run_dir), "train.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    assert wait_for(lambda: (tmp_path / "pids").exists() and ((_summary(run_dir) or {}).get("train") or {})
                    .get("paused"), timeout=60), "the job was never paused"
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert wait_for(lambda: all(_state(p) == "T" for p in pids), timeout=30)
    return runner, run_dir, pids


def _cleanup(runner, pids):
    if runner.poll() is None:
        runner.kill()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_a_stopped_job_killed_from_outside_ends_the_queue_and_leaves_no_stopped_worker(fake_gpus, tmp_path,
                                                                                        monkeypatch):
    runner, run_dir, pids = _start_paused(fake_gpus, tmp_path, monkeypatch)
    try:
        os.kill(pids[0], signal.SIGKILL)          # the OOM killer, or the user, takes the job's main process
        out, _ = runner.communicate(timeout=120)
        assert wait_for(lambda: _state(pids[1]) in (None, "Z"), timeout=30), \
            f"the job's worker was left behind in state {_state(pids[1])}"
    finally:
        _cleanup(runner, pids)
    assert "killed by SIGKILL" in out, out
    assert _summary(run_dir)["train"]["paused"] is None


def test_sigterm_to_the_queue_ends_a_stopped_job(fake_gpus, tmp_path, monkeypatch):
    runner, run_dir, pids = _start_paused(fake_gpus, tmp_path, monkeypatch)
    try:
        runner.send_signal(signal.SIGTERM)
        out, _ = runner.communicate(timeout=120)
        assert wait_for(lambda: all(_state(p) in (None, "Z") for p in pids), timeout=30), \
            [_state(p) for p in pids]
    finally:
        _cleanup(runner, pids)
    assert "SIGTERM: stopping the queue" in out, out
