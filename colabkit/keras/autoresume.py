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

This module holds the callback itself: its arguments, when it saves (save triggers) and what a save holds. Its
parts: hooks.py (how it runs around the other callbacks in fit(), and sees fit() left by an exception),
restore.py (a checkpoint checked against the live model, then assigned), callbacks.py (the other callbacks'
state), state.py (the variables by path, host copies, RNG states), tfdata.py (a tf.data input's position),
frames.py (where fit() is on the call stack), multiworker.py (the workers' agreement).
"""
from __future__ import annotations

import logging
import os
import signal
import time

from ..optional import require

keras = require("keras", "tf", "colabkit.keras.AutoResume")
if int(keras.__version__.split(".")[0]) < 3:
    raise ImportError(f"colabkit.keras.AutoResume needs Keras 3 (TensorFlow 2.16 or newer); this environment has "
                      f"Keras {keras.__version__}. Upgrade with: pip install -U \"colabkit[tf]\"")

from ..checkpoints import untrusted  # noqa: E402
from ..checkpoints.api import Checkpoints  # noqa: E402
from ..checkpoints.buffers import total_nbytes  # noqa: E402
from ..deadline import watch_for  # noqa: E402
from ..health.keras_monitor import Monitor  # noqa: E402 - also colabkit.keras.Monitor
from ..health.recorder import ensure_recording  # noqa: E402
from ..health.progress import start_mark  # noqa: E402
from ..health.thermal import guard_for, pause_must_end  # noqa: E402
from ..resume import schedule  # noqa: E402
from ..resume.run import Run, RunAttributes, recorded  # noqa: E402
from ..resume.schedule import SaveContext, SavePolicy  # noqa: E402
from ..resume.signals import SignalLatch  # noqa: E402
from ..units import DURATION_FORMS, format_duration, parse_duration  # noqa: E402
from . import callbacks as other_callbacks, frames, restore  # noqa: E402
from .hooks import FitHooks  # noqa: E402
from .randomness import FIX, train_function_random_calls  # noqa: E402
from .state import LAYOUT, TrackedVariables, copy_into, own_copy, rng_state  # noqa: E402
from .tfdata import UNTRACKED, attach as attach_input  # noqa: E402

log = logging.getLogger("colabkit")

_ASSUMED_UPLOAD_BYTES_PER_S = 10e6   # first-save estimate before anything was measured (Drive-like)


class AutoResume(RunAttributes, FitHooks, keras.callbacks.Callback):
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
            yet, it is downloaded, verified (manifest, hashes, safe formats only) and resumed; new
            checkpoints go to ``directory``.
        monitor: True (or a dict of options, or a ``colabkit.keras.Monitor``) to watch training health in the
            same fit(): step time, input share, GPU throttling, verdicts and the hang watchdog, which knows
            these checkpoint saves (they get a hang budget of their own). ``self.monitor`` is the callback.
        thermal_guard: None (the thermal_guard setting, on by default), True, False, or a
            ``colabkit.health.ThermalGuard``: training waits between batches while a GPU stays too hot.

    What a resume restores: every variable Keras tracks, matched by where it sits in the model (attribute
    names and, in lists, class names: the same code finds each variable at the same place), including
    optimizers that are attributes of the model or sit in its lists and dicts (built on resume when they were
    built in the saved run), LossScaleOptimizer internals, metrics and seed generators; the state of
    EarlyStopping, ReduceLROnPlateau, ModelCheckpoint (its ``best`` is forgotten when its file is not on this
    machine, so that the file is written again) and TensorBoard; CSVLogger appends to its file from where the
    checkpoint was taken; any callback with ``get_state()`` / ``set_state(state)``. Checkpoints are
    taken after every other callback's ``on_train_batch_end`` / ``on_epoch_end``, wherever AutoResume is in
    the list. The callback can be reused across fit() calls; when fit() is left by an exception, the last
    save is committed (bounded wait) before the exception goes on.
    """

    def __init__(self, directory=None, save_freq="epoch", double_checkpoint=False, delete_checkpoint=False,
                 every=None, keep=None, deadline="auto", deadline_margin=None, keep_every=None, verbose=1,
                 local_dir=None, resume_from=None, *, backup_dir=None, monitor=False, thermal_guard=None):
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
        if not (monitor in (False, None, True) or isinstance(monitor, (Monitor, dict))):
            # refused before the store opens, so a typo leaves nothing open
            raise TypeError(f"AutoResume(monitor={monitor!r}): expected True, False, a dict of "
                            f"colabkit.keras.Monitor options or a colabkit.keras.Monitor.")
        self._thermal = guard_for(thermal_guard, self.record)   # pauses between batches while a GPU is too hot
        self.checkpoints = Checkpoints(directory, **self._checkpoint_args)
        self._checkpoints_closed = False   # delete_checkpoint closed them: the next fit() opens new ones
        self.monitor = self._make_monitor(monitor)
        self.restored = None          # what on_train_begin restored (colabkit.Restored) or None
        # kept across runs: a fit() left by an exception leaves its handlers, which find fit() gone (_fit_running)
        self._signals = SignalLatch(self._fit_running, on_step_aside=self._signals_stepped_aside)
        self._callback_list = None    # the CallbackList of the coming fit(), hooked (see _hook_callback_list)
        self._hooked_run = False      # this fit() runs through those hooks
        self._in_hook = False
        self._running = False         # between on_train_begin and on_train_end (or the exception leaving fit)
        self._vars = TrackedVariables()   # the model's variables, by path (state.py)
        self._fit = frames.FitFrame()     # the running fit()'s frame (see FitHooks._install_signal_handlers)
        self._csv_appending = []      # (CSVLogger, its own `append`) while a resumed run appends to its file
        self._reset_run_state()

    def _make_monitor(self, monitor):
        if monitor is False or monitor is None:
            return None
        if isinstance(monitor, Monitor):
            return monitor
        if monitor is True:
            options = {}
        else:
            options = dict(monitor)
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
        self._fit.forget()
        self._original_train_function = None
        self._saved_in_run = False
        self._last_saved_step = None
        self._reapply = None          # the restore plan, applied again after the resumed epoch's on_epoch_begin
        self._checked = None          # the plan of assignments of the checkpoint _check accepted
        self._input = UNTRACKED       # where a tf.data input stands (tfdata.py), attached at train begin
        self._mw = None               # the multi-worker Coordinator (colabkit.keras.multiworker) or None
        self._random_noted = False    # a resumed run looked for random ops no checkpoint holds
        self._callback_notes = set()  # what restoring the other callbacks said
        self._step_mark = None        # health.progress.StepMark: the last step reached, for the next resume

    # the run record (colabkit.resume.run): events, deadline, verbose, ... come from RunAttributes
    checkpoints = recorded("checkpoints")

    def _variables(self):
        """(model, optimizer, metrics) variables: everything Keras tracks for training (see StateLayout)."""
        return self._vars.groups(self.model)

    # -- the other callbacks' state (callbacks.py) ----------------------------------------------------------
    def _other_callbacks(self):
        return other_callbacks.others(self._callback_list, self)

    def _saved_callback_states(self):
        """What the restored checkpoint holds of the other callbacks (None: nothing was restored)."""
        return (self.restored.state.get("callbacks") or {}) if self.restored is not None else None

    def _restore_callback_states(self):
        """After every callback's on_train_begin (which resets what they keep): set their saved state. A
        mid-epoch resume sets them twice (see FitHooks._around): what that says is said once."""
        for note in other_callbacks.set_states(self._saved_callback_states() or {}, self._other_callbacks()):
            if note not in self._callback_notes:
                self._callback_notes.add(note)
                self._say(note)

    def _restore_callback_settings(self):
        other_callbacks.restore_csv_settings(self._csv_appending)
        self._csv_appending = []

    # -- restore (restore.py) ------------------------------------------------------------------------------
    def on_train_begin(self, logs=None):
        if self._deferred():
            return
        here = frames.caller(0)
        if self._checkpoints_closed:   # delete_checkpoint ended the previous fit(): a new run starts here
            self.checkpoints = Checkpoints(self.directory, **self._checkpoint_args)
            self._checkpoints_closed = False
        self._reset_run_state()
        self._running = True
        ensure_recording()    # the flight recorder (colabkit health --last after a freeze)
        self._vars.forget()
        if not self.model.built and not _parts_hold_everything(self.model):
            raise ValueError("To use the AutoResume callback, your model must be built before you call `fit()`. "
                             f"Model {self.model} is unbuilt. You can build it beforehand by calling it on a "
                             "batch of data (model(x[:1])); a model without call() (a GAN or VAE with its own "
                             "train_step) is ready once each of its parts is built: give each sub-model a "
                             "keras.Input, or call each on a batch.")
        if self.model.optimizer is not None and not self.model.optimizer.built:
            self.model.optimizer.build(self.model.trainable_variables)
        self._watch = watch_for(self.deadline, started_at=time.time(), margin_floor=self.margin_floor)
        self._install_signal_handlers(here)
        if self._thermal is not None:
            self._thermal.start()
        from .multiworker import coordinator_for
        self._mw = coordinator_for(self.model)   # a MultiWorkerMirroredStrategy run: saves are agreed on
        try:
            if self._mw is None or self._mw.is_chief:   # the chief alone writes, and holds the folder's lease
                self.checkpoints.claim()   # another run writing this folder is an error now, not a mix-up later
            for monitor in self._monitors():   # the monitor's train-function wrapper goes innermost
                monitor._install_train_function(self.model)
            self._state_nbytes = self.checkpoints.prepare_snapshot([v for group in self._variables() for v in group])
            self._restore_and_position(here)
            if self._mw is None or self._mw.is_chief:   # books the batches this resume trains again (ledger)
                self._step_mark = start_mark(self.directory, self._step)
            self._guard_train_function()
            saved = self._saved_callback_states()
            if saved is not None:   # a resumed run: CSVLogger appends to its file, cut back to the checkpoint's
                self._csv_appending += other_callbacks.append_csv_logs(saved, self._other_callbacks())
        except BaseException:
            self._restore_signal_handlers()   # fit() is left with an exception: on_train_end will not run
            raise

    def _restore_and_position(self, frame):
        """Restore the newest valid checkpoint and put fit() at its position (``frame``: on_train_begin's)."""
        restored = self.checkpoints.restore(check=self._check)
        if self._mw is not None:
            restored = self._mw.agree_on_restore(restored, self.directory)
        if restored is not None and restored.state.get("callbacks"):
            # their own arrays: a callback keeping one (EarlyStopping's best_weights) would otherwise keep the
            # whole checkpoint's buffer alive for the run
            restored.state["callbacks"] = own_copy(restored.state["callbacks"])
        self.restored = restored
        self._input = attach_input(frame, self.model)
        if restored is None:
            self._wrap_train_function(0)
            self._event("start", "no checkpoint found; training from scratch")
            return
        plan, self._checked = self._checked, None   # restore() returns the checkpoint it checked last
        self._assign(plan)
        self._step = restored.step
        epoch, batch = untrusted.position(restored)
        self._last_saved_position = (epoch, batch)
        per_call = max(1, int(getattr(self.model, "steps_per_execution", 1) or 1))
        skip, note = self._input.resume(restored.state.get("input"), epoch, batch, per_call)
        for line in [note, *self._input.notes()]:
            if line:
                self._say(line)
        if skip is not None:
            batch = skip
        elif batch and not restore.input_positionable(frames.fit_locals_above(frame)):
            self._say(f"the input pipeline cannot be positioned mid-epoch (e.g. a Python generator); "
                      f"epoch {epoch} restarts at batch 0")
            batch = 0
        self.model._initial_epoch = epoch
        self._epoch = epoch
        self._wrap_train_function(batch)
        # a mid-epoch resume: the resumed epoch's on_epoch_begin runs again, after the restore; what other
        # callbacks change there (LearningRateScheduler's relative schedule, a draw from an RNG) was already in
        # the checkpoint, so the checkpoint is applied again after them (see FitHooks._around)
        self._reapply = plan if batch else None
        where = f"epoch {epoch}" + (f", batch {batch}" if batch else "")
        self._event("restore", f"step {restored.step} ({where}) from {restored.source}")
        origin = (f"shared checkpoint {self.checkpoints.resume_from}" if restored.source == "link"
                  else f"{restored.source} copy of {self.directory}")
        self._say(f"resumed from step {restored.step} ({where}) [{origin}]")

    def _note_stateful_random(self):
        """After a resumed run's first trained batch: name the train step's random ops that start over in a new
        process (randomness.py)."""
        self._random_noted = True
        calls = train_function_random_calls(self._original_train_function)
        if calls:
            self._say(f"the train step draws random numbers with {' and '.join(calls)}, whose state lives inside "
                      f"the process and starts over in a new one: this resumed run draws other numbers than an "
                      f"uninterrupted run would have; to resume them exactly, {FIX}")

    def _check(self, restored):
        """The store's check of a candidate checkpoint in restore() (see restore.check): the plan of
        assignments of the checkpoint it accepts is kept for _restore_and_position."""
        self._checked = restore.check(restored, model=self.model, variables=self._vars, directory=self.directory,
                                      callbacks=self._other_callbacks(), fit_frame=self._fit.known)

    def _assign(self, plan):
        restore.assign(plan, self.restored.state)

    def _drop_restored_arrays(self):
        restore.drop_arrays(self.restored)

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
        if self.restored is not None and not self._random_noted:   # the train function is traced now
            self._note_stateful_random()
        self._step += new
        self._batches_since_save += new
        if self._step_mark is not None:
            self._step_mark.reached(self._step)
        # after an epoch's last batch the position is the next epoch's start: a resume then has no batch
        # left to skip in an epoch that would otherwise end without a single trained step
        position = (self._epoch + 1, 0) if steps and batch + 1 >= steps else (self._epoch, batch + 1)
        if self._thermal is not None:   # a hot GPU: wait here, between two batches (a signal or deadline ends it)
            self._thermal.wait_if_hot(self._pause_must_end)
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

    def _pause_must_end(self):
        """Why a thermal pause must end early (a signal, a deadline's save due), or None."""
        return pause_must_end(self._interrupt, self._watch, self._estimated_save_s)

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
            self._unwrap_train_function()
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
            self._let_go_of_fit()
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
        paths_of = self._vars.paths_of

        def fill(buffers):   # the store has copied each variable into its buffer (copy= below)
            arrays = iter(buffers)
            placed = lambda variables: [next(arrays) for _ in variables]  # noqa: E731
            return {
                "model": placed(model_vars), "model_paths": paths_of(model_vars),
                "optimizer": placed(opt_vars), "optimizer_paths": paths_of(opt_vars),
                "metrics": placed(metric_vars), "metrics_paths": paths_of(metric_vars),
                "rng": rng_state(), "layout": LAYOUT, "optimizer_builds": self._vars.optimizer_builds(),
                "callbacks": other_callbacks.states(self._other_callbacks()),
                "input": self._input.state(position),
            }

        # a worker other than the chief takes part (reads every variable, as the chief does); the chief writes
        writes = self._mw is None or self._mw.is_chief
        ok = self.checkpoints.save_snapshot(self._step, everything, fill, periodic=reason in ("save_freq", "every"),
                                            epoch=epoch, batch=batch, info={"reason": reason}, wait=wait,
                                            write=writes,
                                            copy=lambda index, buffer: copy_into(buffer, everything[index]))
        if ok is None:   # the previous snapshot is still being written: the next batch end asks again
            return False
        self._last_saved_position, self._saved_in_run, self._last_saved_step = position, True, self._step
        self._batches_since_save, self._last_save_time = 0, time.time()
        kept = "" if writes else "; kept by the chief"
        self._event(event, f"step {self._step} (epoch {epoch}, batch {batch}, {reason}{kept})")
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


def _parts_hold_everything(model) -> bool:
    """An unbuilt model with no build() of its own whose layers are all built (a GAN or VAE made of built
    sub-models, with no call()): it has every variable it will ever have, and fit() trains it unbuilt."""
    return type(model).build is keras.Model.build and all(layer.built for layer in model.layers)


def _names_no_folder(directory) -> bool:
    """True for what BackupAndRestore rejects as an empty `backup_dir` (None, ""), and for what only looks like
    a folder: Path("") is Path("."), the current folder, which is no folder of a run's own."""
    if directory is None:
        return True
    if isinstance(directory, (str, os.PathLike)):
        text = os.fspath(directory)
        return not isinstance(text, str) or not text.strip() or os.path.normpath(text.strip()) == "."
    return not directory
