"""The one codec for state trees: a registry of type handlers (as Orbax's TypeHandler registry) and the walk that
applies them, both ways. A handler is (type test, tag, encode, decode): `TypeHandler`.

Why it lives in the store (colabkit.checkpoints) and not in colabkit.resume: the store encodes. Checkpoints.save
takes a tree of JSON values, NumPy arrays and TensorFlow objects from anyone (a notebook, the Keras adapter) and
turns it into state.json, arrays.npz and tf/ (state.py, on the training thread); restore() decodes those files
before any adapter sees them. An adapter encodes first: a PyTorch state dict's tensors, tuples and dtypes become
tagged JSON objects whose data are host arrays (copied into buffers the adapter reuses), and it decodes them last,
in the check it hands to restore(). Both passes are this codec. colabkit.resume sits above the store in the layers
(tests/test_layers.py), so a codec there would make the store import upward.

The format on disk is the one every colabkit wrote (old checkpoints restore; old colabkit reads new ones)::

    {"__colabkit_array__": "a0"}                        an array in arrays.npz                     (the store)
    {"__colabkit_trackable__": "t0", "path": "model"}   a TensorFlow object under tf/              (the store)
    {"__colabkit_torch__": KIND, ...}                   a value of a registered kind               (the adapters)
        "tuple" {"items": [...]}; "dict" {"items": [[key, value], ...]} (keys not all strings); "tensor" {"dtype",
        "data"}; "dtype" and "device" {"name"}; "random.Random", "numpy.RandomState", "numpy.Generator" {"state"}

The third marker keeps the name under which the PyTorch adapter first wrote it, whatever framework a kind belongs
to. The torch kinds are registered by colabkit/torch/state.py when it is imported; this module imports no
framework (a TensorFlow object is recognised only once TensorFlow is loaded).

A pass writes and reads the markers it is given (``tags``); tagged objects of other markers pass through it as
plain dicts, for the pass that owns them. The store's pass (STORE_TAGS) keeps what Checkpoints.save always did:
tuples become lists and a torch tensor there is an array. An adapter's pass (VALUE_TAGS) leaves arrays in the tree
for the store. A hostile state.json can only reach the decoders of registered kinds, each of which checks what it
reads and constructs nothing but its own type (a dtype or a bit generator from an allow-list); an unknown kind
raises InvalidCheckpoint naming where it is, and no name read from a checkpoint is ever looked up as an attribute.
"""
from __future__ import annotations

import dataclasses
import random
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from . import rng, untrusted
from .folder import InvalidCheckpoint

ARRAY_TAG = "__colabkit_array__"
TRACKABLE_TAG = "__colabkit_trackable__"
VALUE_TAG = "__colabkit_torch__"
STORE_TAGS = (ARRAY_TAG, TRACKABLE_TAG)     # what the store writes beside state.json
VALUE_TAGS = (VALUE_TAG,)                   # what an adapter writes into the tree it hands to the store
_KEY_TYPES = (str, int, float, bool, type(None))   # the keys a "dict" of other keys may have (JSON's scalars)
_SCALARS = frozenset(_KEY_TYPES)


class StateError(ValueError):
    """A state value colabkit cannot store, or a checkpoint whose state cannot be loaded into the given objects."""


class Where:
    """Where a value sits in a tree: a root label and the keys down to it, formatted only for a message
    (``model['weight']``); `path` is the form the store writes for a TensorFlow object (``model/layers[0]``)."""
    __slots__ = ("parent", "key")

    def __init__(self, parent: Where | None, key):
        self.parent, self.key = parent, key

    def __truediv__(self, key) -> Where:
        return Where(self, key)

    def keys(self) -> list:
        keys, node = [], self
        while node.parent is not None:
            keys.append(node.key)
            node = node.parent
        return keys[::-1]

    @property
    def label(self) -> str:
        node = self
        while node.parent is not None:
            node = node.parent
        return str(node.key)

    @property
    def path(self) -> str:
        path = ""
        for key in self.keys():
            path = f"{path}[{key}]" if isinstance(key, int) and not isinstance(key, bool) else (
                f"{path}/{key}" if path else str(key))
        return path

    def __str__(self) -> str:
        return self.label + "".join(f"[{key!r}]" for key in self.keys())


@dataclasses.dataclass(frozen=True)
class TypeHandler:
    """How one kind of value is stored. ``tag`` is the marker key of its JSON object and ``kind`` the marker's
    value (None where the value is the handler's own, as an array's key); ``test(value)`` says whether the handler
    stores ``value``; ``encode(value, encoding, where)`` returns the tagged JSON object (nested values go through
    ``encoding.encode``); ``decode(obj, decoding, where)`` returns the value, checking what it reads (raise
    InvalidCheckpoint, or untrusted.invalid(...), naming ``where``).

    ``types`` (a class or a tuple of them), when given, narrows the test to their instances: the walk asks the
    handler about those only (and with no ``test``, every one of them is the handler's). Walks look the handlers
    that may take a value up by its class once, so a handler with ``types`` costs nothing elsewhere."""
    tag: str
    kind: str | None
    test: Callable[[Any], bool] | None
    encode: Callable[[Any, Encoding, Where], Any]
    decode: Callable[[dict, Decoding, Where], Any]
    types: type | tuple | None = None


class Sink:
    """Where an encoding puts what its tree does not hold. The store's (state.py) keeps arrays and TensorFlow
    objects beside state.json; this default, for a pass whose tree the store encodes later, leaves arrays in the
    tree as copies of their own (the store may write them after the live ones changed)."""

    def array(self, value, where: Where):
        """The key under which ``value`` (an array) is kept beside the tree, for a pass that writes ARRAY_TAG."""
        raise StateError(f"{where} is an array, and this pass keeps none")

    def trackable(self, value, where: Where) -> str:
        raise StateError(f"{where} is a TensorFlow object, and this pass keeps none")

    def leave(self, value, where: Where, host=None):
        """``value`` (an array, or a tensor that ``host(value)`` copies to a NumPy array) as it stays in the tree
        for the store's pass: a copy made now, by default."""
        return host(value) if host is not None else np.array(value, copy=True)

    def other(self, value, where: Where):
        """``value``, of no kind this pass stores, as it stays in the tree for the store's pass to refuse or
        keep (an array-like left as one)."""
        return self.leave(value, where) if _is_array(value) else value


class Source:
    """What a decoding reads beside the tree: the store's arrays and TensorFlow objects (state.py)."""

    def array(self, key, where: Where):
        raise InvalidCheckpoint(f"{where} names an array, and none was read with this tree")

    def trackable(self, key, path, where: Where):
        raise InvalidCheckpoint(f"{where} names a TensorFlow object, and none was read with this tree")


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What a walk over ``tags`` uses: the handlers it tries (in order), its markers (in the order registered:
    the store's array before its objects), those of them that name a kind, and by class the handlers that may
    take a value of it (filled in as classes are met)."""
    handlers: tuple
    tags: frozenset
    markers: tuple
    kinded: frozenset
    by_class: dict = dataclasses.field(default_factory=dict)

    def candidates(self, cls) -> tuple:
        found = self.by_class.get(cls)
        if found is None:
            found = self.by_class[cls] = tuple(h for h in self.handlers if h.types is None or issubclass(cls, h.types))
        return found


class Codec:
    """The registry of type handlers, and the walks. Handlers are tried newest first (an adapter's handler for a
    type takes it before a core one that would also accept it); a (tag, kind) names one handler."""

    def __init__(self):
        self._handlers: dict[tuple, TypeHandler] = {}   # (tag, kind) -> handler, in the order first registered
        self._order: list[TypeHandler] = []              # newest first
        self._markers: frozenset = frozenset()
        self._plans: dict[frozenset, _Plan] = {}

    def register(self, handler: TypeHandler) -> TypeHandler:
        """Add ``handler``. Its (tag, kind) must be new, or belong to a handler from the same module (that module
        imported again); a marker is either kinded or not."""
        if handler.test is None and handler.types is None:
            raise ValueError(f"a handler for {_describe((handler.tag, handler.kind))} needs a test or types")
        key = (handler.tag, handler.kind)
        old = self._handlers.get(key)
        if old is not None and _module(old) != _module(handler):
            raise ValueError(f"the state codec already has a handler for {_describe(key)} (from {_module(old)}); "
                             f"register another kind or tag")
        if any(tag == handler.tag and (kind is None) != (handler.kind is None) for tag, kind in self._handlers):
            raise ValueError(f"{handler.tag} is used with and without kinds; a marker is one or the other")
        self._handlers[key] = handler
        self._order = [handler] + [h for h in self._order if h is not old]
        self._markers = frozenset(tag for tag, _ in self._handlers)
        self._plans.clear()
        return handler

    def handler(self, tag: str, kind: str | None = None) -> TypeHandler | None:
        return self._handlers.get((tag, kind))

    def handlers(self, tags=None) -> list[TypeHandler]:
        """The registered handlers, in the order they are tried (of ``tags`` only, when given)."""
        return [h for h in self._order if tags is None or h.tag in tags]

    @property
    def markers(self) -> frozenset:
        """Every registered tag: a key of these is never a plain dict's key in a stored tree."""
        return self._markers

    def _plan(self, tags) -> _Plan:
        key = frozenset(tags)
        plan = self._plans.get(key)
        if plan is None:
            if key - self._markers:
                raise ValueError(f"no handler is registered for the tags {sorted(key - self._markers)}")
            markers = tuple(dict.fromkeys(tag for tag, _ in self._handlers if tag in key))
            kinded = frozenset(tag for tag, kind in self._handlers if tag in key and kind is not None)
            plan = self._plans[key] = _Plan(tuple(self.handlers(key)), key, markers, kinded)
        return plan

    def encode(self, value, *, tags, sink: Sink | None = None, where: str = "the state"):
        """``value`` as a JSON-able tree: the kinds of ``tags`` tagged, the rest as the sink keeps it. Raises
        StateError naming where a value is that cannot be stored."""
        try:
            return Encoding(self, tags, sink or Sink()).encode(value, Where(None, where))
        except RecursionError:
            raise StateError(f"{where} is nested too deep to store (or holds itself)") from None

    def decode(self, tree, *, tags, source: Source | None = None, where: str = "the state"):
        """The value ``tree`` (parsed JSON, arrays as the store read them) stands for: the kinds of ``tags``
        decoded, other tagged objects left as dicts. Raises InvalidCheckpoint naming where a value is that no
        colabkit writes."""
        try:
            return Decoding(self, tags, source or Source()).decode(tree, Where(None, where))
        except RecursionError:   # what no colabkit writes: the check that reads it falls back as for any other
            raise InvalidCheckpoint(f"{where} is nested deeper than colabkit writes") from None


def _module(handler: TypeHandler) -> str:
    return getattr(handler.encode, "__module__", None) or "?"


def _describe(key) -> str:
    tag, kind = key
    return tag if kind is None else f"{tag} {kind!r}"


class Encoding:
    """One encoding walk (handlers call back into it for the values they hold)."""

    def __init__(self, codec: Codec, tags, sink: Sink):
        self.codec, self.sink = codec, sink
        plan = codec._plan(tags)
        self.tags, self._by_class, self._candidates = plan.tags, plan.by_class, plan.candidates
        self._keeps_arrays = ARRAY_TAG in plan.tags

    def encode(self, value, where: Where):
        cls = type(value)
        if cls in _SCALARS:
            return value
        for handler in self._by_class.get(cls) or self._candidates(cls):
            if handler.test is None or handler.test(value):
                return handler.encode(value, self, where)
        if isinstance(value, (bool, int, float, str)):   # np.float64, np.str_, an IntEnum: JSON takes them
            return value
        if isinstance(value, np.generic):
            item = value.item()
            if not isinstance(item, np.generic):   # np.longdouble stays one: no JSON number holds it
                return self.encode(item, where)
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise StateError(f"State key {key!r} at {where} must be a string.")
                if key in self.tags:
                    raise StateError(f"State key {key!r} at {where} is a name colabkit uses for its own entries; "
                                     f"rename it.")
                out[key] = self.encode(item, where / key)
            return out
        if isinstance(value, (list, tuple)):
            return [self.encode(item, where / i) for i, item in enumerate(value)]
        return self.sink.other(value, where)

    def array(self, value, where: Where, host=None):
        """``value`` (an array, or a tensor that ``host(value)`` copies to a NumPy array) as this pass stores
        arrays: tagged and kept by the sink where this pass writes ARRAY_TAG, else left in the tree as the sink
        leaves it (for the store's pass)."""
        if self._keeps_arrays:
            return {ARRAY_TAG: self.sink.array(host(value) if host is not None else value, where)}
        return self.sink.leave(value, where, host)


class Decoding:
    """One decoding walk (handlers call back into it for the values they hold)."""

    def __init__(self, codec: Codec, tags, source: Source):
        self.codec, self.source = codec, source
        plan = codec._plan(tags)
        self.tags, self._markers, self._kinded = plan.tags, plan.markers, plan.kinded

    def decode(self, value, where: Where):
        if isinstance(value, dict):
            for tag in self._markers:
                if tag in value:
                    return self._tagged(tag, value, where)
            return {key: self.decode(item, where / key) for key, item in value.items()}
        if isinstance(value, list):
            return [self.decode(item, where / i) for i, item in enumerate(value)]
        return value

    def _tagged(self, tag, value, where: Where):
        kind = value[tag] if tag in self._kinded else None
        if tag in self._kinded and not isinstance(kind, str):
            raise untrusted.invalid(f"{where}'s {tag}", kind, "the name of a kind")
        handler = self.codec.handler(tag, kind)
        if handler is None:
            raise InvalidCheckpoint(f"{where} is tagged {kind!r}, which colabkit does not write")
        return handler.decode(value, self, where)


CODEC = Codec()
register = CODEC.register


def encode(value, *, tags, sink: Sink | None = None, where: str = "the state"):
    return CODEC.encode(value, tags=tags, sink=sink, where=where)


def decode(tree, *, tags, source: Source | None = None, where: str = "the state"):
    return CODEC.decode(tree, tags=tags, source=source, where=where)


# -- the store's kinds: arrays (arrays.npz) and TensorFlow objects (tf/) ---------------------------------------

def _is_trackable(value) -> bool:
    """A TensorFlow object that TensorFlow writes itself (a tf.Variable, tf.Module, Keras model, optimizer): not a
    tensor, not a container. TensorFlow is never imported here: such an object implies it is loaded."""
    tf = sys.modules.get("tensorflow")
    if tf is None or isinstance(value, (dict, list, tuple)) or type(value).__name__ in ("EagerTensor", "Tensor"):
        return False   # a tf.Variable reads as an array too: it stays a trackable so that it restores in place
    try:
        return isinstance(value, tf.__internal__.tracking.Trackable)
    except AttributeError:  # pragma: no cover - very old TF
        return isinstance(value, (tf.Module, tf.Variable))


def _is_array(value) -> bool:
    return isinstance(value, np.ndarray) or (hasattr(value, "__array__") and not isinstance(value, np.generic))


def _decode_array(obj, decoding: Decoding, where: Where):
    return decoding.source.array(obj[ARRAY_TAG], where)


def _encode_trackable(value, encoding: Encoding, where: Where):
    return {TRACKABLE_TAG: encoding.sink.trackable(value, where), "path": where.path}


def _decode_trackable(obj, decoding: Decoding, where: Where):
    key, path = obj[TRACKABLE_TAG], obj.get("path")
    if not isinstance(key, str) or not isinstance(path, str):
        raise InvalidCheckpoint(f"{where} is a TensorFlow object entry without a name and path")
    return decoding.source.trackable(key, path, where)


register(TypeHandler(ARRAY_TAG, None, _is_array, lambda value, encoding, where: encoding.array(value, where),
                     _decode_array))
register(TypeHandler(TRACKABLE_TAG, None, _is_trackable, _encode_trackable, _decode_trackable))


# -- value kinds: tuples, dicts of other keys, RNGs ------------------------------------------------------------

def _encode_tuple(value, encoding: Encoding, where: Where):
    return {VALUE_TAG: "tuple", "items": [encoding.encode(item, where / i) for i, item in enumerate(value)]}


def _decode_tuple(obj, decoding: Decoding, where: Where):
    items = untrusted.sequence(obj.get("items"), f"{where}'s items")
    return tuple(decoding.decode(item, where / i) for i, item in enumerate(items))


def _needs_items(value) -> bool:
    """A dict that JSON cannot hold as an object: keys that are not all strings, or one that is a marker."""
    reserved = CODEC.markers
    return not all(isinstance(key, str) and key not in reserved for key in value)


def _encode_dict(value, encoding: Encoding, where: Where):
    items = []
    for key, item in value.items():
        if not isinstance(key, _KEY_TYPES):
            raise StateError(f"a key {key!r} ({type(key).__name__}) at {where} cannot be stored; use strings or "
                             f"numbers as keys.")
        items.append([key, encoding.encode(item, where / key)])
    return {VALUE_TAG: "dict", "items": items}


def _decode_dict(obj, decoding: Decoding, where: Where):
    pairs = {}
    for i, item in enumerate(untrusted.sequence(obj.get("items"), f"{where}'s items")):
        if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], _KEY_TYPES):
            raise untrusted.invalid(f"{where}'s item {i}", item, "a [key, value] pair")
        pairs[item[0]] = decoding.decode(item[1], where / item[0])
    return pairs


def _rng_handler(kind: str, cls, to_json, from_json) -> TypeHandler:
    """An RNG object (exactly ``cls``: a subclass may hold more than its state) stored as its state."""
    def encode(value, encoding, where):
        return {VALUE_TAG: kind, "state": encoding.encode(to_json(value), where / "state")}

    def decode(obj, decoding, where):
        return from_json(decoding.decode(obj.get("state"), where / "state"), f"{where}'s state")

    return TypeHandler(VALUE_TAG, kind, lambda value: type(value) is cls, encode, decode, types=cls)


def _random_from_json(tree, where):
    generator = random.Random()
    generator.setstate(rng.python_from_json(tree, where))
    return generator


def _random_state_to_json(generator):
    state = generator.get_state(legacy=True)
    if not isinstance(state, tuple):   # a RandomState over another bit generator than MT19937
        raise StateError(f"a numpy.random.RandomState over {state.get('bit_generator')} cannot be stored; use a "
                         f"numpy.random.Generator (np.random.default_rng()) for that bit generator.")
    return rng.numpy_to_json(state)


def _random_state_from_json(tree, where):
    generator = np.random.RandomState()
    generator.set_state(rng.numpy_from_json(tree, where))
    return generator


register(TypeHandler(VALUE_TAG, "tuple", None, _encode_tuple, _decode_tuple, types=tuple))
register(TypeHandler(VALUE_TAG, "dict", _needs_items, _encode_dict, _decode_dict, types=dict))
register(_rng_handler("random.Random", random.Random, lambda r: rng.python_to_json(r.getstate()),
                      _random_from_json))
register(_rng_handler("numpy.RandomState", np.random.RandomState, _random_state_to_json, _random_state_from_json))
register(_rng_handler("numpy.Generator", np.random.Generator, rng.generator_to_json, rng.generator_from_json))
