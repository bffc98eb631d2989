"""`colabkit.torch`: crash-safe one-line exact resume for plain PyTorch training loops (`AutoResume`).

    ar = colabkit.torch.AutoResume("drive:runs/gan", model=G, opt=opt, save_freq=500)

The adapter's parts: autoresume.py (AutoResume for plain loops: its loops, when and what it saves, the restore),
loader.py (where a DataLoader stands: its generators, a StatefulDataLoader's position, skipping), checks.py (what
is refused: arguments, and checkpoints that cannot be valid or do not fit), distributed.py (the ranks of a torchrun
run agreeing), state.py (state dicts and RNG states as the store keeps them), lightning.py (Lightning's
CheckpointIO and callback, whose face is `colabkit.torch_lightning`); all but autoresume.py and distributed.py are
shared with Lightning. Importing this package imports PyTorch; always import torch itself absolutely.
"""
from __future__ import annotations

from ..resume.schedule import FINAL_WAIT_FLOOR_S  # noqa: F401 - read-only here; it lives in colabkit.resume.schedule
from .autoresume import AutoResume
from .state import FORMAT, Stopped

__all__ = ["AutoResume", "FORMAT", "Stopped"]
