"""`colabkit.torch`: crash-safe one-line exact resume for plain PyTorch training loops (`AutoResume`).

    ar = colabkit.torch.AutoResume("drive:runs/gan", model=G, opt=opt, save_freq=500)

The adapter's parts: autoresume.py (AutoResume for plain loops), state.py (state dicts, RNG states and a
DataLoader's place, shared with Lightning), lightning.py (Lightning's CheckpointIO and callback, whose face is
`colabkit.torch_lightning`). Importing this package imports PyTorch; always import torch itself absolutely.
"""
from __future__ import annotations

from ..resume.schedule import FINAL_WAIT_FLOOR_S  # noqa: F401 - read-only here; it lives in colabkit.resume.schedule
from .autoresume import FORMAT, AutoResume
from .state import Stopped

__all__ = ["AutoResume", "FORMAT", "Stopped"]
