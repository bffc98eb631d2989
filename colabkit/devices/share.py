"""A share of a GPU's memory (``use_gpus(1, share="12GiB")`` or ``share=0.5``) applied to the frameworks.

TensorFlow: a logical device with ``memory_limit`` on each chosen GPU (tf.config.set_logical_device_configuration;
memory growth is then TensorFlow's own business inside that limit). PyTorch: ``set_per_process_memory_fraction``
per device, queued for the moment PyTorch initializes CUDA (so importing torch stays cheap). JAX:
``XLA_PYTHON_CLIENT_MEM_FRACTION`` for a process that has not imported it yet. A framework imported after the
choice gets the limit right after its import (an import hook removed once it has fired); one that already
initialized its GPUs cannot be limited any more, and a warning says so.

A share is a promise between processes that use colabkit, counted in their claims: a program that allocates
more than its share (or ignores colabkit) is not stopped by the GPU.
"""
from __future__ import annotations

import importlib.abc
import logging
import os
import sys
import warnings

from ..units import format_size, parse_size

log = logging.getLogger("colabkit")
JAX_VAR = "XLA_PYTHON_CLIENT_MEM_FRACTION"


def parse_share(share, *, what: str = "use_gpus") -> tuple[int | None, float | None]:
    """(bytes, fraction): a size with its unit ("12GiB") -> bytes; a number 0 < x <= 1 (0.5) or "50%" -> a
    fraction of each GPU's memory. A bare number above 1 (share=2: bytes? GiB? GPUs?) is refused."""
    from .select import GPUSelectionError
    if share is None:
        return None, None
    text = share.strip() if isinstance(share, str) else None
    number = share if isinstance(share, (int, float)) and not isinstance(share, bool) else None
    if text is not None and _is_number(text):
        number = float(text)
    if number is not None and not 0 < number <= 1:
        hint = f" For an amount of memory give its unit: share=\"{share}GiB\"." if number > 1 else ""
        raise GPUSelectionError(f"{what}: share={share!r}: a number is a fraction of each GPU's memory, above 0 "
                                f"and at most 1 (share=0.5).{hint}")
    try:
        if number is not None:
            fraction = float(number)
        elif text is not None and text.endswith("%"):
            fraction = float(text[:-1]) / 100
        else:
            return parse_size(share, name="share"), None
        if not 0 < fraction <= 1:
            raise ValueError
        return None, fraction
    except (ValueError, TypeError):
        raise GPUSelectionError(f"{what}: share={share!r} is neither a size (\"12GiB\") nor a fraction of a GPU "
                                f"(0.5 or \"50%\").") from None


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def limits(choice, share_bytes: int | None, fraction: float | None) -> list:
    """[(bytes or None, fraction or None)] per chosen GPU, in CUDA order."""
    out = []
    for g in choice:
        total = g.memory_total
        if share_bytes is not None:
            if total is not None and share_bytes > total:
                from .select import GPUSelectionError
                raise GPUSelectionError(f"share={format_size(share_bytes)} is more than {g.describe()} has.")
            out.append((share_bytes, None if not total else share_bytes / total))
        else:
            out.append((None if total is None else int(fraction * total), fraction))
    return out


def apply(per_gpu: list) -> None:
    """Limit each framework to its share on each chosen GPU: now where it is imported, on import otherwise."""
    if not per_gpu:
        return
    fractions = [f for _, f in per_gpu if f is not None]
    if fractions and JAX_VAR not in os.environ and "jax" not in sys.modules:
        os.environ[JAX_VAR] = f"{min(fractions):.3f}"
    for name, hook in (("tensorflow", _tensorflow), ("torch", _torch)):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__" if name == "torch" else "config"):
            hook(module, per_gpu)
        else:
            _after_import(name, lambda m, hook=hook: hook(m, per_gpu))


def clear() -> None:
    """Forget limits still waiting for a framework's import (a new choice without a share)."""
    _hook.pending.clear()
    with_self_removed()


def _tensorflow(tf, per_gpu: list) -> None:
    try:
        physical = tf.config.list_physical_devices("GPU")
        config = tf.config.LogicalDeviceConfiguration
        for device, (size, _) in zip(physical, per_gpu):
            if size is not None:
                tf.config.set_logical_device_configuration(device, [config(memory_limit=size // 2 ** 20)])
    except (RuntimeError, ValueError) as exc:
        warnings.warn(f"colabkit: the GPU memory share could not be applied to TensorFlow ({exc}); it had already "
                      f"initialized its GPUs. Call use_gpus(..., share=...) before TensorFlow touches a GPU.",
                      stacklevel=3)


def _torch(torch, per_gpu: list) -> None:
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return

    def limit():
        for i, (_, fraction) in enumerate(per_gpu):
            if fraction is not None and i < cuda.device_count():
                cuda.set_per_process_memory_fraction(min(1.0, fraction), i)

    lazy = getattr(cuda, "_lazy_call", None)   # runs at CUDA's initialization, or now if it already happened
    if lazy is not None:
        lazy(limit)
    elif cuda.is_initialized():
        limit()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs callbacks right after a module's own import finished (the first time it is imported)."""

    def __init__(self):
        self.pending: dict = {}

    def find_spec(self, name, path, target=None):
        if name not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        callbacks = self.pending.pop(name)
        exec_module = loader.exec_module

        def run(module):
            exec_module(module)
            for callback in callbacks:
                try:
                    callback(module)
                except Exception as exc:  # noqa: BLE001 - a limit that fails must not break the import
                    log.warning("colabkit: could not apply the GPU memory share to %s: %s", name, exc)

        loader.exec_module = run
        if not self.pending:
            with_self_removed()
        return spec


_hook = _AfterImport()


def with_self_removed() -> None:
    if _hook in sys.meta_path:
        sys.meta_path.remove(_hook)


def _after_import(name: str, callback) -> None:
    _hook.pending[name] = [callback]   # the latest choice replaces an earlier one
    if _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)
