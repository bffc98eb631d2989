"""How colabkit stores PyTorch state: state dicts as a JSON tree whose tensors are NumPy arrays (copied once
into reused host buffers); the RNG states of torch, CUDA, NumPy and Python; and what puts a DataLoader back at
its place (its generators, a StatefulDataLoader's state, skipping). Shared by `colabkit.torch` (AutoResume for
plain loops) and `colabkit.torch_lightning` (Lightning's CheckpointIO and callback). Nothing is pickled.
"""
from __future__ import annotations

import logging
import random

import numpy as np

from .optional import require

torch = require("torch", "torch", "colabkit.torch")

from .checkpoints.api import CheckpointError  # noqa: E402
from .units import DURATION_FORMS, parse_duration  # noqa: E402

log = logging.getLogger("colabkit")

_TAG = "__colabkit_torch__"          # marks encoded values in the JSON tree: tensors, tuples, non-str-key dicts
# dtypes NumPy has no equivalent for: stored as raw integers of the same width, the dtype named beside them
_RAW_VIEW = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8", "float8_e4m3fnuz": "uint8",
             "float8_e5m2fnuz": "uint8", "float8_e8m0fnu": "uint8", "float4_e2m1fn_x2": "uint8",
             "complex32": "int32"}


class Stopped(Exception):
    """Training was stopped before a deadline (the runtime cap, the idle cutoff, a time budget) once its
    checkpoint was saved and committed. Re-running the cell resumes. One class for `colabkit.torch` and
    `colabkit.torch_lightning`. In IPython it shows as one line, not a traceback."""

    def _render_traceback_(self):   # IPython's hook: the message is the whole story (what was saved, what to do)
        return [f"colabkit.Stopped: {self}"]


def check_schedule(save_freq, every):
    """Both PyTorch adapters' save_freq/every arguments, checked: returns ``every`` in seconds (or None)."""
    if save_freq is not None and (isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1):
        raise ValueError(f"save_freq={save_freq!r} is invalid: pass a number of batches (at least 1), or None "
                         f"for no batch-count saves.")
    if every is not None:
        try:
            every = parse_duration(every, name="every")
        except ValueError:
            raise ValueError(f"every={every!r} is invalid: pass None or {DURATION_FORMS}.") from None
    return every


class _Spec:
    """A host buffer's shape and NumPy dtype (what SnapshotBuffers lays its sets out by)."""
    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def _host_dtype(tensor) -> np.dtype:
    name = str(tensor.dtype).removeprefix("torch.")
    try:
        return np.dtype(_RAW_VIEW.get(name, name))
    except TypeError:
        raise CheckpointError(f"a tensor of dtype torch.{name} cannot be stored (NumPy has no such dtype and colabkit "
                              f"has no raw form for it); convert it (tensor.to(torch.float32)) in state_dict(). "
                              f"Nothing was saved.") from None


def _copy_into(buffer: np.ndarray, tensor) -> None:
    """One copy of ``tensor`` (any device) into ``buffer``: device-to-host lands in the buffer directly."""
    t = tensor.detach()
    name = str(t.dtype).removeprefix("torch.")
    if name in _RAW_VIEW:
        t = t.view(getattr(torch, _RAW_VIEW[name]))
    torch.from_numpy(buffer).copy_(t)


class _Slot:
    """Where the n-th tensor's buffer goes in the encoded tree (filled in by _fill)."""
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


def _fill(tree, buffers):
    if isinstance(tree, _Slot):
        return buffers[tree.index]
    if isinstance(tree, dict):
        return {k: _fill(v, buffers) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_fill(v, buffers) for v in tree]
    return tree


def _encode(value, tensors: list):
    """A state dict as the store's tree: each tensor is appended to ``tensors`` and stands as a slot for its
    host copy (its dtype beside it); tuples and dicts with non-string keys are tagged so that they come back
    as they were."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return {_TAG: "tensor", "dtype": str(value.dtype).removeprefix("torch."), "data": _Slot(len(tensors) - 1)}
    if isinstance(value, dict):
        if all(isinstance(k, str) and k != _TAG for k in value):
            return {k: _encode(v, tensors) for k, v in value.items()}
        items = []
        for k, v in value.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise CheckpointError(f"a state_dict key {k!r} ({type(k).__name__}) cannot be stored; use "
                                      f"strings or numbers as keys.")
            items.append([k, _encode(v, tensors)])
        return {_TAG: "dict", "items": items}
    if isinstance(value, tuple):
        return {_TAG: "tuple", "items": [_encode(v, tensors) for v in value]}
    if isinstance(value, list):
        return [_encode(v, tensors) for v in value]
    if isinstance(value, (torch.dtype, torch.device)):
        return {_TAG: type(value).__name__, "name": str(value)}
    if isinstance(value, np.ndarray) or (hasattr(value, "__array__") and not isinstance(value, np.generic)):
        return np.array(value, copy=True)   # a copy now: the write runs in the background, after training goes on
    return value


def _encode_small(value):
    """A small state dict (a loader's position) as the store's tree, each tensor copied to a host array now."""
    tensors = []
    tree = _encode(value, tensors)
    arrays = []
    for t in tensors:
        buffer = np.empty(tuple(t.shape), _host_dtype(t))
        _copy_into(buffer, t)
        arrays.append(buffer)
    return _fill(tree, arrays)


def _decode(value):
    if isinstance(value, dict):
        kind = value.get(_TAG)
        if kind == "tensor":
            data = np.array(value["data"])   # owned and writable (the restored array views the file's bytes)
            tensor = torch.from_numpy(data)
            if value["dtype"] in _RAW_VIEW:
                tensor = tensor.view(getattr(torch, value["dtype"]))
            return tensor
        if kind == "dict":
            return {k: _decode(v) for k, v in value["items"]}
        if kind == "tuple":
            return tuple(_decode(v) for v in value["items"])
        if kind == "dtype":
            return getattr(torch, value["name"].removeprefix("torch."))
        if kind == "device":
            return torch.device(value["name"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


# -- RNG states ----------------------------------------------------------------------------------------------

def _rng_state() -> dict:
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state()
    state = {"python": {"version": version, "internal": list(internal), "gauss": gauss},
             "numpy": {"keys": np_state[1], "pos": int(np_state[2]), "has_gauss": int(np_state[3]),
                       "cached_gaussian": float(np_state[4])},
             "torch": torch.get_rng_state().numpy().copy()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.numpy().copy() for s in torch.cuda.get_rng_state_all()]
    return state


def _set_rng(state: dict):
    p = state["python"]
    random.setstate((p["version"], tuple(int(x) for x in p["internal"]), p["gauss"]))
    n = state["numpy"]
    np.random.set_state(("MT19937", np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(torch.from_numpy(np.array(state["torch"], dtype=np.uint8)))
    if state.get("cuda") and torch.cuda.is_available():
        for i, s in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(torch.from_numpy(np.array(s, dtype=np.uint8)), i)


# -- the loader's position and shuffle order -----------------------------------------------------------------

def _loader_generators(loader) -> list:
    """The torch.Generators that decide a DataLoader's shuffle order and worker seeds (its own, its sampler's),
    each once."""
    found = []
    for owner in (loader, getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None),
                                                                   "sampler", None)):
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator) and all(g is not other for other in found):
            found.append(g)
    return found


def _epoch_start_state(generators) -> dict:
    """What a DataLoader draws from when an epoch's iterator starts: the global torch RNG (the workers' base
    seed and RandomSampler's permutation without a generator of their own) and the loader's generators."""
    return {"torch": torch.get_rng_state().numpy().copy(),
            "generators": [g.get_state().numpy().copy() for g in generators]}


def _set_epoch_start(state: dict, generators) -> None:
    torch.set_rng_state(torch.from_numpy(np.array(state["torch"], dtype=np.uint8)))
    _set_generators(state.get("generators") or [], generators)


def _set_generators(saved: list, generators) -> None:
    if len(saved) != len(generators):
        log.warning("colabkit: the DataLoader has %d generators and the checkpoint %d; its shuffle order is not "
                    "the saved one", len(generators), len(saved))
        return
    for g, s in zip(generators, saved):
        g.set_state(torch.from_numpy(np.array(s, dtype=np.uint8)))


def _stateful(loader) -> bool:
    """A loader that saves and restores its own position (torchdata's StatefulDataLoader, or one like it)."""
    return isinstance(loader, torch.utils.data.DataLoader) and callable(getattr(loader, "state_dict", None)) \
        and callable(getattr(loader, "load_state_dict", None))


def _positionable(loader) -> bool:
    """Whether skipping k batches reaches the same position: a map-style DataLoader, or a re-iterable sized
    collection (a fresh iterator starts from its first batch each time)."""
    if isinstance(loader, torch.utils.data.DataLoader):
        return not isinstance(loader.dataset, torch.utils.data.IterableDataset)
    return hasattr(loader, "__len__") and iter(loader) is not loader


def _skip(iterator, k: int) -> None:
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
