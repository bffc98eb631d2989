"""How the workers of one MultiWorkerMirroredStrategy training agree, for AutoResume: which checkpoint to
restore and what to do at a batch end (save, stop), by all-reduce; a dead peer becomes WorkerLost."""
from __future__ import annotations

from ..resume.schedule import FINAL_WAIT_FLOOR_S


class WorkerLost(RuntimeError):
    """A collective of a multi-worker run failed or timed out: another worker died or stopped answering."""


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

    FLOOR_S = FINAL_WAIT_FLOOR_S   # how long the save may take

    def __init__(self, stop_training: bool):
        import time
        self.stop_training = stop_training
        self.reason = "a deadline on another worker"
        self.key = f"remote@{time.time():.3f}"
        self.at = time.time() + self.FLOOR_S
