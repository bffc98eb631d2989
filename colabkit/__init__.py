"""colabkit: crash-safe checkpoints, one-line resume and a session clock for notebooks on Colab and home rigs.

    %load_ext colabkit
    import colabkit
    model.fit(ds, epochs=50, callbacks=[colabkit.keras.AutoResume("drive:runs/mnist")])

Importing colabkit is cheap: frameworks (TensorFlow, Keras), pydrive2, NVML and google.colab load on first use.
"""
from __future__ import annotations

import importlib

from ._version import __version__

# public name -> (module, attribute or None for the module itself); resolved on first access (PEP 562)
_LAZY = {
    "env": ("colabkit.runtime", "env"),
    "Environment": ("colabkit.runtime", "Environment"),
    "status": ("colabkit.summary", "status"),
    "settings": ("colabkit.config", "load"),
    "ConfigError": ("colabkit.config", "ConfigError"),
    "Checkpoints": ("colabkit.checkpoints", "Checkpoints"),
    "Restored": ("colabkit.checkpoints", "Restored"),
    "CheckpointError": ("colabkit.checkpoints", "CheckpointError"),
    "run_demo": ("colabkit.demo", "run_demo"),
    "config": ("colabkit.config", None),
    # packages README.md names as colabkit.X.Y (colabkit.checkpoints.InvalidCheckpoint, colabkit.gdrive.TIMEOUT_S,
    # colabkit.jobs.run_jobs): reachable after a plain `import colabkit`, as colabkit.keras is
    "checkpoints": ("colabkit.checkpoints", None),
    "gdrive": ("colabkit.gdrive", None),
    "jobs": ("colabkit.jobs", None),
    "guard": ("colabkit.guard", None),
    "gpus": ("colabkit.devices", "gpus"),
    "use_gpus": ("colabkit.devices", "use_gpus"),
    "strategy": ("colabkit.devices", "strategy"),
    "device": ("colabkit.devices", "device"),
    "keras": ("colabkit.keras", None),
    "monitor": ("colabkit.health", "monitor"),   # training health for custom loops (Keras: keras.Monitor)
    "health": ("colabkit.health", None),
    "torch": ("colabkit.torch", None),
    "torch_lightning": ("colabkit.torch_lightning", None),
    "hf": ("colabkit.hf", None),                 # Hugging Face: Trainer callback, accelerate loops
    "keepalive": ("colabkit.keepalive", None),   # a callable module: colabkit.keepalive("60s")
    "presence": ("colabkit.presence", None),     # a callable module: colabkit.presence()
    "widgets": ("colabkit.widgets", None),
    # portable stand-ins for Colab-only calls (what `colabkit migrate` rewrites notebooks to use)
    "on_colab": ("colabkit.portable", "on_colab"),
    "drive": ("colabkit.portable", "drive"),
    "drive_mounted": ("colabkit.portable", "drive_mounted"),
    "workdir": ("colabkit.portable", "workdir"),
    "portable_path": ("colabkit.portable", "portable_path"),
    "mount_drive": ("colabkit.portable", "mount_drive"),
    "flush_and_unmount_drive": ("colabkit.portable", "flush_and_unmount_drive"),
    "upload": ("colabkit.portable", "upload"),
    "download": ("colabkit.portable", "download"),
    "secret": ("colabkit.portable", "secret"),
    "authenticate_user": ("colabkit.portable", "authenticate_user"),
    "cv2_imshow": ("colabkit.portable", "cv2_imshow"),
    "migrate": ("colabkit.migrate", None),
    "doctor": ("colabkit.doctor", None),         # colabkit.doctor.run_checks(): the health check of a GPU box
    "stage": ("colabkit.gdrive.staging", "stage"),
    "fetch": ("colabkit.gdrive.links", "fetch"),
}

__all__ = ["__version__", "load_ipython_extension", "unload_ipython_extension", *_LAZY]


def __getattr__(name):
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'colabkit' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def load_ipython_extension(ipython):
    """`%load_ext colabkit`: register the magics. Loading twice is harmless."""
    from . import magics
    magics.load(ipython)
    from . import gpu_magics
    gpu_magics.load(ipython)


def unload_ipython_extension(ipython):
    """`%unload_ext colabkit`: remove what loading added."""
    from . import magics
    magics.unload(ipython)
    from . import gpu_magics
    gpu_magics.unload(ipython)
