"""`colabkit run --hang-timeout`: a hung job is killed, counted as failed and restarted by --retries (real
subprocesses). The job's monitor learns a budget (floor 5 s against ~5 ms steps: a loaded machine does not stall a
step that long) and the first attempt blocks for 10 minutes, so the outcome does not depend on this machine's
speed."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import textwrap

from tests.waiting import wait_for

TRAINER = textwrap.dedent('''
    import json, os, subprocess, sys, time
    import colabkit
    attempt = int(os.environ["COLABKIT_JOB_ATTEMPT"])
    if attempt == 1:   # a helper in its own session that ignores SIGTERM, as a hung Jupyter kernel can
        helper = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                   "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                                   "time.sleep(300)"], start_new_session=True, stdout=subprocess.PIPE, text=True)
        helper.stdout.readline()
        open("helper.pid", "w").write(str(helper.pid))
    start = 0
    if os.path.exists("ckpt.json"):
        start = json.load(open("ckpt.json"))["step"]       # resume from the last checkpoint
    with colabkit.monitor(hang_floor="5s", sample_every="0.2s") as mon:
        for step in range(start, 60):
            time.sleep(0.005)
            if attempt == 1 and step == 30:
                time.sleep(600)                            # stuck
            mon.step()
            if step % 10 == 9:
                json.dump({"step": step + 1}, open("ckpt.json", "w"))
    print("finished at step", step + 1, "attempt", attempt, "started at", start)
''')


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _summary(run_dir):
    return {j["name"]: j for j in json.loads((run_dir / "summary.json").read_text())["jobs"]}


def test_a_hung_job_is_killed_and_retried_from_its_checkpoint(fake_gpus, run_cli, tmp_path):
    fake_gpus(None)
    (tmp_path / "train.py").write_text(TRAINER)
    out = run_cli("run", "--run-dir", "run", "--retries", "1", "train.py", timeout=180)
    helper = int((tmp_path / "helper.pid").read_text())
    try:
        # the hung attempt's leftovers do not outlive it (they could hold the GPU while the retry starts)
        assert wait_for(lambda: not _alive(helper), 10), "the hung job's helper process survived"
    finally:
        with contextlib.suppress(OSError):
            os.kill(helper, signal.SIGKILL)
    assert out.returncode == 0, out.stdout + out.stderr
    job = _summary(tmp_path / "run")["train"]
    assert job["status"] == "ok" and job["attempts"] == 2
    first, second = job["history"]
    assert first["returncode"] == -15 and "its monitor reports a hang" in first["hung"]
    assert "hung" not in second and second["returncode"] == 0
    assert first["seconds"] < 60          # killed long before its 10-minute sleep would have ended
    log = (tmp_path / "run" / "train.log").read_text()
    assert "finished at step 60 attempt 2 started at 30" in log
    assert "colabkit: HANG? no progress for" in log and "=== colabkit run: hung:" in log
    dumps = sorted((tmp_path / "run").glob("train.hang-*.txt"))
    assert len(dumps) == 1 and "no progress for" in dumps[0].read_text()
    assert 'File "' in dumps[0].read_text() and "train.py" in dumps[0].read_text()
    assert "hung    train: its monitor reports a hang" in out.stdout and "retrying" in out.stdout


def test_a_fixed_hang_timeout_without_a_monitor_uses_the_log(fake_gpus, run_cli, tmp_path):
    fake_gpus(None)
    (tmp_path / "quiet.py").write_text("import time\nprint('working', flush=True)\ntime.sleep(600)\n")
    out = run_cli("run", "--run-dir", "run", "--hang-timeout", "2s", "quiet.py", timeout=120)
    assert out.returncode == 1, out.stdout + out.stderr
    job = _summary(tmp_path / "run")["quiet"]
    assert job["status"] == "failed" and job["attempts"] == 1
    assert "no output for" in job["history"][0]["hung"] and "no training monitor" in job["history"][0]["hung"]
    assert job["history"][0]["seconds"] < 60


def test_off_and_bad_values(fake_gpus, run_cli, tmp_path):
    fake_gpus(None)
    (tmp_path / "ok.py").write_text("print('ok')\n")
    out = run_cli("run", "--run-dir", "run", "--hang-timeout", "soon", "ok.py")
    assert out.returncode == 1 and "--hang-timeout='soon': expected 'auto', 'off'" in out.stderr
    out = run_cli("run", "--run-dir", "run", "--hang-timeout", "off", "ok.py")
    assert out.returncode == 0, out.stderr
    assert "--hang-timeout auto|DURATION|off" in run_cli("run", "--help").stdout
