"""`colabkit run --cluster` on a real three-node Ray cluster (conftest.py): placement, GPUs, logs, failover, Ctrl-C."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import _child_of, kill_driver, read_summary
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

# Each job records what it sees, then waits at a barrier until the test has seen every job running at once
# (so four jobs hold four GPUs at the same time, whatever the speed of the machine).
BARRIER_JOB = '''
import json, os, sys, time
import colabkit
shared = {shared!r}
name = os.environ["COLABKIT_JOB"]
inventory = colabkit.gpus(processes=False)
record = {{"job": name, "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
          "order": os.environ.get("CUDA_DEVICE_ORDER"), "node": os.environ.get("COLABKIT_CLUSTER_NODE"),
          "attempt": os.environ.get("COLABKIT_JOB_ATTEMPT"), "gpus_listed": len(inventory),
          "table": inventory.table(), "args": sys.argv[1:], "params": PARAMS,
          "secret_sent": os.path.exists(".env"), "data_sent": os.path.exists("data.csv")}}
os.makedirs("out", exist_ok=True)   # files a job writes beside itself come back to the run folder
with open(os.path.join("out", name + ".txt"), "w") as fh:
    fh.write("made by " + name)
with open(os.path.join(shared, "records.jsonl"), "a") as fh:
    fh.write(json.dumps(record) + "\\n")
print("at barrier", name, flush=True)
deadline = time.time() + 150
while not os.path.exists(os.path.join(shared, "go")):
    if time.time() > deadline:
        sys.exit(3)
    time.sleep(0.1)
print("past barrier", name)
'''


def _script(folder: Path, name: str, shared: Path) -> Path:
    path = folder / name
    path.write_text("PARAMS = None\n" + BARRIER_JOB.format(shared=str(shared)))
    return path


def _notebook(folder: Path, name: str, shared: Path) -> Path:
    cells = [{"cell_type": "code", "id": "p", "metadata": {"tags": ["parameters"]}, "source": "lr = 0.1\n",
              "outputs": [], "execution_count": None},
             {"cell_type": "code", "id": "b", "metadata": {}, "outputs": [], "execution_count": None,
              "source": "import sys\nsys.argv = ['nb']\nPARAMS = {'lr': lr}\n"
                        + BARRIER_JOB.format(shared=str(shared))}]
    nb = {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}}
    path = folder / name
    path.write_text(json.dumps(nb))
    return path


def _log(run_dir: Path, name: str) -> str:
    try:
        return (run_dir / f"{name}.log").read_text()
    except OSError:
        return ""


def test_jobs_run_on_the_cluster_each_with_its_own_gpus(ray_cluster, tmp_path):
    jobs, shared, run_dir = tmp_path / "jobs", tmp_path / "shared", tmp_path / "run"
    jobs.mkdir()
    shared.mkdir()
    (jobs / ".gitignore").write_text(".env\n")   # what git would not commit stays home
    (jobs / ".env").write_text("API_KEY=do-not-send\n")
    (jobs / "data.csv").write_text("1,2\n")
    paths = [_script(jobs, f"train_{c}.py", shared) for c in "abc"] + [_notebook(jobs, "sweep.ipynb", shared)]
    driver = ray_cluster.popen(sys.executable, "-m", "colabkit", "run", "--cluster", ray_cluster.address,
                               "--run-dir", str(run_dir), "-p", "lr", "0.5", *map(str, paths), "--", "--seed", "7",
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    names = ["train_a", "train_b", "train_c", "sweep"]
    try:
        # streamed: every job's line reaches the local log while the job still waits at the barrier
        streamed = wait_for(lambda: all(f"at barrier {n}" in _log(run_dir, n) for n in names), timeout=150, step=0.3)
        assert streamed, {n: _log(run_dir, n) for n in names}

        def all_running():
            summary = read_summary(run_dir)
            return summary is not None and all(j["status"] == "running" and "node" in (j.get("device") or "")
                                               for j in summary["jobs"]) and summary
        summary = wait_for(all_running, timeout=60, step=0.3) or read_summary(run_dir)
        running = {j["name"]: j for j in summary["jobs"]}
        assert all(j["status"] == "running" for j in running.values()), running
        assert len({j["device"] for j in running.values()}) == 4  # the live summary: 4 machines/GPUs, one each
        assert all("node" in j["device"] and "GPU" in j["device"] for j in running.values())
    finally:
        (shared / "go").touch()
        try:
            out, _ = driver.communicate(timeout=120)
        finally:
            kill_driver(driver)
    assert driver.returncode == 0, out
    records = [json.loads(line) for line in (shared / "records.jsonl").read_text().splitlines()]
    assert sorted(r["job"] for r in records) == sorted(names)
    # two nodes with two GPUs each: four jobs at once take every (node, GPU) pair exactly once
    assert sorted((r["node"], r["cvd"]) for r in records) == sorted(
        {(r["node"], g) for r in records for g in ("0", "1")})
    assert len({r["node"] for r in records}) == 2
    for r in records:
        assert r["order"] == "PCI_BUS_ID"
        assert r["gpus_listed"] == 2, r["table"]  # colabkit.gpus() lists the worker's GPUs...
        assert f"CUDA_VISIBLE_DEVICES={r['cvd']} (CUDA_DEVICE_ORDER=PCI_BUS_ID)" in r["table"]  # ...and its own
        assert r["attempt"] == "1"
        assert r["data_sent"] and not r["secret_sent"]
        assert (run_dir / f"{r['job']}-files" / "out" / f"{r['job']}.txt").read_text() == f"made by {r['job']}"
        assert "file(s) it wrote" in _log(run_dir, r["job"])
    assert "sending" in out and "6 file(s)" in out   # 4 jobs, data.csv, .gitignore
    by_job = {r["job"]: r for r in records}
    assert by_job["train_a"]["args"] == ["--seed", "7"]
    assert by_job["sweep"]["params"] == {"lr": 0.5}  # -p reaches the notebook (and --seed 7 as a parameter)
    summary = read_summary(run_dir)
    assert summary["status"] == "done" and summary["exit_code"] == 0
    assert [j["status"] for j in summary["jobs"]] == ["ok"] * 4
    assert summary["cluster"]["address"] == ray_cluster.address and len(summary["cluster"]["nodes"]) == 3
    output = json.loads((run_dir / "sweep.ipynb").read_text())  # the executed notebook came back
    text = json.dumps(output["cells"])
    assert "past barrier sweep" in text and "seed = 7" in text
    assert "past barrier train_b" in _log(run_dir, "train_b")


CHECKPOINTED_JOB = '''
import json, os, sys, time
import numpy as np
import colabkit
shared = {shared!r}
attempt = int(os.environ["COLABKIT_JOB_ATTEMPT"])
ckpt = colabkit.Checkpoints(os.path.join(shared, "ckpt"))
restored = ckpt.restore()
start = 0 if restored is None else restored.step + 1
total = float(restored.state["total"]) if restored else 0.0
print("attempt", attempt, "starts at step", start, flush=True)
for step in range(start, 8):
    total += step
    ckpt.save(step, {{"total": np.array(total)}}, wait=True)
    print("saved step", step, flush=True)
    if attempt == 1 and step == 3:
        with open(os.path.join(shared, "kill-me"), "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(150)
        sys.exit(3)   # never killed: fail rather than hang
ckpt.close()
with open(os.path.join(shared, "result.json"), "w") as fh:
    json.dump({{"attempt": attempt, "start": start, "total": total,
               "node": os.environ["COLABKIT_CLUSTER_NODE"]}}, fh)
'''


def test_a_dead_node_sends_the_job_elsewhere_and_it_resumes(ray_cluster, tmp_path):
    jobs, shared, run_dir = tmp_path / "jobs", tmp_path / "shared", tmp_path / "run"
    jobs.mkdir()
    shared.mkdir()
    (jobs / "long.py").write_text(CHECKPOINTED_JOB.format(shared=str(shared)))
    driver = ray_cluster.popen(sys.executable, "-m", "colabkit", "run", "--cluster", ray_cluster.address,
                               "--retries", "1", "--run-dir", str(run_dir), str(jobs / "long.py"),
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        marker = shared / "kill-me"
        assert wait_for(marker.exists, timeout=150, step=0.3), _log(run_dir, "long")
        first_node = read_summary(run_dir)["jobs"][0]["device"]
        ray_cluster.kill_node_of(int(marker.read_text()))
        out, _ = driver.communicate(timeout=150)
    finally:
        kill_driver(driver)
        ray_cluster.add_worker()   # the next tests get the cluster's four GPUs again
    assert driver.returncode == 0, out + _log(run_dir, "long")
    result = json.loads((shared / "result.json").read_text())
    assert result["attempt"] == 2 and result["start"] == 4  # resumed after step 3, from the shared folder
    assert result["total"] == sum(range(8))
    summary = read_summary(run_dir)
    job = summary["jobs"][0]
    assert job["status"] == "ok" and job["attempts"] == 2
    assert job["history"][0]["device"] == first_node and job["history"][1]["device"] != first_node
    log = _log(run_dir, "long")
    assert "machine or Ray worker was lost" in log and "marked dead by Ray" in log
    assert "its machine left the cluster" in log  # the checkpoint lease of the dead machine was taken over at once
    assert "its machine or Ray worker was lost" in out


TRAPPING_JOB = '''
import os, signal, sys, time
def on_term(signum, frame):
    print("SIGTERM: saving", flush=True)
    time.sleep(0.5)
    print("saved", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("working", flush=True)
time.sleep(150)
sys.exit(3)
'''


IGNORING_JOB = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda signum, frame: print("SIGTERM ignored", flush=True))
print("working", flush=True)
time.sleep(150)
sys.exit(3)
"""


def test_ctrl_c_gives_cluster_jobs_sigterm_and_the_grace_period(ray_cluster, tmp_path):
    jobs, run_dir = tmp_path / "jobs", tmp_path / "run"
    jobs.mkdir()
    (jobs / "trap.py").write_text(TRAPPING_JOB)
    (jobs / "trap2.py").write_text(TRAPPING_JOB)
    (jobs / "stubborn.py").write_text(IGNORING_JOB)
    grace = 8
    driver = ray_cluster.popen(sys.executable, "-m", "colabkit", "run", "--cluster", ray_cluster.address,
                               "--grace", str(grace), "--run-dir", str(run_dir),
                               *(str(jobs / n) for n in ("trap.py", "trap2.py", "stubborn.py")),
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    names = ("trap", "trap2", "stubborn")
    try:
        assert wait_for(lambda: all("working" in _log(run_dir, n) for n in names), timeout=150, step=0.3), \
            {n: _log(run_dir, n) for n in names}
        python = wait_for(lambda: _child_of(driver.pid), timeout=10)
        sent = time.monotonic()
        os.kill(python, signal.SIGINT)  # what Ctrl-C in the terminal sends to the driver
        out, _ = driver.communicate(timeout=90)
        took = time.monotonic() - sent
    finally:
        kill_driver(driver)
    assert driver.returncode == 130, out
    summary = read_summary(run_dir)
    assert summary["status"] == "interrupted" and summary["interrupted_by"] == "SIGINT"
    jobs_ = {j["name"]: j for j in summary["jobs"]}
    assert [jobs_[n]["status"] for n in names] == ["stopped"] * 3
    assert jobs_["trap"]["returncode"] == 0 and jobs_["trap2"]["returncode"] == 0  # saved within the grace
    assert jobs_["stubborn"]["returncode"] == -signal.SIGKILL                        # killed when it ran out
    for name in ("trap", "trap2"):
        assert "SIGTERM: saving" in _log(run_dir, name) and "saved" in _log(run_dir, name)
    assert "SIGTERM ignored" in _log(run_dir, "stubborn")
    assert grace <= took < 60, took


def test_fewer_gpus_than_gpus_per_job_is_one_line_before_anything_starts(ray_cluster, tmp_path):
    (tmp_path / "j.py").write_text("print('should not run')\n")
    done = ray_cluster.colabkit_run("--gpus-per-job", "3", "--run-dir", str(tmp_path / "run"),
                                    str(tmp_path / "j.py"), cwd=tmp_path)
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "colabkit run: error" in line]
    assert len(errors) == 1 and "--gpus-per-job 3" in errors[0] and "most on one is 2" in errors[0], done.stderr
    assert not (tmp_path / "run").exists()


def test_a_ray_client_address_runs_jobs_from_outside_the_cluster(ray_cluster, tmp_path):
    """ray://HEAD:10001 (Ray Client, for a laptop that is not a node): the same run, and a non-zero exit counts;
    --shared: the jobs run where they are (storage every machine sees), not in a copy."""
    (tmp_path / "ok.py").write_text("import os\nprint('on', os.environ['CUDA_VISIBLE_DEVICES'], 'in', os.getcwd())\n")
    (tmp_path / "bad.py").write_text("import sys\nprint('about to fail')\nsys.exit(4)\n")
    run_dir = tmp_path / "run"
    done = ray_cluster.run(sys.executable, "-m", "colabkit", "run", "--cluster", "ray://127.0.0.1:10001",
                           "--shared", "--run-dir", str(run_dir), str(tmp_path / "ok.py"), str(tmp_path / "bad.py"),
                           cwd=tmp_path)
    summary = read_summary(run_dir)
    server_logs = "".join(p.read_text()[-2000:]
                          for p in sorted(ray_cluster.temp.glob("session_latest/logs/ray_client_server*")))
    assert done.returncode == 1 and summary is not None, done.stdout + done.stderr + server_logs
    jobs = {j["name"]: j for j in summary["jobs"]}
    assert jobs["ok"]["status"] == "ok" and jobs["bad"]["status"] == "failed" and jobs["bad"]["returncode"] == 4
    assert f"in {tmp_path}" in _log(run_dir, "ok")   # its own folder, not a copy
    assert "on 0" in _log(run_dir, "ok") or "on 1" in _log(run_dir, "ok")
    assert "about to fail" in _log(run_dir, "bad")
    assert "1 of 2 job(s) failed (bad)" in done.stdout


def test_doctor_reports_every_node_of_the_cluster(ray_cluster, tmp_path):
    """`colabkit doctor --cluster`: the checks run as a task pinned to each node, one report per node (here the
    NVML checks only: the framework probes and the all-reduce are tested on one machine in tests/doctor)."""
    done = ray_cluster.run(sys.executable, "-m", "colabkit", "doctor", "--cluster", ray_cluster.address, "--json",
                           "--skip", "cuda", "--skip", "gpus seen", "--skip", "nccl", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    reports = json.loads(done.stdout)
    alive = ray_cluster.run(sys.executable, "-c", "import ray; ray.init(address='auto', logging_level='ERROR'); "
                            "print(sum(n['Alive'] for n in ray.nodes()))", cwd=tmp_path)
    assert len(reports) == int(alive.stdout.split()[-1]) >= 2, (reports, alive.stdout + alive.stderr)
    assert len({r["node"] for r in reports}) == len(reports)
    for report in reports:
        (driver,) = [f for f in report["findings"] if f["check"] == "driver"]
        assert driver["status"] == "ok" and "2 GPU(s)" in driver["found"], report
        assert sorted(f["gpu"] for f in report["findings"] if f["check"] == "temperature") == [0, 1]
