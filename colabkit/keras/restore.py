"""Restoring a checkpoint into a live Keras model, for AutoResume: everything a candidate checkpoint holds is
checked against the model before anything is assigned (``check``, the store's check in restore()), which plans
the assignments; ``assign`` then carries them out, with the RNG states.

Variables are matched by path (state.py's StateLayout); checkpoints of earlier colabkit versions, without a
layout, by position. Optimizers and compiled metrics that build lazily (in their first step) are built first,
as that step would, so that their saved state has variables to go into.
"""
from __future__ import annotations

import logging
import sys

import numpy as np

from ..checkpoints import rng, untrusted
from ..checkpoints.api import CheckpointError
from . import callbacks as other_callbacks
from .frames import epoch_iterator
from .state import GROUPS, LAYOUT, keras_global_seed_generator, rng_state
from .tfdata import check_saved as check_input_position

log = logging.getLogger("colabkit")

# Arrays this large are copied into their variable in place (for smaller ones Keras' assign costs as little).
_IN_PLACE_FROM = 64 << 10
# Input pipelines that restart from their first batch every epoch, so skipping k batches positions them.
POSITIONABLE_ADAPTERS = {"ArrayDataAdapter", "PyDatasetAdapter", "TorchDataLoaderAdapter", "GrainDatasetAdapter"}


def check(restored, *, model, variables, directory, callbacks, fit_frame) -> list:
    """Everything ``restored`` holds, checked against the live ``model`` before anything is assigned: a value
    that cannot be valid raises InvalidCheckpoint (the store warns and tries the previous checkpoint); a valid
    checkpoint of another model raises CheckpointError. Optimizers and compiled metrics that build lazily are
    built here (as their first step would), so that their variables can be matched. Returns the plan of
    assignments, (variable, value) pairs, for ``assign``.

    variables: the model's TrackedVariables; directory: the checkpoint folder, as errors name it; callbacks: the
    fit()'s other callbacks ((key, callback) pairs, see callbacks.others); fit_frame: the running fit()'s frame
    or None."""
    untrusted.position(restored)
    state = untrusted.mapping(restored.state, "the state")
    layout = state.get("layout")
    if layout is not None and layout != LAYOUT:
        if isinstance(layout, int) and not isinstance(layout, bool):
            raise CheckpointError(f"The checkpoint at step {restored.step} in {directory} has layout "
                                  f"{layout}, which this colabkit does not know (it knows {LAYOUT}): upgrade "
                                  f"colabkit, or use a new directory. Nothing was changed.")
        raise untrusted.invalid("the state's layout", layout, f"{LAYOUT}")
    for group in GROUPS:
        saved = untrusted.sequence(state.get(group) or [], f"the {group} variables")
        for i, value in enumerate(saved):
            untrusted.numeric_array(value, f"{group} variable {i}")
        if layout == LAYOUT or state.get(f"{group}_paths") is not None:
            paths = untrusted.strings(state.get(f"{group}_paths") or [], f"the {group} variables' paths")
            if len(paths) != len(saved):
                raise untrusted.invalid(f"the {group} variables' paths", f"{len(paths)} paths",
                                        f"one for each of the {len(saved)} {group} variables")
    for path, built_for in untrusted.mapping(state.get("optimizer_builds") or {}, "the optimizer builds").items():
        untrusted.strings(built_for, f"the variables optimizer {path!r} was built for")
    if state.get("rng"):
        check_rng(state["rng"])
    check_input_position(state.get("input"))
    other_callbacks.check_states(state.get("callbacks"), callbacks)
    if layout != LAYOUT:
        return _plan_positional(restored, model, directory)   # written by an earlier colabkit
    _build_compiled_metrics(restored, model, variables, fit_frame)
    _build_optimizers(restored, model, variables, state.get("optimizer_builds") or {}, directory)
    return _plan_by_path(restored, model, variables, directory)


def check_rng(saved) -> None:
    saved = rng.check_global_state(saved)
    live = rng_state()   # each saved state has the shape and dtype of this process's
    for name in ("tf_global_generator", "keras_global_seed"):
        if name in saved and name in live:
            value, want = saved[name], np.asarray(live[name])
            if not isinstance(value, np.ndarray) or value.shape != want.shape or value.dtype != want.dtype:
                raise untrusted.invalid(f"the RNG state {name}", value,
                                        f"an array of shape {want.shape} and dtype {want.dtype}")


def assign(plan, state: dict) -> None:
    """Assign what ``check`` planned (every saved array was checked against the live variables first, so
    nothing is overwritten when the checkpoint does not fit), and set the checkpoint's RNG states."""
    copy_in = _in_place_copier()
    for variable, value in plan:
        if not copy_in(variable, value):
            variable.assign(value)
    if state.get("rng"):
        set_rng_state(state["rng"])


def _in_place_copier():
    """A function that copies a restored array into a variable's own memory, returning False where it cannot
    (the caller then assigns as Keras does).

    ``variable.assign(array)`` converts the array with ``tf.constant``, which copies it into new memory (page
    faults on every byte: after the read, the costliest step of a restore), and the variable then takes that
    memory. Here a DLPack import wraps the array where it lies (64-byte aligned in the checkpoint's buffer, as
    TensorFlow requires) and a slice assignment copies it into the memory the variable already has. The
    variable never shares memory with the checkpoint's arrays, which a mid-epoch resume applies again
    (keras/hooks.py) and which are let go after. Plain TensorFlow variables only: a distributed variable's
    replicas each need the value, which its own assign gives them."""
    import keras
    tf = sys.modules.get("tensorflow")
    dlpack = getattr(getattr(tf, "experimental", None), "dlpack", None)
    if keras.backend.backend() != "tensorflow" or dlpack is None:
        return lambda variable, value: False

    def copy_in(variable, value) -> bool:
        target = getattr(variable, "value", None)
        if (type(target).__name__ != "ResourceVariable" or not isinstance(value, np.ndarray)
                or value.nbytes < _IN_PLACE_FROM or not value.flags.c_contiguous or not value.flags.writeable
                or value.ctypes.data % 64 or value.dtype != target.dtype.as_numpy_dtype
                or tuple(target.shape) != value.shape):
            return False
        try:
            wrapped = dlpack.from_dlpack(value.__dlpack__())
            target[...].assign(wrapped)   # all or nothing: a failed op leaves the variable as it was
        except Exception:  # noqa: BLE001 - a dtype DLPack does not carry (bfloat16 on some versions), or a device
            return False   # the slice assignment does not take it to: Keras' assign then
        return True

    return copy_in


def set_rng_state(state: dict) -> None:
    rng.set_global_state(state)
    tf = sys.modules.get("tensorflow")
    if tf is not None and "tf_global_generator" in state:
        tf.random.get_global_generator().state.assign(state["tf_global_generator"])
    seed_gen = keras_global_seed_generator()
    if seed_gen is not None and "keras_global_seed" in state:
        seed_gen.state.assign(state["keras_global_seed"])


def drop_arrays(restored) -> None:
    """Once assigned, the restored arrays are let go: they are views of the checkpoint's whole file."""
    if restored is not None:
        for group in GROUPS:
            restored.state.pop(group, None)


def input_positionable(fit_locals: dict) -> bool:
    """True when fit()'s input (its frame's locals, see frames.fit_locals_above) restarts from its first batch
    each epoch (arrays, finite datasets)."""
    iterator = fit_locals.get("epoch_iterator")
    if iterator is None or not hasattr(iterator, "data_adapter"):
        return False
    adapter = type(iterator.data_adapter).__name__
    steps = getattr(iterator, "steps_per_epoch", None)
    return adapter in POSITIONABLE_ADAPTERS and (
        steps is None or steps == getattr(iterator.data_adapter, "num_batches", None))


def _does_not_fit(restored, directory, detail: str) -> CheckpointError:
    return CheckpointError(f"The checkpoint at step {restored.step} in {directory} does not fit this model: "
                           f"{detail}. Resume with the same architecture, or use a new directory to start over. "
                           f"Nothing was changed.")


def _check_shape(restored, directory, group, variable, value, saved_name):
    if tuple(variable.shape) != tuple(value.shape):
        raise _does_not_fit(restored, directory, f"{group} variable '{variable.path}' has shape "
                                                 f"{tuple(variable.shape)}, the checkpoint's '{saved_name}' has "
                                                 f"shape {tuple(value.shape)}")


def _plan_by_path(restored, model, variables, directory) -> list:
    """(variable, value) for every saved variable, each matched to the live one at the same path."""
    state, plan = restored.state, []
    # the walk of on_train_begin, or of a build above (each build forgets it): walking a model takes ~15 ms
    for group, live_variables in zip(GROUPS, variables.groups(model)):
        saved, names = state.get(group) or [], state.get(f"{group}_paths") or []
        live = dict(zip(variables.paths_of(live_variables), live_variables))
        if set(names) != set(live) or len(names) != len(saved):
            if group == "metrics":
                continue  # metrics differ (e.g. compile() changed); they only affect logs of the resumed epoch
            missing = [n for n in names if n not in live]
            extra = [path for path in live if path not in set(names)]
            where = (f"the checkpoint's '{missing[0]}' is not in this model" if missing else
                     f"this model's '{extra[0]}' ({live[extra[0]].path}) is not in the checkpoint")
            raise _does_not_fit(restored, directory, f"it holds {len(saved)} {group} variables, the model has "
                                                     f"{len(live_variables)} ({where})")
        for name, value in zip(names, saved):
            _check_shape(restored, directory, group, live[name], value, name)
            plan.append((live[name], value))
    return plan


def _plan_positional(restored, model, directory) -> list:
    """Checkpoints of earlier colabkit versions (no "layout" entry) hold model.variables,
    model.optimizer.variables and metrics_variables, in that order."""
    state, plan = restored.state, []
    groups = (list(model.variables), list(model.optimizer.variables) if model.optimizer is not None else [],
              list(getattr(model, "metrics_variables", [])))
    for group, live_variables in zip(GROUPS, groups):
        saved, names = state.get(group) or [], state.get(f"{group}_paths") or []
        if group == "metrics" and len(saved) != len(live_variables):
            continue
        if len(saved) != len(live_variables):
            raise _does_not_fit(restored, directory, f"it holds {len(saved)} {group} variables, the model has "
                                                     f"{len(live_variables)}")
        for i, (variable, value) in enumerate(zip(live_variables, saved)):
            _check_shape(restored, directory, group, variable, value, names[i] if i < len(names) else f"#{i}")
            plan.append((variable, value))
    return plan


def _build_compiled_metrics(restored, model, variables, fit_frame) -> None:
    """Keras on TensorFlow builds compile()'s metrics (and its loss) in the first train step, after the
    restore: build them now, the way Keras does under a distribution strategy (symbolically, from the
    input's element spec), so their state can be assigned. Without it the resumed epoch's metrics would
    count only the batches after the resume."""
    if all(getattr(getattr(model, name, None), "built", True) for name in ("_compile_metrics", "_compile_loss")):
        return
    saved = set(restored.state.get("metrics_paths") or [])
    if not saved - set(variables.paths_of(variables.groups(model)[2])):
        return
    iterator = epoch_iterator(fit_frame)
    spec = getattr(getattr(iterator, "_distributed_dataset", None), "element_spec", None)
    if spec is None or not hasattr(model, "_symbolic_build"):
        return
    try:
        model._symbolic_build(data_batch=spec)
    except Exception as exc:  # noqa: BLE001 - the resumed epoch's metrics then start from zero, as before
        log.info("colabkit: cannot build the compiled metrics before the first step (%s); the resumed "
                 "epoch's metrics count from the resume on", exc)
    variables.forget()


def _build_optimizers(restored, model, variables, builds: dict, directory) -> None:
    """Build the optimizers that were built in the saved run but are not yet (they build lazily, in their
    first apply), for the same variables in the same order, so their state can be assigned. The model is
    walked again (``forget``) only when one was built."""
    variables.groups(model)
    layout = variables.layout
    for path, optimizer in layout.optimizers:
        if getattr(optimizer, "built", True) or path not in builds:
            continue
        built_for = [layout.by_path.get(p) for p in builds[path]]
        if any(v is None for v in built_for):
            lost = next(p for p, v in zip(builds[path], built_for) if v is None)
            raise _does_not_fit(restored, directory, f"optimizer '{path}' was built for variable '{lost}', which "
                                                     f"this model does not have")
        optimizer.build(built_for)
        variables.forget()
