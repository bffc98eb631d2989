"""What `colabkit run --cluster` costs: per-job overhead against a local `colabkit run` of the same jobs, and
the time from a node's death to its job running again on another node.

    python bench/cluster_overhead.py [-n 8] [--sleep 1.0] [--rounds 2]

Runs a real Ray cluster on this machine (a head without GPUs and two nodes of two logical GPUs each, in a
network and pid namespace of its own, as tests/cluster does; Linux, root or unprivileged user namespaces).
Baseline, measured in the same run: `colabkit run --per-gpu 4` of the same N jobs on this machine (4 CPU slots,
as the cluster's 4 GPU slots). Each job sleeps --sleep seconds; the overhead per job is the difference of
wall times divided by the number of waves (N / 4). Failover: a job saving a checkpoint every step is killed
with its node (SIGKILL of the raylet and everything below it); the figure is the time from the kill to the
restarted job's first line on the other node (Ray's node health checks were shortened to 1 s x 3, as in the
tests; Ray's default is about 30 s more).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)

from tests.cluster.conftest import namespaces_work, read_summary, start_cluster

SLEEPER = "import time, os\nprint('start', os.environ['COLABKIT_JOB'], time.time(), flush=True)\ntime.sleep({s})\n"
CHECKPOINTED = '''
import os, sys, time
import numpy as np
import colabkit
shared = {shared!r}
attempt = int(os.environ["COLABKIT_JOB_ATTEMPT"])
with open(os.path.join(shared, f"started-{{attempt}}"), "w") as fh:
    fh.write(str(time.time()))
ckpt = colabkit.Checkpoints(os.path.join(shared, "ckpt"))
restored = ckpt.restore()
start = 0 if restored is None else restored.step + 1
for step in range(start, 6):
    ckpt.save(step, {{"x": np.array(step)}}, wait=True)
    if attempt == 1 and step == 2:
        with open(os.path.join(shared, "kill-me"), "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(120)
ckpt.close()
'''


def _wall(cmd, cwd) -> float:
    began = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    took = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])}... failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=8, help="jobs per run (default 8)")
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds each job sleeps (default 1)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each kind, alternating (default 2)")
    opts = parser.parse_args()
    why = namespaces_work()
    if why:
        print(f"skipped: {why}")
        return 0
    base = Path(tempfile.mkdtemp(prefix="ck-bench-cluster-"))
    jobs = base / "jobs"
    jobs.mkdir()
    paths = []
    for i in range(opts.n):
        path = jobs / f"job{i}.py"
        path.write_text(SLEEPER.format(s=opts.sleep))
        paths.append(str(path))
    t0 = time.perf_counter()
    cluster = start_cluster(base / "cluster")
    start_s = time.perf_counter() - t0
    try:
        local, remote = [], []
        for r in range(opts.rounds):
            local.append(_wall([sys.executable, "-m", "colabkit", "run", "--per-gpu", "4", "--gpus", "auto",
                                "--run-dir", str(base / f"local-{r}"), *paths], base))
            remote.append(_wall(cluster.command(sys.executable, "-m", "colabkit", "run", "--cluster",
                                                cluster.address, "--run-dir", str(base / f"cluster-{r}"), *paths),
                                base))
        waves = -(-opts.n // 4)
        best_local, best_remote = min(local), min(remote)
        per_job = (best_remote - best_local) / waves

        shared = base / "shared"
        shared.mkdir()
        (jobs / "ckpt_job.py").write_text(CHECKPOINTED.format(shared=str(shared)))
        driver = subprocess.Popen(cluster.command(sys.executable, "-m", "colabkit", "run", "--cluster",
                                                  cluster.address, "--retries", "1", "--run-dir",
                                                  str(base / "failover"), str(jobs / "ckpt_job.py")),
                                  cwd=base, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        marker = shared / "kill-me"
        deadline = time.time() + 180
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.1)
        killed_at = time.time()
        cluster.kill_node_of(int(marker.read_text()))
        out, _ = driver.communicate(timeout=240)
        again = float((shared / "started-2").read_text()) - killed_at
        summary = read_summary(base / "failover")
        assert summary and summary["exit_code"] == 0, out
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)

    print(f"machine: {platform.machine()}, {platform.system()}, Python {platform.python_version()}; "
          f"cluster start (3 nodes): {start_s:.1f}s")
    print(f"{opts.n} jobs of {opts.sleep:g}s, 4 at a time, best of {opts.rounds}:")
    print(f"  local colabkit run --per-gpu 4   {best_local:6.2f}s   (runs: {', '.join(f'{x:.2f}' for x in local)})")
    print(f"  colabkit run --cluster           {best_remote:6.2f}s   (runs: {', '.join(f'{x:.2f}' for x in remote)})")
    print(f"  ratio cluster/local {best_remote / best_local:.2f}; overhead per job {per_job:+.2f}s "
          f"(difference / {waves} wave(s))")
    print(f"node killed -> the job's next attempt running on the other node: {again:.1f}s")
    print(json.dumps({"local_s": local, "cluster_s": remote, "per_job_s": per_job, "failover_s": again}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
