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
pytest.importorskip("lightning")


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
                                             deadline=spec.get("deadline"))

    class Cut(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if [trainer.current_epoch, batch_idx] == spec.get("sigterm_at"):
                os.kill(os.getpid(), signal.SIGTERM)

    trainer = L.Trainer(accelerator="cpu", max_epochs=3, enable_progress_bar=False, logger=False,
                        enable_model_summary=False, default_root_dir=spec["root"], callbacks=[Cut(), ar])
    stopped = None
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


def _run(env, expect_rc=0, **spec):
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=300)
    explain = f"rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-4000:]}"
    assert proc.returncode == expect_rc, explain
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return (json.loads(lines[0][7:]) if lines else None), proc.stdout, explain


def _compare(tmp_path, name):
    with np.load(tmp_path / "ref.npz") as want, np.load(tmp_path / f"{name}.npz") as got:
        assert sorted(want.files) == sorted(got.files)
        return [k for k in want.files if want[k].shape != got[k].shape or not np.array_equal(want[k], got[k])]


@pytest.mark.slow
def test_sigterm_mid_epoch_then_ckpt_path_last_in_a_fresh_process_is_bit_exact(tmp_path, ck_env):
    common = dict(root=str(tmp_path / "root"))
    expected, _, _ = _run(ck_env, dest=str(tmp_path / "ref"), out=str(tmp_path / "ref.npz"), **common)
    _, cut_out, explain = _run(ck_env, 143, dest=str(tmp_path / "run"), out=str(tmp_path / "cut.npz"),
                               sigterm_at=[1, 2], **common)
    assert "SIGTERM received: saved step 9 (committed to" in cut_out, explain
    resumed, out, explain = _run(ck_env, dest=str(tmp_path / "run"), out=str(tmp_path / "resumed.npz"), **common)
    assert "resuming Lightning from step 9 (epoch 1, batch 3)" in out, explain
    assert _compare(tmp_path, "resumed") == [], explain
    assert resumed["step"] == expected["step"] == 18 and resumed["lr"] == expected["lr"]
    assert resumed["seen"] == [s for s in expected["seen"] if (s[0], s[1]) >= (1, 3)], explain
    # what the store holds: arrays and JSON, nothing pickled
    from colabkit.checkpoints.folder import CheckpointFolder
    files = {p.name for c in CheckpointFolder(tmp_path / "run").committed() for p in c.path.iterdir()}
    assert files <= {"arrays.npz", "state.json", "manifest.json"}, files


def main():
    worker(json.loads(sys.argv[1]))


if __name__ == "__main__":
    main()
