"""`colabkit.hf`: crash-safe one-line exact resume for Hugging Face training (`AccelerateResume` for 🤗 Accelerate
loops).

    ar = colabkit.hf.AccelerateResume("drive:runs/lora", accelerator, save_freq=500, every="15min")

Importing this package imports nothing heavy: each name loads its module (and accelerate, PyTorch) on first use.
"""
from __future__ import annotations

import importlib

# public name -> (module, attribute); resolved on first access (PEP 562)
_LAZY = {
    "AccelerateResume": ("colabkit.hf.accelerate", "AccelerateResume"),
    "Stopped": ("colabkit.hf.accelerate", "Stopped"),
}

__all__ = list(_LAZY)


def __getattr__(name):
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'colabkit.hf' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
