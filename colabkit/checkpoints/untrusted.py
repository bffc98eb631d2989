"""Checks of what a restored checkpoint holds. Its contents are untrusted: anyone who can write the folder (or
share a link) can edit a checkpoint's files and re-sign its manifest, whose checksum proves integrity, not
authorship. Each check raises InvalidCheckpoint naming the field, what it holds and what it must be; the
adapters run them in ``Checkpoints.restore(check=...)``, before they change anything live, so that the store
skips such a checkpoint with a warning and tries the previous one. RNG states are checked by rng.py, tagged values
by the state codec's handlers (codec.py)."""
from __future__ import annotations

import numpy as np

from .folder import InvalidCheckpoint


def invalid(where: str, value, expected: str) -> InvalidCheckpoint:
    return InvalidCheckpoint(f"{where} is {_show(value)}, not {expected}")


def _show(value) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def whole(value, where: str, *, low: int = 0, high: int | None = None) -> int:
    """``value`` when it is a whole number (not a bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low or (
            high is not None and value > high):
        raise invalid(where, value, f"a whole number from {low}" + (f" to {high}" if high is not None else " on"))
    return int(value)


def real(value, where: str, *, low: float | None = None) -> float:
    """``value`` when it is a finite or infinite real number (int or float, not a bool), at least ``low``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or (
            low is not None and not value >= low):
        raise invalid(where, value, "a number" + (f" of at least {low}" if low is not None else ""))
    return float(value)


def mapping(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise invalid(where, value, "a dict")
    return value


def sequence(value, where: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise invalid(where, value, "a list")
    return list(value)


def strings(value, where: str) -> list:
    items = sequence(value, where)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise invalid(f"{where}[{i}]", item, "a string")
    return items


def numeric_array(value, where: str) -> np.ndarray:
    """``value`` when it is a NumPy array of numbers or booleans (not text, bytes, records or objects)."""
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biufc":
        raise invalid(where, value, "an array of numbers")
    return value


def vector(value, where: str, *, dtype, length: int | None = None) -> np.ndarray:
    """A 1-D array of ``dtype`` (of ``length`` elements when given): an RNG state, say."""
    array = numeric_array(value, where)
    if array.dtype != np.dtype(dtype) or array.ndim != 1 or (length is not None and array.shape[0] != length):
        raise invalid(where, value, f"a {np.dtype(dtype)} vector" + (f" of {length}" if length is not None else ""))
    return array


def position(restored) -> tuple[int, int]:
    """The manifest's (epoch, batch), each None or a whole number from 0 on; None counts as 0."""
    return tuple(0 if value is None else whole(value, f"the manifest's {name}")
                 for name, value in (("epoch", restored.epoch), ("batch", restored.batch)))

