"""`colabkit run` meters each job by its slot's GPUs: summary.json, the progress line and the cost ledger."""
from __future__ import annotations

import json

import pytest

JOB = '''
import os, sys, time
time.sleep({sleep})
sys.exit(1 if os.environ["COLABKIT_JOB_ATTEMPT"] == "1" and {fail_first} else 0)
'''


def test_two_jobs_get_energy_in_summary_and_ledger_records(fake_gpus, run_cli, tmp_path):
    fake_gpus("energy_box")      # GPU 0: RTX 4090 with an energy counter, GPU 1: GTX 1080 Ti without
    ledger = tmp_path / "ledger.jsonl"
    env_file = tmp_path / "config.toml"
    env_file.write_text(f'electricity_price = 0.25\nledger = "{ledger}"\n')
    (tmp_path / "a.py").write_text(JOB.format(sleep=1.0, fail_first=False))
    (tmp_path / "b.py").write_text(JOB.format(sleep=0.5, fail_first=True))
    import os
    env = dict(os.environ, COLABKIT_CONFIG=str(env_file))
    out = run_cli("run", "--run-dir", "run", "--retries", "1", "--gpus", "0,1", "a.py", "b.py", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "done    a in" in out.stdout and "kWh" in out.stdout and "cloud" in out.stdout
    assert "colabkit run: energy of all jobs:" in out.stdout and "lost to failed or hung attempts" in out.stdout

    jobs = {j["name"]: j for j in json.loads((tmp_path / "run" / "summary.json").read_text())["jobs"]}
    a, b = jobs["a"]["energy"], jobs["b"]["energy"]
    assert a["gpus"] == ["NVIDIA GeForce RTX 4090"] and a["gpu_kwh"] > 0 and a["gpu_hours"] > 0
    assert a["money"] == pytest.approx(a["kwh"] * 0.25) and a["cloud_cost"] > 0 and a["lost_gpu_hours"] == 0
    assert len(b["attempts"]) == 2 and b["gpu_kwh"] > 0          # GPU 1: power samples, no counter
    assert b["lost_gpu_hours"] == pytest.approx(b["attempts"][0]["gpu_hours"])   # the failed attempt

    records = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert sorted(r["project"] for r in records) == ["a", "b", "b"]
    assert all(r["kind"] == "job" and r["final"] and r["gpu_count"] == 1 for r in records)

    costs = run_cli("costs", "--json", env=env)
    rows = {r["key"]: r for r in json.loads(costs.stdout)["rows"]}
    assert rows["b"]["runs"] == 2 and rows["b"]["lost_gpu_hours"] == pytest.approx(b["lost_gpu_hours"])
    assert rows["a"]["kwh"] == pytest.approx(a["kwh"]) and rows["a"]["saved"] == pytest.approx(
        a["cloud_cost"] - a["money"])
