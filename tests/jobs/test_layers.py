"""colabkit.jobs sits below colabkit.cluster: importing it and building `colabkit run`'s options never loads the
Ray side, which `--cluster` finds through the queue's cluster-runner table."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import colabkit.jobs, colabkit.cli
colabkit.cli.build_parser()
print(json.dumps(sorted(m for m in sys.modules if m.startswith("colabkit.cluster"))))
"""


def test_the_local_queue_loads_nothing_of_the_cluster_side():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_cluster_runs_go_to_the_ray_runner():
    from colabkit.cluster.runner import run_on_cluster
    from colabkit.jobs.queue import cluster_runner
    assert cluster_runner() is run_on_cluster
