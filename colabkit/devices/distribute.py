"""tf.distribute for the chosen GPUs: ``strategy()`` (one machine or several workers) and ``device(i)``."""
from __future__ import annotations

import contextlib
import logging
import os
import warnings

from ..units import parse_duration
from . import state
from .records import gpu_names
from .select import GPUSelectionError, GPUSelectionWarning
from .workers import WorkerListError, tf_config

log = logging.getLogger("colabkit")

DEFAULT_TIMEOUT_S = 300.0   # how long a multi-worker collective waits for the other workers

_said: set = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.warning("colabkit: %s", message)


def _tensorflow(purpose: str):
    from ..optional import require
    return require("tensorflow", "tf", purpose)


def _logical_gpus(tf) -> list:
    gpus_seen = tf.config.list_logical_devices("GPU")
    current = state.current
    if current.chosen is not None and len(current.chosen) != len(gpus_seen) and current.applied_value is not None:
        _say_once(f"use_gpus chose {len(current.chosen)} GPU(s) but TensorFlow sees {len(gpus_seen)}; "
                  f"using what TensorFlow sees.")
    return gpus_seen


def _claim_unless_chosen() -> None:
    """Without an earlier use_gpus, claim every GPU nobody else holds (use_gpus("auto")), so that the strategy does
    not spread over other processes' GPUs; where claims are off (Colab, Kaggle) nothing changes."""
    from . import claims
    if state.current.chosen is not None or claims.folder() is None:
        return
    from .apply import use_gpus
    use_gpus("auto", strict=False)


def strategy(workers=None, *, index=None, timeout=None):
    """A tf.distribute strategy for the chosen GPUs: the default strategy for 0 or 1 GPU (0: the CPU, with one
    log line), MirroredStrategy over all of them for 2 or more. Call ``use_gpus`` first to choose; without it,
    every GPU no other process has claimed is claimed and used (``use_gpus("auto")``; on Colab: every GPU
    TensorFlow sees).

    workers: one training over several machines: ["gpu-a:12345", "gpu-b:12345"] (the first is the chief) writes
    TF_CONFIG, says which worker this is, and returns a MultiWorkerMirroredStrategy whose collectives time out
    after ``timeout`` (see multi_worker_strategy; index: this worker's position when the host names
    cannot tell)."""
    if workers is not None:
        return multi_worker_strategy(workers, index=index, timeout=timeout)
    if index is not None or timeout is not None:
        raise ValueError("strategy(index=..., timeout=...) go with workers=[...] (a multi-worker run).")
    _claim_unless_chosen()
    tf = _tensorflow("colabkit.strategy()")
    seen = _logical_gpus(tf)
    if len(seen) >= 2:
        return tf.distribute.MirroredStrategy(devices=[d.name for d in seen])
    if not seen:
        _say_once("no GPU visible to TensorFlow: using the default strategy on the CPU.")
    return tf.distribute.get_strategy()


@contextlib.contextmanager
def device(i: int = 0, *, strict: bool = True):
    """Place what is built inside on the i-th chosen GPU (0-based, CUDA order): ``with colabkit.device(1): ...``.

    Without any GPU: the CPU, with one log line. An index beyond the chosen GPUs is an error; with
    strict=False, a warning and the last GPU (so a two-GPU notebook also runs on one GPU). Yields the
    TensorFlow device name.
    """
    if isinstance(i, bool) or not isinstance(i, int) or i < 0:
        raise GPUSelectionError(f"device({i!r}): expected the position of a chosen GPU: 0, 1, ...")
    tf = _tensorflow("colabkit.device()")
    seen = _logical_gpus(tf)
    if not seen:
        _say_once("no GPU visible to TensorFlow: colabkit.device() places on the CPU.")
        name = "/device:CPU:0"
    elif i < len(seen):
        name = seen[i].name
    else:
        chosen_text = gpu_names(state.current.chosen) if state.current.chosen else ", ".join(d.name for d in seen)
        message = (f"device({i}) asks for GPU #{i} of the chosen ones, but {len(seen)} "
                   f"{'is' if len(seen) == 1 else 'are'} visible ({chosen_text}).")
        if strict:
            raise GPUSelectionError(message + f" Choose more with colabkit.use_gpus({i + 1}) before TensorFlow "
                                              f"starts, or pass strict=False to fall back to the last GPU.")
        warnings.warn(message + f" Using {seen[-1].name} (strict=False).", GPUSelectionWarning, stacklevel=3)
        name = seen[-1].name
    with tf.device(name):
        yield name


# ----------------------------------------------------------------------------------------- several workers

_STRATEGY_CLASS = None


def _strategy_class(tf):
    global _STRATEGY_CLASS
    if _STRATEGY_CLASS is None:
        class MultiWorkerStrategy(tf.distribute.MultiWorkerMirroredStrategy):
            """MultiWorkerMirroredStrategy whose reduce() takes what Keras 3's fit() hands it. Keras 3 fails in
            fit() on two reductions under this strategy (keras-team/keras#20585: a nested data batch handed to
            reduce, a scalar loss reduced along axis 0); nested values are reduced one by one and scalars without
            an axis, which is what those calls mean."""

            def reduce(self, reduce_op, value, axis=None):
                if isinstance(value, (tuple, list, dict)):
                    return tf.nest.map_structure(lambda v: self.reduce(reduce_op, v, axis=axis), value)
                if axis is not None:
                    local = self.experimental_local_results(value)
                    if local and getattr(getattr(local[0], "shape", None), "rank", None) == 0:
                        axis = None
                return super().reduce(reduce_op, value, axis=axis)

        _STRATEGY_CLASS = MultiWorkerStrategy
    return _STRATEGY_CLASS


def multi_worker_strategy(workers=None, *, index=None, timeout=None, verbose: bool = True):
    """A MultiWorkerMirroredStrategy over ``workers`` (TF_CONFIG is written from the list; without it, the
    TF_CONFIG already set is used). Make it before anything else touches TensorFlow. ``timeout``: how long a
    collective waits for the other workers before failing (default 5 minutes; "90s", seconds)."""
    info = tf_config(workers, index) if workers is not None else None
    if info is None and not os.environ.get("TF_CONFIG"):
        raise WorkerListError("strategy(workers=None) needs TF_CONFIG set, or a worker list: "
                              "colabkit.strategy(workers=[\"gpu-a:12345\", \"gpu-b:12345\"]).")
    seconds = DEFAULT_TIMEOUT_S if timeout is None else parse_duration(timeout, name="timeout")
    from ..optional import require
    tf = require("tensorflow", "tf", "colabkit.strategy(workers=...)")
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=seconds)
    made = _strategy_class(tf)(communication_options=options)
    if verbose and info is not None:
        print(f"colabkit: {info}; collectives time out after {seconds:g}s", flush=True)
    return made
