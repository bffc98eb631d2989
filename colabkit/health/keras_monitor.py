"""`colabkit.keras.Monitor`: the training monitor as a Keras callback (also ``AutoResume(..., monitor=True)``).

    model.fit(ds, epochs=5, callbacks=[colabkit.keras.Monitor()])

How the input share is measured with Keras 3's TensorFlow back end: the next batch is fetched inside the
compiled train function, so a callback cannot see the wait. On a sample of train-function calls (every 2nd
call, every call with ``steps_per_execution`` > 1, for the first 12 measurements after the first two
calls, then every 20th) the monitor pulls that call's
batches (``steps_per_execution`` of them) from fit()'s own iterator in Python, timed: that is the input wait,
including waiting for the pipeline's producer (less TensorFlow's own cost of a ``next()`` on a ready element,
timed once per fit on an iterator that repeats one batch); it then hands exactly those batches to Keras' train function
(its documented path for a Python iterator, the same train step compiled once more), timed up to the end of
the step: that is the compute time (host-to-device copies count as compute here; the TensorFlow Profiler
counts them as input). The model trains on the same batches in the same order either way. With
multi-GPU strategies the distributed iterator yields per-replica batches and the same path applies. The first
sampled call traces the train step once more (a compile) and is left out. With the torch back end Keras
fetches the batch in Python before ``on_train_batch_begin``: the input wait is the time between a batch's end
and the next batch's begin. With the JAX back end the fetch happens inside the train function after
``on_train_batch_begin`` and is not measured: the input share is None and the report says why.

Step time: between consecutive ``on_train_batch_end`` calls, divided by the batches in the call. Overriding
``on_train_batch_end`` makes Keras wait for every step (as AutoResume already does); see
bench/monitor_overhead.py for the measured cost.
"""
from __future__ import annotations

import sys
import threading
import time

from ..optional import require
from .health_monitor import HealthMonitor

keras = require("keras", "tf", "colabkit.keras.Monitor")

ADAPTER_KINDS = {"TFDatasetAdapter": "tf.data", "ArrayDataAdapter": "numpy", "GeneratorDataAdapter": "generator",
                 "PyDatasetAdapter": "PyDataset", "TorchDataLoaderAdapter": "DataLoader"}
FIRST_SAMPLES, EARLY_EVERY, LATER_EVERY = 12, 2, 20
JAX_NOTE = ("not measured with Keras' JAX back end (it fetches each batch inside its train function, where no "
            "callback sees it); time next() in a custom loop with colabkit.monitor().wrap() instead")


class Monitor(keras.callbacks.Callback):
    """Measure training health during fit(): see :class:`colabkit.health.HealthMonitor` for the options
    (directory, hang_timeout, hang_floor, hang_ceiling, first_step_timeout, sample_every, gpus, verbose).

    ``report()`` / ``text()`` as there; ``health`` is the underlying monitor (plots, %monitor).
    ``measure_input=False`` leaves the train function alone (no input share with the TensorFlow back end)."""

    _colabkit_health = True   # AutoResume finds monitors in fit()'s callbacks by this

    def __init__(self, directory=None, *, measure_input=True, **options):
        super().__init__()
        self.health = HealthMonitor(directory, **options)
        self.measure_input = measure_input
        self._installed = None        # (model, the train function we wrapped) during a fit()
        self._last_batch = -1
        self._last_end = None
        self._discard = False
        self._calls = self._samples = 0
        self._traced = False
        self._pending_begin = None
        self._tf_backend = True
        self._gap_is_input = False    # torch: the fetch happens between a batch's end and the next one's begin

    # -- results ----------------------------------------------------------------------------------------
    def report(self) -> dict:
        return self.health.report()

    def text(self) -> str:
        return self.health.text()

    # -- fit() hooks --------------------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self.health.input_kind = _input_kind(sys._getframe(1)) or self.health.input_kind
        backend = keras.backend.backend()
        self._tf_backend = backend == "tensorflow"
        self._gap_is_input = backend == "torch"
        if backend == "jax":
            self.health.input_note = JAX_NOTE
        self._pending_begin = None
        self._install_train_function(self.model)
        self._last_batch, self._last_end, self._discard = -1, None, False
        self.health.current_phase, self.health._last_step_end = "first", None
        self.health.start()
        self.health._phase_started = self.health._last_progress = time.monotonic()
        # Keras calls no callback when fit() is left by an exception (the stop button, an error in a
        # callback): the watchdog checks this frame is still running before it reports a hang
        self.health.owner = (threading.get_ident(), _fit_frame(sys._getframe(1), self.model))

    def _install_train_function(self, model):
        """Wrap fit()'s train function to split sampled steps into input wait and compute (TensorFlow back
        end). Called by AutoResume before it wraps the function itself, so that this wrapper is the innermost."""
        if self._installed is not None and self._installed[0] is model and self._in_place(model):
            return   # already installed for this fit() (AutoResume does it first, then on_train_begin asks)
        if not self.measure_input or keras.backend.backend() != "tensorflow" or model.train_function is None:
            return
        tf = sys.modules.get("tensorflow")
        if tf is None:
            return
        inner = model.train_function
        while getattr(inner, "_colabkit_inner", None) is not None:   # left behind by a fit() that raised
            inner = inner._colabkit_inner
        per_call = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
        end_of_data = (StopIteration, tf.errors.OutOfRangeError)
        self._calls, self._samples, self._traced = 0, 0, False
        self._fetch_cost = 0.0
        self._early_every = 1 if per_call > 1 else EARLY_EVERY   # enough measurements within the first 50 steps

        def train_function(iterator):
            self._calls += 1
            iterators = (tf.data.Iterator, tf.distribute.DistributedIterator)
            if not self._sample_now() or not isinstance(iterator, iterators):
                return inner(iterator)
            t0 = time.perf_counter()
            batches = []
            try:
                for _ in range(per_call):
                    batches.append(next(iterator))
            except end_of_data:
                if not batches:
                    raise StopIteration from None
            t1 = time.perf_counter()
            outputs = inner(iter(batches))
            _wait_for(outputs)
            t2 = time.perf_counter()
            if self._traced:
                self.health.record_input(max(0.0, t1 - t0 - self._fetch_cost * len(batches)), t2 - t0)
                self._samples += 1
            else:
                self._traced = True     # the first call on this path traced the step again: not a normal step
                self._discard = True
                self._fetch_cost = _fetch_cost(tf, batches[0])
            return outputs

        train_function._colabkit_monitor, train_function._colabkit_inner = self, inner
        model.train_function = train_function
        self._installed = (model, inner, train_function)

    def _in_place(self, model) -> bool:
        """Our wrapper is the train function, or under AutoResume's wrappers (their _colabkit_original chain)."""
        fn, ours = model.train_function, self._installed[2]
        for _ in range(8):
            if fn is None:
                return False
            if fn is ours:
                return True
            fn = getattr(fn, "_colabkit_original", None)
        return False

    def _sample_now(self) -> bool:
        if self._calls < 2:
            return False    # the first call compiles
        if not self._traced:
            return True
        every = self._early_every if self._samples < FIRST_SAMPLES else LATER_EVERY
        return self._calls % every == 0

    def _uninstall(self):
        installed, self._installed = self._installed, None
        if installed is None:
            return
        model, inner, ours = installed
        if model.train_function is ours:
            model.train_function = inner
        # else: another wrapper (AutoResume's) sits above ours and puts back what it found (ours); the next
        # fit() finds ours with _colabkit_monitor set and unwraps it below

    def on_train_batch_begin(self, batch, logs=None):
        h = self.health
        if h.current_phase == "epoch_end":
            h._leave_phase("step")
            self._last_end = None      # the time since the last batch was validation and savers, not input
        if self._last_end is not None and self._gap_is_input:
            self._pending_begin = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        steps = (self.params or {}).get("steps")
        end = min(batch + 1, steps) if steps else batch + 1
        n = end if batch <= self._last_batch else end - (self._last_batch + 1)
        self._last_batch = batch
        now = time.perf_counter()
        begin = self._pending_begin
        if begin is not None and self._last_end is not None:   # torch: the fetch happened before begin
            self.health.record_input(begin - self._last_end, now - self._last_end)
            self._pending_begin = None
        loss = (logs or {}).get("loss")
        try:
            loss = None if loss is None else float(loss)
        except (TypeError, ValueError):
            loss = None
        self.health.step(n, loss=loss, count_time=not self._discard)
        self._discard = False
        self._last_end = now
        if steps and batch + 1 >= steps:
            self.health.enter_phase("epoch_end")

    def on_epoch_begin(self, epoch, logs=None):
        self._last_batch = -1

    def on_test_begin(self, logs=None):
        if self.health.running:
            self.health.enter_phase("validation")

    def on_test_batch_end(self, batch, logs=None):
        self.health.progress()

    def on_test_end(self, logs=None):
        if self.health.running and self.health.current_phase == "validation":
            self.health.enter_phase("epoch_end")   # on_epoch_end callbacks (savers) run next

    def on_epoch_end(self, epoch, logs=None):
        self.health.log_epoch(epoch, logs)
        if self.health.current_phase not in ("epoch_end", "first"):
            self.health.enter_phase("epoch_end")

    def on_train_end(self, logs=None):
        self._uninstall()
        self.health.stop()


def _fetch_cost(tf, batch) -> float:
    """Seconds a Python ``next()`` of a tf.data iterator costs when the element is ready (TensorFlow's own
    dispatch, not waiting): timed on an iterator that repeats one batch of the same structure, and subtracted
    from each measured fetch, so a fully prefetched pipeline measures ~0 rather than a few hundred us."""
    try:
        iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
        next(iterator)
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            next(iterator)
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]
    except Exception:  # noqa: BLE001 - per-replica batches and the like: no correction
        return 0.0


def _fit_frame(frame, model):
    for _ in range(12):
        if frame is None:
            return None
        if frame.f_code.co_name == "fit" and frame.f_locals.get("self") is model:
            return frame
        frame = frame.f_back
    return None


def _wait_for(outputs):
    """Block until the step's results exist (TensorFlow runs ops asynchronously)."""
    values = outputs.values() if isinstance(outputs, dict) else [outputs]
    for value in values:
        if hasattr(value, "numpy"):
            value.numpy()
            return


def _input_kind(frame) -> str | None:
    """The kind of fit()'s input, from its epoch iterator's data adapter (a few frames up)."""
    for _ in range(12):
        if frame is None:
            return None
        iterator = frame.f_locals.get("epoch_iterator")
        if iterator is not None and hasattr(iterator, "data_adapter"):
            return ADAPTER_KINDS.get(type(iterator.data_adapter).__name__, "unknown")
        frame = frame.f_back
    return None
