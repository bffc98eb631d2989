"""Host buffers that checkpoint snapshots are copied into, reused from save to save: the pool a `Checkpoints`
owns for ``save_snapshot`` (the Keras, PyTorch and Lightning adapters save through it)."""
from __future__ import annotations

import logging
import threading
import time

import numpy as np

from .memory import new_array

log = logging.getLogger("colabkit")


class SnapshotBuffers:
    """Host buffers that snapshots are copied into, reused from save to save. Copying into memory already
    touched is one memcpy (into fresh allocations, page faults cost several times that for hundreds of MB),
    and that copy is the whole stall the training loop sees.

    ``sets`` (default: the ``snapshot_buffers`` setting, 1) sets exist at most, each the size of the training
    state. A set is held from the snapshot until the background thread has written it. A snapshot still
    waiting to be written (behind an upload) is discarded for a newer one and its set reused (``reclaim``).
    When every set is being written, a periodic save of a state above ``small_state_mb`` is taken at a later
    batch (``take`` returns None); any other save waits for a set. So with one set, snapshots cost 1x the state
    in host memory and training never waits for a periodic save's write; each extra set costs another 1x and
    lets such a save be taken at once.
    A new set is touched (its pages faulted in) by a background thread when a periodic save first asks for
    it, and that save is taken once it is done: neither the restore nor the training loop waits for it. A save
    that waits for its set and is the first to ask for the new set gets one faulted in on the spot.
    """

    WAIT_S = 120.0   # a save that must not be skipped waits this long for a set, then allocates one more

    def __init__(self, sets: int | None = None):
        from ..config import load
        settings = load()
        self.sets = settings.snapshot_buffers if sets is None else sets
        # a small state's write is short: a periodic save waits for it rather than move to a later batch, so
        # that every due save is taken (as BackupAndRestore does), and its set is touched inline
        self.small_bytes = settings.small_state_mb * 1e6
        self.sets_allocated = 0     # sets allocated so far (tests and benchmarks read it)
        self._free, self._layout, self._alive = [], None, 0
        self._untouched: set[int] = set()   # ids of sets whose memory was never written
        self._cond = threading.Condition()

    def take(self, variables, *, wait: bool = True, reclaim=None, can_allocate=None) -> list | None:
        """A set of buffers shaped like ``variables``. When all sets are in use: ``reclaim()`` (True when it
        gave a set back) is asked first; then None without ``wait``, else wait for a set. ``can_allocate()``,
        when given, is asked before a set is allocated: False returns TOO_BIG instead (nothing allocated)."""
        layout = layout_of(variables)
        deadline = time.monotonic() + self.WAIT_S
        while True:
            with self._cond:
                self._use_layout(layout)
                buffers = self._free.pop() if self._free else None
                allocate = buffers is None and self._alive < self.sets
                if allocate:
                    self._alive += 1
                    self.sets_allocated += 1
            if allocate and can_allocate is not None and not can_allocate():
                self._forget_one()
                return TOO_BIG
            if allocate:   # a save that waits copies into it now: faulted in at once; else the touch does that
                buffers = _faulted_in(layout) if wait else [np.empty(shape, dtype) for shape, dtype in layout]
            if buffers is not None:
                with self._cond:
                    untouched = id(buffers) in self._untouched
                    self._untouched.discard(id(buffers))
                if untouched and wait:   # prepared, never written: new memory, faulted in at once (memory.py)
                    buffers[:] = _faulted_in(layout)
                if not (untouched or allocate) or wait:
                    return buffers
                self._touch_then_give_back(buffers)
                return None
            if reclaim is not None and reclaim():
                continue
            if not wait:
                return None
            with self._cond:
                left = deadline - time.monotonic()
                if not self._free and left > 0:
                    self._cond.wait(min(left, 1.0))
                    continue
                if self._free:
                    continue
            if can_allocate is not None and not can_allocate():
                return TOO_BIG
            with self._cond:
                log.warning("colabkit: no snapshot buffer came back in %.0fs (the previous checkpoint's write is "
                            "still running: a slow or hung destination disk); allocating another set, the size "
                            "of the training state", self.WAIT_S)
                self._alive += 1
                self.sets_allocated += 1
            return _faulted_in(layout)

    def is_small(self, nbytes: int) -> bool:
        """A state this size waits for its set at every save (the ``small_state_mb`` setting)."""
        return nbytes <= self.small_bytes

    def _use_layout(self, layout) -> None:
        """Called with the lock held: for another model, the sets of the old layout are dropped."""
        if layout != self._layout:
            self._layout, self._alive = layout, self._alive - len(self._free)
            self._free = []
            self._untouched.clear()

    def _forget_one(self) -> None:
        """A set counted as allocated was not, after all."""
        with self._cond:
            self._alive -= 1
            self.sets_allocated -= 1

    def prefill(self, variables, *, can_allocate=None) -> int:
        """Allocate one set unless one exists (its memory is touched when a periodic save first asks for it),
        and unless ``can_allocate()`` says it does not fit. Returns the size of a set in bytes."""
        layout = layout_of(variables)
        if can_allocate is not None and not can_allocate():
            return total_nbytes(variables)
        with self._cond:
            self._use_layout(layout)
            if self._alive == 0:
                buffers = [np.empty(shape, dtype) for shape, dtype in layout]   # not touched: no cost yet
                self._alive += 1
                self.sets_allocated += 1
                self._free.append(buffers)
                self._untouched.add(id(buffers))
        return total_nbytes(variables)

    def _touch_then_give_back(self, buffers: list) -> None:
        """Fault the set's pages in, in a background thread (page faults are most of the cost of a first copy
        into fresh memory, hundreds of ms for hundreds of MB), then make it available. The untouched arrays are
        replaced by new ones whose pages the kernel faults in at once (memory.py: faster than touching each);
        those it cannot populate (small ones, or no MAP_POPULATE) are written once, as every array was before."""
        def touch():
            try:
                for i, buffer in enumerate(buffers):
                    buffers[i] = new_array(buffer.shape, buffer.dtype, fault_in=True)
            finally:
                self.give_back(buffers)

        threading.Thread(target=touch, name="colabkit-snapshot-touch", daemon=True).start()

    def give_back(self, buffers: list) -> None:
        with self._cond:
            if [(b.shape, b.dtype) for b in buffers] == self._layout and self._alive <= self.sets:
                self._free.append(buffers)
            else:
                self._alive -= 1   # of another layout, or an extra set: let it go
            self._cond.notify_all()


TOO_BIG = "too big"   # what take() returns when a set would not fit in free memory (see streaming.py)


def _faulted_in(layout) -> list:
    """New arrays of ``layout``, every page faulted in: populated by the kernel where it can (large arrays,
    memory.py), else written once."""
    return [new_array(shape, dtype, fault_in=True) for shape, dtype in layout]


def layout_of(variables) -> list:
    """(shape, NumPy dtype) of each variable or spec."""
    return [(tuple(v.shape), np.dtype(_dtype_name(v))) for v in variables]


def total_nbytes(variables) -> int:
    return sum(int(np.prod(v.shape)) * np.dtype(_dtype_name(v)).itemsize for v in variables)


def _dtype_name(variable) -> str:
    dtype = variable.dtype
    return dtype if isinstance(dtype, str) else getattr(dtype, "name", str(dtype))
