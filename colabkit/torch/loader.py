"""Where a DataLoader stands, for `colabkit.torch.AutoResume` (and Lightning's callback): the generators that
decide its shuffle order and worker seeds, the RNG states an epoch's iterator starts from, a StatefulDataLoader's
own position, and skipping to a batch. ``LoaderPlace`` puts the loader of a resumed epoch where the checkpoint's
left it, so that its remaining batches are the uninterrupted run's.
"""
from __future__ import annotations

import logging

import numpy as np

from ..optional import require

torch = require("torch", "torch", "colabkit.torch")

from .state import _set_rng  # noqa: E402

log = logging.getLogger("colabkit")


class LoaderPlace:
    """The loader ``batches()`` iterates last, and what a checkpoint holds of its place: ``generators`` (its
    torch.Generators), ``stateful`` (the loader, when it keeps its own position: torchdata's
    StatefulDataLoader), ``epoch_start`` (the RNG states its current epoch's iterator started from; None
    between epochs), ``positionable`` (whether skipping k batches reaches the same place)."""

    def __init__(self):
        self.generators = []
        self.stateful = None
        self.epoch_start = None
        self.positionable = True
        self._restored_position = False   # the stateful loader's own position was loaded (nothing to skip)

    def start(self, loader, pending, resumed_generators) -> int:
        """Before ``loader``'s epoch iterator is made: set its generators as the checkpoint's epoch had them
        (``pending``: the resumed checkpoint's RNG and loader states at its position, or None;
        ``resumed_generators``: the saved generator states after a resume at an epoch's start), and load a
        StatefulDataLoader's own position. Returns the batches still to skip."""
        skip = pending["batch"] if pending is not None else 0
        generators = self.generators = generators_of(loader)
        self.stateful = loader if is_stateful(loader) else None
        if skip and pending.get("epoch_start") is not None:
            set_epoch_start(pending["epoch_start"], generators)   # the same shuffle order and worker seeds
        elif resumed_generators is not None:
            # resumed at an epoch's start: the loader's own generators as the save left them (epochs() has set
            # the global RNGs), before its iterator draws this epoch's order from them
            set_generators(resumed_generators, generators)
        self.epoch_start = epoch_start_state(generators)
        self.positionable = positionable(loader)
        self._restored_position = False
        if skip and self.stateful is not None and pending.get("loader") is not None and (
                not self.positionable or getattr(loader, "num_workers", 0) == 0):
            # its own position: nothing is loaded again. (Map-style data in workers is skipped by loading it
            # instead: only that replays each worker's augmentation RNG; a restored state starts them afresh.)
            loader.load_state_dict(pending["loader"])
            self._restored_position, skip = True, 0
        return skip

    def iterate(self, loader, skip: int, pending):
        """``loader``'s epoch iterator, past ``skip`` batches; then the checkpoint's RNG states (``pending``),
        as they were at its position."""
        if getattr(loader, "persistent_workers", False) and getattr(loader, "num_workers", 0) > 0:
            log.info("colabkit: persistent_workers keeps each worker's RNG across epochs, and a resumed run starts "
                     "new workers: their augmentation does not repeat the uninterrupted run's")
        iterator = iter(loader)
        if skip:
            skip_batches(iterator, skip)
        if pending is not None:
            _set_rng(pending["rng"])
            if self._restored_position:   # the loader's generators as they were at the save
                set_generators(pending["rng"].get("generators") or [], self.generators)
        return iterator

    def generator_states(self) -> list:
        """The current states of the loader's generators (saved with the RNG states)."""
        return [g.get_state().numpy().copy() for g in self.generators]


def generators_of(loader) -> list:
    """The torch.Generators that decide a DataLoader's shuffle order and worker seeds (its own, its sampler's),
    each once."""
    found = []
    for owner in (loader, getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None),
                                                                   "sampler", None)):
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator) and all(g is not other for other in found):
            found.append(g)
    return found


def epoch_start_state(generators) -> dict:
    """What a DataLoader draws from when an epoch's iterator starts: the global torch RNG (the workers' base
    seed and RandomSampler's permutation without a generator of their own) and the loader's generators."""
    return {"torch": torch.get_rng_state().numpy().copy(),
            "generators": [g.get_state().numpy().copy() for g in generators]}


def set_epoch_start(state: dict, generators) -> None:
    torch.set_rng_state(torch.from_numpy(np.array(state["torch"], dtype=np.uint8)))
    set_generators(state.get("generators") or [], generators)


def set_generators(saved: list, generators) -> None:
    if len(saved) != len(generators):
        log.warning("colabkit: the DataLoader has %d generators and the checkpoint %d; its shuffle order is not "
                    "the saved one", len(generators), len(saved))
        return
    for g, s in zip(generators, saved):
        g.set_state(torch.from_numpy(np.array(s, dtype=np.uint8)))


def is_stateful(loader) -> bool:
    """A loader that saves and restores its own position (torchdata's StatefulDataLoader, or one like it)."""
    return isinstance(loader, torch.utils.data.DataLoader) and callable(getattr(loader, "state_dict", None)) \
        and callable(getattr(loader, "load_state_dict", None))


def positionable(loader) -> bool:
    """Whether skipping k batches reaches the same position: a map-style DataLoader, or a re-iterable sized
    collection (a fresh iterator starts from its first batch each time)."""
    if isinstance(loader, torch.utils.data.DataLoader):
        return not isinstance(loader.dataset, torch.utils.data.IterableDataset)
    return hasattr(loader, "__len__") and iter(loader) is not loader


def skip_batches(iterator, k: int) -> None:
    """Advance ``iterator`` past ``k`` batches. A single-process DataLoader skips their indices without
    loading them; with workers, each worker must load its batches again so that its RNG advances as it did."""
    next_index = getattr(iterator, "_next_index", None)
    single = type(iterator).__name__ == "_SingleProcessDataLoaderIter" and callable(next_index)
    for _ in range(k):
        try:
            if single:
                next_index()
            else:
                next(iterator)
        except StopIteration:
            return
