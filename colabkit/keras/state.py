"""What of a Keras training state a checkpoint holds, and how it is found and copied: every variable by a
stable path (StateLayout, TrackedVariables), host copies of variables, the RNG states, and which attributes of
Keras' own callbacks hold theirs. colabkit/keras/autoresume.py's AutoResume saves with these; restore.py and
callbacks.py put them back."""
from __future__ import annotations

import sys

import numpy as np

from ..checkpoints import rng
from ..optional import require

keras = require("keras", "tf", "colabkit.keras.AutoResume")

LAYOUT = 2                          # checkpoints whose variables are matched by path (see StateLayout)
GROUPS = ("model", "optimizer", "metrics")
# Keras callbacks whose state a resumed run needs, and the attributes that hold it (CSVLogger: see
# callbacks.py's append_csv_logs; a callback with get_state()/set_state() is asked instead)
CALLBACK_STATE = (
    ("EarlyStopping", ("wait", "stopped_epoch", "best", "best_weights", "best_epoch")),
    ("ReduceLROnPlateau", ("wait", "best", "cooldown_counter")),
    ("ModelCheckpoint", ("best", "_batches_seen_since_last_saving", "_last_batch_seen")),
    ("TensorBoard", ("_global_train_batch", "_global_test_batch")),
)


def host_value(variable) -> np.ndarray:
    """The variable's current value as a host array, copied at most once: TensorFlow's read of a variable on
    the CPU shares the variable's memory and np.asarray views it (``.numpy()`` would copy it); a GPU value
    is copied to the host (that copy is the one). Keep the result only for the copy it is needed for: while
    it lives, the next update of the variable copies the variable's memory first (copy-on-write)."""
    value = variable.value
    if hasattr(value, "read_value"):   # a tf.Variable: its current tensor
        value = value.value()
    try:
        return np.asarray(value)
    except (TypeError, ValueError, RuntimeError):   # e.g. a torch tensor that requires grad
        return np.asarray(keras.ops.convert_to_numpy(value))


def copy_into(buffer: np.ndarray, variable) -> np.ndarray:
    np.copyto(buffer, host_value(variable), casting="no")
    return buffer


def keras_global_seed_generator():
    try:
        from keras.src.backend.common import global_state
    except ImportError:  # pragma: no cover - other Keras layouts
        return None
    return global_state.get_global_attribute("global_seed_generator")


def rng_state() -> dict:
    """The global RNG states a checkpoint holds: Python's, NumPy's, TensorFlow's global generator (when
    TensorFlow is loaded) and Keras' global seed generator (when there is one)."""
    state = rng.global_state()
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        state["tf_global_generator"] = tf.random.get_global_generator().state.numpy()
    seed_gen = keras_global_seed_generator()
    if seed_gen is not None:
        state["keras_global_seed"] = keras.ops.convert_to_numpy(seed_gen.state.value)
    return state


class TrackedVariables:
    """The variables of a model's training state ((model, optimizer, metrics), see StateLayout), walked again
    when the model is another one or its variables changed (an optimizer builds in its first apply)."""

    def __init__(self):
        self.layout = None   # the StateLayout of the last walk

    def groups(self, model):
        """(model, optimizer, metrics) variables: everything Keras tracks for training."""
        layout = self.layout
        if layout is None or layout.model is not model or layout.changed():
            layout = self.layout = StateLayout(model)
        return layout.groups

    def forget(self) -> None:
        """Walk the model again at the next ``groups`` (variables may have been built meanwhile)."""
        self.layout = None

    def paths_of(self, variables) -> list:
        return [self.layout.paths[id(v)] for v in variables]

    def optimizer_builds(self) -> dict:
        """For each built optimizer, the paths of the variables it was built for, so that a resumed run can
        build one that builds lazily (a GAN's optimizers, in their first apply) before its state is assigned."""
        builds = {}
        for path, optimizer in self.layout.optimizers:
            built_for = getattr(optimizer, "_trainable_variables", None)
            if getattr(optimizer, "built", False) and built_for is not None:
                builds[path] = [self.layout.paths.get(id(v)) for v in built_for]
        return builds


class StateLayout:
    """Every variable of a model's training state, each with a path that says where it sits, found the way
    Keras' own save_weights() finds what it saves: by walking the model's attributes (optimizers and metrics
    in attributes, lists and dicts, layers, a LossScaleOptimizer's inner optimizer), plus seed generators.

    Paths are made of attribute names and, inside lists and dicts, of snake-cased class names numbered in
    order (as Keras names them in a .weights.h5 file), never of layer or variable names: those carry global
    counters (dense_3) that change when a notebook cell builds the model again. The same code therefore finds
    each variable at the same path, in another process as in the same one."""

    def __init__(self, model):
        self.model = model
        self.paths = {}        # id(variable) -> path
        self.by_path = {}      # path -> variable
        self.optimizers = []   # (path, optimizer), outer ones first
        self.groups = ([], [], [])
        # id -> what was visited, held until the walk ends: many values are new objects on every access
        # (Sequential.layers is a new list each time), and one freed during the walk would hand its id to a
        # later one, which would then be skipped as seen
        self._seen = {}
        self._visit(model, "")
        del self._seen
        # anything Keras lists that the walk did not reach (the lists the model itself offers)
        optimizer = getattr(model, "optimizer", None)
        for group, where, variables in ((0, "variables", model.variables),
                                        (1, "optimizer.variables", optimizer.variables if optimizer else []),
                                        (2, "metrics_variables", getattr(model, "metrics_variables", []))):
            for i, variable in enumerate(variables):
                self._add(f"{where}/{i}", variable, group)
        self._sizes = self._count()

    def changed(self) -> bool:
        """Whether variables appeared since (an optimizer builds in its first apply)."""
        return self._count() != self._sizes

    def _count(self):
        return tuple(len(o.variables) for _, o in self.optimizers) + (
            len(self.model.variables), len(getattr(self.model, "metrics_variables", ())))

    def _add(self, path, variable, group):
        if id(variable) not in self.paths:
            self.paths[id(variable)] = path
            self.by_path[path] = variable
            self.groups[group].append(variable)

    def _visit(self, obj, path):
        if id(obj) in self._seen:
            return
        self._seen[id(obj)] = obj
        if isinstance(obj, keras.optimizers.Optimizer):
            self.optimizers.append((path, obj))
            own, group = obj.variables, 1
        elif isinstance(obj, keras.metrics.Metric):
            own, group = obj.variables, 2
        elif isinstance(obj, keras.layers.Layer):
            own = list(getattr(obj, "_trainable_variables", [])) + list(getattr(obj, "_non_trainable_variables", []))
            own += [g.state for g in getattr(obj, "_seed_generators", [])]
            group = 0
        else:
            own, group = [], 0
        for i, variable in enumerate(own):
            self._add(f"{path}/vars/{i}" if path else f"vars/{i}", variable, group)
        for attr, child in _children(obj):
            self._visit_child(child, f"{path}/{attr}" if path else attr)

    def _visit_child(self, child, path):
        if isinstance(child, _SEED_GENERATOR):
            self._add(f"{path}/state", child.state, 0)
        elif _is_saveable(child):
            self._visit(child, path)
        elif isinstance(child, (list, tuple, dict)) and id(child) not in self._seen:
            self._seen[id(child)] = child
            used = {}
            for item in (child.values() if isinstance(child, dict) else child):
                if isinstance(item, _SEED_GENERATOR) or _is_saveable(item):
                    name = _snake_case(type(item).__name__)
                elif isinstance(item, (list, tuple, dict)):
                    name = "container"
                else:
                    continue
                used[name] = used.get(name, -1) + 1
                self._visit_child(item, f"{path}/{name}" if not used[name] else f"{path}/{name}_{used[name]}")


_SEED_GENERATOR = keras.random.SeedGenerator


def _is_saveable(obj) -> bool:
    try:
        from keras.src.saving.keras_saveable import KerasSaveable
    except ImportError:  # pragma: no cover - other Keras layouts
        return isinstance(obj, (keras.layers.Layer, keras.optimizers.Optimizer, keras.metrics.Metric))
    return isinstance(obj, KerasSaveable)


def _children(obj):
    """(attribute, value) pairs Keras' saving walks for ``obj`` (its own walker when available)."""
    try:
        from keras.src.saving.saving_lib import _walk_saveable
    except ImportError:  # pragma: no cover - other Keras layouts
        return sorted((k, v) for k, v in vars(obj).items() if not k.startswith("__"))
    try:
        return list(_walk_saveable(obj))
    except Exception:  # noqa: BLE001 - a type Keras' walker does not know: its own variables were taken already
        return []


def _snake_case(name: str) -> str:
    try:
        from keras.src.utils.naming import to_snake_case
    except ImportError:  # pragma: no cover - other Keras layouts
        import re
        return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
    return to_snake_case(name)


def has_state_protocol(callback) -> bool:
    return callable(getattr(callback, "get_state", None)) and callable(getattr(callback, "set_state", None))


def builtin_state(callback):
    for name, attributes in CALLBACK_STATE:
        cls = getattr(keras.callbacks, name, None)
        if cls is not None and isinstance(callback, cls):
            return attributes
    return None


def detached(value):
    """A copy of a get_state() value that the callback cannot change later (the save is written in the
    background): containers and arrays are copied."""
    if isinstance(value, dict):
        return {key: detached(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [detached(item) for item in value]
    if isinstance(value, np.ndarray) or (hasattr(value, "__array__") and not isinstance(value, (str, bytes))):
        return np.array(value, copy=True)
    return value


def own_copy(value):
    """``value`` with every NumPy array in it (in lists and dicts) copied."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: own_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(own_copy(v) for v in value)
    return value


def weights_stay_arrays(value):
    """get_weights() gives a 0-d variable as a NumPy scalar, which a checkpoint would store as a number."""
    if isinstance(value, list):
        return [np.asarray(item) if isinstance(item, np.generic) else item for item in value]
    return value
