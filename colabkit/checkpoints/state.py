"""Turning a user's state dict into checkpoint files and back, with safe formats only.

Supported values: JSON-able values (None, bool, int, float, str, lists, dicts with str keys), NumPy arrays
and scalars (and anything with ``__array__``, e.g. tensors), and TensorFlow trackables (tf.Variable,
tf.Module, Keras models, optimizers, tf.train.Checkpoint). Files: ``arrays.npz`` (uncompressed, readable with
np.load(allow_pickle=False); written and read in one pass by npz.py), ``state.json``, and a TensorFlow
checkpoint under ``tf/`` for trackables. Nothing read back is ever unpickled.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from . import npz as _npz
from .folder import InvalidCheckpoint
from .storage import write_bytes

ARRAYS = "arrays.npz"
STATE = "state.json"
TF_PREFIX = "tf/ckpt"
_ARRAY_TAG, _TRACKABLE_TAG = "__colabkit_array__", "__colabkit_trackable__"


class StateError(ValueError):
    """A state value colabkit cannot store, or a checkpoint whose state cannot be loaded into the given objects."""


@dataclasses.dataclass
class Snapshot:
    """An in-memory copy of a state dict, independent of the live objects (safe to write from another thread)."""
    tree: dict
    arrays: dict
    trackables: dict


def _is_trackable(value) -> bool:
    tf = sys.modules.get("tensorflow")  # a trackable implies TensorFlow is loaded; never import it here
    if tf is None:
        return False
    try:
        return isinstance(value, tf.__internal__.tracking.Trackable)
    except AttributeError:  # pragma: no cover - very old TF
        return isinstance(value, (tf.Module, tf.Variable))


def snapshot(state: dict, *, copy_arrays: bool = True) -> Snapshot:
    """Copy ``state`` into a Snapshot. Trackables are kept by reference (TensorFlow writes them itself)."""
    if not isinstance(state, dict):
        raise StateError(f"A checkpoint's state must be a dict of name -> value, got {type(state).__name__}.")
    arrays, trackables = {}, {}

    def visit(value, where):
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise StateError(f"State key {key!r} at {where or 'top level'} must be a string.")
                out[key] = visit(item, f"{where}/{key}" if where else key)
            return out
        if isinstance(value, (list, tuple)):
            return [visit(item, f"{where}[{i}]") for i, item in enumerate(value)]
        if _is_trackable(value) and not _looks_like_tensor(value):
            key = f"t{len(trackables)}"
            trackables[key] = value
            return {_TRACKABLE_TAG: key, "path": where}
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray) or hasattr(value, "__array__"):
            array = np.array(value, copy=True) if copy_arrays else np.asarray(value)
            if array.dtype == object:
                raise StateError(f"State value {where!r} is an object array, which cannot be stored without pickle; "
                                 f"convert it to a numeric or string dtype.")
            key = f"a{len(arrays)}"
            arrays[key] = array
            return {_ARRAY_TAG: key}
        raise StateError(f"State value {where!r} has type {type(value).__name__}, which colabkit cannot store; "
                         f"use JSON-able values, NumPy arrays or TensorFlow trackables (tf.Variable, tf.Module, "
                         f"Keras models).")

    tree = visit(state, "")
    return Snapshot(tree=tree, arrays=arrays, trackables=trackables)


def _looks_like_tensor(value) -> bool:
    # tf.Variable is trackable but reads as an array too; keep variables as trackables so they restore in place.
    return type(value).__name__ in ("EagerTensor", "Tensor")


def write_trackables(snap: Snapshot, ckpt_dir: Path) -> None:
    """Write trackables with TensorFlow's own checkpoint format. Runs on the caller's (training) thread."""
    if not snap.trackables:
        return
    import tensorflow as tf
    tf.train.Checkpoint(**snap.trackables).write(str(ckpt_dir / TF_PREFIX))


def write_data(snap: Snapshot, ckpt_dir: Path) -> dict:
    """Write the arrays and the JSON tree (may run on a background thread), each hashed while it is written
    and fsynced. Returns {file name: (sha256 hex, size)} for the manifest (see CheckpointFolder.commit)."""
    written = {}
    if snap.arrays:
        written[ARRAYS] = _npz.write(ckpt_dir / ARRAYS, snap.arrays)
    data = json.dumps({"tree": snap.tree}, allow_nan=True).encode()
    write_bytes(ckpt_dir / STATE, data)
    written[STATE] = (hashlib.sha256(data).hexdigest(), len(data))
    return written


def read(ckpt_dir: Path, into: dict | None = None) -> dict:
    """Load a checkpoint's state. Trackables are restored in place into the objects of ``into``
    (same names as when saved); without them, their entries are left as None."""
    contents = {STATE: (ckpt_dir / STATE).read_bytes()}
    if (ckpt_dir / ARRAYS).exists():
        contents[ARRAYS] = _npz.read_into_memory(ckpt_dir / ARRAYS)[0]
    return from_contents(contents, ckpt_dir, into)


def from_contents(contents: dict, ckpt_dir: Path, into: dict | None = None) -> dict:
    """The state of a checkpoint whose files ``contents`` ({name: bytes-like}) were read already (and checked
    against the manifest): arrays are views into those bytes. ``ckpt_dir`` is read only for trackables.
    A state.json that is not what colabkit writes raises InvalidCheckpoint (the files may match a re-signed
    manifest: that proves integrity, not authorship)."""
    doc = json.loads(bytes(contents[STATE]).decode("utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("tree"), dict):
        raise InvalidCheckpoint(f"{STATE} holds no state tree")
    arrays = _npz.load(contents[ARRAYS]) if ARRAYS in contents else {}
    trackable_paths = {}

    def visit(value, where):
        if isinstance(value, dict):
            if _ARRAY_TAG in value:
                key = value[_ARRAY_TAG]
                if not isinstance(key, str) or key not in arrays:
                    raise InvalidCheckpoint(f"{where or 'the state'} names the array {key!r}, which {ARRAYS} "
                                            f"does not hold")
                return arrays[key]
            if _TRACKABLE_TAG in value:
                key, path = value[_TRACKABLE_TAG], value.get("path")
                if not isinstance(key, str) or not isinstance(path, str):
                    raise InvalidCheckpoint(f"{where or 'the state'} is a TensorFlow object entry without a "
                                            f"name and path")
                trackable_paths[key] = path
                return None
            return {k: visit(v, f"{where}/{k}" if where else k) for k, v in value.items()}
        if isinstance(value, list):
            return [visit(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    state = visit(doc["tree"], "")
    if trackable_paths and into:
        _restore_trackables(ckpt_dir, trackable_paths, into, state)
    return state


def _restore_trackables(ckpt_dir: Path, paths: dict, into: dict, state: dict) -> None:
    """Restore the objects of ``into`` in place from the checkpoint's TensorFlow files. Every tensor there is
    read (and checked against its stored checksum) first: files that cannot be read raise InvalidCheckpoint
    with nothing changed. A checkpoint that does not fit the objects raises StateError after every variable
    TensorFlow had assigned already is put back (it restores them one after another)."""
    import tensorflow as tf
    objects = {}
    for key, path in paths.items():
        if "/" in path or "[" in path:
            raise StateError(f"The trackable at {path!r} was nested; restore supports trackables at the top level.")
        if path in into:
            objects[key] = into[path]
    if not objects:
        return
    prefix = str(ckpt_dir / TF_PREFIX)
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except (tf.errors.OpError, IndexError, ValueError, RuntimeError) as exc:
        # a garbage index: OpError; data cut short: IndexError ("Read less bytes than requested")
        raise InvalidCheckpoint(f"its TensorFlow files cannot be read ({_first_line(exc)})") from None
    before = [(variable, variable.numpy().copy()) for variable in _variables_of(objects.values())]
    try:
        tf.train.Checkpoint(**objects).read(prefix).assert_existing_objects_matched()
    except BaseException as exc:
        for variable, value in before:
            variable.assign(value)
        if isinstance(exc, (ValueError, AssertionError)):
            raise StateError(f"The checkpoint in {ckpt_dir} does not fit the objects given to restore: "
                             f"{_first_line(exc)}. Nothing was changed.") from None
        if isinstance(exc, (tf.errors.OpError, IndexError)):
            raise InvalidCheckpoint(f"its TensorFlow files cannot be read ({_first_line(exc)})") from None
        raise
    for key, path in paths.items():
        if key in objects:
            state[path] = into[path]


def _variables_of(objects) -> list:
    """The variables of the objects given to restore (tf.Variables, tf.Modules, Keras models), each once."""
    import tensorflow as tf
    found, seen = [], set()
    for obj in objects:
        for variable in [obj] if isinstance(obj, tf.Variable) else list(getattr(obj, "variables", None) or []):
            if id(variable) not in seen and callable(getattr(variable, "assign", None)) and callable(
                    getattr(variable, "numpy", None)):
                seen.add(id(variable))
                found.append(variable)
    return found


def _first_line(exc) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
