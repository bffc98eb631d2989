"""Fit interception, for AutoResume: how it places its part around every other callback's, and how it sees a
fit() that ends by an exception, which Keras reports to no callback.

fit() makes a CallbackList and calls ``set_model`` on each callback; AutoResume hooks that list's methods for
that fit() only (``hook_list``): the restore runs before every callback's on_train_begin and the callbacks'
state is set after them all; the saves at a batch's or an epoch's end run after every callback's hook, wherever
AutoResume is in the list (so a learning rate that ReduceLROnPlateau lowers at an epoch's end is in that epoch's
checkpoint). fit()'s train function is wrapped twice: to skip, without training, the batches before a resume
position, and to commit the last save when an exception leaves fit(). The SIGINT/SIGTERM handlers step aside
once that fit() is off the stack (frames.py says where it is).
"""
from __future__ import annotations

import functools
import sys

from ..optional import require
from . import frames
from .tfdata import UNTRACKED

keras = require("keras", "tf", "colabkit.keras.AutoResume")

# CallbackList methods AutoResume hooks for the duration of a fit() (see hook_list)
LIST_HOOKS = ("on_train_begin", "on_epoch_begin", "on_train_batch_begin", "on_train_batch_end", "on_epoch_end",
              "on_test_begin", "on_test_batch_begin", "on_test_batch_end", "on_test_end", "on_train_end")


def hook_list(callbacks, owner, around) -> None:
    """Replace each of ``callbacks``' LIST_HOOKS methods with ``around(name, call, *args, **kwargs)``, where
    ``call`` is what the list would have called. A hook of ``owner``'s own left by an earlier fit() with this
    list is replaced, not wrapped."""
    for name in LIST_HOOKS:
        inner = callbacks.__dict__.get(name)
        if getattr(inner, "_colabkit_owner", None) is owner:   # left by a fit() with this list before
            inner = inner._colabkit_inner
        call = inner if inner is not None else getattr(type(callbacks), name).__get__(callbacks)
        hook = functools.partial(around, name, call)
        hook._colabkit_owner, hook._colabkit_inner = owner, inner
        setattr(callbacks, name, hook)


def unhook_list(callbacks, owner) -> None:
    """Undo ``hook_list`` for ``owner``: the list calls what it called before."""
    for name in LIST_HOOKS:
        hook = callbacks.__dict__.get(name)
        if getattr(hook, "_colabkit_owner", None) is owner:
            if hook._colabkit_inner is None:
                delattr(callbacks, name)
            else:
                setattr(callbacks, name, hook._colabkit_inner)


class FitHooks:
    """AutoResume's side of fit(): ``set_model`` hooks the fit()'s CallbackList, ``_around`` runs AutoResume's
    part of each hook at its own time, the train-function wrappers skip to the resume position and see an
    exception leave fit(), and ``_left_by_exception`` commits the last save and undoes what the fit() set up.

    A mixin of AutoResume (autoresume.py), which holds the run state it reads: ``_running`` (between
    on_train_begin and the end of fit()), ``_hooked_run``, ``_in_hook``, ``_callback_list``, ``_fit`` (a
    frames.FitFrame), ``_skip_calls``, ``_last_call_skipped``, ``_original_train_function``, ``_reapply``,
    ``_input``, ``_mw``, and calls its on_* hooks and its ``_restore_callback_states``, ``_drop_restored_arrays``,
    ``_assign``, ``_restore_callback_settings``, ``_deliver_interrupt``, ``_final_wait_s``."""

    # -- the CallbackList -----------------------------------------------------------------------------------
    def set_model(self, model):
        super().set_model(model)
        frame = frames.caller()
        if self._running:
            if self._fit.known is not None and self._fit.running(frame):
                return   # a CallbackList made inside this fit() (an evaluate() of another callback's)
            self._left_by_exception(None)   # that fit() ended by an exception no hook saw
        caller = frames.calling_object(frame)
        found = isinstance(caller, keras.callbacks.CallbackList) and any(c is self for c in caller.callbacks)
        if found and self.monitor is not None and not any(c is self.monitor for c in caller.callbacks):
            # CallbackList.set_model is looping over this list: the monitor appended now is set up too, and
            # the list calls its hooks like any other callback's
            caller.callbacks.append(self.monitor)
        self._hook_callback_list(caller if found else None)

    def _hook_callback_list(self, callbacks):
        """Hook the CallbackList that fit() made, for that fit() only (see hook_list). An exception leaving any
        hook commits the last save before it goes on: Keras calls no callback when fit() is left by an
        exception, so these hooks, and the train function's, are where AutoResume sees it."""
        self._unhook_callback_list()
        self._hooked_run = False
        if callbacks is None:
            return
        hook_list(callbacks, self, self._around)
        self._callback_list = callbacks

    def _unhook_callback_list(self):
        callbacks, self._callback_list = self._callback_list, None
        if callbacks is not None:
            unhook_list(callbacks, self)

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

    # -- leaving fit() ----------------------------------------------------------------------------------------
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
            self._unwrap_train_function()
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
            self._let_go_of_fit()

    def _let_go_of_fit(self):
        """At the end of a fit() (returned or raised): the signal handlers back, and the input released (it holds
        fit()'s iterator: nothing of a finished fit() stays alive)."""
        self._restore_signal_handlers()
        self._input.detach()
        self._input = UNTRACKED
        if self._thermal is not None:
            self._thermal.stop()

    # -- the train function -----------------------------------------------------------------------------------
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
            self._last_call_skipped = self._skip_calls > 0 and self._fit_running(frames.caller())
            if self._last_call_skipped:
                self._skip_calls -= 1
                for _ in range(per_call):
                    next(iterator)
                return {}
            return original(iterator)

        train_function._colabkit_original = original
        model.train_function = train_function

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
                if self._running and self._fit_running(frames.caller()):
                    mw = self._mw
                    self._left_by_exception(exc)
                    if mw is not None and mw.is_collective_failure(exc):
                        from .multiworker import WorkerLost
                        raise WorkerLost(mw.explain(exc)) from exc
                raise

        train_function._colabkit_original = getattr(inner, "_colabkit_original", inner)
        self.model.train_function = train_function

    def _unwrap_train_function(self):
        """Put back the train function fit() had before this run wrapped it."""
        if self._original_train_function is not None:
            self.model.train_function = self._original_train_function
            self._original_train_function = None

    # -- signals ------------------------------------------------------------------------------------------------
    def _install_signal_handlers(self, frame):
        """Install the handlers for this fit(), from on_train_begin (``frame``: its own). When fit() ends by an
        exception Keras calls no callback, so the handlers stay installed; they then find fit()'s frame
        (recorded here) off the stack at the next signal and step aside (see colabkit.resume.signals)."""
        self._fit.record(frame)
        self._signals.install()

    def _restore_signal_handlers(self):
        self._signals.restore()
        self._fit.forget()

    @property
    def _on_signal(self):
        return self._signals.handle

    def _signals_stepped_aside(self):
        """fit() ended by an exception (no callback ran): act as if AutoResume had never been installed."""
        self._skip_calls = 0
        self._fit.forget()

    def _fit_running(self, frame) -> bool:
        """Whether this callback's fit() is on the stack at ``frame`` (a frame of the calling thread)."""
        return self._fit.running(frame)
