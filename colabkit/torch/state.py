"""How colabkit stores PyTorch state: state dicts as a JSON tree whose tensors are NumPy arrays (copied once
into reused host buffers); the RNG states of torch, CUDA, NumPy and Python; and what puts a DataLoader back at
its place (its generators, a StatefulDataLoader's state, skipping). Shared by `colabkit.torch` (AutoResume for
plain loops) and `colabkit.torch_lightning` (Lightning's CheckpointIO and callback). Nothing is pickled.

The state dicts go through the state codec (colabkit/checkpoints/codec.py): importing this module registers the
torch kinds there (tensors, dtypes, devices); tuples, dicts with other keys and RNG objects are the codec's own.
The RNG states of Python and NumPy are those of colabkit/checkpoints/rng.py, as the Keras adapter saves them.
"""
from __future__ import annotations

import logging

import numpy as np

from ..optional import require

torch = require("torch", "torch", "colabkit.torch")

from ..checkpoints import codec, rng, untrusted  # noqa: E402
from ..checkpoints.api import CheckpointError  # noqa: E402
from ..checkpoints.folder import InvalidCheckpoint  # noqa: E402
from ..units import DURATION_FORMS, parse_duration  # noqa: E402

log = logging.getLogger("colabkit")

# dtypes NumPy has no equivalent for: stored as raw integers of the same width, the dtype named beside them
_RAW_VIEW = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8", "float8_e4m3fnuz": "uint8",
             "float8_e5m2fnuz": "uint8", "float8_e8m0fnu": "uint8", "float4_e2m1fn_x2": "uint8",
             "complex32": "int32"}
# the dtypes a checkpoint may name (an allow-list: a name read from a checkpoint never reaches getattr(torch, ...))
_DTYPES = {name: getattr(torch, name) for name in (
    "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32", "int64", "int32", "int16",
    "int8", "uint64", "uint32", "uint16", "uint8", "bool", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2") if isinstance(getattr(torch, name, None), torch.dtype)}


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


def _host_copy(tensor) -> np.ndarray:
    buffer = np.empty(tuple(tensor.shape), _host_dtype(tensor))
    _copy_into(buffer, tensor)
    return buffer


class _Deferred(codec.Sink):
    """An adapter's side of an encoding whose tensors are copied later, into reused host buffers: each tensor is
    appended to ``tensors`` and stands as a slot for its host copy (filled in by _fill); arrays are copied now
    (the store writes them after training goes on)."""

    def __init__(self, tensors: list):
        self.tensors = tensors

    def leave(self, value, where, host=None):
        if isinstance(value, torch.Tensor):
            self.tensors.append(value)
            return _Slot(len(self.tensors) - 1)
        return super().leave(value, where, host)


def _encode(value, tensors: list):
    """A state dict as the store's tree (the state codec with the adapters' tags): each tensor is appended to
    ``tensors`` and stands as a slot for its host copy (its dtype beside it); tuples and dicts with non-string
    keys are tagged so that they come back as they were."""
    return _encoded(value, _Deferred(tensors))


def _encode_small(value):
    """A small state dict (a loader's position) as the store's tree, each tensor copied to a host array now."""
    return _encoded(value, codec.Sink())


def _encoded(value, sink):
    try:
        return codec.encode(value, tags=codec.VALUE_TAGS, sink=sink)
    except codec.StateError as exc:
        raise CheckpointError(str(exc)) from None


def _decode(value, where: str = "the state"):
    """The tree written by _encode, back: tensors, tuples, dicts with other keys, dtypes, devices. The tree
    is untrusted: a tag it does not know, a dtype outside _DTYPES or data that disagree with their dtype
    raise InvalidCheckpoint naming where."""
    return codec.decode(value, tags=codec.VALUE_TAGS, where=where)


# -- the torch kinds of the state codec (registered on import: `import colabkit` imports no torch) --------------

def _encode_tensor(value, encoding, where):
    return {codec.VALUE_TAG: "tensor", "dtype": str(value.dtype).removeprefix("torch."),
            "data": encoding.array(value, where, host=_host_copy)}


def _decode_tensor(obj, decoding, where):
    dtype = _dtype(obj.get("dtype"), where)
    name = str(dtype).removeprefix("torch.")
    data = decoding.decode(obj.get("data"), where / "data")
    if not isinstance(data, np.ndarray) or data.dtype.kind not in "biufc":   # (the message is made only then)
        untrusted.numeric_array(data, f"{where}'s data")
    stored = np.dtype(_RAW_VIEW.get(name, name))
    if data.dtype != stored:
        raise InvalidCheckpoint(f"{where} is a tensor of {name} whose data are {data.dtype}, not {stored}")
    tensor = torch.from_numpy(np.array(data))   # owned and writable (the restored array views the file's bytes)
    return tensor.view(dtype) if name in _RAW_VIEW else tensor


def _dtype(name, where):
    name = name.removeprefix("torch.") if isinstance(name, str) else name
    if not isinstance(name, str) or name not in _DTYPES:   # a list read from JSON is not even hashable
        raise untrusted.invalid(f"{where}'s dtype", name, "a torch dtype")
    return _DTYPES[name]


def _decode_device(obj, decoding, where):
    name = obj.get("name")
    if not isinstance(name, str):
        raise untrusted.invalid(where, name, "a torch device")
    try:
        return torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise untrusted.invalid(where, name, "a torch device") from None


def _named(kind):
    return lambda value, encoding, where: {codec.VALUE_TAG: kind, "name": str(value)}


codec.register(codec.TypeHandler(codec.VALUE_TAG, "tensor", None, _encode_tensor, _decode_tensor,
                                 types=torch.Tensor))
codec.register(codec.TypeHandler(codec.VALUE_TAG, "dtype", None, _named("dtype"),
                                 lambda obj, decoding, where: _dtype(obj.get("name"), where), types=torch.dtype))
codec.register(codec.TypeHandler(codec.VALUE_TAG, "device", None, _named("device"), _decode_device,
                                 types=torch.device))


def check_optimizer_state(saved, where: str) -> None:
    """A torch.optim optimizer's state_dict() as it writes one: parameter groups that number the parameters
    0, 1, 2, ... in order, state for those numbers only, and numeric hyperparameters that are numbers."""
    saved = untrusted.mapping(saved, where)
    groups = untrusted.sequence(saved.get("param_groups"), f"{where}['param_groups']")
    ids = []
    for g, group in enumerate(groups):
        group = untrusted.mapping(group, f"{where}['param_groups'][{g}]")
        ids += untrusted.sequence(group.get("params"), f"{where}['param_groups'][{g}]['params']")
        for key in ("lr", "weight_decay", "eps", "momentum", "dampening", "initial_lr", "lr_decay", "alpha"):
            value = group.get(key)
            if value is not None and not (isinstance(value, torch.Tensor) and value.numel() == 1):
                untrusted.real(value, f"{where}['param_groups'][{g}][{key!r}]", low=0)
    if ids != list(range(len(ids))):
        raise untrusted.invalid(f"{where}'s parameter ids", ids, f"0 to {len(ids) - 1} in order")
    for key, entry in untrusted.mapping(saved.get("state"), f"{where}['state']").items():
        if key not in ids:
            raise InvalidCheckpoint(f"{where} holds state for parameter {key!r}, which no group lists")
        untrusted.mapping(entry, f"{where}['state'][{key!r}]")


# -- RNG states ----------------------------------------------------------------------------------------------

def _rng_state() -> dict:
    state = rng.global_state()
    state["torch"] = torch.get_rng_state().numpy().copy()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.numpy().copy() for s in torch.cuda.get_rng_state_all()]
    return state


def check_rng(state, where: str = "the RNG states") -> None:
    """The states _rng_state() saves (and a loader's generators'), each of the length this torch uses."""
    state = rng.check_global_state(state, where)
    untrusted.vector(state.get("torch"), f"{where}' torch state", dtype=np.uint8, length=_torch_rng_size())
    for i, cuda in enumerate(untrusted.sequence(state.get("cuda") or [], f"{where}' CUDA states")):
        untrusted.vector(cuda, f"{where}' CUDA state {i}", dtype=np.uint8)
    check_generators(state.get("generators"), f"{where}' loader generators")


def check_generators(saved, where: str) -> None:
    for i, g in enumerate(untrusted.sequence(saved or [], where)):
        untrusted.vector(g, f"{where}[{i}]", dtype=np.uint8, length=_torch_rng_size())


def _torch_rng_size() -> int:
    return torch.get_rng_state().numel()   # a torch.Generator's state on the CPU: the same size


def _set_rng(state: dict):
    rng.set_global_state(state)
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
