"""`colabkit.torch.AutoResume`: one-line exact resume for plain PyTorch training loops.

    ar = colabkit.torch.AutoResume("drive:runs/gan", model=G, disc=D, opt_g=opt_g, opt_d=opt_d,
                                   sched=sched, scaler=scaler, save_freq=500, every="15min")
    for epoch in ar.epochs(100):          # starts at the saved epoch
        for batch in ar.batches(loader):  # skips to the saved position; saves on save_freq / every / deadlines
            ...
        sched.step()                      # per-epoch code runs before the epoch-end save

``for i, batch in ar.enumerate(loader)`` gives each batch's index in the epoch, from the resumed batch on (the
builtin ``enumerate(ar.batches(loader))`` counts from 0 again after a resume).

Everything passed by name with ``state_dict()`` / ``load_state_dict()`` (modules, optimizers, LR schedulers,
``torch.amp.GradScaler``, your own objects) is saved and restored, with ``ar.state`` (values of your own:
JSON-able, tensors, NumPy arrays), the step and epoch counters, the RNG states (torch CPU and CUDA, NumPy,
Python) and the DataLoader's position and shuffle order. In a distributed run (torchrun) rank 0 writes and
every rank restores its own RNG states from the same checkpoint. Checkpoints go through `colabkit.Checkpoints`:
tensors are stored as NumPy arrays in ``.npz`` with a JSON tree; nothing is unpickled on restore.

This module holds AutoResume itself: its loops, when it saves and what, and the restore. The DataLoader's place
is loader.py's, the checks of arguments and checkpoints checks.py's, the ranks' agreement distributed.py's.
"""
from __future__ import annotations

import copy
import gc
import inspect
import logging
import signal
import sys
import time

import numpy as np

from ..optional import require

torch = require("torch", "torch", "colabkit.torch.AutoResume")

from ..checkpoints import untrusted  # noqa: E402
from ..checkpoints.api import CheckpointError, Checkpoints  # noqa: E402
from ..deadline import watch_for  # noqa: E402
from ..health.recorder import ensure_recording  # noqa: E402
from ..health.progress import start_mark  # noqa: E402
from ..health.thermal import guard_for, pause_must_end  # noqa: E402
from ..resume import schedule  # noqa: E402
from ..resume.run import Run, RunAttributes, recorded  # noqa: E402
from ..resume.schedule import SaveContext, SavePolicy  # noqa: E402
from ..resume.signals import SignalLatch  # noqa: E402
from ..units import format_duration  # noqa: E402
from .checks import check_checkpoint, check_objects, check_schedule  # noqa: E402
from .distributed import process_group  # noqa: E402
from .loader import LoaderPlace  # noqa: E402
from .state import (  # noqa: E402
    FORMAT,
    Stopped,
    _copy_into,
    _decode,
    _encode,
    _encode_small,
    _fill,
    _host_dtype,
    _rng_state,
    _set_rng,
    _Spec,
    target,
)

log = logging.getLogger("colabkit")

_ASSUMED_UPLOAD_BYTES_PER_S = 10e6   # first-save estimate before anything was measured (Drive-like)


def _state_before(obj) -> dict:
    """``obj``'s state, kept to load back if a restore fails. A torch.optim optimizer's own load_state_dict
    replaces its state tensors and never writes into them, so its tensors are kept as they are (for Adam, two
    thirds of the state not copied); anything else may copy into its tensors in place (a module does), so it
    is deep-copied."""
    state = obj.state_dict()
    if type(obj).load_state_dict is torch.optim.Optimizer.load_state_dict:
        shared = {}
        for value in state["state"].values():
            shared.update({id(t): t for t in value.values() if isinstance(t, torch.Tensor)})
        return copy.deepcopy(state, memo=shared)
    return copy.deepcopy(state)


def _load_only_copies(obj) -> bool:
    """True for a module whose load_state_dict, once check_checkpoint passed (the same keys, the same shapes),
    does nothing but copy each tensor into place, so it cannot fail halfway: torch's own load_state_dict and
    _load_from_state_dict in every submodule (torch's own overrides included), no load hooks, no extra state."""
    module = torch.nn.Module
    if not isinstance(obj, module) or type(obj).load_state_dict is not module.load_state_dict:
        return False
    for sub in obj.modules():
        kind = type(sub)
        if (not kind._load_from_state_dict.__module__.startswith("torch.")
                or kind.get_extra_state is not module.get_extra_state
                or kind.set_extra_state is not module.set_extra_state
                or sub._load_state_dict_pre_hooks or sub._load_state_dict_post_hooks):
            return False
    return True


class AutoResume(RunAttributes):
    """Save and restore a plain PyTorch training loop, crash-safely, in ``directory`` ("drive:runs/x" or a folder).

    Args:
        directory: where checkpoints go.
        save_freq: also save every this many batches (None: no batch-count saves).
        every: also save on a wall-clock interval, e.g. "15min".
        deadline: "auto" (save and stop before the runtime cap; also save before the idle cutoff when
            %keepalive is on), None, a time budget ("11h30m") counted from the first epoch, or a datetime.
        deadline_margin: the least time before a deadline at which the final save starts (default 60s).
        keep: committed checkpoints to keep (default: the configured ``keep``, 3).
        verbose: 1 prints one line per resume/deadline/interrupt; 0 is silent (logging still records).
        local_dir, keep_every, resume_from: as for `colabkit.Checkpoints`.
        thermal_guard: None (the thermal_guard setting, on by default), True, False, or a
            ``colabkit.health.ThermalGuard``: training waits between batches while a GPU stays too hot.
        **objects: the training state, by name: anything with ``state_dict()`` and ``load_state_dict()``.
            ``DataParallel`` / ``DistributedDataParallel`` (and ``torch.compile``) wrappers are unwrapped, so a
            checkpoint's keys are the model's own.

    A checkpoint is taken after each epoch (once the body of ``for epoch in ar.epochs(n)`` has run), every
    ``save_freq`` batches and ``every`` interval, before a deadline, and on SIGTERM or an interrupt (the
    notebook's stop button): then the checkpoint is committed, and the signal is passed on (SIGTERM ends the
    process as it would have; SIGINT raises KeyboardInterrupt). A deadline that ends training raises `Stopped`
    from ``ar.batches()`` after its save is committed: the code after the inner loop (per-epoch validation,
    logging, ``sched.step()``) never runs on a partial epoch, and neither do the notebook's later cells (in
    IPython it shows as one line). Under DDP, a save that fails on rank 0 raises on every rank.

    The objects are restored when AutoResume is created (before that, every saved value is checked against the
    objects: a checkpoint from another model raises CheckpointError and changes nothing; a load_state_dict that
    fails still puts every object back as it was, then raises CheckpointError); the RNG states when the loops
    reach the saved position.
    """

    def __init__(self, directory, *, save_freq=None, every=None, deadline="auto", deadline_margin=None, keep=None,
                 keep_every=None, verbose=1, local_dir=None, resume_from=None, thermal_guard=None, **objects):
        every = check_schedule(save_freq, every)
        check_objects(objects)
        self._dist = process_group()        # torch.distributed with more than one process: rank 0 writes
        self._rank = self._dist.rank if self._dist is not None else 0
        # what the status panel shows of this run (colabkit.resume.run); rank 0 alone prints
        self.record = Run(self, "colabkit.torch.AutoResume", deadline=deadline, verbose=verbose, quiet=self._rank != 0)
        self.directory, self.save_freq, self.every, self.verbose = directory, save_freq, every, verbose
        self.deadline = deadline
        self.margin_floor = schedule.margin_floor(deadline_margin)
        watch_for(deadline, started_at=time.time())   # validate it now, not at the first epoch
        self._thermal = guard_for(thermal_guard, self.record)   # pauses between batches while a GPU is too hot
        self.objects = dict(objects)
        self.checkpoints = Checkpoints(directory, keep=keep, keep_every=keep_every, local_dir=local_dir,
                                       resume_from=resume_from)
        self.state: dict = {}          # values of your own (JSON-able, tensors, arrays), saved with every checkpoint
        self.step = 0                  # batches trained in total
        self.epoch = 0                 # the current epoch
        self.batch = 0                 # batches trained in the current epoch
        # what was restored (colabkit.Restored), or None. Its state's tensors are not a copy: the objects restored
        # from it hold them (an optimizer's moments are views of the read buffer and change as it trains)
        self.restored = None
        self.stopped_for = None        # why training was stopped (a deadline, a signal), or None
        self._pending = None           # the restored checkpoint's RNG and loader states, applied at its position
        self._checked = None           # what _check decoded from the checkpoint restore() is about to return
        self._place = LoaderPlace()    # the loader batches() iterated last: its generators, its epoch's start
        self._resumed_generators = None   # their saved states, for the first loader after an epoch-start resume
        self._since_save, self._last_save_time = 0, time.time()
        self._last_saved = None        # (step, epoch, batch) of the last save
        self._loop_frame = None        # the frame running ``for epoch in ar.epochs(n)``
        self._signals = SignalLatch(self._loop_running)
        self._watch = None
        self._state_nbytes = 0
        self._restore()
        # books the batches this resume trains again in the cost ledger (rank 0 speaks for the run)
        self._step_mark = start_mark(directory, self.step) if self._rank == 0 else None

    # the run record (colabkit.resume.run): events, deadline, verbose, ... come from RunAttributes
    checkpoints = recorded("checkpoints")

    # -- restore ---------------------------------------------------------------------------------------------
    def _restore(self):
        restored = self.checkpoints.restore(check=self._check)
        if self._dist is not None:   # every rank restores the same checkpoint before any rank saves again
            self._dist.same_checkpoint(restored, self.directory)
        if restored is None:
            return
        decoded, user, ranks = self._checked
        self._checked = None
        self._load_all(decoded, restored.step)
        state = restored.state
        self.state = dict(user)
        self.step = restored.step
        self.epoch, self.batch = untrusted.position(restored)
        own = {"rng": state["rng"], "epoch_start": state.get("epoch_start"), "loader": state.get("loader")}
        if self._dist is not None:
            own = self._dist.own(ranks, own)
        self._pending = {"rng": own["rng"], "epoch_start": own.get("epoch_start"), "batch": self.batch,
                         "loader": _decode(own["loader"]) if own.get("loader") is not None else None}
        self._last_saved = (self.step, self.epoch, self.batch)
        self.restored = restored
        self._event("restore", f"step {self.step} (epoch {self.epoch}, batch {self.batch})")
        self._say(f"resumed from step {self.step} (epoch {self.epoch}, batch {self.batch}) in {self.directory}")

    def _load_all(self, decoded: dict, step: int) -> None:
        """Load each object's state. A load_state_dict that fails after others have loaded puts those back as
        they were; so the objects whose load can fail go first, each with its state kept before (see
        _state_before), and the modules whose load only copies tensors into place go last, with none kept
        (a copy of the weights, a third of a 2 GB resume's time)."""
        targets = {name: target(obj) for name, obj in self.objects.items()}
        only_copies = {name: _load_only_copies(obj) for name, obj in targets.items()}
        names = sorted(targets, key=only_copies.get)
        before = {name: _state_before(targets[name]) for name in names if not only_copies[name]}
        for done, name in enumerate(names):
            try:
                targets[name].load_state_dict(decoded[name])
            except Exception as exc:
                for earlier in names[:done + 1]:
                    if earlier in before:
                        try:
                            targets[earlier].load_state_dict(before[earlier])
                        except Exception:   # the original error is the one to report
                            log.exception("colabkit: %s: putting its state back after a failed restore failed",
                                          earlier)
                partly = [n for n in names[:done + 1] if n not in before]
                one = len(partly) == 1
                outcome = ("Every object was put back as it was; nothing was restored." if not partly else
                           f"{', '.join(partly)} may hold part of the checkpoint: {'its' if one else 'their'} "
                           f"load only copies tensors, was not expected to fail, and keeps no copy to put back. "
                           f"Create {'it' if one else 'them'} anew before training (or restart the runtime); "
                           f"every other object is as it was.")
                raise CheckpointError(f"{name}: loading its state from {self.directory} (step {step}) failed: "
                                      f"{exc}. {outcome}") from exc

    def _check(self, restored):
        """The store's check of a candidate checkpoint in restore() (see checks.check_checkpoint): what it
        decoded from the checkpoint restore() accepts is kept for _restore."""
        self._checked = check_checkpoint(restored, self.objects, self.directory)

    # -- the loops -------------------------------------------------------------------------------------------
    def epochs(self, n: int):
        """Yield the epochs from the saved one up to ``n`` (exclusive). After each epoch's body: a checkpoint."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"epochs(n={n!r}) is invalid: pass the total number of epochs, a whole number.")
        if self.epoch >= n:
            if self._pending is not None:   # as the run that finished left them
                _set_rng(self._pending["rng"])
                self._pending = None
            self._say(f"training already finished: the checkpoint is at epoch {self.epoch} of {n}")
            return
        self.stopped_for, self._interrupt = None, None
        self._watch = watch_for(self.deadline, started_at=time.time(), margin_floor=self.margin_floor)
        self._loop_frame = sys._getframe(1)   # the frame running ``for epoch in ar.epochs(n)``
        self._install_signal_handlers()
        ensure_recording()    # the flight recorder (colabkit health --last after a freeze)
        if self._thermal is not None:
            self._thermal.start()
        try:
            if self._rank == 0:
                self.checkpoints.claim()
            while self.epoch < n:
                pending = self._pending
                if pending is not None and pending["batch"] == 0:   # resumed at an epoch's start
                    _set_rng(pending["rng"])
                    self._resumed_generators = pending["rng"].get("generators")   # set by batches()
                    self._pending = None
                yield self.epoch
                if self.stopped_for is not None:
                    return
                self.epoch, self.batch = self.epoch + 1, 0
                self._place.epoch_start = None
                self._save(reason="epoch")
                self._agree(False)
                if self._check_interrupt():
                    return
            if not self.checkpoints.wait(self._final_wait_s()):
                self._say(f"the final checkpoint (step {self.step}) is not on {self.directory} yet: "
                          f"{self._saved_where(False)}")
        finally:
            if self._thermal is not None:
                self._thermal.stop()
            self._restore_signal_handlers()
            self._release_if_committed()

    def _release_if_committed(self):
        """Everything is on the destination: another AutoResume (a re-run of the cell) may write there now."""
        if self.checkpoints.wait(0):
            self.checkpoints.release()

    def batches(self, loader):
        """Yield ``loader``'s batches for the current epoch, from the saved position on a resume; saves on
        ``save_freq``, ``every``, deadlines and signals after each batch's step."""
        pending = self._pending
        resumed_generators, self._resumed_generators = self._resumed_generators, None
        skip = self._place.start(loader, pending, resumed_generators)
        if skip and not self._place.positionable:
            self._say(f"{type(loader).__name__} cannot be positioned mid-epoch (an IterableDataset or iterator "
                      f"without state): epoch {self.epoch} restarts from its first batch")
            self.batch, skip = 0, 0
        iterator = self._place.iterate(loader, skip, pending)
        if pending is not None:
            self._pending = None
        if self.batch and _counted_by_enumerate(sys._getframe()):
            self._say(f"enumerate(ar.batches(loader)) counts from 0, but epoch {self.epoch} resumes at batch "
                      f"{self.batch}: code that tests the index (if i % 100 == 0) runs at other batches than in an "
                      f"uninterrupted run; `for i, batch in ar.enumerate(loader):` counts from the resumed batch")
        for batch in iterator:
            yield batch
            self.step += 1
            if self._step_mark is not None:
                self._step_mark.reached(self.step)
            self.batch += 1
            self._since_save += 1
            if self._thermal is not None:   # a hot GPU: wait here, between two batches (a signal or deadline ends it)
                self._thermal.wait_if_hot(self._pause_must_end)
            if self._after_batch():
                # a deadline stop: raised here, inside the epoch's body, so that the code after this loop
                # (validation, logging, a scheduler step) does not run on the partial epoch, nor do later cells
                self._restore_signal_handlers()
                raise Stopped(f"{self.stopped_for}: saved step {self.step} (epoch {self.epoch}, batch {self.batch}) "
                              f"and stopped training. Re-run this cell to resume.")

    def enumerate(self, loader):
        """``enumerate(ar.batches(loader))`` that counts from the batch the epoch resumes at: yields (the batch's
        index in the epoch, the batch)."""
        for batch in self.batches(loader):
            yield self.batch, batch

    def _after_batch(self) -> bool:
        """Save when due. True when training stops (a deadline or a signal). In a distributed run rank 0
        decides when (it keeps the clock) and every rank takes part in the save and the stop."""
        deadline = save = None
        if self._rank == 0:   # a signal is acted on below, once every rank knows of it
            deadline = self._watch.due(self._estimated_save_s()) if self._watch is not None else None
            policy = SavePolicy(self.save_freq, self.every)
            decision = policy.should_save(self.step, SaveContext(
                self._since_save, policy.every_due(time.time() - self._last_save_time), deadline=deadline))
            if deadline is not None:
                self._watch.mark_handled(deadline)
            save = None if decision.stop else decision.reason
        stopping, save = self._agree(deadline is not None and deadline.stop_training, save)
        if self._check_interrupt():
            return True
        if stopping:
            if deadline is None:   # rank 0 stops for a deadline: so does this rank, once rank 0 has saved
                self._final_save("rank 0 reached a deadline")
            else:
                self._final_save(f"{deadline.reason} is {format_duration(deadline.at - time.time())} away",
                                 timeout=max(1.0, deadline.at - time.time()), event="deadline-save")
            return True
        if save == "deadline":
            if deadline is None:
                self._save(reason="deadline")
            else:
                self._save(reason=f"before {deadline.reason}", wait=max(1.0, deadline.at - time.time()),
                           event="deadline-save")
                self._say(f"saved step {self.step} before {deadline.reason}; training continues")
        elif save is not None:
            self._save(reason=save)
        return False

    def _pause_must_end(self):
        """Why a thermal pause must end early (a signal, a deadline's save due), or None."""
        return pause_must_end(self._interrupt, self._watch, self._estimated_save_s)

    def _check_interrupt(self) -> bool:
        """A signal arrived: save, commit, then pass it on. True when training stops."""
        if not self._interrupt:
            return False
        name = self._interrupt
        self._final_save(f"{name} received")
        self._restore_signal_handlers()
        if name == "SIGTERM":
            signal.raise_signal(signal.SIGTERM)   # the checkpoint is safe: let it end the process as it would have
        raise KeyboardInterrupt("training interrupted; the last checkpoint was committed first")

    # -- distributed runs (distributed.py) --------------------------------------------------------------------
    def _agree(self, stop: bool, save=None):
        """In a distributed run, every rank learns of a signal any rank received, and of rank 0's decisions (see
        ProcessGroup.agree). Returns (whether a deadline stops training, the save due or None)."""
        if self._dist is None:
            return stop, save
        signalled, stop, save = self._dist.agree(self._interrupt, stop, save)
        if signalled and not self._interrupt:
            self._interrupt = signalled
        return stop, save

    def _rank_states(self):
        """Rank 0: every rank's RNG and epoch-start states, gathered (each rank draws its own numbers);
        other ranks: None after sending theirs. Called by every rank at every save."""
        return self._dist.gather({"rng": self._rng_state(),
                                  "epoch_start": self._place.epoch_start if self.batch else None,
                                  "loader": self._loader_state()})

    # -- saving ----------------------------------------------------------------------------------------------
    def save(self, *, wait=False, reason: str = "manual") -> bool:
        """Save now (between batches). ``wait``: True blocks until committed; a number waits at most that long.

        Every call saves the state as it is now, also outside ``ar.batches()`` (a loop of your own), where the
        step does not move: that checkpoint carries the same step and supersedes the earlier one."""
        return self._save(reason=reason, wait=wait, manual=True)

    def _rng_state(self) -> dict:
        """The global RNG states and the current states of the loader's own generators."""
        state = _rng_state()
        state["generators"] = self._place.generator_states()
        return state

    def _loader_state(self):
        """A StatefulDataLoader's position mid-epoch (its own state_dict, tensors as arrays), else None."""
        if self._place.stateful is None or not self.batch:
            return None
        return _encode_small(self._place.stateful.state_dict())

    def _state(self, ranks=None):
        """(the specs of the tensors to copy, fill, copy): ``copy(i, buffer)`` copies the i-th tensor into its host
        buffer; ``fill(buffers)`` returns the state to save, holding those buffers (see Checkpoints.save_snapshot)."""
        tensors = []
        objects = {name: _encode(target(obj).state_dict(), tensors) for name, obj in self.objects.items()}
        user = _encode(self.state, tensors)   # a copy: later in-place updates do not reach the background write
        specs = [_Spec(tuple(t.shape), _host_dtype(t)) for t in tensors]
        self._state_nbytes = sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in specs)

        def fill(buffers):
            state = {"format": FORMAT, "objects": _fill(objects, buffers), "user": _fill(user, buffers),
                     "classes": {name: type(target(obj)).__name__ for name, obj in self.objects.items()},
                     "rng": self._rng_state(), "epoch_start": self._place.epoch_start if self.batch else None,
                     "loader": self._loader_state()}
            if ranks is not None:
                state["ranks"] = ranks
            return state

        return specs, fill, lambda index, buffer: _copy_into(buffer, tensors[index])

    def _save(self, *, reason: str, wait=False, event: str = "save", manual: bool = False) -> bool:
        # the loops' saves skip a position already saved; a manual one cannot know the model stayed as it was
        taken = self._last_saved == (self.step, self.epoch, self.batch) and not wait and not manual
        if taken and self._dist is None:
            return True
        # a distributed run: every rank takes part in the gather at every call, whatever it saved before (only
        # rank 0 knows whether its last periodic save was taken or put off for busy buffers)
        ranks = self._rank_states() if self._dist is not None else None
        ok, error = True, None
        if self._rank == 0 and not taken:
            try:
                ok = self._write(reason, wait, event, ranks)
            except Exception as e:
                if self._dist is None:
                    raise
                error = e
        if self._dist is not None:
            # rank 0's save failing must stop every rank here, not leave the others in the next collective
            self._dist.raise_if_failed(error, f"step {self.step} (epoch {self.epoch}, batch {self.batch})",
                                       self.directory)
        if self._rank != 0:   # rank 0 holds the same model state and writes it
            self._last_saved = (self.step, self.epoch, self.batch)
            self._since_save, self._last_save_time = 0, time.time()
        return ok

    def _write(self, reason, wait, event, ranks) -> bool:
        """Rank 0 (or the only process): the store copies the state into its host buffers and writes it. False
        when a periodic save of a large state finds the buffers still being written (the next batch asks again)."""
        specs, fill, copy = self._state(ranks=ranks)
        ok = self.checkpoints.save_snapshot(self.step, specs, fill, periodic=reason in ("save_freq", "every"),
                                            epoch=self.epoch, batch=self.batch, info={"reason": reason}, wait=wait,
                                            copy=copy)
        if ok is None:
            return False
        self._last_saved = (self.step, self.epoch, self.batch)
        self._since_save, self._last_save_time = 0, time.time()
        self._event(event, f"step {self.step} (epoch {self.epoch}, batch {self.batch}, {reason})")
        return ok

    def _estimated_save_s(self) -> float:
        measured = self.checkpoints.estimated_save_seconds()
        return measured if measured is not None else 0.2 + self._state_nbytes / _ASSUMED_UPLOAD_BYTES_PER_S

    def _final_wait_s(self) -> float:
        return self.record.final_wait_s(self._estimated_save_s())

    def _saved_where(self, committed: bool) -> str:
        if committed:
            return f"committed to {self.directory}"
        last_local = self.checkpoints.status.last_local
        if last_local is not None and last_local.step == self.step:
            return (f"kept on local disk at {last_local.path}; the upload to {self.directory} is pending "
                    f"({self.checkpoints.status.last_error or 'still running'})")
        return f"NOT saved: {self.checkpoints.status.last_error or 'the local write failed'}"

    def _final_save(self, why: str, timeout=None, event: str = "save"):
        wait = self._final_wait_s() if timeout is None else timeout
        self._last_saved = None   # always taken and waited for
        committed = self._save(reason=why, wait=wait, event=event)
        if self._dist is not None:
            self._dist.barrier()   # no rank ends (and has its launcher stop the others) before rank 0 has committed
        self.stopped_for = why
        self._event("stop", why)
        if committed:
            self._release_if_committed()
        self._say(f"{why}: saved step {self.step} ({self._saved_where(committed)}) and stopped training. "
                  f"Re-run this cell to resume.")

    def close(self, timeout: float | None = 60.0) -> None:
        """Finish pending uploads and release the folder."""
        self.checkpoints.close(timeout)

    # -- signals ---------------------------------------------------------------------------------------------
    def _install_signal_handlers(self):
        self._signals.install()

    def _restore_signal_handlers(self):
        self._signals.restore()

    @property
    def _on_signal(self):
        return self._signals.handle

    def _loop_running(self, frame) -> bool:
        """Whether the frame that iterates ``epochs()`` is on the stack at ``frame``."""
        while frame is not None:
            if frame is self._loop_frame:
                return True
            frame = frame.f_back
        return False


def _counted_by_enumerate(generator_frame) -> bool:
    """Whether the generator running ``generator_frame`` is iterated by the builtin enumerate()."""
    for generator in gc.get_referrers(generator_frame):
        if inspect.isgenerator(generator) and generator.gi_frame is generator_frame:
            return any(type(referrer) is enumerate for referrer in gc.get_referrers(generator))
    return False
