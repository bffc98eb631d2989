"""Energy per run, its money and cloud equivalent, the cost ledger and `colabkit costs`: the NVML stand-in with
and without an energy counter, a fake RAPL tree (a real file tree read by the real code), real subprocesses."""
from __future__ import annotations

import json
import os
import re
import sys
import time

import pytest

from colabkit.health import ledger
from colabkit.health.energy import EnergyMeter, Rapl


def _meter(seconds: float = 0.6, **kwargs) -> dict:
    meter = EnergyMeter(**kwargs).start()
    for _ in range(3):
        time.sleep(seconds / 3)
        meter.sample()
    return meter.reading()


def _rapl_tree(root, zones: dict):
    """zones: {"intel-rapl:0": (energy_uj, max_energy_range_uj) or None (unreadable)}."""
    for name, values in zones.items():
        zone = root / name
        zone.mkdir(parents=True, exist_ok=True)
        if values is not None:
            (zone / "energy_uj").write_text(f"{values[0]}\n")
            (zone / "max_energy_range_uj").write_text(f"{values[1]}\n")
    return root


def test_counter_gpu_and_power_only_gpu(fake_gpus):
    fake_gpus("energy_box")    # GPU 0 (RTX 4090, 360 W) has a counter; GPU 1 (GTX 1080 Ti, 240 W) has none
    r = _meter()
    assert r["gpus"] == ["NVIDIA GeForce RTX 4090", "NVIDIA GeForce GTX 1080 Ti"]
    assert r["method"] == "counter+power" and r["estimate"] is False
    watts = r["gpu_kwh"] * 3.6e6 / r["seconds"]
    assert watts == pytest.approx(600, rel=0.2)           # both draw 600 W together
    assert r["gpu_hours"] == pytest.approx(2 * r["seconds"] / 3600, rel=1e-3)


def test_power_samples_integrated_without_a_counter(fake_gpus, monkeypatch):
    fake_gpus("energy_box")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    r = _meter()
    assert r["gpus"] == ["NVIDIA GeForce GTX 1080 Ti"] and r["method"] == "power", r["note"]
    # trapezoids from the first sample (at start) to the last: 240 W over that span
    assert r["gpu_kwh"] * 3.6e6 / r["seconds"] == pytest.approx(240, rel=0.1)


def test_a_gpu_shared_with_another_process_is_an_estimate(fake_gpus):
    data = fake_gpus("energy_shared")    # an A100 at 400 W that also runs pid 4242
    r = _meter()
    # this process is not on the GPU (or NVML lists other process ids, as in a container): it cannot say what
    # share is its own, so the whole GPU counts, as an estimate
    assert r["estimate"] is True and "shared" in r["why_estimate"][0]
    assert r["gpu_kwh"] * 3.6e6 / r["seconds"] == pytest.approx(400, rel=0.2)
    gpu = dict(data["gpus"][0], processes=data["gpus"][0]["processes"] + [
        {"pid": os.getpid(), "name": "python3", "used_memory": 9000}])
    fake_gpus("energy_shared", gpus=[gpu])
    r = _meter()
    assert r["estimate"] is True
    assert r["gpu_kwh"] * 3.6e6 / r["seconds"] == pytest.approx(200, rel=0.2)   # split with the other process


def test_rapl_packages_wrap_around_and_unreadable_zones(tmp_path, monkeypatch):
    root = _rapl_tree(tmp_path / "powercap", {"intel-rapl:0": (262_143_000_000, 262_143_328_850),
                                              "intel-rapl:0:0": (5, 262_143_328_850),   # a subzone: inside :0
                                              "intel-rapl:1": (1_000_000, 262_143_328_850),
                                              "intel-rapl:2": None})                    # root only
    monkeypatch.setenv("COLABKIT_TEST_POWERCAP", str(root))
    rapl = Rapl()
    assert [z["path"].name for z in rapl.zones] == ["intel-rapl:0", "intel-rapl:1"]
    (root / "intel-rapl:0" / "energy_uj").write_text("1000000\n")     # wrapped: 328850 + 1000000 uJ
    (root / "intel-rapl:1" / "energy_uj").write_text("3000000\n")     # +2 J
    assert rapl.sample() == pytest.approx(1.32885 + 2.0)
    (root / "intel-rapl:1" / "energy_uj").write_text("4000000\n")
    assert rapl.sample() == pytest.approx(1.0)


def test_the_cpu_figure_is_an_estimate_while_another_program_uses_a_gpu_of_the_box(fake_gpus, tmp_path,
                                                                                   monkeypatch):
    data = fake_gpus("energy_box")
    other = dict(data["gpus"][1], processes=[{"pid": 4242, "name": "python3", "used_memory": 9000}])
    fake_gpus("energy_box", gpus=[data["gpus"][0], other])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")        # this run: GPU 0, which nobody else uses
    root = _rapl_tree(tmp_path / "powercap", {"intel-rapl:0": (1_000_000, 262_143_328_850)})
    monkeypatch.setenv("COLABKIT_TEST_POWERCAP", str(root))
    meter = EnergyMeter().start()
    (root / "intel-rapl:0" / "energy_uj").write_text("3000000\n")
    meter.sample()
    r = meter.reading()
    assert r["cpu_kwh"] == pytest.approx(2.0 / 3.6e6)
    assert r["estimate"] is True and r["why_estimate"] == ["CPU energy is the whole box's, shared"]


def test_no_rapl_means_no_cpu_figure(tmp_path, monkeypatch, fake_gpus):
    fake_gpus(None)
    monkeypatch.setenv("COLABKIT_TEST_POWERCAP", str(tmp_path / "none"))
    r = _meter(0.1)
    assert r["cpu_kwh"] is None and r["kwh"] is None and "no readable RAPL" in r["note"]


def test_monitored_loop_reports_kwh_money_cloud_and_books_the_ledger(fake_gpus, tmp_path, monkeypatch):
    fake_gpus("energy_box")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    root = _rapl_tree(tmp_path / "powercap", {"intel-rapl:0": (1_000_000, 262_143_328_850)})
    monkeypatch.setenv("COLABKIT_TEST_POWERCAP", str(root))
    monkeypatch.setenv("COLABKIT_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("COLABKIT_ELECTRICITY_PRICE", "0.40")
    monkeypatch.setenv("COLABKIT_CURRENCY", "EUR")
    monkeypatch.setenv("COLABKIT_PROJECT", "lora")
    from colabkit.health import monitor
    with monitor(sample_every="0.1s", verbose=0, hang_timeout="off") as mon:
        for step in range(6):
            time.sleep(0.05)
            (root / "intel-rapl:0" / "energy_uj").write_text(f"{1_000_000 + 500_000 * (step + 1)}\n")
            mon.step(loss=1.0 / (step + 1))
    report = mon.report()
    energy = report["energy"]
    assert energy["gpus"] == ["NVIDIA GeForce RTX 4090"] and energy["gpu_kwh"] > 0
    assert energy["cpu_kwh"] == pytest.approx(3.0 / 3.6e6)            # the 3 J the fake package counted
    assert energy["estimate"] is False                  # nothing else ran on the box's GPUs
    assert energy["money"] == pytest.approx(energy["kwh"] * 0.40) and energy["currency"] == "EUR"
    assert energy["cloud"]["as"] == "aws g5 (A10G)" and energy["cloud"]["date"]
    assert "kWh" in report["text"] and "EUR" in report["text"] and "cloud" in report["text"]
    records = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["final"] and records[0]["project"] == "lora"
    assert records[0]["kind"] == "fit" and records[0]["money"] == pytest.approx(records[0]["kwh"] * 0.40)


def _write_ledger(path, records, torn: str = ""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + torn)


def _rec(run_id, user, project, end, gpu_hours, kwh, cloud, money=None, lost=0.0, steps=0, estimate=False):
    return {"id": run_id, "kind": "job", "start": end - 3600, "end": end, "user": user, "project": project,
            "gpus": ["NVIDIA GeForce RTX 4090"], "gpu_count": 1, "gpu_hours": gpu_hours, "kwh": kwh,
            "estimate": estimate, "money": money, "currency": "USD", "cloud_cost": cloud,
            "cloud_as": "aws g5 (A10G)", "cloud_date": "2024-06", "cloud_currency": "USD",
            "lost_gpu_hours": lost, "lost_steps": steps, "final": True}


def test_costs_sums_per_user_and_project_since_a_date(tmp_path, run_cli, monkeypatch):
    path = tmp_path / "ledger.jsonl"
    nov = time.mktime((2026, 11, 10, 12, 0, 0, 0, 0, -1))
    oct_ = time.mktime((2026, 10, 1, 12, 0, 0, 0, 0, -1))
    running = dict(_rec("r3", "bob", "gan", nov, 1.0, 0.3, 1.0), final=False)
    _write_ledger(path, [
        _rec("r1", "ana", "lora", nov, 2.0, 0.8, 2.0, money=0.24),
        _rec("r2", "ana", "gan", oct_, 4.0, 1.6, 4.0, lost=1.0, steps=120),
        running, dict(running, gpu_hours=3.0, kwh=0.9, cloud_cost=3.0),     # r3's later record counts
        _rec("r4", "bob", "lora", nov, 1.0, 0.5, 1.0, lost=0.5, estimate=True),
    ], torn='{"id": "r5", "user": "ana", "gpu_ho')
    monkeypatch.setenv("COLABKIT_LEDGER", str(path))
    monkeypatch.setenv("COLABKIT_ELECTRICITY_PRICE", "0.30")

    out = run_cli("costs", "--by", "user", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    rows = {r["key"]: r for r in data["rows"]}
    assert rows["ana"]["runs"] == 2 and rows["ana"]["gpu_hours"] == pytest.approx(6.0)
    # r1 kept its own money; r2 is priced at today's 0.30/kWh
    assert rows["ana"]["money"] == pytest.approx(0.24 + 1.6 * 0.30)
    assert rows["ana"]["saved"] == pytest.approx(6.0 - 0.24 - 0.48)
    assert rows["ana"]["lost_gpu_hours"] == 1.0 and rows["ana"]["lost_steps"] == 120
    assert rows["bob"]["gpu_hours"] == pytest.approx(4.0) and rows["bob"]["kwh"] == pytest.approx(1.4)
    assert rows["bob"]["estimate"] is True and data["total"]["runs"] == 4

    out = run_cli("costs", "--since", "2026-11-01", "--json")     # by project
    rows = {r["key"]: r for r in json.loads(out.stdout)["rows"]}
    assert set(rows) == {"lora", "gan"} and rows["gan"]["runs"] == 1 and rows["lora"]["runs"] == 2
    assert rows["lora"]["kwh"] == pytest.approx(1.3) and rows["lora"]["lost_gpu_hours"] == 0.5

    text = run_cli("costs", "--since", "2026-11-01").stdout
    assert "since 2026-11-01" in text and "lora" in text and "~" in text and "prices of 2024-06" in text
    assert "no electricity price" not in text


def test_costs_without_a_price_says_how_to_set_it_and_rejects_a_bad_date(tmp_path, run_cli, monkeypatch):
    path = tmp_path / "ledger.jsonl"
    _write_ledger(path, [_rec("r1", "ana", "lora", time.time(), 2.0, 0.8, 2.0)])
    monkeypatch.setenv("COLABKIT_LEDGER", str(path))
    out = run_cli("costs")
    assert out.returncode == 0 and "electricity_price" in out.stdout
    assert re.search(r"lora\s+1\s+2\.00\s+0\.8\s+-\s+2\.00\s+-", out.stdout), out.stdout
    bad = run_cli("costs", "--since", "last tuesday")
    assert bad.returncode == 1 and "--since 'last tuesday'" in bad.stderr and "2026-11-01" in bad.stderr
    with pytest.raises(ValueError, match="'user' or 'project'"):
        ledger.costs(by="host")


def test_concurrent_appends_stay_whole_lines(tmp_path):
    path = tmp_path / "ledger.jsonl"
    code = ("import sys\nfrom colabkit.health import ledger\n"
            "for i in range(200):\n"
            "    ledger.append({'id': sys.argv[2] + str(i), 'pad': 'x' * 3000, 'gpu_hours': 1.0}, sys.argv[1])\n")
    import subprocess
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), tag]) for tag in "ab"]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    assert len(ledger.read(path)) == 400


def test_the_gpus_a_run_claimed_are_the_ones_metered(fake_gpus):
    fake_gpus("energy_box")
    import colabkit
    colabkit.use_gpus("1")          # claims GPU 1 machine-wide and makes it the only one this process sees
    try:
        r = _meter(0.1)
    finally:
        colabkit.use_gpus(0)
    assert r["gpus"] == ["NVIDIA GeForce GTX 1080 Ti"]


def test_cloud_prices_from_the_config_file(tmp_path, monkeypatch):
    from colabkit import config
    from colabkit.health import prices
    cfg = tmp_path / "config.toml"
    cfg.write_text('electricity_price = 0.5\n[cloud_prices]\ndate = "2026-11"\n"aws g6e (L40S)" = 1.861\n'
                   '[cloud_prices.compare]\n"RTX 6000 Ada" = "aws g6e (L40S)"\n')
    monkeypatch.setenv("COLABKIT_CONFIG", str(cfg))
    settings = config.load()
    reading = {"gpus": ["NVIDIA RTX 6000 Ada Generation", "NVIDIA GeForce RTX 3090"], "gpu_hours": 2.0, "kwh": 1.0}
    priced = prices.costs_of(reading, settings)
    assert priced["money"] == 0.5 and priced["cloud"]["date"] == "2026-11"
    assert priced["cloud"]["cost"] == pytest.approx(1.861 + 1.006)        # the 3090 compared with an A10G
    assert priced["saved"] == pytest.approx(1.861 + 1.006 - 0.5)
    cfg.write_text('[cloud_prices]\n"aws g5 (A10G)" = "cheap"\n')
    with pytest.raises(config.ConfigError, match="cloud_prices"):
        config.load()
    cfg.write_text('[cloud_prices.compare]\n"RTX 4090" = "nowhere"\n')
    with pytest.raises(ValueError, match="names no price"):
        prices.price_table()


def test_keras_fit_report_has_energy_and_books_one_fit(tf_keras, fake_gpus, tmp_path, monkeypatch):
    _tf, keras = tf_keras
    import numpy as np

    import colabkit
    from tests.health.conftest import tiny_model
    fake_gpus("energy_box")
    monkeypatch.setenv("COLABKIT_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("COLABKIT_ELECTRICITY_PRICE", "0.30")
    x = np.random.default_rng(0).random((256, 32), dtype="float32")
    monitor = colabkit.keras.Monitor(sample_every="0.2s", verbose=0)
    tiny_model(keras).fit(x, x[:, :1], epochs=2, batch_size=32, verbose=0, callbacks=[monitor])
    report = monitor.report()
    assert report["energy"]["gpu_count"] == 2 and report["energy"]["kwh"] > 0
    assert report["energy"]["money"] == pytest.approx(report["energy"]["kwh"] * 0.30)
    assert "kWh" in monitor.text()
    runs = ledger.read(tmp_path / "ledger.jsonl")
    assert len(runs) == 1 and runs[0]["kind"] == "fit" and runs[0]["final"]


def test_a_long_run_appends_as_it_goes_and_the_last_record_counts(fake_gpus, tmp_path, monkeypatch):
    fake_gpus("energy_box")
    monkeypatch.setattr(ledger, "APPEND_EVERY", 0.0)     # every sample (the default is every 5 minutes)
    monkeypatch.setenv("COLABKIT_LEDGER", str(tmp_path / "ledger.jsonl"))
    from colabkit.health.runcost import RunCost
    cost = RunCost("fit", project="p").start()
    for _ in range(3):
        time.sleep(0.05)
        cost.sample()
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    assert len(lines) == 3 and not json.loads(lines[-1])["final"]      # a crash now would keep these
    cost.book(final=True)
    runs = ledger.read(tmp_path / "ledger.jsonl")
    assert len(runs) == 1 and runs[0]["final"] and runs[0]["gpu_hours"] >= json.loads(lines[-1])["gpu_hours"]


def test_which_project_a_run_is_booked_under(fake_gpus, tmp_path, monkeypatch):
    fake_gpus(None)
    from colabkit.health.runcost import RunCost
    monkeypatch.chdir(tmp_path)
    assert RunCost("fit").project == tmp_path.name                         # the working folder's name
    assert RunCost("job", fallback="train").project == "train"             # a job's name
    monkeypatch.setenv("COLABKIT_PROJECT", "lora")
    assert RunCost("job", fallback="train").project == "lora"              # the setting
    assert RunCost("fit", project="gan").project == "gan"                  # the monitor's argument


def test_costs_reads_a_ledger_edited_by_hand_and_names_the_lines_it_skips(tmp_path, run_cli, monkeypatch):
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("COLABKIT_LEDGER", str(path))
    monkeypatch.setenv("COLABKIT_CURRENCY", "USD")
    monkeypatch.setenv("COLABKIT_ELECTRICITY_PRICE", "0.30")
    end = time.time()
    path.write_text("\n".join([
        # priced in EUR before the currency setting changed: priced again in USD, not summed as dollars
        json.dumps({"id": "a", "end": end, "project": "p1", "gpu_hours": 2.0, "kwh": 0.8, "money": 0.24,
                    "currency": "EUR", "cloud_cost": 3.0, "cloud_currency": "USD"}),
        json.dumps({"id": "b", "end": str(end), "project": "p1", "gpu_hours": "2.5", "kwh": "1.0"}),  # quoted
        "[1, 2]",
        json.dumps({"id": ["x"], "end": end}),
        json.dumps({"id": "c", "end": end, "project": "p1", "kwh": "lots"}),
    ]) + "\n")
    done = run_cli("costs", "--since", "1d", "--json")
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)["rows"][0]
    assert (row["runs"], row["gpu_hours"], round(row["kwh"], 6)) == (2, 4.5, 1.8)
    assert round(row["money"], 6) == 0.54 and round(row["saved"], 6) == 2.76
    shown = run_cli("costs").stdout
    assert f"3 line(s) of {path} skipped, not a run record with numeric figures (line 3, 4, 5)" in shown


def test_a_lower_case_currency_is_still_compared_with_the_cloud(tmp_path, monkeypatch):
    from colabkit import config
    from colabkit.health import prices
    cfg = tmp_path / "config.toml"
    cfg.write_text('electricity_price = 0.5\ncurrency = "eur"\n[cloud_prices]\ncurrency = "Eur"\n'
                   '"aws g6e (L40S)" = 1.8\n[cloud_prices.compare]\n"RTX 6000 Ada" = "aws g6e (L40S)"\n')
    monkeypatch.setenv("COLABKIT_CONFIG", str(cfg))
    priced = prices.costs_of({"gpus": ["NVIDIA RTX 6000 Ada Generation"], "gpu_hours": 1.0, "kwh": 1.0},
                             config.load())
    assert priced["currency"] == "EUR" and priced["cloud"]["currency"] == "EUR"
    assert priced["saved"] == pytest.approx(1.8 - 0.5)
