"""`colabkit run`: jobs over the 2 fake GPUs of the home_rig scenario (NVML stand-in), real subprocesses."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from colabkit import cli
from colabkit.devices import GPUSelectionError
from colabkit.jobs import JobError, run_jobs
from tests.waiting import wait_for

RECORDER = '''
import json, os, sys, time
record = {{"job": os.environ["COLABKIT_JOB"], "attempt": int(os.environ["COLABKIT_JOB_ATTEMPT"]),
          "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "order": os.environ.get("CUDA_DEVICE_ORDER"),
          "growth": os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"), "argv": sys.argv[1:], "start": time.time()}}
print("hello from", record["job"], "attempt", record["attempt"])
time.sleep({sleep})
record["end"] = time.time()
with open({records!r}, "a") as fh:
    fh.write(json.dumps(record) + "\\n")
code = {exit_code}
if code:
    print("boom", file=sys.stderr)
sys.exit(code)
'''

NOTEBOOK_SOURCE = [
    ["lr = 0.1\n", "epochs = 1\n", "tag = 'default'"],
    ["import json, os\n",
     "print('training with', lr, epochs, tag)\n",
     "with open(os.environ['RECORDS_NB'], 'w') as fh:\n",
     "    json.dump({'lr': lr, 'lr_type': type(lr).__name__, 'epochs': epochs, 'epochs_type': type(epochs).__name__,\n",
     "               'tag': tag, 'cvd': os.environ.get('CUDA_VISIBLE_DEVICES'), 'cwd': os.getcwd()}, fh)"],
]


def job(folder: Path, name: str, *, sleep=0.0, exit_code="0", records="records.jsonl") -> Path:
    path = folder / name
    path.write_text(RECORDER.format(sleep=sleep, exit_code=exit_code, records=str(folder / records)))
    return path


def notebook(folder: Path, name: str = "train.ipynb", kernelspec=True) -> Path:
    cells = [{"cell_type": "code", "id": f"c{i}", "metadata": {"tags": ["parameters"]} if i == 0 else {},
              "source": src, "outputs": [], "execution_count": None} for i, src in enumerate(NOTEBOOK_SOURCE)]
    metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}} if kernelspec else {}
    path = folder / name
    path.write_text(json.dumps({"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}))
    return path


def records(folder: Path, name="records.jsonl") -> dict:
    out = {}
    for line in (folder / name).read_text().splitlines():
        r = json.loads(line)
        out.setdefault(r["job"], []).append(r)
    return out


def summary(run_dir: Path) -> dict:
    data = json.loads((run_dir / "summary.json").read_text())
    return {j["name"]: j for j in data["jobs"]} | {"_run": data}


def test_three_jobs_over_two_gpus(fake_gpus, run_cli, tmp_path):
    fake_gpus("home_rig")
    job(tmp_path, "a.py", sleep=0.8)
    job(tmp_path, "b.py", sleep=2.0)
    job(tmp_path, "c.py", sleep=0.1)
    out = run_cli("run", "--run-dir", "run", "a.py", "b.py", "c.py", "--", "--seed", "7")
    assert out.returncode == 0, out.stdout + out.stderr
    r = {k: v[0] for k, v in records(tmp_path).items()}
    a, b, c = r["a"], r["b"], r["c"]
    assert (a["cvd"], b["cvd"]) == ("0", "1")                      # each job its own GPU
    assert a["start"] < b["end"] and b["start"] < a["end"]         # side by side
    assert c["start"] >= a["end"] and c["cvd"] == "0"              # the third waited for the first free GPU
    assert all(x["order"] == "PCI_BUS_ID" and x["growth"] == "true" and x["argv"] == ["--seed", "7"]
               for x in (a, b, c))
    s = summary(tmp_path / "run")
    assert [s[n]["status"] for n in "abc"] == ["ok", "ok", "ok"] and s["_run"]["exit_code"] == 0
    assert [s[n]["device"] for n in "abc"] == ["GPU 0", "GPU 1", "GPU 0"]
    log = (tmp_path / "run" / "a.log").read_text()
    assert "=== colabkit run: a, attempt 1/1, on GPU 0 (CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0" in log
    assert "hello from a attempt 1" in log
    assert "all 3 job(s) succeeded" in out.stdout and "c    python  GPU 0" in out.stdout


def test_notebook_parameters_retries_and_a_failure(fake_gpus, run_cli, tmp_path):
    fake_gpus("home_rig")
    nb_folder = tmp_path / "notebooks"
    nb_folder.mkdir()
    notebook(nb_folder)
    job(tmp_path, "flaky.py", exit_code='0 if record["attempt"] == 2 else 3')
    job(tmp_path, "broken.py", exit_code="2")
    out = run_cli("run", "--run-dir", "run", "--retries", "1", "-p", "tag", "hello", "notebooks/train.ipynb",
                  "flaky.py", "broken.py", "--", "--lr", "1e-3", "--epochs=3",
                  env=dict(os.environ, RECORDS_NB=str(tmp_path / "nb.json")))
    assert out.returncode == 1, out.stdout + out.stderr
    nb = json.loads((tmp_path / "nb.json").read_text())
    assert (nb["lr"], nb["lr_type"], nb["epochs"], nb["epochs_type"], nb["tag"]) == (0.001, "float", 3, "int", "hello")
    assert nb["cvd"] in ("0", "1") and nb["cwd"] == str(nb_folder)   # notebooks run in their own folder
    output = json.loads((tmp_path / "run" / "train.ipynb").read_text())
    assert any("injected-parameters" in c["metadata"].get("tags", []) for c in output["cells"])
    assert "training with 0.001 3 hello" in (tmp_path / "run" / "train.log").read_text()

    r = records(tmp_path)
    assert [x["attempt"] for x in r["flaky"]] == [1, 2] and r["flaky"][0]["argv"] == ["--lr", "1e-3", "--epochs=3"]
    assert [x["attempt"] for x in r["broken"]] == [1, 2]
    s = summary(tmp_path / "run")
    assert (s["train"]["status"], s["flaky"]["status"], s["broken"]["status"]) == ("ok", "ok", "failed")
    assert (s["flaky"]["attempts"], s["broken"]["attempts"], s["broken"]["returncode"]) == (2, 2, 2)
    assert [h["returncode"] for h in s["flaky"]["history"]] == [3, 0]
    assert s["_run"]["exit_code"] == 1
    broken_log = (tmp_path / "run" / "broken.log").read_text()
    assert broken_log.count("=== colabkit run: broken, attempt") == 2 and broken_log.count("boom") == 2
    assert "failed  flaky (exit status 3)" in out.stdout and "retrying" in out.stdout
    assert "1 of 3 job(s) failed (broken)" in out.stdout


def test_per_gpu_packs_jobs_round_robin(fake_gpus, tmp_path, monkeypatch):
    fake_gpus("home_rig")
    monkeypatch.chdir(tmp_path)
    paths = [job(tmp_path, f"j{i}.py", sleep=1.0) for i in range(3)]
    report = run_jobs(paths, per_gpu=2, run_dir=tmp_path / "run", out=io.StringIO(), progress=False)
    assert report.exit_code == 0 and report.slots == ["GPU 0", "GPU 1", "GPU 0", "GPU 1"]
    r = {k: v[0] for k, v in records(tmp_path).items()}
    assert [r[f"j{i}"]["cvd"] for i in range(3)] == ["0", "1", "0"]
    assert max(x["start"] for x in r.values()) < min(x["end"] for x in r.values())   # all three at once


def test_gpus_per_job_gives_each_job_a_group(fake_gpus, tmp_path, monkeypatch):
    fake_gpus("workstation")   # 4 GPUs
    monkeypatch.chdir(tmp_path)
    # j0 ends well before j1 (equal sleeps would race), so j2 gets j0's pair
    paths = [job(tmp_path, f"j{i}.py", sleep=s) for i, s in enumerate((0.3, 1.5, 0.3))]
    out = io.StringIO()
    report = run_jobs(paths, gpus_per_job=2, run_dir=tmp_path / "run", out=out, progress=False)
    assert report.exit_code == 0 and report.slots == ["GPUs 0,1", "GPUs 2,3"]
    r = {k: v[0] for k, v in records(tmp_path).items()}
    assert [r[f"j{i}"]["cvd"] for i in range(3)] == ["0,1", "2,3", "0,1"]
    assert r["j2"]["start"] >= min(r["j0"]["end"], r["j1"]["end"])           # the third waited for a free pair
    assert summary(tmp_path / "run")["j0"]["device"] == "GPUs 0,1"


def test_gpus_per_job_groups_neighbours_and_reports_the_spare(fake_gpus, tmp_path, monkeypatch):
    fake_gpus("workstation")
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    report = run_jobs([job(tmp_path, "x.py")], gpus="3,0,2", gpus_per_job=2, run_dir=tmp_path / "run", out=out,
                      progress=False)
    assert report.slots == ["GPUs 0,2"] and records(tmp_path)["x"][0]["cvd"] == "0,2"
    assert "3 GPUs do not split into groups of 2; GPU 3 left idle." in out.getvalue()


def test_each_job_gets_one_of_the_named_mig_instances(fake_gpus, tmp_path, monkeypatch):
    fake_gpus("mig")
    monkeypatch.chdir(tmp_path)
    from colabkit import devices
    instances = [g.uuid for g in devices.gpus() if g.is_mig]
    report = run_jobs([job(tmp_path, "x.py", sleep=0.5), job(tmp_path, "y.py", sleep=0.5)], gpus=",".join(instances),
                      run_dir=tmp_path / "run", out=io.StringIO(), progress=False)
    assert report.exit_code == 0 and report.slots == ["MIG 0:0", "MIG 0:1"]
    assert sorted(r[0]["cvd"] for r in records(tmp_path).values()) == sorted(instances)
    # "auto" for a run: every instance and whole GPU is a slot of its own (a single process gets one)
    report = run_jobs([job(tmp_path, "z.py")], run_dir=tmp_path / "run2", out=io.StringIO(), progress=False)
    assert report.slots == ["MIG 0:0", "MIG 0:1", "GPU 1"]


@pytest.mark.parametrize("scenario, gpus, size, error, needles", [
    ("home_rig", "auto", 3, JobError, ["--gpus-per-job 3", "only 2 GPU(s) chosen (0, 1)", "at most 2"]),
    ("mig", "instances", 2, GPUSelectionError, ["at most one MIG instance per process"]),
    ("mig", "one instance", 2, JobError, ["MIG instances (0:0)", "cannot be grouped"]),
])
def test_gpus_per_job_that_cannot_be_met(fake_gpus, tmp_path, scenario, gpus, size, error, needles):
    fake_gpus(scenario)
    from colabkit import devices
    instances = [g.uuid for g in devices.gpus() if g.is_mig]
    if gpus != "auto":
        gpus = ",".join(instances) if gpus == "instances" else instances[0]
    with pytest.raises(error) as err:
        run_jobs([job(tmp_path, "x.py")], gpus=gpus, gpus_per_job=size, run_dir=tmp_path / "run", out=io.StringIO())
    for needle in needles:
        assert needle in str(err.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("gpus, expected_cvd", [("auto", None), (0, "-1")])
def test_cpu_slots(fake_gpus, tmp_path, monkeypatch, gpus, expected_cvd):
    fake_gpus(None if gpus == "auto" else "home_rig")  # no GPU at all / GPUs, but none asked for
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    report = run_jobs([job(tmp_path, "x.py", sleep=0.3), job(tmp_path, "y.py", sleep=0.3)], gpus=gpus,
                      run_dir=tmp_path / "run", out=out, progress=False)
    assert report.exit_code == 0 and report.slots == ["CPU"]
    r = {k: v[0] for k, v in records(tmp_path).items()}
    assert r["y"]["start"] >= r["x"]["end"] and r["x"]["cvd"] == r["y"]["cvd"] == expected_cvd
    if gpus == "auto":
        assert "No NVIDIA GPU found" in out.getvalue() and "running on the CPU" in out.getvalue()


def test_one_named_gpu(fake_gpus, tmp_path, monkeypatch):
    fake_gpus("home_rig")
    monkeypatch.chdir(tmp_path)
    report = run_jobs([job(tmp_path, "x.py"), job(tmp_path, "y.py")], gpus="1,", out=io.StringIO(), progress=False)
    assert report.slots == ["GPU 1"] and report.run_dir.parent == tmp_path / "colabkit-runs"
    assert {r[0]["cvd"] for r in records(tmp_path).values()} == {"1"}


@pytest.mark.parametrize("argv, needles", [
    (["run", "missing.py", "ok.py", "notes.txt"], ["Nothing was started", "missing.py: no such file",
                                                   "notes.txt: not a notebook (.ipynb), a script (.py, .sh)"]),
    (["run", "ok.py", "bad.ipynb"], ["bad.ipynb: not a readable Jupyter notebook"]),
    (["run", "bare.ipynb"], ["bare.ipynb: the notebook names no kernel", "--kernel python3"]),
    (["run", "--kernel", "no-such-kernel", "ok.ipynb"], ["no Jupyter kernel named 'no-such-kernel'"]),
    (["run", "ok.ipynb", "--", "-x", "1"], ["--name value pairs", "'-x' is not one"]),
    (["run", "-p", "not a name", "1", "ok.ipynb"], ["-p 'not a name'"]),
    (["run", "--per-gpu", "0", "ok.py"], ["--per-gpu 0"]),
    (["run", "--gpus-per-job", "0", "ok.py"], ["--gpus-per-job 0"]),
    (["run", "--retries", "-1", "ok.py"], ["--retries -1"]),
    (["run", "--gpus", "0,7", "ok.py"], ["there is no GPU 7", "GPU 1 (NVIDIA GeForce GTX 1080 Ti"]),
    (["run", "--gpus", "3", "ok.py"], ["asked for 3 GPUs; there are 2"]),
])
def test_bad_jobs_are_rejected_before_anything_starts(fake_gpus, tmp_path, monkeypatch, capsys, argv, needles):
    fake_gpus("home_rig")
    monkeypatch.chdir(tmp_path)
    job(tmp_path, "ok.py")
    (tmp_path / "notes.txt").write_text("not a job")
    (tmp_path / "bad.ipynb").write_text("{not json")
    notebook(tmp_path, "bare.ipynb", kernelspec=False)
    notebook(tmp_path, "ok.ipynb")
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("colabkit run: error: ")
    for needle in needles:
        assert needle in err
    assert not (tmp_path / "records.jsonl").exists() and not (tmp_path / "colabkit-runs").exists()


def test_job_error_is_a_value_error():
    with pytest.raises(JobError, match="No jobs given"):
        run_jobs([])


SAVER = '''
import os, signal, sys, time
marks = os.environ["MARKS"]
def on_term(signum, frame):
    time.sleep(0.3)  # saving a checkpoint
    open(os.path.join(marks, "saver.saved"), "w").write("saved")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(marks, "saver.started"), "w").write(str(os.getpid()))
time.sleep(60)
'''

STUBBORN = '''
import json, os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
# a child in its own session that also ignores SIGTERM, like a Jupyter kernel under papermill
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
open(os.path.join(os.environ["MARKS"], "stubborn.started"), "w").write(json.dumps([os.getpid(), child.pid]))
time.sleep(60)
'''


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.subprocess_kill
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("first, second, grace, code", [
    (signal.SIGINT, None, 1.5, 130),             # Ctrl-C: SIGTERM to the jobs, SIGKILL after the grace period
    (signal.SIGTERM, signal.SIGINT, 60, 143),    # a second signal kills at once
])
def test_interrupt_stops_the_queue_cleanly(fake_gpus, tmp_path, first, second, grace, code):
    fake_gpus("home_rig")
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "saver.py").write_text(SAVER)
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    job(tmp_path, "third.py")
    with open(tmp_path / "out.txt", "w") as out:
        runner = subprocess.Popen([sys.executable, "-m", "colabkit", "run", "--run-dir", "run", "--grace", str(grace),
                                   "saver.py", "stubborn.py", "third.py"], cwd=tmp_path, stdout=out,
                                  stderr=subprocess.STDOUT, env=dict(os.environ, MARKS=str(marks)))
    try:
        assert wait_for(lambda: (marks / "saver.started").exists() and (marks / "stubborn.started").exists())
        stubborn_pid, child_pid = json.loads((marks / "stubborn.started").read_text())
        sent = time.monotonic()
        runner.send_signal(first)
        if second is not None:
            # the second signal comes once the runner has seen the saver exit (after saving), else it may kill it
            assert wait_for(lambda: "stopped saver" in (tmp_path / "out.txt").read_text())
            runner.send_signal(second)
        rc = runner.wait(timeout=30)
        elapsed = time.monotonic() - sent
    finally:
        if runner.poll() is None:
            runner.kill()
    text = (tmp_path / "out.txt").read_text()
    assert rc == code, text
    assert (marks / "saver.saved").read_text() == "saved"           # SIGTERM gave it time to save
    assert wait_for(lambda: not alive(stubborn_pid) and not alive(child_pid), 5)   # SIGKILL reached both
    if second is None:
        assert grace - 0.2 <= elapsed < grace + 10, text
    else:
        assert elapsed < 20, text
    s = summary(tmp_path / "run")
    assert (s["saver"]["status"], s["saver"]["returncode"]) == ("stopped", 0)
    assert (s["stubborn"]["status"], s["stubborn"]["returncode"]) == ("stopped", -signal.SIGKILL)
    assert s["third"]["status"] == "not started" and s["third"]["attempts"] == 0
    assert s["_run"]["interrupted_by"] == signal.Signals(first).name and s["_run"]["exit_code"] == code
    assert "stopping the queue; sent SIGTERM to 2 running job(s)" in text and "sent SIGKILL to stubborn" in text
    assert not (tmp_path / "records.jsonl").exists()                  # the waiting job never started
