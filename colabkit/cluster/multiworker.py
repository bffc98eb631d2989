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
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket

from ..units import parse_duration

DEFAULT_PORT = 12345
DEFAULT_TIMEOUT_S = 300.0
INDEX_VAR = "COLABKIT_WORKER_INDEX"


class WorkerListError(ValueError):
    """A worker list colabkit cannot turn into TF_CONFIG for this machine."""


class WorkerLost(RuntimeError):
    """A collective of a multi-worker run failed or timed out: another worker died or stopped answering."""


@dataclasses.dataclass
class WorkerInfo:
    workers: list
    index: int

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    def __str__(self) -> str:
        role = "the chief" if self.is_chief else "a worker"
        return f"worker {self.index} of {len(self.workers)} ({self.workers[self.index]}), {role}"


def _normalise(workers) -> list:
    if isinstance(workers, str) or not workers:
        raise WorkerListError(f"workers={workers!r}: expected a list of hosts, e.g. [\"gpu-a:{DEFAULT_PORT}\", "
                              f"\"gpu-b:{DEFAULT_PORT}\"] (the first is the chief).")
    out = []
    for w in workers:
        text = str(w).strip()
        host, sep, port = text.rpartition(":")
        if not sep:
            host, port = text, str(DEFAULT_PORT)
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise WorkerListError(f"workers: {w!r} is not HOST or HOST:PORT.")
        out.append(f"{host}:{int(port)}")
    if len(set(out)) != len(out):
        raise WorkerListError(f"workers={list(workers)!r}: an address appears twice; each worker needs its own "
                              f"HOST:PORT.")
    return out


def _my_names() -> set:
    names = {socket.gethostname(), socket.getfqdn()}
    try:
        names |= set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return {n.lower() for n in names if n}


def _is_this_machine(host: str, mine: set) -> bool:
    """``host`` names this machine: one of its names, or an address this machine can bind to (on Debian and
    Ubuntu the hostname resolves to 127.0.1.1, so a worker list of LAN addresses must be checked this way)."""
    if host.lower() in mine:
        return True
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, _, _, _, address in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address[0], 0))
            return True
        except OSError:
            continue
    return False


def worker_index(workers: list, index=None) -> int:
    """Which entry of ``workers`` this process is: ``index``, else $COLABKIT_WORKER_INDEX, else the one entry
    whose host names this machine."""
    if index is None and os.environ.get(INDEX_VAR, "").strip():
        raw = os.environ[INDEX_VAR].strip()
        if not raw.isdigit():
            raise WorkerListError(f"{INDEX_VAR}={raw!r}: expected the position of this worker in the list (0, 1, ...).")
        index = int(raw)
    if index is not None:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(workers):
            raise WorkerListError(f"index={index!r}: expected 0 to {len(workers) - 1} for {len(workers)} workers "
                                  f"({', '.join(workers)}).")
        return index
    mine = _my_names()
    matches = [i for i, w in enumerate(workers) if _is_this_machine(w.rpartition(":")[0], mine)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise WorkerListError(f"the worker list ({', '.join(workers)}) does not include this host "
                              f"({', '.join(sorted(mine))}); add it, or pass index= (or set {INDEX_VAR}).")
    raise WorkerListError(f"this host is entries {matches} of the worker list ({', '.join(workers)}); say which "
                          f"one this process is with index= (or {INDEX_VAR}).")


def tf_config(workers, index=None) -> WorkerInfo:
    """Write TF_CONFIG for ``workers`` (["host:port", ...], worker 0 the chief) and this worker's position in it."""
    workers = _normalise(workers)
    i = worker_index(workers, index)
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
    return WorkerInfo(workers, i)


_STRATEGY_CLASS = None


def _strategy_class(tf):
    global _STRATEGY_CLASS
    if _STRATEGY_CLASS is None:
        class MultiWorkerStrategy(tf.distribute.MultiWorkerMirroredStrategy):
            """MultiWorkerMirroredStrategy whose reduce() takes what Keras 3's fit() hands it (see module docs)."""

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


def strategy(workers=None, *, index=None, timeout=None, verbose: bool = True):
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


# ------------------------------------------------------------------------------------- AutoResume's helper

def coordinator_for(model):
    """A Coordinator when ``model`` trains under a multi-worker strategy of more than one worker, else None."""
    import sys
    tf = sys.modules.get("tensorflow")
    strategy_ = getattr(model, "_distribute_strategy", None)
    if tf is None or strategy_ is None:
        return None
    if not isinstance(strategy_, tf.distribute.MultiWorkerMirroredStrategy):
        return None
    resolver = strategy_.cluster_resolver
    workers = (resolver.cluster_spec().as_dict().get("worker") or []) if resolver is not None else []
    if len(workers) < 2:
        return None
    return Coordinator(tf, strategy_, int(resolver.task_id or 0), len(workers))


class Coordinator:
    """Agreement between the workers of one run, by all-reduce: every worker calls the same methods in the same
    order (AutoResume does, at the same points of fit())."""

    def __init__(self, tf, strategy_, index: int, count: int):
        self.tf, self.strategy, self.index, self.count = tf, strategy_, index, count
        self.local_replicas = max(1, len(strategy_.extended.worker_devices))

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    def sum(self, values: list) -> list:
        """Element-wise sum over the workers of each worker's ``values`` (floats)."""
        tf = self.tf
        local = tf.constant([float(v) / self.local_replicas for v in values], dtype=tf.float64)
        try:
            per_replica = self.strategy.run(lambda: tf.identity(local))
            total = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
            return [float(v) for v in total.numpy()]
        except (tf.errors.OpError, RuntimeError) as exc:
            raise WorkerLost(self.explain(exc)) from exc

    def any_of(self, flags: list) -> list:
        return [v > 0.5 for v in self.sum([1.0 if f else 0.0 for f in flags])]

    def chief_value(self, value: float) -> float:
        return self.sum([value if self.is_chief else 0.0])[0]

    def agree_on_restore(self, restored, directory):
        """Every worker restores the checkpoint the chief chose (``restored``: what this worker found, or None),
        or all stop with one CheckpointError."""
        mine = -1 if restored is None else restored.step
        chosen = int(self.chief_value(mine))
        if chosen == -1 and not self.is_chief:
            restored, mine = None, -1   # the chief starts from scratch: so does every worker
        if self.any_of([mine != chosen])[0]:
            from ..checkpoints.api import CheckpointError
            raise CheckpointError(f"the workers of this multi-worker run do not see the same checkpoint in "
                                  f"{directory}: the chief chose {'none' if chosen == -1 else f'step {chosen}'}, "
                                  f"worker {self.index} sees {'none' if mine == -1 else f'step {mine}'}. Put the "
                                  f"checkpoint folder on storage every worker sees at the same path (NFS, a synced "
                                  f"Drive folder, gdrive://).")
        return restored

    def agree_on_batch_end(self, interrupt, deadline, every_due: bool) -> tuple:
        """What every worker does at this batch end, from what each saw: (interrupt or None, the deadline to
        act on or None, every_due). A signal or a stopping deadline on any worker stops all; a save-only
        deadline on any makes all save."""
        any_interrupt, any_stop, any_save, every_due = self.any_of(
            [interrupt, deadline is not None and deadline.stop_training,
             deadline is not None and not deadline.stop_training, every_due])
        interrupt = interrupt or ("a signal on another worker" if any_interrupt else None)
        if any_stop and not (deadline is not None and deadline.stop_training):
            deadline = RemoteDeadline(True)   # another worker stops after this save: so does this one
        elif deadline is None and any_save:
            deadline = RemoteDeadline(False)
        return interrupt, deadline, every_due

    def explain(self, exc: BaseException) -> str:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        return (f"worker {self.index} of {self.count}: another worker of this multi-worker run died or stopped "
                f"answering, or never joined within the collective timeout ({type(exc).__name__}: {first}). "
                f"Start every worker again (within the timeout= of colabkit.strategy() of each other): they "
                f"resume together from the chief's last checkpoint.")

    def is_collective_failure(self, exc: BaseException) -> bool:
        errors = self.tf.errors
        return isinstance(exc, (errors.DeadlineExceededError, errors.UnavailableError, errors.CancelledError,
                                errors.AbortedError, errors.InternalError))


class RemoteDeadline:
    """A deadline another worker of a multi-worker run reached: this worker saves (and stops) with it."""

    FLOOR_S = 60.0   # as AutoResume's FINAL_WAIT_FLOOR_S: how long the save may take

    def __init__(self, stop_training: bool):
        import time
        self.stop_training = stop_training
        self.reason = "a deadline on another worker"
        self.key = f"remote@{time.time():.3f}"
        self.at = time.time() + self.FLOOR_S
