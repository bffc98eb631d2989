"""Stand-in for PyTorch, for colabkit doctor's probes: the scenario (COLABKIT_TEST_GPUS) key "torch":
{"version": "2.3.1+cu121", "cuda": "12.1" (null: a CPU-only build), "nccl": "ok" | "hang" | "fail"}. Without
that key `import torch` fails as where PyTorch is not installed. Attribute names as in torch 2.x."""
import sys as _sys

from . import version  # noqa: F401 - torch.version.cuda
from ._tensor import Tensor, ones  # noqa: F401

__version__ = version.__version__

from . import cuda  # noqa: E402,F401
from . import distributed  # noqa: E402,F401

_sys.modules.setdefault("torch.version", version)
