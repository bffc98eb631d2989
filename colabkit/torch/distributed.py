"""A distributed run (torchrun), for `colabkit.torch.AutoResume`: rank 0 writes, and every rank acts at the same
batch. The ranks agree, by small all-reduces, on which checkpoint they restore, on a signal any of them received
and on rank 0's save and stop decisions, and on a save that failed on rank 0; each rank's own RNG and loader
states are gathered on rank 0 for every checkpoint, and each rank restores its own.
"""
from __future__ import annotations

import logging

from ..optional import require

torch = require("torch", "torch", "colabkit.torch")

from ..checkpoints.api import CheckpointError  # noqa: E402

log = logging.getLogger("colabkit")

_SIGNALS = (None, "SIGINT", "SIGTERM")
_SAVES = (None, "save_freq", "every", "deadline")


def process_group():
    """The ProcessGroup when this process is one of several of an initialized torch.distributed process group,
    else None."""
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return ProcessGroup(dist)
    return None


class ProcessGroup:
    """The ranks of this run, as AutoResume sees them: ``rank``, ``size``, and the collectives it calls (every
    rank calls the same ones in the same order)."""

    def __init__(self, dist):
        self.dist = dist
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()

    def max(self, values: list) -> list:
        """The element-wise maximum of ``values`` (whole numbers) over the ranks."""
        dist = self.dist
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        tensor = torch.tensor(values, dtype=torch.int64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return [int(v) for v in tensor.tolist()]

    def same_checkpoint(self, restored, directory) -> None:
        """Every rank restores the same checkpoint before any rank saves again: CheckpointError when the ranks
        found different ones (``restored``: this rank's, or None)."""
        step = restored.step if restored else -1
        low, high = self.max([-step, step])
        if -low != high:
            raise CheckpointError(f"the processes of this distributed run found different checkpoints in "
                                  f"{directory} (steps {-low} to {high}); give every rank the same "
                                  f"folder, readable from each. Nothing was restored.")

    def agree(self, interrupt, stop: bool, save):
        """Every rank learns of a signal any rank received, and of rank 0's decisions: a deadline stop, a save
        (one small all-reduce per batch), so that all act at the same batch. Returns (the signal received by
        some rank or None, whether a deadline stops training, the save due or None)."""
        signalled, stop, due = self.max([_SIGNALS.index(interrupt), int(stop), _SAVES.index(save)])
        return _SIGNALS[signalled], bool(stop), _SAVES[due]

    def gather(self, mine):
        """Rank 0: every rank's ``mine``, in rank order; other ranks: None, after sending theirs."""
        gathered = [None] * self.size if self.rank == 0 else None
        self.dist.gather_object(mine, gathered, dst=0)
        return gathered

    def own(self, ranks: list, default: dict) -> dict:
        """This rank's states from a checkpoint's gathered ``ranks``; ``default`` (rank 0's) when the checkpoint
        holds another number of ranks."""
        if len(ranks) == self.size:
            return ranks[self.rank]
        log.warning("colabkit: the checkpoint holds the RNG states of %d processes and this run has %d; "
                    "every rank starts from rank 0's", len(ranks) or 1, self.size)
        return default

    def raise_if_failed(self, error, what: str, directory) -> None:
        """After rank 0's save (``error``: its exception there, or None): a save that failed on rank 0 raises on
        every rank, here, rather than leaving the others in the next collective."""
        (failed,) = self.max([int(error is not None)])
        if error is not None:
            raise error
        if failed:
            raise CheckpointError(f"rank 0 could not save {what} to {directory}; its error is in rank 0's output. "
                                  f"Training stopped on every rank.")

    def barrier(self) -> None:
        self.dist.barrier()
