"""SIGKILL a training process at random moments while it uploads to gdrive:// (the local Drive API server):
every restart resumes from a committed checkpoint, never from a half-uploaded one."""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKERS = Path(__file__).resolve().parent.parent / "checkpoints" / "workers.py"

pytestmark = [pytest.mark.slow, pytest.mark.subprocess_kill]


def test_numpy_state_survives_random_kills_during_drive_uploads(gdrive, tmp_path):
    rng = random.Random(int(os.environ.get("COLABKIT_TEST_SEED", "4321")))
    gdrive.slow_chunk_s = 0.02                     # uploads take long enough to be killed in the middle
    env = {**gdrive.env, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    args = [sys.executable, str(WORKERS), "numpy", "gdrive://runs/kill", "150", "4000000", "5"]
    floor, resumed_any = 0, False
    for _ in range(6):
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # the kill lands at a random moment after training started (the RESUMED line); in the first round,
        # after the first upload, so that some restart has something on Drive to resume from
        wanted = "UPLOADED" if not resumed_any and floor == 0 else "RESUMED"
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(wanted):
                break
        time.sleep(rng.uniform(0.0, 1.5))
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate()
        out = "".join(seen) + out
        assert "INCONSISTENT" not in out and "Traceback" not in err, (out, err)
        resumed = [int(line.split()[1]) for line in out.splitlines() if line.startswith("RESUMED")]
        uploaded = [int(line.split()[1]) for line in out.splitlines() if line.startswith("UPLOADED")]
        if resumed:
            assert resumed[0] >= floor, f"resumed at {resumed[0]}, but step {floor} was on Drive"
            resumed_any |= resumed[0] > 0
        if uploaded:
            floor = max(floor, uploaded[-1])
        shutil_rm(tmp_path / "cache")              # a fresh VM each time: Drive is all that is left
    assert resumed_any, "no restart ever resumed from Drive"
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "DONE 150" in out.stdout


def shutil_rm(path):
    import shutil
    shutil.rmtree(path, ignore_errors=True)
