"""Turning a user's state dict into checkpoint files and back, with safe formats only.

Supported values: JSON-able values (None, bool, int, float, str, lists, dicts with str keys), NumPy arrays
and scalars (and anything with ``__array__``, e.g. tensors), and TensorFlow trackables (tf.Variable,
tf.Module, Keras models, optimizers, tf.train.Checkpoint). Files: ``arrays.npz`` (uncompressed, readable with
np.load(allow_pickle=False); written and read in one pass by npz.py), ``state.json``, and a TensorFlow
checkpoint under ``tf/`` for trackables. Nothing read back is ever unpickled. The tree is encoded and decoded by
the state codec (codec.py) with the store's tags (arrays, trackables); this module owns the files.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from . import codec, digest
from . import npz as _npz
from .codec import StateError
from .folder import InvalidCheckpoint
from .storage import write_bytes

__all__ = ["ARRAYS", "STATE", "TF_PREFIX", "Snapshot", "StateError", "snapshot", "write_trackables", "write_data",
           "read", "from_contents"]

ARRAYS = "arrays.npz"
STATE = "state.json"
TF_PREFIX = "tf/ckpt"


@dataclasses.dataclass
class Snapshot:
    """An in-memory copy of a state dict, independent of the live objects (safe to write from another thread)."""
    tree: dict
    arrays: dict
    trackables: dict


class _Kept(codec.Sink):
    """The store's side of an encoding: arrays (for arrays.npz, copied unless told not to) and trackables (for
    TensorFlow to write, by reference); anything else is refused."""

    def __init__(self, copy_arrays: bool):
        self.copy_arrays, self.arrays, self.trackables = copy_arrays, {}, {}

    def array(self, value, where):
        array = np.array(value, copy=True) if self.copy_arrays else np.asarray(value)
        if array.dtype == object:
            raise StateError(f"The value at {where} is an object array, which cannot be stored without pickle; "
                             f"convert it to a numeric or string dtype.")
        key = f"a{len(self.arrays)}"
        self.arrays[key] = array
        return key

    def trackable(self, value, where):
        key = f"t{len(self.trackables)}"
        self.trackables[key] = value
        return key

    def other(self, value, where):
        raise StateError(f"The value at {where} has type {type(value).__name__}, which colabkit cannot store; "
                         f"use JSON-able values, NumPy arrays or TensorFlow trackables (tf.Variable, tf.Module, "
                         f"Keras models).")


class _Read(codec.Source):
    """The store's side of a decoding: arrays from arrays.npz; trackables are noted (restored afterwards)."""

    def __init__(self, arrays: dict):
        self.arrays, self.trackable_paths = arrays, {}

    def array(self, key, where):
        if not isinstance(key, str) or key not in self.arrays:
            raise InvalidCheckpoint(f"{where} names the array {key!r}, which {ARRAYS} does not hold")
        return self.arrays[key]

    def trackable(self, key, path, where):
        self.trackable_paths[key] = path
        return None


def snapshot(state: dict, *, copy_arrays: bool = True) -> Snapshot:
    """Copy ``state`` into a Snapshot. Trackables are kept by reference (TensorFlow writes them itself)."""
    if not isinstance(state, dict):
        raise StateError(f"A checkpoint's state must be a dict of name -> value, got {type(state).__name__}.")
    kept = _Kept(copy_arrays)
    tree = codec.encode(state, tags=codec.STORE_TAGS, sink=kept)
    return Snapshot(tree=tree, arrays=kept.arrays, trackables=kept.trackables)


def write_trackables(snap: Snapshot, ckpt_dir: Path) -> None:
    """Write trackables with TensorFlow's own checkpoint format. Runs on the caller's (training) thread."""
    if not snap.trackables:
        return
    import tensorflow as tf
    tf.train.Checkpoint(**snap.trackables).write(str(ckpt_dir / TF_PREFIX))


def write_data(snap: Snapshot, ckpt_dir: Path) -> dict:
    """Write the arrays and the JSON tree (may run on a background thread), each hashed while it is written
    and fsynced. Returns {file name: (digest.HASH hex, size)} for the manifest (see CheckpointFolder.commit)."""
    written = {}
    if snap.arrays:
        written[ARRAYS] = _npz.write(ckpt_dir / ARRAYS, snap.arrays)
    data = json.dumps({"tree": snap.tree}, allow_nan=True).encode()
    write_bytes(ckpt_dir / STATE, data)
    hasher = digest.hasher()
    hasher.update(data)
    written[STATE] = (hasher.hexdigest(), len(data))
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
    source = _Read(_npz.load(contents[ARRAYS]) if ARRAYS in contents else {})
    state = codec.decode(doc["tree"], tags=codec.STORE_TAGS, source=source)
    if source.trackable_paths and into:
        _restore_trackables(ckpt_dir, source.trackable_paths, into, state)
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
