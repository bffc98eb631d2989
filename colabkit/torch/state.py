"""How colabkit stores PyTorch state: state dicts as a JSON tree whose tensors are NumPy arrays (copied once
into the store's reused host buffers, see Checkpoints.save_snapshot), decoded back without unpickling anything;
and the RNG states of torch, CUDA, NumPy and Python. Shared by `colabkit.torch` (AutoResume for plain loops) and
`colabkit.torch_lightning` (Lightning's CheckpointIO and callback). What is refused is in checks.py, where a
DataLoader stands in loader.py.
"""
from __future__ import annotations

import random

import numpy as np

from ..optional import require

torch = require("torch", "torch", "colabkit.torch")

from ..checkpoints import untrusted  # noqa: E402
from ..checkpoints.api import CheckpointError  # noqa: E402
from ..checkpoints.folder import InvalidCheckpoint  # noqa: E402

FORMAT = "colabkit.torch/1"          # the state colabkit.torch.AutoResume saves (Lightning's has its own)
_TAG = "__colabkit_torch__"          # marks encoded values in the JSON tree: tensors, tuples, non-str-key dicts
# dtypes NumPy has no equivalent for: stored as raw integers of the same width, the dtype named beside them
_RAW_VIEW = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8", "float8_e4m3fnuz": "uint8",
             "float8_e5m2fnuz": "uint8", "float8_e8m0fnu": "uint8", "float4_e2m1fn_x2": "uint8",
             "complex32": "int32"}
# the dtypes a checkpoint may name (an allow-list: a name read from a checkpoint never reaches getattr(torch, ...))
_DTYPES = {name: getattr(torch, name) for name in (
    "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32", "int64", "int32", "int16",
    "int8", "uint64", "uint32", "uint16", "uint8", "bool", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2") if isinstance(getattr(torch, name, None), torch.dtype)}
_KEY_TYPES = (str, int, float, bool, type(None))


class Stopped(Exception):
    """Training was stopped before a deadline (the runtime cap, the idle cutoff, a time budget) once its
    checkpoint was saved and committed. Re-running the cell resumes. One class for `colabkit.torch` and
    `colabkit.torch_lightning`. In IPython it shows as one line, not a traceback."""

    def _render_traceback_(self):   # IPython's hook: the message is the whole story (what was saved, what to do)
        return [f"colabkit.torch.Stopped: {self}"]


def target(obj):
    """The object whose state_dict is saved: wrappers (DataParallel, DistributedDataParallel, torch.compile)
    give way to the module they wrap, so keys carry no ``module.`` prefix and a checkpoint fits either form."""
    while True:
        if isinstance(obj, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
            obj = obj.module
        elif isinstance(obj, torch.nn.Module) and isinstance(getattr(obj, "_orig_mod", None), torch.nn.Module):
            obj = obj._orig_mod
        else:
            return obj


class _Spec:
    """A host buffer's shape and NumPy dtype (a spec of Checkpoints.save_snapshot)."""
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


def _decode(value, where: str = "the state"):
    """The tree written by _encode, back: tensors, tuples, dicts with other keys, dtypes, devices. The tree
    is untrusted: a tag it does not know, a dtype outside _DTYPES or data that disagree with their dtype
    raise InvalidCheckpoint naming where."""
    if isinstance(value, dict):
        kind = value.get(_TAG)
        if kind is None:
            return {k: _decode(v, f"{where}[{k!r}]") for k, v in value.items()}
        if kind == "tensor":
            return _decode_tensor(value, where)
        if kind in ("dict", "tuple"):
            items = untrusted.sequence(value.get("items"), f"{where}'s items")
            if kind == "tuple":
                return tuple(_decode(v, f"{where}[{i}]") for i, v in enumerate(items))
            pairs = {}
            for i, item in enumerate(items):
                if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], _KEY_TYPES):
                    raise untrusted.invalid(f"{where}'s item {i}", item, "a [key, value] pair")
                pairs[item[0]] = _decode(item[1], f"{where}[{item[0]!r}]")
            return pairs
        if kind == "dtype":
            return _dtype(value.get("name"), where)
        if kind == "device":
            name = value.get("name")
            try:
                return torch.device(name)
            except (RuntimeError, TypeError, ValueError):
                raise untrusted.invalid(where, name, "a torch device") from None
        raise InvalidCheckpoint(f"{where} is tagged {kind!r}, which colabkit does not write")
    if isinstance(value, list):
        return [_decode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def _dtype(name, where):
    name = name.removeprefix("torch.") if isinstance(name, str) else name
    if name not in _DTYPES:
        raise untrusted.invalid(f"{where}'s dtype", name, "a torch dtype")
    return _DTYPES[name]


def _decode_tensor(value, where):
    dtype = _dtype(value.get("dtype"), where)
    name = str(dtype).removeprefix("torch.")
    data = untrusted.numeric_array(value.get("data"), f"{where}'s data")
    stored = np.dtype(_RAW_VIEW.get(name, name))
    if data.dtype != stored:
        raise InvalidCheckpoint(f"{where} is a tensor of {name} whose data are {data.dtype}, not {stored}")
    tensor = torch.from_numpy(np.array(data))   # owned and writable (the restored array views the file's bytes)
    return tensor.view(dtype) if name in _RAW_VIEW else tensor


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
    random.setstate(untrusted.python_rng(state["python"]))
    np.random.set_state(untrusted.numpy_rng(state["numpy"]))
    torch.set_rng_state(torch.from_numpy(np.array(state["torch"], dtype=np.uint8)))
    if state.get("cuda") and torch.cuda.is_available():
        for i, s in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(torch.from_numpy(np.array(s, dtype=np.uint8)), i)
