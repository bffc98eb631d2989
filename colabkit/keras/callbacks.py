"""The other callbacks' state, for AutoResume: what a checkpoint holds of each callback of the same fit(), and
how a resumed run puts it back.

A callback with ``get_state()`` / ``set_state(state)`` is asked; Keras' own callbacks that keep state
(EarlyStopping, ReduceLROnPlateau, ModelCheckpoint, TensorBoard: state.py's CALLBACK_STATE) have those attributes
saved and set; a CSVLogger's file is cut back to its size at the checkpoint and appended to. Each callback is
found under a key made of its class name, numbered from the second of a class on (EarlyStopping,
EarlyStopping_1), so the same list of callbacks finds the same state.
"""
from __future__ import annotations

import glob
import os
import re

from ..checkpoints import untrusted
from ..optional import require
from .state import builtin_state, detached, has_state_protocol, weights_stay_arrays

keras = require("keras", "tf", "colabkit.keras.AutoResume")


def others(callback_list, me):
    """(key, callback) for the callbacks of ``callback_list`` (a CallbackList, or None) other than ``me`` and
    Keras' History and progress bar."""
    callbacks = callback_list.callbacks if callback_list is not None else []
    counts = {}
    for callback in callbacks:
        if callback is me or isinstance(callback, (keras.callbacks.History, keras.callbacks.ProgbarLogger)):
            continue
        name = type(callback).__name__
        counts[name] = counts.get(name, -1) + 1
        yield (name if not counts[name] else f"{name}_{counts[name]}"), callback


def states(callbacks) -> dict:
    """key -> the state to save, for ``callbacks`` ((key, callback) pairs, see ``others``)."""
    found = {}
    for key, callback in callbacks:
        if has_state_protocol(callback):
            found[key] = detached(callback.get_state())
        elif isinstance(callback, keras.callbacks.CSVLogger):
            found[key] = {"csv_bytes": _local_file_size(callback.filename)}
        else:
            attributes = builtin_state(callback)
            if attributes:
                # Keras replaces these values (best_weights too), never changes them in place
                found[key] = {name: weights_stay_arrays(getattr(callback, name, None)) for name in attributes}
    return found


def check_states(saved, callbacks) -> None:
    """A checkpoint's callback states, checked before anything is restored (InvalidCheckpoint: a value that
    cannot be valid)."""
    saved = untrusted.mapping(saved or {}, "the callbacks' states")
    for key, callback in callbacks:
        if key in saved and not has_state_protocol(callback) and (
                builtin_state(callback) or isinstance(callback, keras.callbacks.CSVLogger)):
            entry = untrusted.mapping(saved[key], f"the state of callback {key}")
            if entry.get("csv_bytes") is not None:
                untrusted.whole(entry["csv_bytes"], f"the state of callback {key}'s csv_bytes")


def set_states(saved: dict, callbacks) -> list:
    """After every callback's on_train_begin (which resets what they keep): set their saved state. Returns what
    a resume must tell the user, one line each (see ``_rewrite_lost_best_file``)."""
    notes = []
    for key, callback in callbacks:
        if key not in saved:
            continue
        if has_state_protocol(callback):
            callback.set_state(saved[key])
        elif not isinstance(callback, keras.callbacks.CSVLogger):
            initial_best = getattr(callback, "best", None)
            for name in builtin_state(callback) or ():
                if name in saved[key]:
                    setattr(callback, name, saved[key][name])
            if isinstance(callback, keras.callbacks.ModelCheckpoint):
                notes += _rewrite_lost_best_file(callback, initial_best)
    return notes


def _rewrite_lost_best_file(callback, initial_best) -> list:
    """A ModelCheckpoint(save_best_only=True) writes its file only when its restored ``best`` is beaten: when a
    resume runs on another machine than the one that wrote the file (a new Colab VM), the file would never come
    back. Its ``best`` goes back to where it started then, so that the next save writes the file again."""
    path = os.fspath(callback.filepath)
    if not callback.save_best_only or callback.best == initial_best or "://" in path or _written(path):
        return []
    lost = callback.best
    callback.best = initial_best
    return [f"ModelCheckpoint's file {path} is not on this machine (the interrupted run wrote it elsewhere): its best "
            f"{callback.monitor} ({lost:.6g}) was forgotten so that the file is written again at the next save, "
            f"holding the best model since this resume. A filepath on Google Drive keeps the file itself."]


def _written(filepath: str) -> bool:
    """Whether a ModelCheckpoint's file is here (any file its pattern names, when it has {epoch}-like fields)."""
    if "{" not in filepath:
        return os.path.exists(filepath)
    return bool(glob.glob(re.sub(r"\{[^}]*\}", "*", glob.escape(filepath))))


def append_csv_logs(saved: dict, callbacks) -> list:
    """Before any callback's on_train_begin, in a resumed run: each CSVLogger appends to its file, cut back to
    where it stood when the checkpoint was taken (the epochs after it are trained and logged again). Returns
    (CSVLogger, its own ``append``) pairs, for ``restore_csv_settings`` when the fit() ends."""
    appending = []
    for key, callback in callbacks:
        if isinstance(callback, keras.callbacks.CSVLogger) and not has_state_protocol(callback):
            appending.append((callback, callback.append))
            callback.append = True
            size = (saved.get(key) or {}).get("csv_bytes")
            if size is not None and (_local_file_size(callback.filename) or 0) > size:
                os.truncate(callback.filename, size)
    return appending


def restore_csv_settings(appending: list) -> None:
    for callback, append in appending:
        callback.append = append


def _local_file_size(filename):
    try:
        return os.path.getsize(filename)
    except (OSError, TypeError, ValueError):   # not written yet, or not a local file (gs://...)
        return None
