"""GPUs: inventory (NVML, with an ``nvidia-smi`` fallback), selection, and applying the choice.

    colabkit.gpus()                                  # what is there, who uses it
    colabkit.use_gpus(2)                             # the 2 GPUs with most free memory, then least busy
    colabkit.use_gpus("0,1")                         # by index (nvidia-smi numbering) or UUID (GPU-..., MIG-...)
    colabkit.use_gpus("auto", min_free="8GiB", max_util=50)
    strategy = colabkit.strategy()                   # default strategy (0-1 GPU) or MirroredStrategy (2+)
    with colabkit.device(1): ...                     # the 2nd chosen GPU

Applying a choice sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and ``CUDA_VISIBLE_DEVICES`` (so CUDA's numbering is
nvidia-smi's) and, when the ``memory_growth`` setting is on (default), ``TF_FORCE_GPU_ALLOW_GROWTH=true`` unless
that variable is already set. CUDA reads these variables once, when a framework first touches the GPUs: call
``use_gpus`` before TensorFlow (or PyTorch) does. If TensorFlow has listed its GPUs but not yet created its
devices, the choice is applied with ``tf.config.set_visible_devices``; after that, ``DevicesAlreadyInitialized``
explains what to do (restart the kernel, call ``use_gpus`` first).

A machine without an NVIDIA GPU or driver has an empty inventory; ``use_gpus(n)`` / ``use_gpus("auto")`` then
take the CPU path with one log line, so the same notebook runs on a laptop. Values a driver does not report
(``[N/A]``, ``[Not Supported]``, NVML's NotSupported) are None in the records and "n/a" in tables.

With MIG, each instance is listed after its GPU with a label such as ``0:1`` and is selectable by its
``MIG-...`` UUID (or that label); CUDA uses at most one MIG instance per process, and a GPU in MIG mode cannot
be used as a whole.

The steps, bottom up: records.py (GPU, Process, Inventory), nvml.py (the one NVML binding) and smi.py
(``nvidia-smi``), inventory.py (``gpus()``), select.py (``select_gpus``), apply.py (``use_gpus``), workers.py and
distribute.py (``strategy()``, ``device()``, multi-worker strategies); state.py holds the choice applied last;
claims.py (machine-wide GPU claims: no two processes, notebooks, `colabkit run` jobs or users get the same GPU;
waiting in line) and share.py (a share of a GPU's memory, applied to the frameworks).
"""
from __future__ import annotations

import logging

from .apply import DevicesAlreadyInitialized, chosen, use_gpus
from .distribute import device, strategy
from .inventory import gpus
from .records import GPU, GROWTH_VAR, NA, NO_GPUS, ORDER_VAR, VISIBLE_VAR, Inventory, Process
from .select import GPUSelectionError, GPUSelectionWarning, GPUsTaken, parse_request, select_gpus
from .smi import SMI_BASE_FIELDS, SMI_FIELDS, SMI_TIMEOUT

log = logging.getLogger("colabkit")

__all__ = [
    "NA", "ORDER_VAR", "VISIBLE_VAR", "GROWTH_VAR", "NO_GPUS", "SMI_FIELDS", "SMI_BASE_FIELDS", "SMI_TIMEOUT",
    "GPUSelectionError", "GPUsTaken", "DevicesAlreadyInitialized", "GPUSelectionWarning", "Process", "GPU", "Inventory",
    "gpus", "parse_request", "select_gpus", "chosen", "use_gpus", "strategy", "device",
]
