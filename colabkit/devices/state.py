"""The choice ``use_gpus`` applied last in this process, which selection, applying and strategies all read."""
from __future__ import annotations

import dataclasses

from .records import Inventory


@dataclasses.dataclass
class State:
    chosen: Inventory | None = None      # the latest choice applied by use_gpus
    applied_value: str | None = None     # the CUDA_VISIBLE_DEVICES value use_gpus set
    inherited: str | None = None         # CUDA_VISIBLE_DEVICES before colabkit first set it
    claim: object | None = None          # the claims.Claim use_gpus holds for this process (None: none)


current = State()   # read and replaced as ``state.current`` (tests put a fresh State here)
