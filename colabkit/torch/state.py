"""How colabkit stores PyTorch state: state dicts as a JSON tree whose tensors are NumPy arrays (copied once
into the store's reused host buffers, see Checkpoints.save_snapshot), decoded back without unpickling anything;
and the RNG states of torch, CUDA, NumPy and Python. Shared by `colabkit.torch` (AutoResume for plain loops) and
`colabkit.torch_lightning` (Lightning's CheckpointIO and callback). What is refused is in checks.py, where a
DataLoader stands in loader.py.

The state dicts go through the state codec (colabkit/checkpoints/codec.py): importing this module registers the
torch kinds there (tensors, dtypes, devices); tuples, dicts with other keys and RNG objects are the codec's own.
The RNG states of Python and NumPy are those of colabkit/checkpoints/rng.py, as the Keras adapter saves them.
"""
from __future__ import annotations

import numpy as np

from ..optional import require

torch = require("torch", "torch", "colabkit.torch")

from ..checkpoints import codec, rng, untrusted  # noqa: E402
from ..checkpoints.api import CheckpointError  # noqa: E402
from ..checkpoints.folder import InvalidCheckpoint  # noqa: E402

FORMAT = "colabkit.torch/1"          # the state colabkit.torch.AutoResume saves (Lightning's has its own)
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
    checkpoint was saved and committed. Re-running the cell resumes. One class for `colabkit.torch`,
    `colabkit.torch_lightning` and `colabkit.hf`. In IPython it shows as one line, not a traceback."""

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
    # the restored array views the checkpoint's read buffer, which the restored state keeps anyway: the tensor
    # shares it (no copy; a module's load_state_dict copies into its parameters). A read-only or misaligned array
    # (a file of another writer) is copied.
    tensor = torch.from_numpy(data if data.flags.writeable and data.flags.aligned else data.copy())
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


# -- RNG states ----------------------------------------------------------------------------------------------

def _rng_state() -> dict:
    state = rng.global_state()
    state["torch"] = torch.get_rng_state().numpy().copy()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.numpy().copy() for s in torch.cuda.get_rng_state_all()]
    return state


def _set_rng(state: dict):
    rng.set_global_state(state)
    torch.set_rng_state(torch.from_numpy(np.array(state["torch"], dtype=np.uint8)))
    if state.get("cuda") and torch.cuda.is_available():
        for i, s in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(torch.from_numpy(np.array(s, dtype=np.uint8)), i)
