"""colabkit.torch_lightning: a Lightning run stopped mid-epoch (SIGTERM, a deadline) and resumed in a fresh process
with ``ckpt_path="last"`` ends bit-equal to an uninterrupted run; the store holds arrays and JSON only.

Run as a script, this file is the training worker: ``python test_lightning_resume.py '<json spec>'``.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")


def _build(spec):
    import lightning as L
    import torch.nn.functional as F

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                           torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
            self.seen = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen.append([self.current_epoch, batch_idx, float(x.sum())])
            return F.binary_cross_entropy_with_logits(self.net(x), y)

        def configure_optimizers(self):
            opt = torch.optim.Adam(self.parameters(), lr=0.01)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]

    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(24, 4, generator=g)
    dataset = torch.utils.data.TensorDataset(x, (x.sum(1, keepdim=True) > 0).float())
    if spec.get("loader") == "plain":
        loader = torch.utils.data.DataLoader(dataset, batch_size=4, shuffle=True,
                                             generator=torch.Generator().manual_seed(5))
    else:
        from torchdata.stateful_dataloader import StatefulDataLoader
        loader = StatefulDataLoader(dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5))
    return Tiny(), loader


def worker(spec):
    import lightning as L

    import colabkit

    model, loader = _build(spec)
    ar = colabkit.torch_lightning.AutoResume(spec["dest"], save_freq=spec.get("save_freq"),
                                             deadline=spec.get("deadline"), verbose=1)

    class Cut(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if [trainer.current_epoch, batch_idx] == spec.get("sigterm_at"):
                os.kill(os.getpid(), signal.SIGTERM)
            if [trainer.current_epoch, batch_idx] == spec.get("crash_at"):
                assert ar.checkpoint_io.checkpoints.wait(120)
                os._exit(3)   # no signal, no save: a reclaimed VM

    trainer = L.Trainer(accelerator="cpu", max_epochs=3, enable_progress_bar=False, logger=False,
                        enable_model_summary=False, default_root_dir=spec["root"], callbacks=[Cut(), ar])
    stopped = None
    handlers = [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)]
    try:
        trainer.fit(model, loader, ckpt_path="last")
    except colabkit.torch_lightning.Stopped as exc:
        stopped = str(exc)
    arrays = {f"model/{k}": v.detach().numpy() for k, v in model.state_dict().items()}
    opt = trainer.optimizers[0].state_dict()
    for i, s in opt["state"].items():
        for k, v in s.items():
            arrays[f"opt/{i}/{k}"] = v.numpy() if isinstance(v, torch.Tensor) else np.array(v)
    arrays["rng/torch"] = torch.get_rng_state().numpy()
    np.savez(spec["out"], **arrays)
    print("RESULT " + json.dumps({"seen": model.seen, "step": trainer.global_step, "stopped": stopped,
                                  "lr": trainer.optimizers[0].param_groups[0]["lr"]}), flush=True)
    if spec.get("after_fit"):
        import weakref
        refs = [weakref.ref(trainer), weakref.ref(model)]
        del trainer, model, ar   # as re-running a notebook cell rebinds them
        after_fit(handlers, refs)


def after_fit(handlers, refs):
    """What a notebook has after fit(): its signal handlers as before, no thread left, the trainer and model
    freed once the cell's names go; then a SIGTERM ends the process as it would without Lightning."""
    import gc
    import threading

    kept = [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)] == handlers
    # the machine's flight recorder (colabkit health --last) records until the process ends, by design
    threads = [t.name for t in threading.enumerate()
               if t is not threading.main_thread() and t.name != "colabkit-flight-recorder"]
    gc.collect()
    alive = [type(r()).__name__ for r in refs if r() is not None]
    print("AFTER " + json.dumps({"handlers_kept": kept, "threads": threads, "alive": alive}), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    print("SURVIVED SIGTERM", flush=True)


def _run(env, expect_rc=0, **spec):
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    explain = f"rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-4000:]}"
    assert proc.returncode == expect_rc, explain
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return (json.loads(lines[0][7:]) if lines else None), proc.stdout, explain


def _compare(tmp_path, name):
    with np.load(tmp_path / "ref.npz") as want, np.load(tmp_path / f"{name}.npz") as got:
        assert sorted(want.files) == sorted(got.files)
        return [k for k in want.files if want[k].shape != got[k].shape or not np.array_equal(want[k], got[k])]


@pytest.mark.slow
def test_sigterm_mid_epoch_or_on_an_epochs_last_batch_then_ckpt_path_last_in_a_fresh_process_is_bit_exact(tmp_path,
                                                                                                        ck_env):
    """SIGTERM at (epoch 1, batch 2), and at an epoch's last batch (6 batches an epoch), which is saved as the
    epoch's end: each resumed run ends where the uninterrupted one does (Lightning restored from a save after
    the last step would skip the next epoch). The uninterrupted run, after fit(), has its signal handlers back as
    they were, no uploader thread, and its trainer and model freed."""
    common = {"root": str(tmp_path / "root")}
    expected, out, explain = _run(ck_env, -signal.SIGTERM, dest=str(tmp_path / "ref"), out=str(tmp_path / "ref.npz"),
                                  after_fit=True, **common)
    after = json.loads(next(ln for ln in out.splitlines() if ln.startswith("AFTER "))[6:])
    assert after == {"handlers_kept": True, "threads": [], "alive": []}, explain
    assert "SURVIVED" not in out, explain   # the SIGTERM after fit() ended it

    _, cut_out, explain = _run(ck_env, 143, dest=str(tmp_path / "run"), out=str(tmp_path / "cut.npz"),
                               sigterm_at=[1, 2], **common)
    assert "SIGTERM received: saved step 9 (committed to" in cut_out, explain
    resumed, out, explain = _run(ck_env, dest=str(tmp_path / "run"), out=str(tmp_path / "resumed.npz"), **common)
    assert "resuming Lightning from step 9 (epoch 1, batch 3)" in out, explain
    assert _compare(tmp_path, "resumed") == [], explain
    assert resumed["step"] == expected["step"] == 18 and resumed["lr"] == expected["lr"]
    assert resumed["seen"] == [s for s in expected["seen"] if (s[0], s[1]) >= (1, 3)], explain

    _, cut_out, explain = _run(ck_env, 143, dest=str(tmp_path / "last"), out=str(tmp_path / "cut.npz"),
                               sigterm_at=[0, 5], **common)
    assert "SIGTERM received: saved step 6 (committed to" in cut_out, explain
    resumed, out, explain = _run(ck_env, dest=str(tmp_path / "last"), out=str(tmp_path / "last.npz"), **common)
    assert "resuming Lightning from step 6 (epoch 0, batch 6)" in out, explain
    assert resumed["step"] == 18 and resumed["seen"] == [s for s in expected["seen"] if s[0] >= 1], explain
    assert _compare(tmp_path, "last") == [], explain

    # what the store holds: arrays and JSON, nothing pickled
    from colabkit.checkpoints.folder import CheckpointFolder
    files = {p.name for c in CheckpointFolder(tmp_path / "run").committed() for p in c.path.iterdir()}
    assert files <= {"arrays.npz", "state.json", "MANIFEST.json"}, files


@pytest.mark.slow
@pytest.mark.parametrize("crash_at, resumed_at", [
    ([1, 4], "step 10 (epoch 1, batch 4)"),
    ([1, 0], "step 6 (epoch 0, batch 6)")],
                         ids=["mid-epoch", "epoch-start"])
def test_killed_without_a_signal_resumes_bit_exactly_from_the_newest_checkpoint(tmp_path, ck_env, crash_at,
                                                                                resumed_at):
    """save_freq=4 (6 batches an epoch): saves at steps 4, 6 (the epoch's end) and 10. Killed in batch (1, 4)
    before its save, the newest is step 10, mid-epoch; in batch (1, 0), the epoch-end one."""
    common = {"root": str(tmp_path / "root"), "save_freq": 4}
    expected, _, _ = _run(ck_env, dest=str(tmp_path / "ref"), out=str(tmp_path / "ref.npz"), **common)
    _run(ck_env, 3, dest=str(tmp_path / "run"), out=str(tmp_path / "cut.npz"), crash_at=crash_at, **common)
    resumed, out, explain = _run(ck_env, dest=str(tmp_path / "run"), out=str(tmp_path / "resumed.npz"), **common)
    assert f"resuming Lightning from {resumed_at}" in out, explain
    assert _compare(tmp_path, "resumed") == [], explain
    epoch, batch = (1, 4) if crash_at == [1, 4] else (1, 0)
    assert resumed["seen"] == [s for s in expected["seen"] if (s[0], s[1]) >= (epoch, batch)], explain


def test_deadline_stop_mid_epoch_then_a_fresh_process_resumes_bit_exactly(tmp_path, ck_env):
    """A time budget of 1s with a 1s margin: the first batch's end is past the save point, so the callback saves,
    commits, raises Stopped, and no epoch-end save follows; the fresh process resumes at (epoch 0, batch 1)."""
    common = {"root": str(tmp_path / "root")}
    _run(ck_env, dest=str(tmp_path / "ref"), out=str(tmp_path / "ref.npz"), **common)
    cut, _, explain = _run(ck_env, dest=str(tmp_path / "run"), out=str(tmp_path / "cut.npz"),
                                 deadline="1s", **common)
    assert cut["stopped"] and "time budget" in cut["stopped"] and "Re-run this cell" in cut["stopped"], explain
    assert cut["step"] == 1, explain
    import colabkit
    assert [(c.step, c.epoch, c.batch) for c in colabkit.Checkpoints(tmp_path / "run").list()] == [(1, 0, 1)]
    _, out, explain = _run(ck_env, dest=str(tmp_path / "run"), out=str(tmp_path / "resumed.npz"), **common)
    assert "resuming Lightning from step 1 (epoch 0, batch 1)" in out, explain
    assert _compare(tmp_path, "resumed") == [], explain


def test_a_fresh_vm_with_the_local_cache_gone_resumes_from_drive(tmp_path, ck_env):
    """Colab's case: the VM is replaced, so the local staging folder (and the ckpt_path="last" pointer beside
    it) is gone and only Drive holds the run; a new cache dir stands for the new VM."""
    common = {"root": str(tmp_path / "root")}
    _run(ck_env, dest=str(tmp_path / "ref"), out=str(tmp_path / "ref.npz"), **common)
    cut, _, explain = _run(ck_env, dest="drive:runs/lit", out=str(tmp_path / "cut.npz"), deadline="1s", **common)
    assert cut["step"] == 1 and cut["stopped"], explain
    new_vm = {**ck_env, "XDG_CACHE_HOME": str(tmp_path / "new-vm-cache")}
    _, out, explain = _run(new_vm, dest="drive:runs/lit", out=str(tmp_path / "resumed.npz"), **common)
    assert "resuming Lightning from step 1 (epoch 0, batch 1)" in out, explain
    assert _compare(tmp_path, "resumed") == [], explain


def _trainer(tmp_path, ar, **kw):
    import lightning as L
    return L.Trainer(accelerator="cpu", max_epochs=kw.pop("max_epochs", 2), enable_progress_bar=False, logger=False,
                     enable_model_summary=False, default_root_dir=str(tmp_path / "root"), callbacks=[ar], **kw)


def test_a_failed_step_saves_nothing_and_a_plain_dataloader_resume_says_it_is_not_exact(tmp_path, ck_env, capsys):
    import colabkit
    model, loader = _build({"loader": "plain"})
    steps = []

    def failing_step(batch, batch_idx, _orig=model.training_step):
        steps.append(batch_idx)
        if len(steps) == 4:
            raise RuntimeError("a NaN check failed")
        return _orig(batch, batch_idx)

    model.training_step = failing_step
    ar = colabkit.torch_lightning.AutoResume(tmp_path / "run", save_freq=2, deadline=None)
    trainer = _trainer(tmp_path, ar)
    with pytest.raises(RuntimeError, match="NaN check"):
        trainer.fit(model, loader, ckpt_path="last")
    assert [(c.step, c.batch) for c in colabkit.Checkpoints(tmp_path / "run").list()] == [(2, 2)]   # no save at 3
    weights = model.net[0].weight.detach().clone()

    fresh, loader = _build({"loader": "plain"})
    ar = colabkit.torch_lightning.AutoResume(tmp_path / "run", save_freq=2, deadline=None)
    trainer = _trainer(tmp_path, ar, max_epochs=1)
    trainer.fit(fresh, loader, ckpt_path="last")
    out = capsys.readouterr().out
    assert "resuming Lightning from step 2 (epoch 0, batch 2)" in out
    assert "has no state_dict" in out and "StatefulDataLoader" in out
    assert not torch.equal(fresh.net[0].weight, weights)   # loaded, then trained on


class Settings:
    """A config object of the user's own (picklable, so Lightning keeps it in the hyperparameters)."""
    lr = 0.01


def _a_config():
    """An OmegaConf DictConfig where OmegaConf is installed, else an object of its own in the same place."""
    try:
        from omegaconf import OmegaConf
    except ImportError:
        return {"cfg": Settings()}, r"\['hyper_parameters'\]\['cfg'\] of type Settings.*ignore"
    return OmegaConf.create({"lr": 0.01}), r"\['hyper_parameters'\] of type DictConfig.*OmegaConf.to_container"


class _KeyedByClass:
    """A callback whose state is keyed by class (a registry of the kinds it has seen, say)."""

    def state_dict(self):
        return {torch.nn.Linear: 1}


@pytest.mark.parametrize("case", ["config", "module", "filesystem", "callback keyed by class"])
def test_a_value_that_needs_pickle_is_refused_at_setup_naming_it_and_the_fix(tmp_path, ck_env, case):
    """Refused before the first step, not at the first save (here the epoch's end), with the key and the fix."""
    import fsspec
    import lightning as L

    import colabkit
    model, loader = _build({})
    callbacks = []
    if case == "config":
        hparams, match = _a_config()
        model.save_hyperparameters(hparams)
    elif case == "module":
        model.save_hyperparameters({"width": 8, "loss_fn": torch.nn.MSELoss()})
        match = r"\['hyper_parameters'\]\['loss_fn'\] of type MSELoss.*ignore=\[\.\.\.\]"
    elif case == "filesystem":
        model.save_hyperparameters({"fs": fsspec.filesystem("memory")})
        match = r"\['hyper_parameters'\]\['fs'\] of type MemoryFileSystem.*ignore=\[\.\.\.\]"
    else:
        callbacks.append(type("Registry", (_KeyedByClass, L.Callback), {})())
        match = r"\['callbacks'\]\['Registry'\] with a key <class 'torch.nn.*Linear'>.*string keys from state_dict"
    ar = colabkit.torch_lightning.AutoResume(tmp_path / "run", deadline=None)
    trainer = _trainer(tmp_path, ar, max_epochs=1)
    trainer.callbacks.extend(callbacks)
    with pytest.raises(colabkit.CheckpointError, match=match + r".*nothing was trained or saved"):
        trainer.fit(model, loader)
    assert model.seen == []
    assert colabkit.Checkpoints(tmp_path / "run").list() == []


def test_another_checkpoint_io_plugin_is_refused(tmp_path, ck_env):
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    import colabkit
    model, loader = _build({})
    ar = colabkit.torch_lightning.AutoResume(tmp_path / "run", deadline=None)
    with pytest.raises(ValueError, match="already has a CheckpointIO plugin"):
        _trainer(tmp_path, ar, plugins=[AsyncCheckpointIO()]).fit(model, loader)


def test_the_plain_plugin_under_a_model_checkpoint_keeps_its_files_and_links_and_resumes_from_them(tmp_path, ck_env):
    """ModelCheckpoint(save_last="link") into a folder that does not exist yet: its files (pointers into the store)
    and its last.ckpt link exist; ckpt_path="last" and the newest file's path resume; an older file's path is
    refused, saying why, since the store restores only its newest checkpoint."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    import colabkit

    def trainer(max_epochs):
        mc = ModelCheckpoint(dirpath=str(tmp_path / "mc"), monitor=None, save_top_k=-1, save_last="link")
        return L.Trainer(accelerator="cpu", max_epochs=max_epochs, enable_progress_bar=False, logger=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path / "root"), callbacks=[mc],
                         plugins=[colabkit.torch_lightning.CheckpointIO(tmp_path / "run")])

    model, loader = _build({})
    trainer(2).fit(model, loader)
    files = sorted(p.name for p in (tmp_path / "mc").iterdir())
    assert files == ["epoch=0-step=6.ckpt", "epoch=1-step=12.ckpt", "last.ckpt"], files
    last = tmp_path / "mc" / "last.ckpt"
    assert last.is_symlink() and last.resolve() == (tmp_path / "mc" / "epoch=1-step=12.ckpt").resolve()

    for ckpt_path, epochs in (("last", 3), (str(tmp_path / "mc" / "epoch=2-step=18.ckpt"), 4)):
        model, loader = _build({})
        resumed = trainer(epochs)
        resumed.fit(model, loader, ckpt_path=ckpt_path)
        assert [s[0] for s in model.seen] == [epochs - 1] * 6 and resumed.global_step == 6 * epochs, ckpt_path

    model, loader = _build({})
    with pytest.raises(colabkit.CheckpointError, match=r"epoch=0-step=6.ckpt names step 6 in .*newest checkpoint is "
                                                       r"step 24.*restores only the newest"):
        trainer(5).fit(model, loader, ckpt_path=str(tmp_path / "mc" / "epoch=0-step=6.ckpt"))
    assert model.seen == []
    dangling = [p.name for p in (tmp_path / "mc").iterdir() if not p.exists()]
    assert dangling == [] and (tmp_path / "mc" / "last.ckpt").resolve().name == "epoch=3-step=24.ckpt"


def test_bad_arguments_name_the_value(tmp_path, ck_env):
    import colabkit
    with pytest.raises(ValueError, match="save_freq=0 is invalid"):
        colabkit.torch_lightning.AutoResume(tmp_path / "run", save_freq=0)
    with pytest.raises(ValueError, match="every='soon' is invalid"):
        colabkit.torch_lightning.AutoResume(tmp_path / "run", every="soon")


def test_a_trainer_of_several_processes_is_refused_before_training(tmp_path, ck_env):
    import lightning as L

    import colabkit
    model, _ = _build({})
    ar = colabkit.torch_lightning.AutoResume(tmp_path / "run", deadline=None)
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_epochs=1, logger=False,
                        enable_progress_bar=False, default_root_dir=str(tmp_path / "root"), callbacks=[ar])
    assert trainer.world_size == 2
    with pytest.raises(ValueError, match=r"one process.*world_size=2"):
        ar.setup(trainer, model, "fit")   # what fit() calls on each rank once the processes are up


class Picklable(L.LightningModule):
    """A model that ddp_spawn can send to its processes (one defined inside a function cannot be)."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return self.net(batch[0]).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_ddp_spawn_is_refused_before_any_process_starts_with_what_to_do(tmp_path, ck_env):
    """ddp_spawn pickles the trainer to start its processes; the callback and the plugin refuse to be pickled
    (they hold this process's uploader), with the guidance for trainers of several processes."""
    import pickle

    import colabkit
    _, loader = _build({})
    model = Picklable()
    ar = colabkit.torch_lightning.AutoResume(tmp_path / "run", deadline=None)
    trainer = L.Trainer(accelerator="cpu", strategy="ddp_spawn", devices=2, max_epochs=1, logger=False,
                        enable_progress_bar=False, default_root_dir=str(tmp_path / "root"), callbacks=[ar])
    guidance = r"AutoResume runs in one process.*ddp_spawn.*devices=1.*colabkit.torch.AutoResume"
    with pytest.raises(ValueError, match=guidance):
        trainer.fit(model, loader)
    assert model.steps == 0
    with pytest.raises(ValueError, match=r"CheckpointIO runs in one process.*torch.save\(trainer\)"):
        pickle.dumps(colabkit.torch_lightning.CheckpointIO(tmp_path / "run"))


def test_a_model_checkpoint_beside_autoresume_is_refused_with_what_to_do(tmp_path, ck_env):
    from lightning.pytorch.callbacks import ModelCheckpoint

    import colabkit
    model, loader = _build({})
    ar = colabkit.torch_lightning.AutoResume(tmp_path / "run", deadline=None)
    trainer = _trainer(tmp_path, ar, max_epochs=1)
    trainer.callbacks.append(ModelCheckpoint(dirpath=str(tmp_path / "mc"), monitor=None))
    with pytest.raises(ValueError, match="ModelCheckpoint.*AutoResume"):
        trainer.fit(model, loader)
    assert colabkit.Checkpoints(tmp_path / "run").list() == []


def test_a_drive_that_cannot_be_listed_does_not_break_the_callback(tmp_path, ck_env, monkeypatch, caplog):
    import colabkit
    from colabkit.checkpoints.api import Checkpoints

    ar = colabkit.torch_lightning.AutoResume(tmp_path / "run", deadline=None)
    ar.checkpoint_io.last_step = None
    ar.checkpoint_io.pointer.parent.mkdir(parents=True, exist_ok=True)
    ar.checkpoint_io.pointer.write_text("kept")

    def unreadable(self, *a, **k):
        raise OSError(107, "Transport endpoint is not connected")

    monkeypatch.setattr(Checkpoints, "list", unreadable)
    colabkit.torch_lightning.AutoResume(tmp_path / "run", deadline=None)   # construction survives the blip
    ar.checkpoint_io.write_pointer()
    assert ar.checkpoint_io.pointer.read_text() == "kept"                 # the pointer is left as it was
    assert "Transport endpoint" in caplog.text


def test_the_interrupt_button_saves_then_stops_with_one_line_and_leaves_sigint_working(tmp_path, ck_env):
    """Lightning turns a KeyboardInterrupt into sys.exit(1) and leaves SIGINT ignored (the notebook's stop
    button would do nothing afterwards); the callback stops with Stopped instead, after its save."""
    import lightning as L

    import colabkit
    model, loader = _build({})

    class Press(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if (trainer.current_epoch, batch_idx) == (0, 2):
                os.kill(os.getpid(), signal.SIGINT)

    ar = colabkit.torch_lightning.AutoResume(tmp_path / "run", deadline=None, verbose=0)
    trainer = _trainer(tmp_path, ar, max_epochs=1)
    trainer.callbacks.insert(0, Press())
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(colabkit.torch_lightning.Stopped, match="SIGINT received: saved step 3.*Re-run") as info:
        trainer.fit(model, loader)
    assert signal.getsignal(signal.SIGINT) is before
    assert info.value._render_traceback_() == [f"colabkit.torch.Stopped: {info.value}"]
    assert [(c.step, c.batch) for c in colabkit.Checkpoints(tmp_path / "run").list()] == [(3, 3)]


def main():
    worker(json.loads(sys.argv[1]))


if __name__ == "__main__":
    main()
