"""The thermal guard: training waits between steps while a GPU stays too hot and resumes by itself once it cooled,
ending bit-equal to the same training without a pause; a signal during a pause still saves and stops; bad settings
are refused by name.

The GPU is the NVML stand-in over tests/standins/gpu/scenarios/hot_office.json ("live": the stand-in re-reads the
file when it changes): the test cools the GPU by rewriting the file once the run has recorded its pause.

Run as a script, this file is a training worker: ``python test_thermal.py torch-hot DIRECTORY``.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.checkpoints.conftest import ck_env  # noqa: F401 - isolated cache, config and Drive root

HERE = Path(__file__).resolve()


def _set_gpu(**values) -> None:
    """Change the stand-in GPU now (atomically, as the live scenario is re-read on change)."""
    path = Path(os.environ["COLABKIT_TEST_GPUS"])
    data = json.loads(path.read_text())
    data["gpus"][0].update(values)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class CoolOnPause:
    """Cools the stand-in GPU once ``run`` (a run record) has recorded a thermal pause."""

    def __init__(self, run):
        self.run, self.done = run, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        while not self.done.wait(0.01):
            if any(kind == "thermal-pause" for _, kind, _ in list(self.run.events)):
                _set_gpu(temperature=80, clocks_event_reasons=[])
                return

    def stop(self):
        self.done.set()
        self.thread.join()


def _guard(poll_s=0.02, **options):
    from colabkit.health import ThermalGuard
    return ThermalGuard(slowdown_for=0, poll_s=poll_s, **options)


@pytest.fixture
def hot_gpu(ck_env, monkeypatch, request):  # noqa: F811 - the shared fixture imported above
    """The hot GPU of hot_office.json; a PyTorch or TensorFlow loaded before stays loaded (neither imports twice)."""
    loaded = {name: sys.modules[name] for name in ("torch", "tensorflow") if name in sys.modules}
    use = request.getfixturevalue("fake_gpus")
    for name, module in loaded.items():
        monkeypatch.setitem(sys.modules, name, module)
    return use("hot_office")


def _lines(out: str, text: str) -> list:
    return [line for line in out.splitlines() if text in line]


def test_keras_fit_waits_while_the_gpu_is_hot_and_ends_bit_equal(tmp_path, hot_gpu, tf_keras, capsys):
    import colabkit.keras
    from tests.health.conftest import tiny_model
    _, keras = tf_keras
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 32)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")

    def fit(name, guard):
        keras.utils.set_random_seed(0)
        model = tiny_model(keras)
        ar = colabkit.keras.AutoResume(str(tmp_path / name), deadline=None, thermal_guard=guard)
        cooler = CoolOnPause(ar.record)
        try:
            model.fit(x, y, epochs=3, batch_size=8, callbacks=[ar], verbose=0)
        finally:
            cooler.stop()
        return model.get_weights(), ar

    plain, _ = fit("plain", False)
    paused, ar = fit("paused", _guard())
    out = capsys.readouterr().out
    assert all(np.array_equal(a, b) for a, b in zip(plain, paused))
    assert _lines(out, "training paused") == [
        "colabkit: GPU 0 at 93 C (thermal slowdown for 0s): training paused until it cools below 85 C"]
    resumed = _lines(out, "training resumes")
    assert len(resumed) == 1 and resumed[0].startswith("colabkit: GPU 0 cooled to 80 C after ")
    assert [kind for _, kind, _ in ar.record.events if kind.startswith("thermal")] == ["thermal-pause",
                                                                                        "thermal-resume"]


def _torch_loop(directory, guard, cool=True, deadline=None):
    import torch

    import colabkit.torch
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    ar = colabkit.torch.AutoResume(str(directory), deadline=deadline, thermal_guard=guard, model=model, opt=opt)
    cooler = CoolOnPause(ar.record) if cool else None
    try:
        for _epoch in ar.epochs(2):
            for xb, yb in ar.batches(loader):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(xb), yb).backward()
                opt.step()
    finally:
        if cooler is not None:
            cooler.stop()
    return [p.detach().clone() for p in model.parameters()], ar


def test_torch_loop_waits_while_the_gpu_is_hot_and_ends_bit_equal(tmp_path, hot_gpu, capsys):
    torch = pytest.importorskip("torch")
    plain, _ = _torch_loop(tmp_path / "plain", False)
    paused, ar = _torch_loop(tmp_path / "paused", _guard(max_gpu_temperature=88))
    out = capsys.readouterr().out
    assert all(torch.equal(a, b) for a, b in zip(plain, paused))
    # the user's own limit is lower than the slowdown threshold: the GPU must cool below it, less the margin
    assert _lines(out, "training paused") == [
        "colabkit: GPU 0 at 93 C (thermal slowdown for 0s): training paused until it cools below 83 C"]
    assert len(_lines(out, "cooled to 80 C")) == 1
    assert ar.step == 16


@pytest.mark.slow
def test_accelerate_loop_waits_while_the_gpu_is_hot_and_ends_bit_equal(tmp_path, hot_gpu, capsys):
    torch = pytest.importorskip("torch")
    pytest.importorskip("accelerate")

    def train(name, guard):
        from accelerate import Accelerator

        import colabkit.hf
        torch.manual_seed(0)
        accelerator = Accelerator(cpu=True)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.utils.data.TensorDataset(torch.randn(12, 3))
        model, opt, loader = accelerator.prepare(model, opt, torch.utils.data.DataLoader(data, batch_size=4,
                                                                                         shuffle=True))
        ar = colabkit.hf.AccelerateResume(tmp_path / name, accelerator, deadline=None, thermal_guard=guard)
        cooler = CoolOnPause(ar.record)
        try:
            for _ in ar.epochs(2):
                for (x,) in ar.batches(loader):
                    opt.zero_grad()
                    accelerator.backward(model(x).sum())
                    opt.step()
        finally:
            cooler.stop()
            ar.close()
        return model.weight.detach().clone()

    plain = train("plain", False)
    paused = train("paused", _guard())
    out = capsys.readouterr().out
    assert torch.equal(plain, paused)
    assert len(_lines(out, "training paused")) == 1 and len(_lines(out, "training resumes")) == 1


@pytest.mark.slow
def test_lightning_and_hf_trainer_wait_while_the_gpu_is_hot_and_end_bit_equal(tmp_path, hot_gpu, capsys):
    torch = pytest.importorskip("torch")
    lightning = pytest.importorskip("lightning")
    transformers = pytest.importorskip("transformers")
    import colabkit.hf
    import colabkit.torch_lightning

    class Module(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, index):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit_lightning(name, guard):
        torch.manual_seed(0)
        module = Module()
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=4)
        ar = colabkit.torch_lightning.AutoResume(tmp_path / name, deadline=None, thermal_guard=guard)
        cooler = CoolOnPause(ar.record)
        try:
            lightning.Trainer(max_epochs=2, callbacks=[ar], accelerator="cpu", logger=False, enable_progress_bar=False,
                              enable_model_summary=False, default_root_dir=tmp_path).fit(module, loader)
        finally:
            cooler.stop()
        return module.layer.weight.detach().clone()

    class Regression(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x, labels=None):
            return {"loss": ((self.layer(x) - labels) ** 2).mean()}

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            return {"x": torch.full((4,), float(i) / 16), "labels": torch.tensor([1.0])}

    def fit_trainer(name, guard):
        torch.manual_seed(0)
        model = Regression()
        ar = colabkit.hf.AutoResume(tmp_path / name, deadline=None, thermal_guard=guard)
        args = transformers.TrainingArguments(str(tmp_path / f"out-{name}"), num_train_epochs=2, report_to=[],
                                              per_device_train_batch_size=4, use_cpu=True, save_strategy="no",
                                              logging_strategy="no", disable_tqdm=True, seed=0)
        cooler = CoolOnPause(ar.record)
        try:
            transformers.Trainer(model=model, args=args, train_dataset=Data(), callbacks=[ar]).train()
        finally:
            cooler.stop()
        return model.layer.weight.detach().clone()

    for fit in (fit_lightning, fit_trainer):
        plain = fit(f"{fit.__name__}-plain", False)
        _set_gpu(temperature=93, clocks_event_reasons=["sw_thermal_slowdown"])   # hot again for this fit
        paused = fit(f"{fit.__name__}-paused", _guard())
        out = capsys.readouterr().out
        assert torch.equal(plain, paused), fit.__name__
        assert len(_lines(out, "training paused")) == 1 and len(_lines(out, "training resumes")) == 1, out


def test_a_deadline_ends_a_pause_and_its_save_and_stop_follow(tmp_path, hot_gpu, capsys):
    pytest.importorskip("torch")
    import colabkit.torch
    # a 30s budget is inside the 60s deadline margin: its save is due at the first batch, on a GPU that never cools
    with pytest.raises(colabkit.torch.Stopped, match=r"saved step 1 .* and stopped training"):
        _torch_loop(tmp_path / "run", _guard(), cool=False, deadline="30s")
    out = capsys.readouterr().out
    assert len(_lines(out, "training paused")) == 1
    ended = _lines(out, "thermal pause ended early after ")
    assert len(ended) == 1 and "the 30s time budget is" in ended[0], out


def test_max_gpu_temperature_alone_pauses_and_the_margin_decides_when_it_resumes(hot_gpu):
    from colabkit.resume.run import Run
    _set_gpu(temperature=86, clocks_event_reasons=[])
    guard = _guard(max_gpu_temperature=85, resume_margin=3, poll_s=600)   # read by this test alone after start
    guard.attach(Run(guard, "test"))
    assert guard.start()
    try:
        assert guard.paused
        _set_gpu(temperature=83)      # below 85 but not below 85 - 3: still hot
        guard.check()
        assert guard.paused
        _set_gpu(temperature=81)
        guard.check()
        assert not guard.paused
    finally:
        guard.stop()


def test_a_training_monitor_takes_a_pause_for_neither_a_hang_nor_a_step(hot_gpu, tmp_path, monkeypatch):
    import colabkit
    from colabkit.health.watchdog import job_hang_reason, read_heartbeat
    from colabkit.resume.run import Run
    from tests.waiting import wait_for
    for name, value in (("COLABKIT_RUN_DIR", str(tmp_path)), ("COLABKIT_JOB", "train"), ("COLABKIT_JOB_ATTEMPT", "1")):
        monkeypatch.setenv(name, value)   # as in a `colabkit run` job: the monitor writes a heartbeat
    beats, seen = tmp_path / "train.health.json", []
    guard = _guard()
    guard.attach(Run(guard, "test"))
    with colabkit.monitor(tmp_path, hang_timeout="0.2s", first_step_timeout="0.2s", sample_every="0.1s",
                          verbose=0) as mon:
        for _ in range(5):
            mon.step()
        assert guard.start()
        began = time.time()

        def cool_once_watched_past_the_budget():
            # the heartbeat, written by the watchdog's own thread, still shows the pause a second after it began,
            # five hang budgets later
            seen.append(wait_for(lambda: (b := read_heartbeat(beats)) and b["phase"] == "paused"
                                 and b["updated"] > began + 1.0 and b, 60))
            seen.append(job_hang_reason(beats, attempt=1, started=began - 10, log=tmp_path / "train.log",
                                        timeout=0.2, now=time.time()))
            _set_gpu(temperature=80, clocks_event_reasons=[])

        cooler = threading.Thread(target=cool_once_watched_past_the_budget)
        cooler.start()
        guard.wait_if_hot()
        cooler.join()
        mon.step()
    guard.stop()
    assert mon.hangs == []
    assert seen[0]["budget_s"] is None and seen[1] is None    # `colabkit run --hang-timeout 0.2s` kills nothing


def test_power_limit_is_lowered_while_hot_and_put_back_where_permitted(hot_gpu, capsys):
    import pynvml

    from colabkit.resume.run import Run
    guard = _guard(power_limit="80%", poll_s=600)
    guard.attach(Run(guard, "test"))
    assert guard.start()
    guard.stop()
    assert _lines(capsys.readouterr().out, "power limit") == [
        "colabkit: cannot lower GPU 0's power limit (thermal_power_limit): Insufficient Permissions; setting it "
        "needs root (sudo) and a board that allows it"]

    _set_gpu(power_limit_settable=True)
    guard = _guard(power_limit="250W", poll_s=600)
    guard.attach(Run(guard, "test"))
    assert guard.start()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(handle) == 250_000
    guard.stop()
    assert pynvml.nvmlDeviceGetPowerManagementLimit(handle) == 350_000
    assert _lines(capsys.readouterr().out, "power limit") == [
        "colabkit: lowered GPU 0's power limit from 350 W to 250 W while it is hot; the old limit is put back "
        "when training ends",
        "colabkit: put GPU 0's power limit back to 350 W"]


@pytest.mark.slow
def test_sigterm_during_a_pause_saves_and_stops(tmp_path, hot_gpu):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs PyTorch")
    proc = subprocess.Popen([sys.executable, str(HERE), "torch-hot", str(tmp_path / "run")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if "training paused" in line:
            proc.send_signal(signal.SIGTERM)
    assert proc.wait() == -signal.SIGTERM, lines
    assert any(line.startswith("colabkit: thermal pause ended early after ") and line.endswith(": SIGTERM received")
               for line in lines), lines
    assert any(line.startswith("colabkit: SIGTERM received: saved step 1 (") for line in lines), lines


def test_bad_settings_are_refused_by_name(ck_env, monkeypatch):  # noqa: F811
    from colabkit import config
    from colabkit.health import ThermalGuard
    from colabkit.health.thermal import guard_for
    with pytest.raises(config.ConfigError, match=r"'hot' for the max_gpu_temperature argument: expected a temp"):
        ThermalGuard(max_gpu_temperature="hot")
    with pytest.raises(config.ConfigError, match=r"thermal_resume_margin argument: expected degrees C above 0"):
        ThermalGuard(resume_margin=-5)
    with pytest.raises(ValueError, match=r"poll_s=0"):
        ThermalGuard(poll_s=0)
    with pytest.raises(TypeError, match=r"thermal_guard='yes': expected True, False, None"):
        guard_for("yes")
    monkeypatch.setenv("COLABKIT_THERMAL_POWER_LIMIT", "lots")
    with pytest.raises(config.ConfigError, match=r"COLABKIT_THERMAL_POWER_LIMIT: expected \"off\", watts"):
        config.load()
    monkeypatch.setenv("COLABKIT_THERMAL_POWER_LIMIT", "80%")
    monkeypatch.setenv("COLABKIT_MAX_GPU_TEMPERATURE", "83")
    settings = config.load()
    assert settings.thermal_power_limit == "80%" and settings.max_gpu_temperature == 83
    assert settings.thermal_guard is True and settings.thermal_slowdown_for == 30.0
    from colabkit.summary import config_report
    report = config_report(settings)
    assert "max_gpu_temperature    83 " in report and "thermal_power_limit    80% " in report, report
    assert "thermal_resume_margin  5 " in report and "thermal_slowdown_for   30s " in report, report


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parents[2]))
    if sys.argv[1] == "torch-hot":   # a GPU that never cools: only a signal ends the pause
        _torch_loop(sys.argv[2], _guard(), cool=False)
