"""Where fit()'s tf.data input stands, so that a resumed fit() reads exactly the batches an uninterrupted one
would have read (used by `colabkit.keras.AutoResume`).

A tf.data pipeline keeps state from one pass over the data to the next that a fresh process lacks: each
iterator made over a reshuffling ``shuffle()`` (``reshuffle_each_iteration``, the default) takes the next
seed from that shuffle's seed generator, so after a restart epoch N would get epoch 0's order; a Keras random
layer in ``map()`` keeps its seed in a variable; with ``.repeat()`` and ``steps_per_epoch`` one iterator
runs across epochs; a ``cache()`` above a reshuffling shuffle is filled by the first epoch, which every later
epoch replays, so a resumed process (its cache empty) must read that shuffle in the first epoch's order.

tf.data can save a whole iterator (``tf.train.Checkpoint(iterator=...)``), but a running iterator's state
holds its buffers' elements: with ``shuffle(10_000)`` over 3 kB elements, 31 MB in every checkpoint. What
fixes an epoch's order is only what its iterator starts from. So, for each reshuffling part of the pipeline,
an iterator over that part that is never read (a probe) stands in for its seed generator: a probe's state is
the generator's count plus bookkeeping (about 170 bytes per shuffle-buffer slot, 3.4 bytes after zlib), and
restoring it sets the generator. Just before fit() makes an iterator, the probes' states and the pipeline's
own variables are taken; a checkpoint holds those for the iterator the next batch comes from, and the number
of batches drawn from it. On resume they are put back before Keras makes its first iterator, which then
starts exactly as the saved one did, and the batches drawn before the position are drawn again without
training (for the resumed epoch, as before; with ``.repeat()`` and ``steps_per_epoch``, every batch since that
iterator was made). The cost is one capture an epoch, 6-16 microseconds per shuffle-buffer slot (measured:
60 ms for shuffle(10_000), 1.6 s for shuffle(100_000); bench/input_position_bench.py).

Keras 3's TensorFlow back end makes fit()'s iterators in its epoch iterator (``TFEpochIterator``): one at the
start of each epoch (with ``steps_per_epoch``: only when the previous one ran out), and one at the end of a
complete epoch that it throws away unless ``steps_per_epoch`` is set. That one would draw seeds after an
epoch's last batch was saved, so here it is made only if it is read. The probes are made when training
begins, in every run alike; each draws one seed.
"""
from __future__ import annotations

import contextlib
import logging
import re
import sys
import time
import weakref
import zlib
from typing import NamedTuple

import numpy as np

from .frames import fit_locals_above
from .randomness import VARIABLE_WRITES, graph_ops, stateful_random_calls

log = logging.getLogger("colabkit")

_FORMAT = 1
_SLOW_S = 2.0            # a seed-state capture this slow gets one warning
_IGNORE = 1   # tf.data.experimental.ExternalStatePolicy.IGNORE


def check_saved(saved) -> None:
    """A checkpoint's input position, read from untrusted files: what ``state()`` writes, or None (an older
    colabkit's, or no tf.data input). Raises InvalidCheckpoint naming what cannot be valid."""
    from ..checkpoints import untrusted
    if saved is None:
        return
    saved = untrusted.mapping(saved, "the input position")
    if saved.get("format") != _FORMAT:
        return   # an older colabkit's: resume() says that it holds no position
    if saved.get("why") is not None:
        if not isinstance(saved["why"], str):
            raise untrusted.invalid("the input position's reason", saved["why"], "a text")
        return
    for i, state in enumerate(untrusted.sequence(saved.get("seeds"), "the input position's seeds")):
        untrusted.vector(state, f"the input position's seed {i}", dtype=np.uint8)
    for i, value in enumerate(untrusted.sequence(saved.get("variables") or [], "the input position's variables")):
        if not isinstance(value, np.ndarray):
            raise untrusted.invalid(f"the input position's variable {i}", value, "an array")
    untrusted.whole(saved.get("drawn"), "the input position's batches drawn")
    if saved.get("note") is not None and not isinstance(saved["note"], str):
        raise untrusted.invalid("the input position's note", saved["note"], "a text")


class _Untracked:
    """An input autoresume.py positions by its own rules (arrays, PyDataset, Python generators)."""

    def resume(self, saved, epoch: int, batch: int, per_call: int = 1):
        return None, None

    def before_call(self, iterator, per_call: int = 1):
        return iterator

    def state(self, position):
        return None

    def notes(self) -> list:
        return []

    def detach(self):
        pass


UNTRACKED = _Untracked()


class _Unpositionable(_Untracked):
    """A tf.data input whose iterators colabkit cannot follow: a resume says so."""

    def __init__(self, why: str):
        self.why = why

    def resume(self, saved, epoch, batch, per_call=1):
        return batch, (f"the tf.data input's position cannot be saved ({self.why}): epoch {epoch} resumes at batch "
                       f"{batch} in this process's order, which differs from an uninterrupted run's if the dataset "
                       f"reshuffles each epoch")


def attach(frame, model=None):
    """The position tracker for the fit() of ``model`` running at or above ``frame`` (from on_train_begin)."""
    fit_locals = fit_locals_above(frame)
    epoch_iterator = fit_locals.get("epoch_iterator")
    adapter = type(getattr(epoch_iterator, "data_adapter", None)).__name__
    if adapter != "TFDatasetAdapter":
        return UNTRACKED
    tf = sys.modules.get("tensorflow")
    if tf is None or type(epoch_iterator).__name__ != "TFEpochIterator" or not all(
            hasattr(epoch_iterator, name) for name in ("_get_iterator", "catch_stop_iteration", "steps_per_epoch")):
        return _Unpositionable(f"Keras {_keras_version()} iterates it in a way colabkit does not know; colabkit "
                               f"follows Keras 3's TensorFlow back end")
    iterable = epoch_iterator._get_iterator()
    dataset = iterable if isinstance(iterable, tf.data.Dataset) else getattr(iterable, "_original_dataset", None)
    if not isinstance(dataset, tf.data.Dataset):
        return _Unpositionable("a distributed dataset made by a function")
    validation = fit_locals.get("validation_data")
    validation = validation if isinstance(validation, tf.data.Dataset) else None
    try:
        return TFDataInput(epoch_iterator, iterable, dataset, tf, restored_elsewhere=_keras_state_variables(model),
                           validation=validation)
    except Exception as exc:  # noqa: BLE001 - never stop training for this; a resume says why
        log.warning("colabkit: cannot follow the tf.data input's position: %s", exc)
        return _Unpositionable(f"colabkit cannot follow its iterators: {_tf_message(exc)}")


class TFDataInput:
    """Follows the iterators fit() makes over a tf.data input, and puts the first one back on resume."""

    def __init__(self, epoch_iterator, iterable, dataset, tf, restored_elsewhere=frozenset(), validation=None):
        self._tf, self._ep = tf, epoch_iterator
        self._iterable = iterable      # what Keras iterates: the dataset, or a DistributedDataset over it
        pipeline = _pipeline_state(dataset)
        parts, variables = pipeline.parts, pipeline.variables
        self._python, self._racing = pipeline.python, pipeline.racing
        # validation_data that reads a reshuffling part of the training pipeline draws its seeds too, after an
        # epoch's batches: a position saved at an epoch's last batch cannot know those draws
        self._shared = validation is not None and bool(
            {id(part) for part in parts} & {id(part) for part in _pipeline_state(validation).parts})
        # A reshuffling part below a cache() is read by the first iterator only, when every epoch reads to the
        # end: later epochs replay that order from the cache. A fresh process has an empty cache, so its first
        # iterator must read those parts as the run's first iterator did, whatever epoch it resumes.
        self._cached_parts = {i: parts[i] for i in pipeline.cached}
        self._cache_unknown = bool(pipeline.cached) and epoch_iterator.steps_per_epoch is not None
        self._first_seeds = None       # the seed states the first iterator of this fit() started from
        # One iterator over each reshuffling part of the pipeline, never read: its state holds that part's seed
        # generator (shared by every iterator over it), and setting it sets the generator. Made now, before
        # fit() makes its first iterator, in every run alike.
        self._probes = [iter(part) for part in parts]
        # Variables the pipeline's functions use (a Keras random layer's seed state in map()), but not the
        # model's: those, and Keras's global seed, are restored with the model at the saved position
        self._variables = [v for v in variables if id(v) not in restored_elsewhere and
                           (v.dtype.is_floating or v.dtype.is_integer or v.dtype.is_bool)]
        self._newest = None            # (iterator, origin, drawn) of the last iterator made
        self._current = None           # the iterator the last batch came from
        self._origin = None            # the probes' states just before _current was made
        self._drawn = 0                # batches drawn from _current
        self._after_epoch = None       # probe states taken after an epoch's batches and validation
        self._broken = None            # why no state could be taken
        self._pending = None           # on resume: (origin, batches to draw) for the first iterator made
        self._carried = None           # on resume: the saved entry, saved again until a batch is drawn
        self._at_epoch_start = self._loop_done = self._said_slow = False
        keras_catch_stop_iteration = epoch_iterator.catch_stop_iteration

        @contextlib.contextmanager
        def catch_stop_iteration():    # fit() reads each epoch's batches inside it
            self._at_epoch_start, self._loop_done = True, False
            try:
                with keras_catch_stop_iteration():
                    yield
            finally:   # the epoch's batches are read; validation and on_epoch_end follow
                self._at_epoch_start, self._loop_done = False, True

        def get_iterator():
            at_start, self._at_epoch_start = self._at_epoch_start, False
            if not at_start and epoch_iterator.steps_per_epoch is None:
                return _Deferred(self)   # Keras makes it at an epoch's end and throws it away
            return _Making(self)

        epoch_iterator.catch_stop_iteration, epoch_iterator._get_iterator = catch_stop_iteration, get_iterator

    # -- resume ------------------------------------------------------------------------------------------
    def resume(self, saved, epoch: int, batch: int, per_call: int = 1):
        """Before the first batch of a resumed fit(): (batch to resume at in ``epoch``, a line to say or None)."""
        if not isinstance(saved, dict) or saved.get("format") != _FORMAT:
            return batch, (f"the checkpoint holds no position of the tf.data input (it was saved by an older "
                           f"colabkit): epoch {epoch} resumes at batch {batch} in this process's order, which differs "
                           f"from an uninterrupted run's if the dataset reshuffles each epoch")
        if saved.get("why"):
            return 0, f"the tf.data input cannot be positioned ({saved['why']}); epoch {epoch} restarts at batch 0"
        origin = {"seeds": [np.asarray(state, dtype=np.uint8) for state in saved["seeds"]],
                  "variables": [np.asarray(value) for value in saved.get("variables") or []]}
        try:
            if len(origin["seeds"]) != len(self._probes) or len(origin["variables"]) != len(self._variables):
                raise ValueError(f"{len(origin['seeds'])} reshuffling parts and {len(origin['variables'])} variables "
                                 f"were saved, the pipeline has {len(self._probes)} and {len(self._variables)}")
            for variable, value in zip(self._variables, origin["variables"]):
                if tuple(variable.shape) != value.shape:
                    raise ValueError(f"variable {variable.name} has shape {tuple(variable.shape)}, the saved value "
                                     f"{value.shape}")
            for probe, state in zip(self._probes, origin["seeds"]):
                self._deserialize(probe, state)   # the seed generators as they were before that iterator was made
            for variable, value in zip(self._variables, origin["variables"]):
                variable.assign(value)
        except Exception as exc:  # noqa: BLE001 - TensorFlow raises several kinds for a state that does not fit
            return 0, (f"the tf.data input cannot be positioned: the saved position does not fit this pipeline "
                       f"({_tf_message(exc)}); epoch {epoch} restarts at batch 0")
        # autoresume.py draws the resumed epoch's first ``batch`` batches itself, whole train-function calls at a time
        prefix = max(0, int(saved["drawn"]) - -(-batch // per_call) * per_call)
        self._pending, self._carried = (origin, prefix), saved
        if saved.get("note"):
            return batch, f"{saved['note']}: epoch {epoch} may read its batches in another order than an " \
                          f"uninterrupted run"
        if self._python:
            return batch, (f"the tf.data input runs Python code ({self._python}), whose own state colabkit cannot "
                           f"save: resumed at epoch {epoch}, batch {batch}, assuming that code yields the same "
                           f"elements in every pass over the data")
        return batch, None

    # -- following fit()'s iterators ---------------------------------------------------------------------
    def _make(self):
        """Make the iterator Keras asks for (Keras calls iter() on what _get_iterator returned)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            origin, drawn = pending
        else:
            origin = self._after_epoch if self._after_epoch is not None else self._seed_states()
            drawn = 0
        self._after_epoch = None
        if self._first_seeds is None:
            self._first_seeds = self._cache_filled_by(origin["seeds"], resumed=pending is not None)
        iterator = iter(self._iterable)
        for done in range(drawn):   # on resume: batches drawn before the saved position in earlier epochs
            try:
                next(iterator)
            except (StopIteration, self._tf.errors.OutOfRangeError):
                log.warning("colabkit: the tf.data input ran out after %d of the %d batches drawn before the "
                            "saved position; training goes on from there", done, drawn)
                drawn = done
                break
        self._newest = (iterator, origin, drawn)
        return iterator

    def before_call(self, iterator, per_call: int = 1):
        """Each call of fit()'s train function, before it draws ``per_call`` batches from ``iterator``."""
        if isinstance(iterator, _DeferredIterator):
            iterator = iterator.made()   # Keras reads the iterator it made at an epoch's end after all
        if iterator is not self._current:
            newest = self._newest
            if newest is None or iterator is not newest[0]:
                return iterator          # not made in this fit() (a train function left behind by a failed fit())
            self._current, self._origin, self._drawn = newest
        self._after_epoch = None         # reading may draw seeds (a shuffle before .repeat() does, each pass)
        self._drawn += per_call
        return iterator

    def state(self, position):
        """The checkpoint entry for training position (epoch, batch)."""
        if self._current is None:      # nothing drawn in this fit() yet
            if self._carried is not None:
                return self._carried   # it still stands where it was resumed
            return {"format": _FORMAT, **self._seed_states(), "drawn": 0}
        origin, drawn = self._origin, self._drawn
        if position[1] == 0 and not self._keras_keeps_current():   # the next batch comes from another iterator
            newest = self._newest
            if self._ep.steps_per_epoch is not None and newest[0] is not self._current and \
                    getattr(self._ep, "_current_iterator", None) is newest[0]:
                origin, drawn = newest[1], newest[2]   # made already, not read yet
            else:   # not made yet: it will start from the seed generators as they are now
                origin, drawn = self._seed_states(), 0
                if self._loop_done:
                    self._after_epoch = origin
                elif self._shared:
                    return {"format": _FORMAT, **self._filling_cache(origin), "drawn": drawn, "note": _SHARED}
        if self._broken:
            return {"format": _FORMAT, "why": self._broken}
        return {"format": _FORMAT, **self._filling_cache(origin), "drawn": drawn}

    def _cache_filled_by(self, seeds, resumed) -> list:
        """The seed states the cache() above each cached part was (or is now) filled from in this process: a cache
        outlives fit(), so a later fit() over the same dataset (fine-tuning after a first fit) replays what the
        first fit's first iterator read. A resume's saved seeds are that order already."""
        seeds = list(seeds)
        for i, part in self._cached_parts.items():
            known = _CACHE_FILLED_BY.get(id(part))
            if not resumed and known is not None and known[0]() is part:
                seeds[i] = known[1]
            else:
                key = id(part)
                _CACHE_FILLED_BY[key] = (weakref.ref(part, lambda _, key=key: _CACHE_FILLED_BY.pop(key, None)),
                                         seeds[i])
        return seeds

    def _filling_cache(self, origin) -> dict:
        """``origin`` with the parts below a cache() as the first iterator read them (see __init__)."""
        if not self._cached_parts or self._cache_unknown or self._first_seeds is None:
            return origin
        seeds = [self._first_seeds[i] if i in self._cached_parts else seed
                 for i, seed in enumerate(origin["seeds"])]
        return {**origin, "seeds": seeds}

    def notes(self) -> list:
        """What a resume cannot make exact in this pipeline, one line each."""
        notes = []
        if self._racing:
            notes.append(f"the tf.data input runs {self._racing} in a map() with num_parallel_calls: the random "
                         f"numbers each element gets depend on thread timing, so no two runs read the same batches, "
                         f"resumed or not; for reproducible batches, drop num_parallel_calls from that map() or "
                         f"put the random layers into the model")
        if self._cache_unknown:
            notes.append("the tf.data input has a cache() above a reshuffling shuffle() and fit() has "
                         "steps_per_epoch: whether the cache replays the first epoch's order cannot be known, so "
                         "the resumed epochs may read another order than an uninterrupted run; shuffle() after "
                         "cache() reshuffles every epoch and resumes exactly")
        return notes

    def _keras_keeps_current(self) -> bool:
        """Whether Keras reads the next epoch from the current iterator (steps_per_epoch set, data left)."""
        ep = self._ep
        if ep.steps_per_epoch is None or getattr(ep, "_current_iterator", None) is not self._current:
            return False
        num_batches = getattr(ep, "_num_batches", None)
        return not (num_batches and getattr(ep, "_steps_seen", 0) >= num_batches)

    def detach(self):
        """At train end: Keras's own methods back, references dropped."""
        for name in ("_get_iterator", "catch_stop_iteration"):
            self._ep.__dict__.pop(name, None)
        self._probes, self._newest, self._current, self._origin, self._after_epoch = [], None, None, None, None

    # -- seed generator states ---------------------------------------------------------------------------
    def _seed_states(self) -> dict:
        """What an iterator made now starts from: the seed generators, and the variables its functions use."""
        started = time.monotonic()
        seeds = [self._serialize(probe) for probe in self._probes]
        took = time.monotonic() - started
        if took > _SLOW_S and not self._said_slow:
            self._said_slow = True
            log.warning("colabkit: saving the seed state of the tf.data input's shuffle() takes %.1fs, once an epoch "
                        "(it grows with the shuffle buffer's size); a smaller buffer makes it cheaper", took)
        return {"seeds": seeds, "variables": [np.array(variable.numpy()) for variable in self._variables]}

    def _serialize(self, iterator):
        """A compressed state of a probe (an iterator that was never read: no elements in it)."""
        tf = self._tf
        try:
            variant = tf.raw_ops.SerializeIterator(resource_handle=iterator._iterator_resource,
                                                   external_state_policy=_IGNORE)
            data = tf.io.serialize_tensor(variant).numpy()
        except Exception as exc:  # noqa: BLE001 - never stop training for this; the resume says why
            if self._broken is None:
                self._broken = f"tf.data could not save a seed generator's state: {_tf_message(exc)}"
                log.warning("colabkit: %s", self._broken)
            return np.zeros(0, np.uint8)
        return np.frombuffer(zlib.compress(data, 1), dtype=np.uint8)

    def _deserialize(self, iterator, state):
        tf = self._tf
        variant = tf.io.parse_tensor(zlib.decompress(state.tobytes()), tf.variant)
        tf.raw_ops.DeserializeIterator(resource_handle=iterator._iterator_resource, serialized=variant)


_PYTHON_OPS = {"PyFunc": "from_generator or numpy_function", "PyFuncStateless": "numpy_function",
               "EagerPyFunc": "py_function"}


# id(a reshuffling part below a cache()) -> (a weak reference to it, the seed state the cache was filled from in
# this process): see TFDataInput._cache_filled_by
_CACHE_FILLED_BY: dict = {}


class _Pipeline(NamedTuple):
    """What a tf.data pipeline keeps from one iterator to the next, as ``_pipeline_state`` finds it."""
    parts: list           # parts whose iterators take a new seed each time one is made, in a stable order
    variables: list       # the variables its functions use
    python: str           # the Python code it runs ("" if none)
    cached: frozenset     # indices of ``parts`` below a cache(): read once, then replayed from the cache
    racing: str           # the random code it runs in parallel calls ("" if none)


def _pipeline_state(dataset) -> _Pipeline:
    """The state ``dataset``'s pipeline keeps from one iterator to the next: its parts whose iterators take a
    new seed each time one is made (a reshuffling shuffle(), Dataset.random with rerandomize_each_iteration),
    which of them lie below a cache(), the variables its functions use; which Python code it runs, and which
    random code it runs in a parallel map(), if any."""
    parts, cached, variables, python, racing, seen, stack = [], set(), {}, set(), set(), set(), [(dataset, False)]
    while stack:
        node, below_cache = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        kind = type(node).__name__
        below_cache = below_cache or kind == "CacheDataset"
        if (kind == "_ShuffleDataset" and getattr(node, "_reshuffle_each_iteration", True) is not False) or (
                kind == "_RandomDataset" and getattr(node, "_rerandomize", False)):
            if below_cache:
                cached.add(len(parts))
            parts.append(node)
        try:
            for wrapper in node._functions():
                graph = wrapper.function.graph
                for variable in graph.variables:
                    variables.setdefault(id(variable), variable)
                ops = graph_ops(graph)
                python.update(_PYTHON_OPS[op] for op in ops & _PYTHON_OPS.keys())
                if kind == "_ParallelMapDataset" and _parallel(node):
                    racing.update(stateful_random_calls(ops))
                    if ops & VARIABLE_WRITES:
                        racing.add("a Keras random layer (or another variable update)")
            inputs = list(node._inputs())
        except Exception:  # noqa: BLE001 - a part colabkit cannot look into
            inputs = []
        stack.extend((part, below_cache) for part in reversed(inputs))
    return _Pipeline(parts, list(variables.values()), " / ".join(sorted(python)), frozenset(cached),
                     " / ".join(sorted(racing)))


def _parallel(map_node) -> bool:
    """Whether a map() runs its function on several elements at once (num_parallel_calls other than 1)."""
    calls = getattr(map_node, "_num_parallel_calls", None)
    try:
        return int(calls) != 1
    except (TypeError, ValueError):
        return True


def _keras_state_variables(model) -> frozenset:
    """ids of the tf.Variables behind what AutoResume restores itself: the model's, optimizer's and metrics'
    variables and Keras's global seed generator."""
    found = []
    if model is not None:
        optimizer = getattr(model, "optimizer", None)
        found += list(model.variables) + list(getattr(optimizer, "variables", None) or [])
        found += list(getattr(model, "metrics_variables", []))
    try:
        from keras.src.backend.common import global_state
        seed_generator = global_state.get_global_attribute("global_seed_generator")
    except ImportError:  # pragma: no cover - other Keras layouts
        seed_generator = None
    if seed_generator is not None:
        found.append(seed_generator.state)
    return frozenset(id(getattr(v, "_value", v)) for v in found)


class _Making:
    """What the epoch iterator's _get_iterator returns: Keras calls iter() on it at once."""

    def __init__(self, owner):
        self._owner = owner

    def __iter__(self):
        return self._owner._make()


class _Deferred(_Making):
    def __iter__(self):
        return _DeferredIterator(self._owner)


class _DeferredIterator:
    """Stands for an iterator Keras makes at the end of an epoch and throws away: made only if it is read."""

    def __init__(self, owner):
        self._owner, self._made = owner, None

    def made(self):
        if self._made is None:
            self._made = self._owner._make()
        return self._made

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.made())


_SHARED = ("the position was saved at an epoch's last batch, and validation_data reads the training data's "
           "shuffle() after it")


def _tf_message(exc) -> str:
    """TensorFlow's message without its op and device decorations."""
    text = str(getattr(exc, "message", None) or exc).strip()
    text = text.splitlines()[0] if text else ""
    text = re.sub(r"^\{\{[^}]*\}\}\s*", "", text)
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", text).strip() or type(exc).__name__


def _keras_version() -> str:
    keras = sys.modules.get("keras")
    return getattr(keras, "__version__", "?")
