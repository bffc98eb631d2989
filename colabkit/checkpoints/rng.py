"""RNG states as JSON-able trees and back: Python's `random`, NumPy's global RandomState and NumPy Generators.

One module for every adapter: the Keras and PyTorch AutoResumes save `global_state()` in each checkpoint, check a
restored one with `check_global_state()` and put it back with `set_global_state()`; the state codec (codec.py)
stores random.Random, numpy.random.RandomState and numpy.random.Generator objects found in a state tree through
the same functions. It sits beside the codec, in the store's layer (below colabkit.resume), because the codec's
handlers use it; it imports no framework.

The trees are those every colabkit wrote:

    Python    {"version": 3, "internal": [624 words and a position], "gauss": None or a number}
    NumPy     {"keys": a uint32 array of 624 (a list of numbers in early colabkit), "pos", "has_gauss",
               "cached_gaussian"}
    Generator its bit generator's state as NumPy gives it: {"bit_generator": "PCG64", "state": {...}, ...}

A restored tree is untrusted (see untrusted.py): each ``*_from_json`` checks every field against what this Python
and NumPy write and raises InvalidCheckpoint naming it; a bit generator is made only from an allow-list of names.
"""
from __future__ import annotations

import random

import numpy as np

from . import untrusted
from .folder import InvalidCheckpoint

_MT_WORDS = 624           # the Mersenne Twister's state: 624 32-bit words and a position (Python's and NumPy's)
_BIT_GENERATORS = {name: getattr(np.random, name) for name in ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
                   if hasattr(np.random, name)}
_WORD_LIMIT = 2 ** 128    # no bit generator's state holds a larger whole number (PCG64's state and increment)


# -- Python's random ---------------------------------------------------------------------------------------------

def python_to_json(state: tuple) -> dict:
    """random.getstate() (or a random.Random's getstate()) as a tree."""
    version, internal, gauss = state
    return {"version": version, "internal": list(internal), "gauss": gauss}


def python_from_json(tree, where: str = "the Python RNG state") -> tuple:
    """The saved tree as random.setstate takes it, checked."""
    tree = untrusted.mapping(tree, where)
    version = tree.get("version")
    if version != random.Random.VERSION or isinstance(version, bool):
        raise untrusted.invalid(f"{where}'s version", version, str(random.Random.VERSION))
    internal = untrusted.sequence(tree.get("internal"), f"{where}'s internal state")
    if len(internal) != _MT_WORDS + 1:
        raise untrusted.invalid(f"{where}'s internal state", f"{len(internal)} numbers", f"{_MT_WORDS + 1} numbers")
    words = tuple(untrusted.whole(word, f"{where}'s internal state", high=2**32 - 1) for word in internal[:-1])
    index = untrusted.whole(internal[-1], f"{where}'s position", high=_MT_WORDS)
    gauss = tree.get("gauss")
    return version, words + (index,), None if gauss is None else untrusted.real(gauss, f"{where}'s gauss")


# -- NumPy's global RandomState (and RandomState objects) --------------------------------------------------------

def numpy_to_json(state: tuple) -> dict:
    """np.random.get_state() (MT19937's legacy tuple) as a tree; the keys stay an array (arrays.npz holds it)."""
    _, keys, pos, has_gauss, cached_gaussian = state
    return {"keys": np.array(keys, copy=True), "pos": int(pos), "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian)}


def numpy_from_json(tree, where: str = "the NumPy RNG state") -> tuple:
    """The saved tree as np.random.set_state takes it, checked."""
    tree = untrusted.mapping(tree, where)
    keys = tree.get("keys")
    if isinstance(keys, list):   # an earlier colabkit wrote them as JSON
        if not all(isinstance(k, int) and not isinstance(k, bool) and 0 <= k < 2**32 for k in keys):
            raise untrusted.invalid(f"{where}'s keys", keys, "624 whole numbers under 2**32")
        keys = np.asarray(keys, dtype=np.uint32)
    keys = untrusted.vector(keys, f"{where}'s keys", dtype=np.uint32, length=_MT_WORDS)
    return ("MT19937", keys.copy(), untrusted.whole(tree.get("pos"), f"{where}'s position", high=_MT_WORDS),
            untrusted.whole(tree.get("has_gauss"), f"{where}'s has_gauss", high=1),
            untrusted.real(tree.get("cached_gaussian"), f"{where}'s cached_gaussian"))


# -- NumPy Generators --------------------------------------------------------------------------------------------

def generator_to_json(generator: np.random.Generator) -> dict:
    """A Generator's bit generator state as a tree (its arrays copied)."""
    return _copied(generator.bit_generator.state)


def generator_from_json(tree, where: str = "the NumPy Generator's state") -> np.random.Generator:
    """A new Generator in the saved state. The tree must have the shape of a fresh bit generator's state of the
    same (allow-listed) kind: the same keys, whole numbers where it has them (under 2**128), arrays of the same
    dtype and shape."""
    tree = untrusted.mapping(tree, where)
    name = tree.get("bit_generator")
    cls = _BIT_GENERATORS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise untrusted.invalid(f"{where}'s bit_generator", name, f"one of {', '.join(sorted(_BIT_GENERATORS))}")
    bit_generator = cls(0)
    _check_like(tree, bit_generator.state, where)
    try:
        bit_generator.state = _copied(tree)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidCheckpoint(f"{where} is not a state of {name} ({exc})") from None
    return np.random.Generator(bit_generator)


def _copied(tree):
    if isinstance(tree, dict):
        return {key: _copied(value) for key, value in tree.items()}
    if isinstance(tree, np.ndarray):
        return tree.copy()
    return tree


def _check_like(saved, template, where: str) -> None:
    if isinstance(template, dict):
        saved = untrusted.mapping(saved, where)
        if set(saved) != set(template):
            raise untrusted.invalid(f"{where}'s fields", sorted(saved), f"{sorted(template)}")
        for key, value in template.items():
            _check_like(saved[key], value, f"{where}[{key!r}]")
    elif isinstance(template, np.ndarray):
        array = untrusted.numeric_array(saved, where)
        if array.dtype != template.dtype or array.shape != template.shape:
            raise untrusted.invalid(where, saved, f"an array of shape {template.shape} and dtype {template.dtype}")
    elif isinstance(template, str):
        if saved != template:
            raise untrusted.invalid(where, saved, repr(template))
    else:   # a whole number: a counter, a flag, a word of state
        untrusted.whole(saved, where, high=_WORD_LIMIT - 1)


# -- the global states an AutoResume saves ---------------------------------------------------------------------

def global_state() -> dict:
    """Python's and NumPy's global RNG states: {"python": ..., "numpy": ...}."""
    return {"python": python_to_json(random.getstate()), "numpy": numpy_to_json(np.random.get_state())}


def check_global_state(tree, where: str = "the RNG states") -> dict:
    """``tree`` when its Python and NumPy states can be set (InvalidCheckpoint otherwise); nothing is set."""
    tree = untrusted.mapping(tree, where)
    python_from_json(tree.get("python"), f"{where}' Python state")
    numpy_from_json(tree.get("numpy"), f"{where}' NumPy state")
    return tree


def set_global_state(tree) -> None:
    """Put back the states `global_state()` saved (checked again: nothing is set unless both are valid)."""
    python = python_from_json(tree["python"])
    numpy = numpy_from_json(tree["numpy"])
    random.setstate(python)
    np.random.set_state(numpy)
