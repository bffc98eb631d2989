"""Where an accelerate data loader stands, for `colabkit.hf.AccelerateResume`: the RNG state and generator states
its epoch's shuffle order and worker seeds were drawn from, its generators' current states, accelerate's epoch
counter (``iteration``) and a seedable sampler's seed; written per process beside accelerate's files as NumPy
arrays (read without unpickling anything) and put back before the resumed epoch's iterator is made.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ..optional import require

accelerate = require("accelerate", "hf", "colabkit.hf.AccelerateResume")
torch = require("torch", "hf", "colabkit.hf.AccelerateResume")

log = logging.getLogger("colabkit")

LOADER = "colabkit-loader-{}.npz"      # each process's loader place


class LoaderPlace:
    """The loader ``batches()`` iterates, and what a checkpoint holds of its place: the torch RNG state and the
    generator states its epoch's iterator started from (its shuffle order, its workers' seeds), its generators'
    current states, accelerate's epoch counter (``iteration``) and a seedable sampler's seed."""

    def __init__(self, loader):
        self.loader = loader
        self.generators = _generators_of(loader)
        self.seedable = _seedable_sampler_of(loader)
        self.epoch_start = None

    def start(self, pending) -> int:
        """Before the epoch's iterator is made: put the loader where the checkpoint's left it. Returns the batches
        to skip."""
        skip = pending["batch"] if pending is not None else 0
        place = pending["place"] if pending is not None else None
        if place is not None:
            if "iteration" in place and hasattr(self.loader, "iteration"):
                self.loader.iteration = int(place["iteration"])
            if self.seedable is not None and "seed" in place:
                self.seedable.initial_seed, self.seedable.epoch = (int(v) for v in place["seed"])
            if skip and "start_torch" in place:   # the epoch's shuffle order and worker seeds are drawn again
                torch.set_rng_state(torch.from_numpy(place["start_torch"]))
                _set_generators(self.generators, place, "start")
            elif not skip:                       # an epoch's start: the generators as the epoch before left them
                _set_generators(self.generators, place, "now")
        if skip and getattr(self.loader, "use_stateful_dataloader", False):
            skip = 0   # load_state put its position back: nothing to skip
        self.epoch_start = {"torch": torch.get_rng_state().numpy().copy(),
                            "generators": [g.get_state().numpy().copy() for g in self.generators]}
        if skip and place is not None and "start_torch" in place:
            self.epoch_start["torch"] = place["start_torch"]   # the torch state was set to it above
        return skip

    def finish(self, source) -> None:
        """After the epoch: a skipping loader's epoch counter goes back to the loader it was made from."""
        if source is not self.loader and hasattr(source, "iteration") and hasattr(self.loader, "iteration"):
            self.loader.iteration = source.iteration

    def write(self, path: Path, *, mid_epoch: bool) -> None:
        arrays = {}
        if mid_epoch and self.epoch_start is not None:
            arrays["start_torch"] = self.epoch_start["torch"]
            arrays.update({f"start_{i}": s for i, s in enumerate(self.epoch_start["generators"])})
        arrays.update({f"now_{i}": g.get_state().numpy().copy() for i, g in enumerate(self.generators)})
        arrays["generators"] = np.array(len(self.generators), dtype=np.int64)
        if hasattr(self.loader, "iteration"):
            arrays["iteration"] = np.array(int(self.loader.iteration), dtype=np.int64)
        if self.seedable is not None:
            arrays["seed"] = np.array([int(self.seedable.initial_seed), int(self.seedable.epoch)], dtype=np.int64)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            np.savez(f, **arrays)


def read_loader_place(folder: Path, index: int):
    """This process's loader place from a restored checkpoint, or None (not there, or not one colabkit writes)."""
    path = folder / LOADER.format(index)
    if not path.is_file():   # saved before any batches() of this run
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            place = {key: data[key] for key in data.files}
    except (OSError, ValueError) as exc:
        log.warning("colabkit: %s cannot be read (%s); the loader starts its epoch afresh", path.name, exc)
        return None
    for key in ("start_torch", *(k for k in place if k.startswith(("start_", "now_")))):
        if key in place and (place[key].dtype != np.uint8 or place[key].ndim != 1):
            log.warning("colabkit: %s holds %s of dtype %s; the loader starts its epoch afresh", path.name, key,
                        place[key].dtype)
            return None
    return place


def _set_generators(generators, place: dict, which: str) -> None:
    saved = [place.get(f"{which}_{i}") for i in range(int(place.get("generators", 0)))]
    if len(saved) != len(generators) or any(s is None for s in saved):
        log.warning("colabkit: the data loader has %d generators and the checkpoint %d; its shuffle order is not "
                    "the saved one", len(generators), len(saved))
        return
    for g, s in zip(generators, saved):
        g.set_state(torch.from_numpy(np.array(s, dtype=np.uint8)))


def _owners(loader):
    """The loader and the samplers inside it (a prepared loader's batch sampler shards another one)."""
    found, todo = [], [loader]
    while todo:
        obj = todo.pop(0)
        if obj is None or any(obj is seen for seen in found):
            continue
        found.append(obj)
        for name in ("sampler", "batch_sampler"):
            todo.append(getattr(obj, name, None))
        getter = getattr(obj, "get_sampler", None)
        if callable(getter) and obj is loader:
            try:
                todo.append(getter())
            except Exception:  # noqa: BLE001 - a loader of another shape: its samplers are found above
                pass
    return found


def _generators_of(loader) -> list:
    """The torch.Generators that decide a loader's shuffle order and worker seeds, each once."""
    found = []
    for owner in _owners(loader):
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator) and all(g is not other for other in found):
            found.append(g)
    return found


def _seedable_sampler_of(loader):
    seedable = accelerate.data_loader.SeedableRandomSampler
    return next((o for o in _owners(loader) if isinstance(o, seedable)), None)
