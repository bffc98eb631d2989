"""`colabkit.hf`: crash-safe one-line exact resume for Hugging Face training.

    ar = colabkit.hf.AutoResume("drive:runs/llm", every="15min")          # a Trainer callback (TRL's trainers too)
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[ar])
    trainer.train(resume_from_checkpoint=ar.resume_from)

    ar = colabkit.hf.AccelerateResume("drive:runs/lora", accelerator, save_freq=500, every="15min")   # accelerate loops

The adapter's parts: trainer.py (AutoResume, the TrainerCallback), accelerate.py (AccelerateResume) and loader.py
(its loaders' place). Importing this package imports nothing heavy: each name loads its module (and transformers,
accelerate, PyTorch) on first use, and a missing one raises with the extra to install (``pip install
"colabkit[hf]"``).
"""
from __future__ import annotations

import importlib

# public name -> (module, attribute); resolved on first access (PEP 562)
_LAZY = {
    "AutoResume": ("colabkit.hf.trainer", "AutoResume"),
    "AccelerateResume": ("colabkit.hf.accelerate", "AccelerateResume"),
    "Stopped": ("colabkit.torch.state", "Stopped"),
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
