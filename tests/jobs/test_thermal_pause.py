"""`colabkit run` and a hot GPU: a plain script job (no AutoResume) is stopped whole (SIGSTOP) while its GPU is too
hot and continued (SIGCONT) once it cooled; it finishes with its output complete, is not taken for hung, and the
pause is in summary.json."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.waiting import wait_for

JOB = textwrap.dedent("""
    import pathlib, time
    print("started", flush=True)
    while not pathlib.Path("cooled").exists():   # the test cools the GPU only once the runner stopped this job
        time.sleep(0.05)
    for i in range(200):
        print(f"line {i}", flush=True)
""")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _summary(run_dir: Path) -> dict | None:
    try:
        return {j["name"]: j for j in json.loads((run_dir / "summary.json").read_text())["jobs"]}
    except (OSError, ValueError, KeyError):
        return None


def test_a_plain_job_is_stopped_while_its_gpu_is_hot_and_finishes_complete(fake_gpus, tmp_path, monkeypatch):
    scenario = fake_gpus("hot_office")
    monkeypatch.setenv("COLABKIT_THERMAL_SLOWDOWN_FOR", "0")
    (tmp_path / "train.py").write_text(JOB)
    run_dir = tmp_path / "run"
    runner = subprocess.Popen([sys.executable, "-m", "colabkit", "run", "--gpus", "0,", "--hang-timeout", "1s",
                               "--run-dir", str(run_dir), "train.py"], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        paused = wait_for(lambda: ((_summary(run_dir) or {}).get("train") or {}).get("paused"), timeout=60)
        assert paused, "the job was never paused"
        assert paused["why"] == ("GPU 0 at 93 C (thermal slowdown for 0s); stopped (SIGSTOP) until it cools below "
                                 "85 C")
        scenario["gpus"][0].update(temperature=80, clocks_event_reasons=[])
        path = Path(os.environ["COLABKIT_TEST_GPUS"])
        path.with_suffix(".tmp").write_text(json.dumps(scenario))
        os.replace(path.with_suffix(".tmp"), path)
        (tmp_path / "cooled").touch()
        out, _ = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0, out
    assert "paused  train: GPU 0 at 93 C (thermal slowdown for 0s); stopped (SIGSTOP) until it cools below 85 C" in out
    assert "resumed train: GPU 0 cooled to 80 C after " in out and "hung" not in out
    log = (run_dir / "train.log").read_text()
    assert [line for line in log.splitlines() if line.startswith("line ")] == [f"line {i}" for i in range(200)]
    job = _summary(run_dir)["train"]
    assert job["status"] == "ok" and job["paused"] is None
    assert [p["why"] for p in job["thermal_pauses"]] == [paused["why"]]
    assert job["thermal_pauses"][0]["ended"].startswith("GPU 0 cooled to 80 C after ")


GUARDED_JOB = textwrap.dedent("""
    import time
    from colabkit.health import ThermalGuard
    guard = ThermalGuard(slowdown_for=0, poll_s=0.05)   # what every AutoResume in the job runs
    assert guard.start()
    print("guard started", flush=True)
    while not guard.pauses:      # steps; between two, the guard waits while the GPU is too hot
        guard.wait_if_hot()
        time.sleep(0.01)
    guard.stop()
    print(f"resumed after {len(guard.pauses)} pause", flush=True)
""")


def _set_gpu(scenario: dict, **values) -> None:
    scenario["gpus"][0].update(values)
    path = Path(os.environ["COLABKIT_TEST_GPUS"])
    path.with_suffix(".tmp").write_text(json.dumps(scenario))
    os.replace(path.with_suffix(".tmp"), path)


def test_a_job_whose_training_pauses_itself_is_left_running(fake_gpus, tmp_path, monkeypatch):
    scenario = fake_gpus("hot_office")
    _set_gpu(scenario, temperature=70, clocks_event_reasons=[])   # cool until the job's guard runs
    monkeypatch.setenv("COLABKIT_THERMAL_SLOWDOWN_FOR", "0")
    (tmp_path / "train.py").write_text(GUARDED_JOB)
    run_dir = tmp_path / "run"
    runner = subprocess.Popen([sys.executable, "-m", "colabkit", "run", "--gpus", "0,", "--run-dir", str(run_dir),
                               "train.py"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        assert wait_for(lambda: "guard started" in _read(run_dir / "train.log"), timeout=60)
        _set_gpu(scenario, temperature=93, clocks_event_reasons=["sw_thermal_slowdown"])
        for line in runner.stdout:
            lines.append(line.rstrip("\n"))
            if " hot     train: " in line:   # the runner saw the hot GPU and left the job to pause itself
                _set_gpu(scenario, temperature=80, clocks_event_reasons=[])
        runner.wait(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0, lines
    assert any(line.endswith("hot     train: GPU 0 at 93 C (thermal slowdown for 0s); its training pauses itself "
                             "between steps") for line in lines), lines
    assert not any(" paused  " in line for line in lines), lines
    assert "resumed after 1 pause" in (run_dir / "train.log").read_text()
    assert _summary(run_dir)["train"]["thermal_pauses"] == []
