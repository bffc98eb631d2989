"""colabkit.resume.run: every AutoResume writes to one run record that the status panel (the text behind
``%colabkit``) reads; here a real Lightning fit, during the run and after a deadline stop."""
import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning")


def _tiny():
    import torch.nn.functional as F

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.binary_cross_entropy_with_logits(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 4, generator=g)
    dataset = torch.utils.data.TensorDataset(x, (x.sum(1, keepdim=True) > 0).float())
    return Tiny(), torch.utils.data.DataLoader(dataset, batch_size=4)


def test_the_status_text_shows_a_lightning_run_and_its_deadline_stop(tmp_path, monkeypatch):
    import colabkit
    from colabkit import widgets

    monkeypatch.setenv("COLABKIT_DRIVE_ROOT", str(tmp_path / "drive"))
    model, loader = _tiny()
    # a one-hour budget with a two-hour margin: the deadline save is due at the first batch's end
    ar = colabkit.torch_lightning.AutoResume(tmp_path / "run", deadline="1h", deadline_margin="2h", verbose=0)
    seen = {}

    class Look(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == 0:   # before AutoResume's own batch end (it comes later in the list)
                seen["during"] = widgets.text()

    trainer = L.Trainer(accelerator="cpu", max_epochs=1, enable_progress_bar=False, logger=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path / "root"), callbacks=[Look(), ar])
    with pytest.raises(colabkit.torch_lightning.Stopped):
        trainer.fit(model, loader, ckpt_path="last")
    assert "colabkit.torch_lightning.AutoResume" in seen["during"]
    after = widgets.text()
    assert "colabkit.torch_lightning.AutoResume" in after
    last = next(line for line in after.splitlines() if "last deadline save" in line)
    assert "time budget is" in last and "away" in last   # "1h 00m away", or "59m 59s" a second later
    kinds = [kind for _, kind, _ in ar.events]
    assert kinds[-2:] == ["deadline-save", "stop"]
    ar.checkpoint_io.checkpoints.close()


def test_a_run_that_has_not_saved_yet_shows_over_an_older_store_still_open(tmp_path, monkeypatch):
    """A notebook's earlier cell left a Checkpoints open (with a save); a new Lightning run must be what the panel
    shows from its first batch, before its own first save."""
    import numpy as np

    import colabkit
    older = colabkit.Checkpoints(str(tmp_path / "older"))
    older.save(1, {"w": np.ones(3)}, wait=True)
    try:
        test_the_status_text_shows_a_lightning_run_and_its_deadline_stop(tmp_path, monkeypatch)
    finally:
        older.close()
