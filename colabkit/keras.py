"""`colabkit.keras.AutoResume`: a drop-in superset of `keras.callbacks.BackupAndRestore`.

    model.fit(ds, epochs=50, callbacks=[colabkit.keras.AutoResume("drive:runs/mnist")])

Restores weights, optimizer state, metric state, epoch, batch and RNG state when training begins; saves
crash-safely while training (to local disk, then uploaded in the background); saves and stops before the
runtime cap; saves on SIGTERM and on an interrupt (the notebook's stop button) before giving control back.
Requires Keras 3 (TensorFlow >= 2.16).
"""
from __future__ import annotations

import logging
import os
import random
import signal
import sys
import threading
import time

import numpy as np

from .optional import require

keras = require("keras", "tf", "colabkit.keras.AutoResume")
if int(keras.__version__.split(".")[0]) < 3:
    raise ImportError(f"colabkit.keras.AutoResume needs Keras 3 (TensorFlow 2.16 or newer); this environment has "
                      f"Keras {keras.__version__}. Upgrade with: pip install -U \"colabkit[tf]\"")

from .checkpoints.api import CheckpointError, Checkpoints  # noqa: E402
from .deadline import watch_for  # noqa: E402
from .units import DURATION_FORMS, format_duration, parse_duration  # noqa: E402

log = logging.getLogger("colabkit")

# Input pipelines that restart from their first batch every epoch, so skipping k batches positions them.
_POSITIONABLE_ADAPTERS = {"ArrayDataAdapter", "TFDatasetAdapter", "PyDatasetAdapter", "TorchDataLoaderAdapter",
                          "GrainDatasetAdapter"}
_ASSUMED_UPLOAD_BYTES_PER_S = 10e6   # first-save estimate before anything was measured (Drive-like)
FINAL_WAIT_FLOOR_S = 60.0            # a final save waits at least this long for its upload


class AutoResume(keras.callbacks.Callback):
    """Back up and restore training state, crash-safely, to ``directory`` ("drive:runs/x" or a folder).

    Args:
        directory: where checkpoints go (same role as BackupAndRestore's ``backup_dir``).
        save_freq: "epoch" or an integer number of batches, as in BackupAndRestore.
        every: also save on a wall-clock interval, e.g. "15min".
        keep: committed checkpoints to keep (default: the configured ``keep``, 3).
        deadline: "auto" (save and stop before the runtime cap; also save before the idle cutoff when
            %keepalive is on), None, a time budget ("11h30m") counted from the start of training, or a datetime.
        delete_checkpoint: delete the checkpoints after training completes (BackupAndRestore's default is
            True; here False, so a finished run can still be inspected or continued).
        deadline_margin: the least time before a deadline at which the final save starts (default 60s);
            colabkit starts earlier when measured saves take longer (3x the measured save+upload time).
        keep_every: also keep one checkpoint per interval ("6h").
        verbose: 1 prints one line per resume/deadline/interrupt; 0 is silent (logging still records).
        resume_from: a Google Drive share link to someone's checkpoint: when ``directory`` has no checkpoint
            yet, it is downloaded, verified (manifest, sha256, safe formats only) and resumed; new
            checkpoints go to ``directory``.
    """

    def __init__(self, directory, save_freq="epoch", every=None, keep=None, deadline="auto",
                 delete_checkpoint=False, deadline_margin=None, keep_every=None, verbose=1, local_dir=None,
                 resume_from=None):
        super().__init__()
        if not directory or (isinstance(directory, str) and not directory.strip()):
            raise ValueError(f"Empty `directory` argument passed (directory={directory!r}); pass a folder such as "
                             f"\"drive:runs/mnist\" or \"checkpoints/mnist\".")
        if save_freq != "epoch" and (isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1):
            raise ValueError(f"Invalid value for argument `save_freq`. Received: save_freq={save_freq!r}. "
                             f"Expected either 'epoch' or an integer value (a number of batches, at least 1).")
        if every is not None:
            try:
                every = parse_duration(every, name="every")
            except ValueError:
                raise ValueError(f"Invalid value for argument `every`. Received: every={every!r}. "
                                 f"Expected None or {DURATION_FORMS}.") from None
        self.directory, self.save_freq, self.every = directory, save_freq, every
        self.deadline, self.delete_checkpoint, self.verbose = deadline, delete_checkpoint, verbose
        self.margin_floor = 60.0 if deadline_margin is None else parse_duration(deadline_margin, name="deadline_margin")
        watch_for(deadline, started_at=time.time())  # validate the deadline now, not when fit() starts
        self.checkpoints = Checkpoints(directory, keep=keep, keep_every=keep_every, local_dir=local_dir,
                                       resume_from=resume_from)
        from .widgets import track
        track(self)  # the status panel shows this run's saves and deadlines
        self.restored = None          # what on_train_begin restored (colabkit.Restored) or None
        self.events = []              # (wall time, event, detail) for timelines and the status panel
        self._buffers = _SnapshotBuffers()
        self._old_handlers = {}       # kept across runs: one that fit() left by an exception chains to them
        self._reset_run_state()

    def _reset_run_state(self):
        self._step = 0                # batches trained in total
        self._epoch = 0               # current epoch
        self._last_batch_seen = -1
        self._batches_since_save = 0
        self._last_saved_position = None
        self._state_nbytes = 0        # bytes of one snapshot, for the first save-time estimate
        self._last_save_time = time.time()
        self._skip_calls = 0
        self._last_call_skipped = False
        self._end_position = None     # where training stands after the last epoch_end
        self._interrupt = None        # "SIGINT" / "SIGTERM" once received
        self._stopped_for = None
        self._fit_frame = None        # the running fit()'s frame (see _install_signal_handlers)
        self._original_train_function = None

    # -- helpers -----------------------------------------------------------------------------------------
    def _say(self, message: str):
        log.info("colabkit: %s", message)
        if self.verbose:
            print(f"colabkit: {message}", flush=True)

    def _event(self, kind: str, detail: str):
        self.events.append((time.time(), kind, detail))

    def _variables(self):
        model = self.model
        optimizer = model.optimizer
        return (list(model.variables),
                list(optimizer.variables) if optimizer is not None else [],
                list(getattr(model, "metrics_variables", [])))

    def _rng_state(self) -> dict:
        state = {"python": _python_rng_to_json(random.getstate())}
        np_state = np.random.get_state()
        state["numpy"] = {"keys": np_state[1], "pos": int(np_state[2]), "has_gauss": int(np_state[3]),
                          "cached_gaussian": float(np_state[4])}
        tf = sys.modules.get("tensorflow")
        if tf is not None:
            state["tf_global_generator"] = tf.random.get_global_generator().state.numpy()
        seed_gen = _keras_global_seed_generator()
        if seed_gen is not None:
            state["keras_global_seed"] = keras.ops.convert_to_numpy(seed_gen.state.value)
        return state

    def _set_rng_state(self, state: dict):
        random.setstate(_python_rng_from_json(state["python"]))
        n = state["numpy"]
        np.random.set_state(("MT19937", n["keys"], n["pos"], n["has_gauss"], n["cached_gaussian"]))
        tf = sys.modules.get("tensorflow")
        if tf is not None and "tf_global_generator" in state:
            tf.random.get_global_generator().state.assign(state["tf_global_generator"])
        seed_gen = _keras_global_seed_generator()
        if seed_gen is not None and "keras_global_seed" in state:
            seed_gen.state.assign(state["keras_global_seed"])

    # -- restore -------------------------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        self._reset_run_state()
        if not self.model.built:
            raise ValueError("To use the AutoResume callback, your model must be built before you call `fit()`. "
                             f"Model {self.model} is unbuilt. You can build it beforehand by calling it on a "
                             "batch of data.")
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        self._watch = watch_for(self.deadline, started_at=time.time(), margin_floor=self.margin_floor)
        self._install_signal_handlers()
        try:
            self.checkpoints.claim()   # another run writing this folder is an error now, not a mix-up later
            self._state_nbytes = self._buffers.prefill([v for group in self._variables() for v in group])
            self._restore_and_position()
        except BaseException:
            self._restore_signal_handlers()   # fit() is left with an exception: on_train_end will not run
            raise

    def _restore_and_position(self):
        restored = self.checkpoints.restore()
        self.restored = restored
        if restored is None:
            self._wrap_train_function(0)
            self._event("start", "no checkpoint found; training from scratch")
            return
        self._apply(restored)
        self._step = restored.step
        epoch, batch = restored.epoch or 0, restored.batch or 0
        self._last_saved_position = (epoch, batch)
        if batch and not self._input_positionable():
            self._say(f"the input pipeline cannot be positioned mid-epoch (e.g. a Python generator); "
                      f"epoch {epoch} restarts at batch 0")
            batch = 0
        self.model._initial_epoch = epoch
        self._epoch = epoch
        self._wrap_train_function(batch)
        where = f"epoch {epoch}" + (f", batch {batch}" if batch else "")
        self._event("restore", f"step {restored.step} ({where}) from {restored.source}")
        origin = (f"shared checkpoint {self.checkpoints.resume_from}" if restored.source == "link"
                  else f"{restored.source} copy of {self.directory}")
        self._say(f"resumed from step {restored.step} ({where}) [{origin}]")

    def _apply(self, restored):
        """Check every saved array against the live variables first, then assign: nothing is overwritten
        when the checkpoint does not fit."""
        state = restored.state
        groups = zip(("model", "optimizer", "metrics"), self._variables())
        plan = []
        for group, variables in groups:
            saved, names = state.get(group) or [], state.get(f"{group}_paths") or []
            if group == "metrics" and len(saved) != len(variables):
                continue  # metrics differ (e.g. compile() changed); they only affect logs of the resumed epoch
            if len(saved) != len(variables):
                raise CheckpointError(
                    f"The checkpoint at step {restored.step} in {self.directory} does not fit this model: it holds "
                    f"{len(saved)} {group} variables, the model has {len(variables)}. Resume with the same "
                    f"architecture, or use a new directory to start over. Nothing was changed.")
            for i, (variable, value) in enumerate(zip(variables, saved)):
                if tuple(variable.shape) != tuple(value.shape):
                    saved_name = names[i] if i < len(names) else f"#{i}"
                    raise CheckpointError(
                        f"The checkpoint at step {restored.step} in {self.directory} does not fit this model: "
                        f"{group} variable '{variable.path}' has shape {tuple(variable.shape)}, the checkpoint's "
                        f"'{saved_name}' has shape {tuple(value.shape)}. Resume with the same architecture, or "
                        f"use a new directory to start over. Nothing was changed.")
                plan.append((variable, value))
        for variable, value in plan:
            variable.assign(value)
        if state.get("rng"):
            self._set_rng_state(state["rng"])

    def _input_positionable(self) -> bool:
        """True when fit()'s input restarts from its first batch each epoch (arrays, finite datasets)."""
        frame = sys._getframe(1)
        for _ in range(12):  # fit() -> CallbackList.on_train_begin -> here; look a few frames up
            if frame is None:
                break
            iterator = frame.f_locals.get("epoch_iterator")
            if iterator is not None and hasattr(iterator, "data_adapter"):
                adapter = type(iterator.data_adapter).__name__
                steps = getattr(iterator, "steps_per_epoch", None)
                return adapter in _POSITIONABLE_ADAPTERS and (
                    steps is None or steps == getattr(iterator.data_adapter, "num_batches", None))
            frame = frame.f_back
        return False

    def _wrap_train_function(self, skip_batches: int):
        """Wrap fit()'s train_function for this run: its first calls in the resumed epoch consume their
        batches without training (the resume position). Exceptions pass through untouched: an epoch of
        unknown length ends with one (StopIteration / OutOfRangeError) that Keras catches. A wrapper left on
        the model by a fit() that ended by an exception is replaced, not wrapped, and skips nothing outside
        its own fit()."""
        model = self.model
        per_call = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
        self._skip_calls = -(-skip_batches // per_call)
        original = model.train_function
        while getattr(original, "_colabkit_original", None) is not None:
            original = original._colabkit_original
        self._original_train_function = original

        def train_function(iterator):
            self._last_call_skipped = self._skip_calls > 0 and self._fit_running(sys._getframe(1))
            if self._last_call_skipped:
                self._skip_calls -= 1
                for _ in range(per_call):
                    next(iterator)
                return {}
            return original(iterator)

        train_function._colabkit_original = original
        model.train_function = train_function

    # -- save triggers -------------------------------------------------------------------------------------
    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._last_batch_seen = -1

    def on_train_batch_end(self, batch, logs=None):
        new = batch + 1 if batch <= self._last_batch_seen else batch - self._last_batch_seen
        self._last_batch_seen = batch
        if self._last_call_skipped:
            return  # a batch skipped to reach the resume position; it was trained before the interruption
        self._step += new
        self._batches_since_save += new
        steps = (self.params or {}).get("steps")
        # after an epoch's last batch the position is the next epoch's start: a resume then has no batch
        # left to skip in an epoch that would otherwise end without a single trained step
        position = (self._epoch + 1, 0) if steps and batch + 1 >= steps else (self._epoch, batch + 1)
        if self._interrupt:
            self._final_save(position, f"{self._interrupt} received")
            return
        deadline = self._watch.due(self._estimated_save_s())
        if deadline is not None:
            self._watch.mark_handled(deadline)
            if deadline.stop_training:
                self._final_save(position, f"{deadline.reason} is {format_duration(deadline.at - time.time())} away",
                                 timeout=max(1.0, deadline.at - time.time()), event="deadline-save")
            else:
                self._save(position, reason=f"before {deadline.reason}", wait=max(1.0, deadline.at - time.time()),
                           event="deadline-save")
                self._say(f"saved step {self._step} before {deadline.reason}; training continues")
            return
        if isinstance(self.save_freq, int) and self._batches_since_save >= self.save_freq:
            self._save(position, reason="save_freq")
        elif self.every and time.time() - self._last_save_time >= self.every:
            self._save(position, reason="every")

    def on_epoch_end(self, epoch, logs=None):
        self._skip_calls = 0   # a shorter resumed epoch than the saved position must not skip the next one
        steps = (self.params or {}).get("steps")
        if steps and self._last_batch_seen + 1 < steps:   # another callback stopped training mid-epoch
            self._end_position = (epoch, self._last_batch_seen + 1)
        else:
            self._epoch, self._end_position = epoch + 1, (epoch + 1, 0)
        if self.save_freq == "epoch" and self._stopped_for is None:
            self._save(self._end_position, reason="epoch")

    def on_train_end(self, logs=None):
        self.model._initial_epoch = None  # fit() read it already; a later fit() without us starts as asked
        try:
            if self._original_train_function is not None:
                self.model.train_function = self._original_train_function
                self._original_train_function = None
            end = self._end_position or (self._epoch, 0)
            if self._stopped_for is None:
                if self._last_saved_position != end:
                    self._save(end, reason="end of training")
                if not self.checkpoints.wait(self._final_wait_s()):
                    self._say(f"the final checkpoint (step {self._step}) is not on {self.directory} yet: "
                              f"{self._saved_where(False)}")
            if self._stopped_for is None and self.delete_checkpoint and not self.model.stop_training:
                self.checkpoints.close()
                from .checkpoints.storage import remove_tree
                destination = self.checkpoints.destination
                if isinstance(destination, os.PathLike):
                    remove_tree(destination)
                else:  # a back end that is not a filesystem (gdrive://)
                    destination.remove_all()
                remove_tree(self.checkpoints.local.path)
            if self.checkpoints.wait(0):   # all on the destination: another run may write here now
                self.checkpoints.release()
        finally:
            self._restore_signal_handlers()
        if self._interrupt == "SIGTERM":
            signal.raise_signal(signal.SIGTERM)   # deliver it now that the checkpoint is safe
        elif self._interrupt == "SIGINT":
            raise KeyboardInterrupt("training interrupted; the last checkpoint was committed first")

    # -- saving --------------------------------------------------------------------------------------------
    def _estimated_save_s(self) -> float:
        measured = self.checkpoints.estimated_save_seconds()
        if measured is not None:
            return measured
        return 0.2 + self._state_nbytes / _ASSUMED_UPLOAD_BYTES_PER_S

    def _save(self, position, *, reason: str, wait=False, event: str = "save") -> bool:
        epoch, batch = position
        model_vars, opt_vars, metric_vars = self._variables()
        buffers = self._buffers.take([*model_vars, *opt_vars, *metric_vars], wait=reason not in ("save_freq", "every"),
                                     reclaim=self.checkpoints._drop_pending)
        if buffers is None:   # the previous snapshot is still being written: the next batch end asks again
            return False
        arrays = iter(buffers)
        copy = lambda variables: [_copy_into(next(arrays), v) for v in variables]  # noqa: E731
        state = {
            "model": copy(model_vars), "model_paths": [v.path for v in model_vars],
            "optimizer": copy(opt_vars), "optimizer_paths": [v.path for v in opt_vars],
            "metrics": copy(metric_vars), "metrics_paths": [v.path for v in metric_vars],
            "rng": self._rng_state(),
        }
        ok = self.checkpoints.save(self._step, state, epoch=epoch, batch=batch, wait=wait, _copy_arrays=False,
                                   info={"reason": reason}, _release=lambda: self._buffers.give_back(buffers))
        self._last_saved_position = position
        self._batches_since_save, self._last_save_time = 0, time.time()
        self._event(event, f"step {self._step} (epoch {epoch}, batch {batch}, {reason})")
        return ok

    def _final_wait_s(self) -> float:
        """How long a final save waits for its upload: generous, but bounded, so a destination that stays
        down (a dropped mount cannot come back while the cell runs) does not hang the notebook."""
        return max(FINAL_WAIT_FLOOR_S, 3 * self._estimated_save_s())

    def _saved_where(self, committed: bool) -> str:
        if committed:
            return f"committed to {self.directory}"
        last_local = self.checkpoints.status.last_local
        if last_local is not None and last_local.step == self._step:
            return (f"kept on local disk at {last_local.path}; the upload to {self.directory} is pending "
                    f"({self.checkpoints.status.last_error or 'still running'})")
        return f"NOT saved: {self.checkpoints.status.last_error or 'the local write failed'}"

    def _final_save(self, position, why: str, timeout=None, event: str = "save"):
        committed = self._save(position, reason=why, wait=self._final_wait_s() if timeout is None else timeout,
                               event=event)
        self.model.stop_training = True
        self._stopped_for = why
        self._event("stop", why)
        self._say(f"{why}: saved step {self._step} ({self._saved_where(committed)}) and stopped training. "
                  f"Re-run this cell to resume.")

    # -- signals -------------------------------------------------------------------------------------------
    def _install_signal_handlers(self):
        """Install the handlers for this fit(), called from on_train_begin. When fit() ends by an exception
        Keras calls no callback, so the handlers stay installed; they then find fit()'s frame (recorded
        here) off the stack at the next signal and step aside (see _on_signal)."""
        stale, self._old_handlers = self._old_handlers, {}   # non-empty: this callback's fit() ended that way
        self._fit_frame = _fit_frame_above(sys._getframe(1)) or _FIT_FRAME_UNKNOWN
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                previous = signal.signal(sig, self._on_signal)
            except (ValueError, OSError):
                continue
            owner = getattr(previous, "__self__", None)
            if isinstance(owner, AutoResume):
                # left behind by a fit() that ended in an exception Keras reported to no callback: chain to the
                # handler that was there before it
                default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
                previous = (stale if owner is self else owner._old_handlers).get(sig, default)
            self._old_handlers[sig] = previous

    def _restore_signal_handlers(self):
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers = {}
        self._fit_frame = None

    def _fit_running(self, frame) -> bool:
        """Whether this callback's fit() is on the stack at ``frame`` (a frame of the calling thread)."""
        fit_frame = self._fit_frame
        if fit_frame is None or fit_frame is _FIT_FRAME_UNKNOWN:
            return fit_frame is _FIT_FRAME_UNKNOWN   # not in a fit(), or its frame was not found: assume running
        while frame is not None:
            if frame is fit_frame:
                return True
            frame = frame.f_back
        return False

    def _on_signal(self, signum, frame):
        if not self._fit_running(frame if frame is not None else sys._getframe(1)):
            # fit() ended by an exception (no callback ran): act as if AutoResume had never been installed
            previous = self._old_handlers.get(signum, signal.SIG_DFL)
            self._skip_calls = 0
            self._restore_signal_handlers()
            _pass_signal_on(previous, signum, frame)
            return
        name = signal.Signals(signum).name
        if self._interrupt != name:
            self._interrupt = name   # handled at the next batch end: save, then stop
            return
        # the same signal twice: stop waiting for the save and let the previous handler act now
        previous, fit_frame = self._old_handlers.get(signum, signal.SIG_DFL), self._fit_frame
        self._restore_signal_handlers()
        self._fit_frame = fit_frame   # fit() still runs when the previous handler returns
        _pass_signal_on(previous, signum, frame)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt


_FIT_FRAME_UNKNOWN = object()   # on_train_begin ran outside a recognised fit(): its handlers assume it runs


def _fit_frame_above(frame):
    """The innermost Keras ``fit()`` frame at or above ``frame``: a function named fit with an
    ``epoch_iterator`` local (Keras 3's trainers, all backends), or None."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "fit" and ("epoch_iterator" in code.co_varnames or "epoch_iterator" in code.co_cellvars):
            return frame
        frame = frame.f_back
    return None


def _pass_signal_on(previous, signum, frame):
    """Let ``previous`` (a handler signal.signal returned, already reinstalled) handle the signal."""
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.raise_signal(signum)


class _SnapshotBuffers:
    """Host buffers that snapshots are copied into, reused from save to save. Copying into memory already
    touched is one memcpy (into fresh allocations, page faults cost several times that for hundreds of MB),
    and that copy is the whole stall the training loop sees.

    ``sets`` (default: the ``snapshot_buffers`` setting, 1) sets exist at most, each the size of the training
    state. A set is held from the snapshot until the background thread has written it. A snapshot still
    waiting to be written (behind an upload) is discarded for a newer one and its set reused (``reclaim``).
    When every set is being written, a periodic save is taken at a later batch (``take`` returns None); any
    other save waits for a set. So with one set, snapshots cost 1x the state in host memory and training never
    waits for a periodic save's write; each extra set costs another 1x and lets such a save be taken at once.
    A new set is touched (its pages faulted in) by a background thread when a periodic save first asks for
    it, and that save is taken once it is done: neither the restore nor the training loop waits for it.
    """

    WAIT_S = 120.0   # a save that must not be skipped waits this long for a set, then allocates one more

    def __init__(self, sets: int | None = None):
        if sets is None:
            from .config import load
            sets = load().snapshot_buffers
        self.sets = sets
        self.sets_allocated = 0     # sets allocated so far (tests and benchmarks read it)
        self._free, self._layout, self._alive = [], None, 0
        self._untouched: set[int] = set()   # ids of sets whose memory was never written
        self._cond = threading.Condition()

    def take(self, variables, *, wait: bool = True, reclaim=None) -> list | None:
        """A set of buffers shaped like ``variables``. When all sets are in use: ``reclaim()`` (True when it
        gave a set back) is asked first; then None without ``wait``, else wait for a set."""
        layout = [(tuple(v.shape), np.dtype(_dtype_name(v))) for v in variables]
        deadline = time.monotonic() + self.WAIT_S
        while True:
            with self._cond:
                self._use_layout(layout)
                buffers = self._free.pop() if self._free else None
                allocate = buffers is None and self._alive < self.sets
                if allocate:
                    self._alive += 1
                    self.sets_allocated += 1
            if allocate:
                buffers = [np.empty(shape, dtype) for shape, dtype in layout]
            if buffers is not None:
                with self._cond:
                    fresh = id(buffers) in self._untouched or allocate
                    self._untouched.discard(id(buffers))
                if not fresh or wait:
                    return buffers
                self._touch_then_give_back(buffers)
                return None
            if reclaim is not None and reclaim():
                continue
            if not wait:
                return None
            with self._cond:
                left = deadline - time.monotonic()
                if not self._free and left > 0:
                    self._cond.wait(min(left, 1.0))
                    continue
                if self._free:
                    continue
                log.warning("colabkit: no snapshot buffer came back in %.0fs; allocating another set", self.WAIT_S)
                self._alive += 1
                self.sets_allocated += 1
            return [np.empty(shape, dtype) for shape, dtype in layout]

    def _use_layout(self, layout) -> None:
        """Called with the lock held: for another model, the sets of the old layout are dropped."""
        if layout != self._layout:
            self._layout, self._alive = layout, self._alive - len(self._free)
            self._free = []
            self._untouched.clear()

    def prefill(self, variables) -> int:
        """Allocate one set unless one exists (its memory is touched when a periodic save first asks for it).
        Returns the size of a set in bytes."""
        layout = [(tuple(v.shape), np.dtype(_dtype_name(v))) for v in variables]
        with self._cond:
            self._use_layout(layout)
            if self._alive == 0:
                buffers = [np.empty(shape, dtype) for shape, dtype in layout]   # not touched: no cost yet
                self._alive += 1
                self.sets_allocated += 1
                self._free.append(buffers)
                self._untouched.add(id(buffers))
        return sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in layout)

    def _touch_then_give_back(self, buffers: list) -> None:
        """Fault the set's pages in, in a background thread (page faults are most of the cost of a first copy
        into fresh memory, hundreds of ms for hundreds of MB), then make it available."""
        def touch():
            try:
                for buffer in buffers:
                    buffer.fill(0)
            finally:
                self.give_back(buffers)

        threading.Thread(target=touch, name="colabkit-snapshot-touch", daemon=True).start()

    def give_back(self, buffers: list) -> None:
        with self._cond:
            if [(b.shape, b.dtype) for b in buffers] == self._layout and self._alive <= self.sets:
                self._free.append(buffers)
            else:
                self._alive -= 1   # of another layout, or an extra set: let it go
            self._cond.notify_all()


def _dtype_name(variable) -> str:
    dtype = variable.dtype
    return dtype if isinstance(dtype, str) else getattr(dtype, "name", str(dtype))


def _host_value(variable) -> np.ndarray:
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


def _copy_into(buffer: np.ndarray, variable) -> np.ndarray:
    np.copyto(buffer, _host_value(variable), casting="no")
    return buffer


def _keras_global_seed_generator():
    try:
        from keras.src.backend.common import global_state
    except ImportError:  # pragma: no cover - other Keras layouts
        return None
    return global_state.get_global_attribute("global_seed_generator")


def _python_rng_to_json(state):
    version, internal, gauss = state
    return {"version": version, "internal": list(internal), "gauss": gauss}


def _python_rng_from_json(data):
    return (data["version"], tuple(int(x) for x in data["internal"]), data["gauss"])
