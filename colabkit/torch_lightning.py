"""`colabkit.torch_lightning`: Lightning on colabkit's crash-safe store (the face of colabkit/torch/lightning.py).

    ar = colabkit.torch_lightning.AutoResume("drive:runs/lit", save_freq=200, every="15min")
    trainer = lightning.Trainer(callbacks=[ar], max_epochs=10)
    trainer.fit(model, train_loader, ckpt_path="last")
"""
from __future__ import annotations

from .resume.schedule import FINAL_WAIT_FLOOR_S  # noqa: F401 - read-only here; it lives in colabkit.resume.schedule
from .torch.lightning import FORMAT, POINTER, STATE_KEY, AutoResume, CheckpointIO, Stopped

__all__ = ["AutoResume", "CheckpointIO", "FORMAT", "POINTER", "STATE_KEY", "Stopped"]
