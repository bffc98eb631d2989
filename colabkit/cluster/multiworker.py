"""One Keras training over several machines: `tf.distribute.MultiWorkerMirroredStrategy` made from a host list,
and what `colabkit.keras.AutoResume` needs to checkpoint such a run as one.

    strategy = colabkit.strategy(workers=["gpu-a:12345", "gpu-b:12345"])   # first thing in the script
    with strategy.scope():
        model = build_and_compile()
    model.fit(x, y, callbacks=[colabkit.keras.AutoResume("/mnt/shared/runs/big")])

Worker 0 is the chief. With AutoResume under this strategy:
- every worker takes part in every save (each reads the variables in the same order, so a variable whose read
  is a collective cannot hang); only the chief writes the checkpoint and holds the folder's lease, the others
  write nothing;
- at train begin the chief chooses the checkpoint; every worker restores that one (it must be on storage every
  worker sees) or all of them stop with the same error, so they cannot diverge;
- SIGTERM, Ctrl-C or a deadline on any worker makes all of them save the same step, once, and stop;
- collectives time out (``timeout``, default 5 minutes), so a dead worker is an error on the others, not a hang.

Keras 3 with MultiWorkerMirroredStrategy fails in fit() on two reductions (keras-team/keras#20585: a nested
data batch handed to strategy.reduce, and a scalar loss reduced along axis 0); the strategy made here reduces
nested values one by one and scalars without an axis, which is what those calls mean.

The worker list, TF_CONFIG and that strategy are made in colabkit.devices (workers.py, distribute.py); this
module re-exports them, and the Coordinator of the workers' agreement that AutoResume uses (it lives in
colabkit.keras.multiworker, below this layer).
"""
from __future__ import annotations

# the worker list, TF_CONFIG and the strategy are tf.distribute matters: they live in colabkit.devices
from ..devices.distribute import DEFAULT_TIMEOUT_S  # noqa: F401 - importable here as before
from ..devices.distribute import multi_worker_strategy as strategy  # noqa: F401
from ..devices.workers import (  # noqa: F401
    DEFAULT_PORT,
    INDEX_VAR,
    WorkerInfo,
    WorkerListError,
    tf_config,
    worker_index,
)

_FOR_AUTORESUME = ("WorkerLost", "Coordinator", "coordinator_for", "RemoteDeadline")


def __getattr__(name):
    """AutoResume's agreement between workers lives in colabkit.keras.multiworker (it needs Keras, which this
    module does not import); its names stay importable from here."""
    if name in _FOR_AUTORESUME:
        from ..keras import multiworker
        return getattr(multiworker, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
