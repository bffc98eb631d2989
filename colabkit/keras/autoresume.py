"""`colabkit.keras.AutoResume`: a drop-in superset of `keras.callbacks.BackupAndRestore`.

    model.fit(ds, epochs=50, callbacks=[colabkit.keras.AutoResume("drive:runs/mnist")])

Restores the whole training state when training begins: every variable Keras tracks (the model's weights
and seed generators, every optimizer reachable from the model, e.g. a GAN's ``self.d_opt``/``self.g_opt``,
metrics), the other callbacks' state, epoch, batch and the RNG states; saves crash-safely while training (to
local disk, then uploaded in the background); saves and stops before the runtime cap; saves on SIGTERM and on
an interrupt (the notebook's stop button) before giving control back. Requires Keras 3 (TensorFlow >= 2.16).

A callback of your own keeps its state across a resume with two methods::

    class Counter(keras.callbacks.Callback):
        def get_state(self):            # JSON-able values; NumPy arrays allowed
            return {"seen": self.seen, "history": np.asarray(self.history)}

        def set_state(self, state):     # called once every callback's on_train_begin has run
            self.seen, self.history = state["seen"], list(state["history"])
"""
from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import time

import numpy as np

from ..optional import require

keras = require("keras", "tf", "colabkit.keras.AutoResume")
if int(keras.__version__.split(".")[0]) < 3:
    raise ImportError(f"colabkit.keras.AutoResume needs Keras 3 (TensorFlow 2.16 or newer); this environment has "
                      f"Keras {keras.__version__}. Upgrade with: pip install -U \"colabkit[tf]\"")

from ..checkpoints import rng, untrusted  # noqa: E402
from ..checkpoints.api import CheckpointError, Checkpoints  # noqa: E402
from ..checkpoints.buffers import SnapshotBuffers as _SnapshotBuffers, total_nbytes  # noqa: E402
from ..deadline import watch_for  # noqa: E402
from ..health.keras_monitor import Monitor  # noqa: E402 - also colabkit.keras.Monitor
from .tfdata import UNTRACKED, attach as attach_input, check_saved as check_input_position  # noqa: E402
from .state import (  # noqa: E402
    GROUPS,
    LAYOUT,
    StateLayout,
    builtin_state,
    copy_into,
    detached,
    has_state_protocol,
    keras_global_seed_generator,
    own_copy,
    weights_stay_arrays,
)
from ..resume import schedule  # noqa: E402
from ..resume.schedule import SaveContext, SavePolicy  # noqa: E402
from ..resume.run import Run, RunAttributes, recorded  # noqa: E402
from ..resume.signals import SignalLatch  # noqa: E402
from ..units import DURATION_FORMS, format_duration, parse_duration  # noqa: E402

log = logging.getLogger("colabkit")

# Input pipelines that restart from their first batch every epoch, so skipping k batches positions them.
_POSITIONABLE_ADAPTERS = {"ArrayDataAdapter", "PyDatasetAdapter", "TorchDataLoaderAdapter",
                          "GrainDatasetAdapter"}
_ASSUMED_UPLOAD_BYTES_PER_S = 10e6   # first-save estimate before anything was measured (Drive-like)
# CallbackList methods AutoResume hooks for the duration of a fit() (see _hook_callback_list)
_LIST_HOOKS = ("on_train_begin", "on_epoch_begin", "on_train_batch_begin", "on_train_batch_end", "on_epoch_end",
               "on_test_begin", "on_test_batch_begin", "on_test_batch_end", "on_test_end", "on_train_end")


class AutoResume(RunAttributes, keras.callbacks.Callback):
    """Back up and restore training state, crash-safely, to ``directory`` ("drive:runs/x" or a folder).

    Accepts every argument of ``keras.callbacks.BackupAndRestore`` with the same meaning (the first four, in
    the same order), and more.

    Args:
        directory: where checkpoints go (BackupAndRestore's ``backup_dir``, which is accepted as a keyword too).
        save_freq: "epoch", an integer number of batches, or False (no periodic saves: only on SIGTERM, an
            interrupt, a deadline, ``every`` and at the end of training), as in BackupAndRestore.
        double_checkpoint: keep the previous checkpoint too, for when the newest cannot be read. colabkit always
            keeps ``keep`` checkpoints and falls back to the newest valid one; True makes ``keep`` at least 2.
        delete_checkpoint: delete the checkpoints after training completes (BackupAndRestore's default is
            True; here False, so a finished run can still be inspected or continued).
        every: also save on a wall-clock interval, e.g. "15min".
        keep: committed checkpoints to keep (default: the configured ``keep``, 3).
        deadline: "auto" (save and stop before the runtime cap; also save before the idle cutoff when
            %keepalive is on), None, a time budget ("11h30m") counted from the start of training, or a datetime.
        deadline_margin: the least time before a deadline at which the final save starts (default 60s);
            colabkit starts earlier when measured saves take longer (3x the measured save+upload time).
        keep_every: also keep one checkpoint per interval ("6h").
        verbose: 1 prints one line per resume/deadline/interrupt; 0 is silent (logging still records).
        resume_from: a Google Drive share link to someone's checkpoint: when ``directory`` has no checkpoint
            yet, it is downloaded, verified (manifest, sha256, safe formats only) and resumed; new
            checkpoints go to ``directory``.
        monitor: True (or a dict of options, or a ``colabkit.keras.Monitor``) to watch training health in the
            same fit(): step time, input share, GPU throttling, verdicts and the hang watchdog, which knows
            these checkpoint saves (they get a hang budget of their own). ``self.monitor`` is the callback.

    What a resume restores: every variable Keras tracks, matched by where it sits in the model (attribute
    names and, in lists, class names: the same code finds each variable at the same place), including
    optimizers that are attributes of the model or sit in its lists and dicts (built on resume when they were
    built in the saved run), LossScaleOptimizer internals, metrics and seed generators; the state of
    EarlyStopping, ReduceLROnPlateau, ModelCheckpoint and TensorBoard; CSVLogger appends to its file from where
    the checkpoint was taken; any callback with ``get_state()`` / ``set_state(state)``. Checkpoints are
    taken after every other callback's ``on_train_batch_end`` / ``on_epoch_end``, wherever AutoResume is in
    the list. The callback can be reused across fit() calls; when fit() is left by an exception, the last
    save is committed (bounded wait) before the exception goes on.
    """

    def __init__(self, directory=None, save_freq="epoch", double_checkpoint=False, delete_checkpoint=False,
                 every=None, keep=None, deadline="auto", deadline_margin=None, keep_every=None, verbose=1,
                 local_dir=None, resume_from=None, *, backup_dir=None, monitor=False):
        super().__init__()
        # what the status panel shows of this run (colabkit.resume.run)
        self.record = Run(self, "colabkit.keras.AutoResume", deadline=deadline, verbose=verbose)
        if backup_dir is not None:
            if directory is not None:
                raise TypeError(f"AutoResume got directory={directory!r} and backup_dir={backup_dir!r}; pass one "
                                f"of them (backup_dir is BackupAndRestore's name for the same argument).")
            directory = backup_dir
        if _names_no_folder(directory):
            hint = (" (an empty Path is Path('.'), the current folder, not a folder of the run's own)"
                    if isinstance(directory, os.PathLike) else "")
            raise ValueError(f"Empty `backup_dir` argument passed: directory={directory!r}{hint}; pass a folder "
                             f"such as \"drive:runs/mnist\" or \"checkpoints/mnist\".")
        if save_freq is not False and save_freq != "epoch" and (
                isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1):
            raise ValueError(f"Invalid value for argument `save_freq`. Received: save_freq={save_freq!r}. "
                             f"Expected either 'epoch' or an integer value (a number of batches, at least 1), or "
                             f"False (no periodic saves).")
        if every is not None:
            try:
                every = parse_duration(every, name="every")
            except ValueError:
                raise ValueError(f"Invalid value for argument `every`. Received: every={every!r}. "
                                 f"Expected None or {DURATION_FORMS}.") from None
        if double_checkpoint and (keep is None or keep == 1) and not isinstance(keep, bool):
            from ..config import load as load_settings
            keep = max(2, load_settings().keep if keep is None else keep)   # the previous checkpoint stays
        self.double_checkpoint = double_checkpoint
        self.directory, self.save_freq, self.every = directory, save_freq, every
        self.deadline, self.delete_checkpoint, self.verbose = deadline, delete_checkpoint, verbose
        self.margin_floor = schedule.margin_floor(deadline_margin)
        watch_for(deadline, started_at=time.time())  # validate the deadline now, not when fit() starts
        self._checkpoint_args = dict(keep=keep, keep_every=keep_every, local_dir=local_dir, resume_from=resume_from)
        self.checkpoints = Checkpoints(directory, **self._checkpoint_args)
        self._checkpoints_closed = False   # delete_checkpoint closed them: the next fit() opens new ones
        self.monitor = self._make_monitor(monitor)
        self.restored = None          # what on_train_begin restored (colabkit.Restored) or None
        self._buffers = _SnapshotBuffers()
        # kept across runs: a fit() left by an exception leaves its handlers, which find fit() gone (_fit_running)
        self._signals = SignalLatch(self._fit_running, on_step_aside=self._signals_stepped_aside)
        self._callback_list = None    # the CallbackList of the coming fit(), hooked (see _hook_callback_list)
        self._hooked_run = False      # this fit() runs through those hooks
        self._in_hook = False
        self._running = False         # between on_train_begin and on_train_end (or the exception leaving fit)
        self._layout = None
        self._csv_appending = []      # (CSVLogger, its own `append`) while a resumed run appends to its file
        self._reset_run_state()

    def _make_monitor(self, monitor):
        if monitor is False or monitor is None:
            return None
        if isinstance(monitor, Monitor):
            return monitor
        if monitor is True:
            options = {}
        elif isinstance(monitor, dict):
            options = dict(monitor)
        else:
            raise TypeError(f"AutoResume(monitor={monitor!r}): expected True, False, a dict of "
                            f"colabkit.keras.Monitor options or a colabkit.keras.Monitor.")
        if "directory" not in options and not os.environ.get("COLABKIT_RUN_DIR"):
            options["directory"] = self.checkpoints.local.path / "health"   # hang dumps beside the checkpoints
        return Monitor(**options)

    def _monitors(self) -> list:
        """The health monitors in this fit()'s callbacks (ours, added in set_model, and the user's)."""
        callbacks = self._callback_list.callbacks if self._callback_list is not None else []
        return [c for c in callbacks if getattr(c, "_colabkit_health", False)]

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
        self._saved_in_run = False
        self._last_saved_step = None
        self._reapply = None          # the restore plan, applied again after the resumed epoch's on_epoch_begin
        self._checked = None          # the plan of assignments of the checkpoint _check accepted
        self._input = UNTRACKED       # where a tf.data input stands (tfdata.py), attached at train begin
        self._mw = None               # the multi-worker Coordinator (colabkit.keras.multiworker) or None

    # the run record (colabkit.resume.run): events, deadline, verbose, ... come from RunAttributes
    checkpoints = recorded("checkpoints")

    def _variables(self):
        """(model, optimizer, metrics) variables: everything Keras tracks for training (see StateLayout)."""
        layout = self._layout
        if layout is None or layout.model is not self.model or layout.changed():
            layout = self._layout = StateLayout(self.model)
        return layout.groups

    def _paths_of(self, variables) -> list:
        return [self._layout.paths[id(v)] for v in variables]

    def _optimizer_builds(self) -> dict:
        """For each built optimizer, the paths of the variables it was built for, so that a resumed run can
        build one that builds lazily (a GAN's optimizers, in their first apply) before its state is assigned."""
        builds = {}
        for path, optimizer in self._layout.optimizers:
            built_for = getattr(optimizer, "_trainable_variables", None)
            if getattr(optimizer, "built", False) and built_for is not None:
                builds[path] = [self._layout.paths.get(id(v)) for v in built_for]
        return builds

    def _rng_state(self) -> dict:
        state = rng.global_state()
        tf = sys.modules.get("tensorflow")
        if tf is not None:
            state["tf_global_generator"] = tf.random.get_global_generator().state.numpy()
        seed_gen = keras_global_seed_generator()
        if seed_gen is not None:
            state["keras_global_seed"] = keras.ops.convert_to_numpy(seed_gen.state.value)
        return state

    def _set_rng_state(self, state: dict):
        rng.set_global_state(state)
        tf = sys.modules.get("tensorflow")
        if tf is not None and "tf_global_generator" in state:
            tf.random.get_global_generator().state.assign(state["tf_global_generator"])
        seed_gen = keras_global_seed_generator()
        if seed_gen is not None and "keras_global_seed" in state:
            seed_gen.state.assign(state["keras_global_seed"])

    # -- the other callbacks' state ------------------------------------------------------------------------
    def _other_callbacks(self):
        """(key, callback) for this fit()'s other callbacks; the key is the class name, numbered from the
        second of a class on (EarlyStopping, EarlyStopping_1), so the same list finds the same state."""
        callbacks = self._callback_list.callbacks if self._callback_list is not None else []
        counts = {}
        for callback in callbacks:
            if callback is self or isinstance(callback, (keras.callbacks.History, keras.callbacks.ProgbarLogger)):
                continue
            name = type(callback).__name__
            counts[name] = counts.get(name, -1) + 1
            yield (name if not counts[name] else f"{name}_{counts[name]}"), callback

    def _callback_states(self) -> dict:
        states = {}
        for key, callback in self._other_callbacks():
            if has_state_protocol(callback):
                states[key] = detached(callback.get_state())
            elif isinstance(callback, keras.callbacks.CSVLogger):
                states[key] = {"csv_bytes": _local_file_size(callback.filename)}
            else:
                attributes = builtin_state(callback)
                if attributes:
                    # Keras replaces these values (best_weights too), never changes them in place
                    states[key] = {name: weights_stay_arrays(getattr(callback, name, None)) for name in attributes}
        return states

    def _prepare_callbacks(self):
        """Before any callback's on_train_begin, in a resumed run: CSVLogger appends to its file, cut back to
        where it stood when the checkpoint was taken (the epochs after it are trained and logged again)."""
        saved = (self.restored.state.get("callbacks") or {}) if self.restored is not None else None
        if saved is None:
            return
        for key, callback in self._other_callbacks():
            if isinstance(callback, keras.callbacks.CSVLogger) and not has_state_protocol(callback):
                self._csv_appending.append((callback, callback.append))
                callback.append = True
                size = (saved.get(key) or {}).get("csv_bytes")
                if size is not None and (_local_file_size(callback.filename) or 0) > size:
                    os.truncate(callback.filename, size)

    def _restore_callback_states(self):
        """After every callback's on_train_begin (which resets what they keep): set their saved state."""
        saved = (self.restored.state.get("callbacks") or {}) if self.restored is not None else {}
        for key, callback in self._other_callbacks():
            if key not in saved:
                continue
            if has_state_protocol(callback):
                callback.set_state(saved[key])
            elif not isinstance(callback, keras.callbacks.CSVLogger):
                for name in builtin_state(callback) or ():
                    if name in saved[key]:
                        setattr(callback, name, saved[key][name])

    def _drop_restored_arrays(self):
        """Once assigned, the restored arrays are let go: they are views of the checkpoint's whole file."""
        if self.restored is not None:
            for group in ("model", "optimizer", "metrics"):
                self.restored.state.pop(group, None)

    def _restore_callback_settings(self):
        for callback, append in self._csv_appending:
            callback.append = append
        self._csv_appending = []

    # -- the fit() this callback runs in ------------------------------------------------------------------
    def set_model(self, model):
        super().set_model(model)
        frame = sys._getframe(1)
        if self._running:
            if self._fit_frame not in (None, _FIT_FRAME_UNKNOWN) and self._fit_running(frame):
                return   # a CallbackList made inside this fit() (an evaluate() of another callback's)
            self._left_by_exception(None)   # that fit() ended by an exception no hook saw
        caller = frame.f_locals.get("self")
        found = isinstance(caller, keras.callbacks.CallbackList) and any(c is self for c in caller.callbacks)
        if found and self.monitor is not None and not any(c is self.monitor for c in caller.callbacks):
            # CallbackList.set_model is looping over this list: the monitor appended now is set up too, and
            # the list calls its hooks like any other callback's
            caller.callbacks.append(self.monitor)
        self._hook_callback_list(caller if found else None)

    def _hook_callback_list(self, callbacks):
        """Hook the CallbackList that fit() made (it calls set_model on each callback), for that fit() only:
        the restore runs before every callback's on_train_begin and the callbacks' state is set after them
        all; the saves at a batch's or an epoch's end run after every callback's hook, wherever AutoResume is
        in the list (so a learning rate that ReduceLROnPlateau lowers at an epoch's end is in that epoch's
        checkpoint); an exception leaving any hook commits the last save before it goes on. Keras calls no
        callback when fit() is left by an exception: these hooks, and the train function's, are where
        AutoResume sees it."""
        self._unhook_callback_list()
        self._hooked_run = False
        if callbacks is None:
            return
        for name in _LIST_HOOKS:
            inner = callbacks.__dict__.get(name)
            if getattr(inner, "_colabkit_owner", None) is self:   # left by a fit() with this list before
                inner = inner._colabkit_inner
            call = inner if inner is not None else getattr(type(callbacks), name).__get__(callbacks)
            hook = functools.partial(self._around, name, call)
            hook._colabkit_owner, hook._colabkit_inner = self, inner
            setattr(callbacks, name, hook)
        self._callback_list = callbacks

    def _unhook_callback_list(self):
        callbacks, self._callback_list = self._callback_list, None
        if callbacks is None:
            return
        for name in _LIST_HOOKS:
            hook = callbacks.__dict__.get(name)
            if getattr(hook, "_colabkit_owner", None) is self:
                if hook._colabkit_inner is None:
                    delattr(callbacks, name)
                else:
                    setattr(callbacks, name, hook._colabkit_inner)

    def _around(self, name, call, *args, **kwargs):
        """One CallbackList method, with AutoResume's part before or after every callback's."""
        try:
            if name == "on_train_begin":
                self._hooked_run = True
                self._direct(self.on_train_begin, *args, **kwargs)
                call(*args, **kwargs)
                self._restore_callback_states()
                if self._reapply is None:
                    self._drop_restored_arrays()
            elif name == "on_train_end":
                self._direct(self.on_train_end, *args, **kwargs)
                try:
                    call(*args, **kwargs)
                finally:
                    self._hooked_run = False
                    self._unhook_callback_list()
                self._deliver_interrupt()
            elif name == "on_train_batch_begin":
                if self._skip_calls <= 0:
                    call(*args, **kwargs)   # not for a batch skipped to reach the resume position (see below)
            elif name in ("on_train_batch_end", "on_epoch_end"):
                # a batch skipped to reach the resume position was trained, and seen by the other callbacks,
                # before the interruption: their state in the checkpoint counts it already
                if name == "on_epoch_end" or not self._last_call_skipped:
                    call(*args, **kwargs)
                callbacks = self._callback_list
                if callbacks is not None and getattr(callbacks, "_async_train", False):
                    callbacks._flush_futures()   # every callback's hook has run before the save
                self._direct(getattr(self, name), *args, **kwargs)
            elif name == "on_epoch_begin":
                call(*args, **kwargs)
                plan, self._reapply = self._reapply, None
                if plan is not None:
                    self._assign(plan)
                    self._restore_callback_states()
                    self._drop_restored_arrays()
            else:
                call(*args, **kwargs)
        except BaseException as exc:
            self._left_by_exception(exc)
            raise

    def _direct(self, method, *args, **kwargs):
        self._in_hook = True
        try:
            return method(*args, **kwargs)
        finally:
            self._in_hook = False

    def _deferred(self) -> bool:
        """True when the CallbackList calls one of AutoResume's hooks that _around calls at its own time."""
        return self._hooked_run and not self._in_hook

    def _left_by_exception(self, exc):
        """fit() is being left by ``exc`` (from a callback, the train function, or AutoResume itself; None:
        it was, unseen, and the next fit() begins): commit the last save (bounded wait), then undo what this
        fit() set up, as on_train_end would."""
        running, self._running = self._running, False
        self._hooked_run = False
        self._unhook_callback_list()
        if not running:
            return
        try:
            self._skip_calls = 0
            self.model._initial_epoch = None
            if self._original_train_function is not None:
                self.model.train_function = self._original_train_function
                self._original_train_function = None
            self._restore_callback_settings()
            if isinstance(exc, Exception) and self._saved_in_run and self._stopped_for is None:
                committed = self.checkpoints.wait(self._final_wait_s())
                pending = self.checkpoints.status.last_error or "the upload is still running"
                where = (f"is committed to {self.directory}" if committed else
                         f"is not on {self.directory} yet ({pending}); it stays on local disk")
                self._event("error", f"fit() left by {type(exc).__name__}")
                self._say(f"training stopped by {type(exc).__name__}: the last checkpoint (step "
                          f"{self._last_saved_step}) {where}")
            if self.checkpoints.wait(0):
                self.checkpoints.release()
        finally:
            self._restore_signal_handlers()
            self._input.detach()

    def _guard_train_function(self):
        """Wrap this fit()'s train function (around the resume wrapper) so that an exception that ends fit()
        (not the end of an epoch of unknown length, which Keras catches) commits the last save first."""
        inner = self.model.train_function
        tf = sys.modules.get("tensorflow")
        end_of_data = (StopIteration,) + ((tf.errors.OutOfRangeError,) if tf is not None else ())

        def train_function(iterator):
            try:
                return inner(iterator)
            except end_of_data:
                raise
            except Exception as exc:
                if self._running and self._fit_running(sys._getframe(1)):
                    mw = self._mw
                    self._left_by_exception(exc)
                    if mw is not None and mw.is_collective_failure(exc):
                        from .multiworker import WorkerLost
                        raise WorkerLost(mw.explain(exc)) from exc
                raise

        train_function._colabkit_original = getattr(inner, "_colabkit_original", inner)
        self.model.train_function = train_function

    # -- restore -------------------------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        if self._deferred():
            return
        if self._checkpoints_closed:   # delete_checkpoint ended the previous fit(): a new run starts here
            self.checkpoints = Checkpoints(self.directory, **self._checkpoint_args)
            self._checkpoints_closed = False
        self._reset_run_state()
        self._running, self._layout = True, None
        if not self.model.built:
            raise ValueError("To use the AutoResume callback, your model must be built before you call `fit()`. "
                             f"Model {self.model} is unbuilt. You can build it beforehand by calling it on a "
                             "batch of data.")
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        self._watch = watch_for(self.deadline, started_at=time.time(), margin_floor=self.margin_floor)
        self._install_signal_handlers()
        from .multiworker import coordinator_for
        self._mw = coordinator_for(self.model)   # a MultiWorkerMirroredStrategy run: saves are agreed on
        try:
            if self._mw is None or self._mw.is_chief:   # the chief alone writes, and holds the folder's lease
                self.checkpoints.claim()   # another run writing this folder is an error now, not a mix-up later
            for monitor in self._monitors():   # the monitor's train-function wrapper goes innermost
                monitor._install_train_function(self.model)
            self._state_nbytes = self._buffers.prefill([v for group in self._variables() for v in group])
            self._restore_and_position()
            self._guard_train_function()
            self._prepare_callbacks()
        except BaseException:
            self._restore_signal_handlers()   # fit() is left with an exception: on_train_end will not run
            raise

    def _restore_and_position(self):
        restored = self.checkpoints.restore(check=self._check)
        if self._mw is not None:
            restored = self._mw.agree_on_restore(restored, self.directory)
        if restored is not None and restored.state.get("callbacks"):
            # their own arrays: a callback keeping one (EarlyStopping's best_weights) would otherwise keep the
            # whole checkpoint's buffer alive for the run
            restored.state["callbacks"] = own_copy(restored.state["callbacks"])
        self.restored = restored
        self._input = attach_input(sys._getframe(1), self.model)
        if restored is None:
            self._wrap_train_function(0)
            self._event("start", "no checkpoint found; training from scratch")
            return
        plan = self._apply(restored)
        self._step = restored.step
        epoch, batch = untrusted.position(restored)
        self._last_saved_position = (epoch, batch)
        per_call = max(1, int(getattr(self.model, "steps_per_execution", 1) or 1))
        skip, note = self._input.resume(restored.state.get("input"), epoch, batch, per_call)
        if note:
            self._say(note)
        if skip is not None:
            batch = skip
        elif batch and not self._input_positionable():
            self._say(f"the input pipeline cannot be positioned mid-epoch (e.g. a Python generator); "
                      f"epoch {epoch} restarts at batch 0")
            batch = 0
        self.model._initial_epoch = epoch
        self._epoch = epoch
        self._wrap_train_function(batch)
        # a mid-epoch resume: the resumed epoch's on_epoch_begin runs again, after the restore; what other
        # callbacks change there (LearningRateScheduler's relative schedule, a draw from an RNG) was already in
        # the checkpoint, so the checkpoint is applied again after them (see _around)
        self._reapply = plan if batch else None
        where = f"epoch {epoch}" + (f", batch {batch}" if batch else "")
        self._event("restore", f"step {restored.step} ({where}) from {restored.source}")
        origin = (f"shared checkpoint {self.checkpoints.resume_from}" if restored.source == "link"
                  else f"{restored.source} copy of {self.directory}")
        self._say(f"resumed from step {restored.step} ({where}) [{origin}]")

    def _check(self, restored):
        """Everything a candidate checkpoint holds, checked against the live model before anything is assigned
        (the store calls this in restore()): a value that cannot be valid raises InvalidCheckpoint (the store
        warns and tries the previous checkpoint); a valid checkpoint of another model raises CheckpointError.
        Optimizers and compiled metrics that build lazily are built here (as their first step would), so that
        their variables can be matched; the plan of assignments is kept for _apply."""
        untrusted.position(restored)
        state = untrusted.mapping(restored.state, "the state")
        layout = state.get("layout")
        if layout is not None and layout != LAYOUT:
            if isinstance(layout, int) and not isinstance(layout, bool):
                raise CheckpointError(f"The checkpoint at step {restored.step} in {self.directory} has layout "
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
            self._check_rng(state["rng"])
        check_input_position(state.get("input"))
        self._check_callback_states(state.get("callbacks"))
        if layout != LAYOUT:
            plan = self._plan_positional(restored)   # written by an earlier colabkit
        else:
            self._build_compiled_metrics(restored)
            self._build_optimizers(restored, state.get("optimizer_builds") or {})
            plan = self._plan_by_path(restored)
        self._checked = plan

    def _check_rng(self, saved):
        saved = rng.check_global_state(saved)
        live = self._rng_state()   # each saved state has the shape and dtype of this process's
        for name in ("tf_global_generator", "keras_global_seed"):
            if name in saved and name in live:
                value, want = saved[name], np.asarray(live[name])
                if not isinstance(value, np.ndarray) or value.shape != want.shape or value.dtype != want.dtype:
                    raise untrusted.invalid(f"the RNG state {name}", value,
                                            f"an array of shape {want.shape} and dtype {want.dtype}")

    def _check_callback_states(self, saved):
        saved = untrusted.mapping(saved or {}, "the callbacks' states")
        for key, callback in self._other_callbacks():
            if key in saved and not has_state_protocol(callback) and (
                    builtin_state(callback) or isinstance(callback, keras.callbacks.CSVLogger)):
                entry = untrusted.mapping(saved[key], f"the state of callback {key}")
                if entry.get("csv_bytes") is not None:
                    untrusted.whole(entry["csv_bytes"], f"the state of callback {key}'s csv_bytes")

    def _apply(self, restored):
        """Assign what _check planned for ``restored``: every saved array was checked against the live
        variables first, so nothing is overwritten when the checkpoint does not fit."""
        plan, self._checked = self._checked, None   # restore() returns the checkpoint it checked last
        self._assign(plan)
        return plan

    def _assign(self, plan):
        for variable, value in plan:
            variable.assign(value)
        state = self.restored.state
        if state.get("rng"):
            self._set_rng_state(state["rng"])

    def _does_not_fit(self, restored, detail: str) -> CheckpointError:
        return CheckpointError(f"The checkpoint at step {restored.step} in {self.directory} does not fit this model: "
                               f"{detail}. Resume with the same architecture, or use a new directory to start over. "
                               f"Nothing was changed.")

    def _check_shape(self, restored, group, variable, value, saved_name):
        if tuple(variable.shape) != tuple(value.shape):
            raise self._does_not_fit(restored, f"{group} variable '{variable.path}' has shape "
                                               f"{tuple(variable.shape)}, the checkpoint's '{saved_name}' has shape "
                                               f"{tuple(value.shape)}")

    def _plan_by_path(self, restored) -> list:
        """(variable, value) for every saved variable, each matched to the live one at the same path."""
        state, plan = restored.state, []
        self._layout = None
        for group, variables in zip(GROUPS, self._variables()):
            saved, names = state.get(group) or [], state.get(f"{group}_paths") or []
            live = dict(zip(self._paths_of(variables), variables))
            if set(names) != set(live) or len(names) != len(saved):
                if group == "metrics":
                    continue  # metrics differ (e.g. compile() changed); they only affect logs of the resumed epoch
                missing = [n for n in names if n not in live]
                extra = [path for path in live if path not in set(names)]
                where = (f"the checkpoint's '{missing[0]}' is not in this model" if missing else
                         f"this model's '{extra[0]}' ({live[extra[0]].path}) is not in the checkpoint")
                raise self._does_not_fit(restored, f"it holds {len(saved)} {group} variables, the model has "
                                                   f"{len(variables)} ({where})")
            for name, value in zip(names, saved):
                self._check_shape(restored, group, live[name], value, name)
                plan.append((live[name], value))
        return plan

    def _plan_positional(self, restored) -> list:
        """Checkpoints of earlier colabkit versions (no "layout" entry) hold model.variables,
        model.optimizer.variables and metrics_variables, in that order."""
        state, model, plan = restored.state, self.model, []
        groups = (list(model.variables), list(model.optimizer.variables) if model.optimizer is not None else [],
                  list(getattr(model, "metrics_variables", [])))
        for group, variables in zip(GROUPS, groups):
            saved, names = state.get(group) or [], state.get(f"{group}_paths") or []
            if group == "metrics" and len(saved) != len(variables):
                continue
            if len(saved) != len(variables):
                raise self._does_not_fit(restored, f"it holds {len(saved)} {group} variables, the model has "
                                                   f"{len(variables)}")
            for i, (variable, value) in enumerate(zip(variables, saved)):
                self._check_shape(restored, group, variable, value, names[i] if i < len(names) else f"#{i}")
                plan.append((variable, value))
        return plan

    def _build_compiled_metrics(self, restored):
        """Keras on TensorFlow builds compile()'s metrics (and its loss) in the first train step, after the
        restore: build them now, the way Keras does under a distribution strategy (symbolically, from the
        input's element spec), so their state can be assigned. Without it the resumed epoch's metrics would
        count only the batches after the resume."""
        model = self.model
        if all(getattr(getattr(model, name, None), "built", True) for name in ("_compile_metrics", "_compile_loss")):
            return
        saved = set(restored.state.get("metrics_paths") or [])
        if not saved - set(self._paths_of(self._variables()[2])):
            return
        fit_frame = self._fit_frame if self._fit_frame is not _FIT_FRAME_UNKNOWN else None
        iterator = fit_frame.f_locals.get("epoch_iterator") if fit_frame is not None else None
        spec = getattr(getattr(iterator, "_distributed_dataset", None), "element_spec", None)
        if spec is None or not hasattr(model, "_symbolic_build"):
            return
        try:
            model._symbolic_build(data_batch=spec)
        except Exception as exc:  # noqa: BLE001 - the resumed epoch's metrics then start from zero, as before
            log.info("colabkit: cannot build the compiled metrics before the first step (%s); the resumed "
                     "epoch's metrics count from the resume on", exc)
        self._layout = None

    def _build_optimizers(self, restored, builds: dict):
        """Build the optimizers that were built in the saved run but are not yet (they build lazily, in their
        first apply), for the same variables in the same order, so their state can be assigned."""
        self._layout = None
        self._variables()
        layout = self._layout
        for path, optimizer in layout.optimizers:
            if getattr(optimizer, "built", True) or path not in builds:
                continue
            built_for = [layout.by_path.get(p) for p in builds[path]]
            if any(v is None for v in built_for):
                lost = next(p for p, v in zip(builds[path], built_for) if v is None)
                raise self._does_not_fit(restored, f"optimizer '{path}' was built for variable '{lost}', which "
                                                   f"this model does not have")
            optimizer.build(built_for)

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
            iterator = self._input.before_call(iterator, per_call)
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
        if self._deferred():
            return
        steps = (self.params or {}).get("steps")
        # Keras reports an execution's last batch as if it were full (steps_per_execution > 1): an epoch's
        # last execution can hold fewer batches
        end = min(batch + 1, steps) if steps else batch + 1
        new = end if batch <= self._last_batch_seen else end - (self._last_batch_seen + 1)
        self._last_batch_seen = batch
        if self._last_call_skipped:
            return  # a batch skipped to reach the resume position; it was trained before the interruption
        self._step += new
        self._batches_since_save += new
        # after an epoch's last batch the position is the next epoch's start: a resume then has no batch
        # left to skip in an epoch that would otherwise end without a single trained step
        position = (self._epoch + 1, 0) if steps and batch + 1 >= steps else (self._epoch, batch + 1)
        policy = self._save_policy()
        deadline = self._watch.due(self._estimated_save_s())
        every_due = policy.every_due(time.time() - self._last_save_time)
        interrupt = self._interrupt
        if self._mw is not None:   # what one worker saw, all act on, at this same batch
            local = deadline
            interrupt, deadline, every_due = self._mw.agree_on_batch_end(interrupt, deadline, every_due)
            if local is not None:
                self._watch.mark_handled(local)
        decision = policy.should_save(self._step, SaveContext(self._batches_since_save, every_due, interrupt, deadline))
        if decision.reason == "signal":
            self._final_save(position, f"{interrupt} received")
            return
        if decision.reason == "deadline":
            self._watch.mark_handled(deadline)
            if deadline.stop_training:
                self._final_save(position, f"{deadline.reason} is {format_duration(deadline.at - time.time())} away",
                                 timeout=max(1.0, deadline.at - time.time()), event="deadline-save")
            else:
                self._save(position, reason=f"before {deadline.reason}", wait=max(1.0, deadline.at - time.time()),
                           event="deadline-save")
                self._say(f"saved step {self._step} before {deadline.reason}; training continues")
            return
        if decision:
            self._save(position, reason=decision.reason)

    def _save_policy(self) -> SavePolicy:
        """save_freq (a number of batches; "epoch" saves are on_epoch_end's) and every, as they are set now."""
        batches = self.save_freq if isinstance(self.save_freq, int) and not isinstance(self.save_freq, bool) else None
        return SavePolicy(batches, self.every)

    def on_epoch_end(self, epoch, logs=None):
        if self._deferred():
            return
        self._skip_calls = 0   # a shorter resumed epoch than the saved position must not skip the next one
        steps = (self.params or {}).get("steps")
        if steps and self._last_batch_seen + 1 < steps:   # another callback stopped training mid-epoch
            self._end_position = (epoch, self._last_batch_seen + 1)
        else:
            self._epoch, self._end_position = epoch + 1, (epoch + 1, 0)
        if self.save_freq == "epoch" and self._stopped_for is None:
            self._save(self._end_position, reason="epoch")

    def on_train_end(self, logs=None):
        if self._deferred():
            return
        self._running = False
        self.model._initial_epoch = None  # fit() read it already; a later fit() without us starts as asked
        try:
            if self._original_train_function is not None:
                self.model.train_function = self._original_train_function
                self._original_train_function = None
            self._restore_callback_settings()
            end = self._end_position or (self._epoch, 0)
            if self._stopped_for is None:
                if self._last_saved_position != end:
                    self._save(end, reason="end of training")
                if not self.checkpoints.wait(self._final_wait_s()):
                    self._say(f"the final checkpoint (step {self._step}) is not on {self.directory} yet: "
                              f"{self._saved_where(False)}")
            if self._stopped_for is None and self.delete_checkpoint:   # as BackupAndRestore: training finished
                self.checkpoints.close()
                self._checkpoints_closed = True
                if self._mw is None or self._mw.is_chief:   # the chief's folder: the chief removes it
                    self.checkpoints.delete_all()
                else:
                    self.checkpoints.local.remove_all()
            if self.checkpoints.wait(0):   # all on the destination: another run may write here now
                self.checkpoints.release()
        finally:
            self._restore_signal_handlers()
            self._input.detach()
        if not self._hooked_run:
            self._deliver_interrupt()

    def _deliver_interrupt(self):
        """After every callback's on_train_end: pass on the signal that stopped training, now that the
        checkpoint is safe."""
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
        monitors = [m.health for m in self._monitors() if m.health.running]
        for health in monitors:
            health.enter_phase("checkpoint")   # a save has a hang budget of its own
        try:
            return self._save_now(position, reason=reason, wait=wait, event=event)
        finally:
            for health in monitors:
                if health.current_phase == "checkpoint":
                    health._leave_phase("epoch_end" if position[1] == 0 else "step")

    def _save_now(self, position, *, reason: str, wait=False, event: str = "save") -> bool:
        epoch, batch = position
        model_vars, opt_vars, metric_vars = self._variables()
        everything = [*model_vars, *opt_vars, *metric_vars]
        self._state_nbytes = total_nbytes(everything)   # optimizers built in the first step count from then on
        periodic = reason in ("save_freq", "every")
        buffers = self._buffers.take(everything, wait=not periodic or self._buffers.is_small(self._state_nbytes),
                                     reclaim=self.checkpoints._drop_pending)
        if buffers is None:   # the previous snapshot is still being written: the next batch end asks again
            return False
        arrays = iter(buffers)
        copy = lambda variables: [copy_into(next(arrays), v) for v in variables]  # noqa: E731
        try:
            state = {
                "model": copy(model_vars), "model_paths": self._paths_of(model_vars),
                "optimizer": copy(opt_vars), "optimizer_paths": self._paths_of(opt_vars),
                "metrics": copy(metric_vars), "metrics_paths": self._paths_of(metric_vars),
                "rng": self._rng_state(), "layout": LAYOUT, "optimizer_builds": self._optimizer_builds(),
                "callbacks": self._callback_states(),
                "input": self._input.state(position),
            }
        except BaseException:   # a callback's get_state() failing, a second interrupt: the set is free again
            self._buffers.give_back(buffers)
            raise
        if self._mw is not None and not self._mw.is_chief:
            # it took part (read every variable, as the chief did); only the chief's copy is kept
            self._buffers.give_back(buffers)
            self._last_saved_position, self._saved_in_run, self._last_saved_step = position, True, self._step
            self._batches_since_save, self._last_save_time = 0, time.time()
            self._event(event, f"step {self._step} (epoch {epoch}, batch {batch}, {reason}; kept by the chief)")
            return True
        ok = self.checkpoints.save(self._step, state, epoch=epoch, batch=batch, wait=wait, _copy_arrays=False,
                                   info={"reason": reason}, _release=lambda: self._buffers.give_back(buffers))
        self._last_saved_position, self._saved_in_run, self._last_saved_step = position, True, self._step
        self._batches_since_save, self._last_save_time = 0, time.time()
        self._event(event, f"step {self._step} (epoch {epoch}, batch {batch}, {reason})")
        return ok

    def _final_wait_s(self) -> float:
        return self.record.final_wait_s(self._estimated_save_s())

    def _saved_where(self, committed: bool) -> str:
        if self._mw is not None and not self._mw.is_chief:
            return f"the chief, worker 0, writes it to {self.directory}"
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
        here) off the stack at the next signal and step aside (see colabkit.resume.signals)."""
        self._fit_frame = _fit_frame_above(sys._getframe(1)) or _FIT_FRAME_UNKNOWN
        self._signals.install()

    def _restore_signal_handlers(self):
        self._signals.restore()
        self._fit_frame = None

    @property
    def _on_signal(self):
        return self._signals.handle

    def _signals_stepped_aside(self):
        """fit() ended by an exception (no callback ran): act as if AutoResume had never been installed."""
        self._skip_calls = 0
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


def _names_no_folder(directory) -> bool:
    """True for what BackupAndRestore rejects as an empty `backup_dir` (None, ""), and for what only looks like
    a folder: Path("") is Path("."), the current folder, which is no folder of a run's own."""
    if directory is None:
        return True
    if isinstance(directory, (str, os.PathLike)):
        text = os.fspath(directory)
        return not isinstance(text, str) or not text.strip() or os.path.normpath(text.strip()) == "."
    return not directory


def _local_file_size(filename):
    try:
        return os.path.getsize(filename)
    except (OSError, TypeError, ValueError):   # not written yet, or not a local file (gs://...)
        return None
