"""`colabkit.hf.AccelerateResume`: crash-safe one-line exact resume for 🤗 Accelerate training loops.

    accelerator = Accelerator()
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    ar = colabkit.hf.AccelerateResume("drive:runs/lora", accelerator, save_freq=500, every="15min")
    for epoch in ar.epochs(num_epochs):        # starts at the saved epoch
        for batch in ar.batches(loader):       # skips the batches already trained; saves on schedule
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                opt.step(); sched.step(); opt.zero_grad()

A checkpoint is what ``accelerator.save_state()`` writes (the prepared models, optimizers, LR schedulers and
GradScaler, objects registered with ``accelerator.register_for_checkpointing``, every process's RNG states,
accelerate's step counter, a stateful loader's position), written into a fresh folder on local disk and taken into
`colabkit.Checkpoints` with ``save_folder``: hard-linked, hashed and committed in the background, uploaded to
Drive, kept with ``keep``. Beside accelerate's files it holds colabkit's position record (step, epoch, batch,
``ar.state``, the number of processes) and, per process, the loader's place (the RNG states its epoch's shuffle
order was drawn from, its generators, accelerate's epoch counter and seedable-sampler seed). A resume restores the
newest verified checkpoint to local disk, ``accelerator.load_state()``s it on every process and puts the loader
where the save left it with ``accelerator.skip_first_batches`` (the trained batches' indices are skipped, nothing
is loaded again).

What resumes bit-exactly (every parameter, buffer and optimizer state ends equal to an uninterrupted run's), in a
fresh process on a fresh local disk, with the same number of processes on one machine:
  - a stop at an epoch's end or mid-epoch: SIGTERM, the interrupt button, a deadline, or a crash after a save;
  - a shuffled loader's order, drawn from the global torch RNG, the loader's own generator or accelerate's
    seedable sampler (``DataLoaderConfiguration(use_seedable_sampler=True)``; its seed is saved, so the resumed
    process need not set the same one), with or without loader workers;
  - random draws in the training step (dropout, noise): each process's Python, NumPy, torch and CUDA states;
  - gradient accumulation with ``accelerator.accumulate()``: a save waits for the accumulation's optimizer step,
    since save_state does not hold the gradients of a partial accumulation.
What does not:
  - random augmentation drawn while loading (``Dataset.__getitem__``, ``collate_fn``): the resumed epoch trains the
    right samples, but their augmentation differs; without loader workers, every later random draw differs too;
  - a changed number of processes: the states are restored and the position is converted to samples seen, but
    the data order and random draws are the new layout's (one line says so at the resume);
  - an IterableDataset: skip_first_batches reads and discards the trained batches (accelerate's
    ``use_stateful_dataloader=True`` positions it from its saved state instead);
  - several machines: every process writes into one scratch folder, which must be shared (untested).

Every process calls ``ar.epochs()``, ``ar.batches()`` and ``ar.save()`` at the same points (the main process
decides when to save and every process takes part: ``save_state`` writes each process's RNG states); only the
main process writes to the store and prints. The training loop waits for ``save_state``'s write to local disk;
hashing and the upload run in the background. accelerate reads its own files with ``torch.load``: restore only
checkpoints you or your runs wrote.
"""
from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path

import numpy as np

from ..optional import require

accelerate = require("accelerate", "hf", "colabkit.hf.AccelerateResume")
torch = require("torch", "hf", "colabkit.hf.AccelerateResume")

from .. import config as _config  # noqa: E402
from ..checkpoints import files as _files  # noqa: E402
from ..checkpoints import untrusted  # noqa: E402
from ..checkpoints.api import CheckpointError, Checkpoints  # noqa: E402
from ..checkpoints.folder import InvalidCheckpoint  # noqa: E402
from ..deadline import watch_for  # noqa: E402
from ..health.recorder import ensure_recording  # noqa: E402
from ..health.progress import start_mark  # noqa: E402
from ..health.thermal import guard_for, pause_must_end  # noqa: E402
from ..resume import schedule  # noqa: E402
from ..resume.run import Run, RunAttributes, recorded  # noqa: E402
from ..resume.schedule import SaveContext, SavePolicy  # noqa: E402
from ..resume.signals import SignalLatch  # noqa: E402
from ..torch.checks import check_schedule  # noqa: E402
from ..torch.distributed import process_group  # noqa: E402
from ..torch.state import Stopped  # noqa: E402 - one Stopped for every PyTorch-based adapter
from ..units import format_duration  # noqa: E402
from .loader import LOADER, LoaderPlace, read_loader_place  # noqa: E402

__all__ = ["AccelerateResume", "FORMAT", "POSITION", "Stopped"]

log = logging.getLogger("colabkit")

FORMAT = "colabkit.accelerate/1"       # the position record's format
POSITION = "colabkit-position.json"    # the position record, beside accelerate's files
_MAX_POSITION_BYTES = 1 << 20
_ASSUMED_SAVE_BYTES_PER_S = 10e6       # first-save estimate before anything was measured (Drive-like)


class AccelerateResume(RunAttributes):
    """Save and restore an 🤗 Accelerate training loop, crash-safely, in ``directory`` ("drive:runs/x" or a folder).

    Args:
        directory: where checkpoints go.
        accelerator: the ``accelerate.Accelerator`` whose prepared objects are saved; create AccelerateResume
            after ``accelerator.prepare(...)`` and ``register_for_checkpointing(...)``, before training.
        save_freq: also save every this many batches (None: no batch-count saves). With gradient accumulation the
            save waits for the accumulation's optimizer step.
        every: also save on a wall-clock interval, e.g. "15min".
        deadline: "auto" (save and stop before the runtime cap; also save before the idle cutoff when %keepalive
            is on), None, a time budget ("11h30m") counted from the first epoch, or a datetime.
        deadline_margin: the least time before a deadline at which the final save starts (default 60s).
        keep: committed checkpoints to keep (default: the configured ``keep``, 3).
        verbose: 1 prints one line per resume/deadline/interrupt (main process); 0 is silent (logging records).
        keep_every, local_dir: as for `colabkit.Checkpoints`.
        thermal_guard: None (the thermal_guard setting, on by default), True, False, or a
            ``colabkit.health.ThermalGuard``: training waits between batches while a GPU stays too hot.

    A checkpoint is taken after each epoch (once the body of ``for epoch in ar.epochs(n)`` has run), every
    ``save_freq`` batches and ``every`` interval, before a deadline, and on SIGTERM or an interrupt (the
    notebook's stop button): then it is committed, and the signal is passed on (SIGTERM ends the process as it
    would have; SIGINT raises KeyboardInterrupt). A deadline that ends training raises `Stopped` from
    ``ar.batches()`` once its save is committed. ``ar.state`` holds values of your own (JSON: numbers, strings,
    lists, dicts), saved with every checkpoint; register objects with state_dict()/load_state_dict() with
    ``accelerator.register_for_checkpointing``.

    The newest valid checkpoint is restored when AccelerateResume is created (a damaged one is skipped for the
    previous one; a checkpoint of another model raises CheckpointError naming the tensor, before anything is
    loaded); the loader's place and the RNG states when the loops reach the saved position.
    """

    def __init__(self, directory, accelerator, *, save_freq=None, every=None, deadline="auto", deadline_margin=None,
                 keep=None, keep_every=None, verbose=1, local_dir=None, thermal_guard=None):
        if not isinstance(accelerator, accelerate.Accelerator):
            raise TypeError(f"accelerator={_show(accelerator)} is not an accelerate.Accelerator: pass the Accelerator "
                            f"that prepared your model, optimizer and data loader, as in "
                            f"AccelerateResume(\"drive:runs/x\", accelerator).")
        every = check_schedule(save_freq, every)
        if verbose not in (0, 1, True, False):
            raise ValueError(f"verbose={verbose!r} is invalid: pass 1 (one line per resume, deadline and "
                             f"interrupt) or 0 (silent).")
        self.accelerator = accelerator
        self._main = accelerator.is_main_process
        self._index, self._processes = accelerator.process_index, accelerator.num_processes
        self._dist = process_group() if self._processes > 1 else None
        # what the status panel shows of this run (colabkit.resume.run); the main process alone prints
        self.record = Run(self, "colabkit.hf.AccelerateResume", deadline=deadline, verbose=verbose,
                          quiet=not self._main)
        self.directory, self.save_freq, self.every, self.verbose = directory, save_freq, every, verbose
        self.deadline = deadline
        self.margin_floor = schedule.margin_floor(deadline_margin)
        watch_for(deadline, started_at=time.time())   # validate it now, not at the first epoch
        self._thermal = guard_for(thermal_guard, self.record)   # pauses between batches while a GPU is too hot
        # every process checks the arguments the same way; only the main process saves or restores through it
        self.checkpoints = Checkpoints(directory, keep=keep, keep_every=keep_every, local_dir=local_dir)
        self.state: dict = {}          # values of your own (JSON), saved with every checkpoint
        self.step = 0                  # batches trained in total (by each process)
        self.epoch = 0                 # the current epoch
        self.batch = 0                 # batches trained in the current epoch
        self.restored = None           # what was restored (colabkit.Restored; on the main process), or None
        self.stopped_for = None        # why training was stopped (a deadline, a signal), or None
        self._pending = None           # the restored loader place and RNG states, applied at the saved position
        self._place = None             # the loader batches() iterates: its generators, epoch start, seedable sampler
        self._since_save, self._last_save_time = 0, time.time()
        self._last_saved = None        # (step, epoch, batch) of the last save
        self._saves = 0                # saves taken by this run: each into a fresh scratch folder
        self._save_state_s = None      # how long the last save_state took
        self._loop_frame = None
        self._signals = SignalLatch(self._loop_running)
        self._watch = None
        self._restore()
        # books the batches this resume trains again in the cost ledger (the main process speaks for the run)
        self._step_mark = start_mark(directory, self.step) if self._main else None

    # the run record (colabkit.resume.run): events, deadline, verbose, ... come from RunAttributes
    checkpoints = recorded("checkpoints")

    # -- restore ---------------------------------------------------------------------------------------------
    def _restore(self):
        """The main process finds and verifies the newest checkpoint on local disk; every process loads it."""
        token, found, error = uuid.uuid4().hex[:12], None, None
        if self._main:
            try:
                restored = self.checkpoints.restore_folder(check=self._check)
                if restored is not None:
                    found = (str(restored.path), restored.step, *untrusted.position(restored),
                             self._read_position(restored.path))
                    self.restored = restored
            except Exception as exc:  # noqa: BLE001 - every process must learn of it, not wait in a collective
                error = exc
        scratch = _scratch_root(self.checkpoints)
        if self._processes > 1:
            shared = [token, str(scratch), found, None if error is None else f"{type(error).__name__}: {error}"]
            accelerate.utils.broadcast_object_list(shared, from_process=0)
            token, scratch, found, message = shared[0], Path(shared[1]), shared[2], shared[3]
            if error is None and message is not None:
                raise CheckpointError(f"the main process could not restore from {self.directory}: {message}")
        if error is not None:
            raise error
        self._scratch = scratch / token
        if found is None:
            return
        path, step, epoch, batch, position = found
        try:
            self.accelerator.load_state(path)
        except Exception as exc:
            raise CheckpointError(f"loading the checkpoint of step {step} from {self.directory} failed: "
                                  f"{type(exc).__name__}: {exc}. The prepared objects may be partly loaded: "
                                  f"create them again before you retry.") from exc
        self.state = dict(position.get("state") or {})
        self.step, self.epoch = step, epoch
        saved_by = position["num_processes"]
        place = read_loader_place(Path(path), self._index) if saved_by == self._processes else None
        skip = batch if saved_by == self._processes else (batch * saved_by) // self._processes
        self.batch = skip
        self._pending = {"batch": skip, "place": place, "rng": _global_rng()}
        self._last_saved = (self.step, self.epoch, self.batch)
        if self._dist is not None:
            self._dist.barrier()   # every process has loaded before the main process saves (or prunes) again
        self._event("restore", f"step {self.step} (epoch {self.epoch}, batch {self.batch})")
        self._say(f"resumed from step {self.step} (epoch {self.epoch}, batch {self.batch}) in {self.directory}")
        if saved_by != self._processes:
            self._say(f"the checkpoint was saved by {saved_by} process(es) and this run has {self._processes}: "
                      f"states restored, epoch {epoch} resumes after about {batch * saved_by} batches' samples; "
                      f"the data order and random draws are not the saved run's")

    def _check(self, restored):
        """The store's check of a candidate checkpoint (before anything live changes): its position record must
        be one colabkit writes (else InvalidCheckpoint: the previous checkpoint is tried), and the models' tensors
        must fit the prepared models (else CheckpointError: nothing is restored)."""
        untrusted.position(restored)
        folder = _folder_of(restored)
        position = self._read_position(folder)
        step = untrusted.whole(position.get("step"), "the position record's step")
        if step != restored.step:
            raise untrusted.invalid("the position record's step", step, f"the manifest's step {restored.step}")
        _check_models(self.accelerator, folder, self.directory, restored.step)

    @staticmethod
    def _read_position(folder) -> dict:
        path = Path(folder) / POSITION
        try:
            if path.stat().st_size > _MAX_POSITION_BYTES:
                raise untrusted.invalid(POSITION, f"{path.stat().st_size} bytes", f"at most {_MAX_POSITION_BYTES}")
            position = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:
            raise InvalidCheckpoint(f"its {POSITION} cannot be read ({type(exc).__name__}: {exc}); it is not a "
                                    f"checkpoint of colabkit.hf.AccelerateResume") from None
        position = untrusted.mapping(position, POSITION)
        if position.get("format") != FORMAT:
            raise untrusted.invalid(f"{POSITION}'s format", position.get("format"), FORMAT)
        untrusted.whole(position.get("num_processes"), f"{POSITION}'s num_processes", low=1, high=1 << 20)
        untrusted.mapping(position.get("state", {}), f"{POSITION}'s state")
        return position

    # -- the loops -------------------------------------------------------------------------------------------
    def epochs(self, n: int):
        """Yield the epochs from the saved one up to ``n`` (exclusive). After each epoch's body: a checkpoint."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"epochs(n={n!r}) is invalid: pass the total number of epochs, a whole number.")
        if self.epoch >= n:
            self._say(f"training already finished: the checkpoint is at epoch {self.epoch} of {n}")
            return
        self.stopped_for, self._interrupt = None, None
        self._watch = watch_for(self.deadline, started_at=time.time(), margin_floor=self.margin_floor)
        self._loop_frame = sys._getframe(1)   # the frame running ``for epoch in ar.epochs(n)``
        self._signals.install()
        ensure_recording()    # the flight recorder (colabkit health --last after a freeze)
        if self._thermal is not None:
            self._thermal.start()
        try:
            self._claim()
            while self.epoch < n:
                pending = self._pending
                if pending is not None and pending["batch"] == 0 and pending["rng"] is not None:
                    _set_global_rng(pending["rng"])   # resumed at an epoch's start: as the save left them
                    pending["rng"] = None
                yield self.epoch
                if self.stopped_for is not None:
                    return
                self.epoch, self.batch = self.epoch + 1, 0
                self._save(reason="epoch")
                self._agree(False)
                if self._check_interrupt():
                    return
            if self._main and not self.checkpoints.wait(self._final_wait_s()):
                self._say(f"the final checkpoint (step {self.step}) is not on {self.directory} yet: "
                          f"{self._saved_where(False)}")
            if self._dist is not None:
                self._dist.barrier()
        finally:
            if self._thermal is not None:
                self._thermal.stop()
            self._signals.restore()
            self._release_if_committed()

    def _claim(self):
        """The main process claims the folder (FolderInUse when another process writes there) and clears the
        scratch folders that runs killed mid-save left; every process learns whether that failed."""
        error = None
        if self._main:
            try:
                self.checkpoints.claim()
                root = self._scratch.parent
                for leftover in (root.iterdir() if root.is_dir() else ()):
                    if leftover != self._scratch:
                        shutil.rmtree(leftover, ignore_errors=True)
            except Exception as exc:  # noqa: BLE001 - raised on every process below
                error = exc
        if self._dist is not None:
            self._dist.raise_if_failed(error, "the claim of the folder", self.directory)
        elif error is not None:
            raise error

    def _release_if_committed(self):
        """Everything is on the destination: another run (a re-run of the cell) may write there now."""
        if self._main and self.checkpoints.wait(0):
            self.checkpoints.release()

    def batches(self, loader):
        """Yield ``loader``'s batches for the current epoch (the loader ``accelerator.prepare`` returned), from the
        saved position on a resume; saves on ``save_freq``, ``every``, deadlines and signals after a batch's
        optimizer step."""
        if not hasattr(loader, "dataset") or not hasattr(loader, "__iter__"):
            raise TypeError(f"batches(loader={_show(loader)}) takes a torch DataLoader (the one "
                            f"accelerator.prepare returned), so that a resume can skip to the saved batch.")
        pending, self._pending = self._pending, None
        place = self._place = LoaderPlace(loader)
        skip = place.start(pending)
        source = self.accelerator.skip_first_batches(loader, skip) if skip else loader
        rng = pending["rng"] if pending is not None and pending["batch"] else None
        for batch in source:
            if rng is not None:   # the order is drawn (and the first batch loaded): now the saved RNG states
                _set_global_rng(rng)
                rng = None
            yield batch
            self.step += 1
            self.batch += 1
            self._since_save += 1
            if self._step_mark is not None:
                self._step_mark.reached(self.step)
            if self._thermal is not None:   # a hot GPU: wait here, between two batches (a signal or deadline ends it)
                self._thermal.wait_if_hot(lambda: pause_must_end(self._interrupt, self._watch, self._estimated_save_s))
            if self._after_batch():
                # a deadline stop: raised here, inside the epoch's body, so that the code after this loop
                # (evaluation, logging) does not run on the partial epoch, nor do the notebook's later cells
                self._signals.restore()
                raise Stopped(f"{self.stopped_for}: saved step {self.step} (epoch {self.epoch}, batch "
                              f"{self.batch}) and stopped training. Re-run this cell to resume.")
        if rng is not None:   # the saved position was the epoch's end
            _set_global_rng(rng)
        place.finish(source)

    def _after_batch(self) -> bool:
        """Save when due. True when training stops (a deadline or a signal). Only after an optimizer step (mid
        accumulation the gradients are in no checkpoint); the main process decides (it keeps the clock) and every
        process takes part in the save and the stop."""
        if not self.accelerator.sync_gradients:
            return False
        deadline = save = None
        if self._main:
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
            if deadline is None:   # the main process stops for a deadline: so does this one
                self._final_save("the main process reached a deadline")
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

    def _check_interrupt(self) -> bool:
        """A signal arrived: save, commit, then pass it on. True when training stops."""
        if not self._interrupt:
            return False
        name = self._interrupt
        self._final_save(f"{name} received")
        self._signals.restore()
        if name == "SIGTERM":
            signal.raise_signal(signal.SIGTERM)   # the checkpoint is safe: let it end the process as it would have
        raise KeyboardInterrupt("training interrupted; the last checkpoint was committed first")

    def _agree(self, stop: bool, save=None):
        """Several processes: each learns of a signal any received, and of the main process's decisions."""
        if self._dist is None:
            return stop, save
        signalled, stop, save = self._dist.agree(self._interrupt, stop, save)
        if signalled and not self._interrupt:
            self._interrupt = signalled
        return stop, save

    # -- saving ----------------------------------------------------------------------------------------------
    def save(self, *, wait=False, reason: str = "manual") -> bool:
        """Save now, between batches (every process calls it). ``wait``: True blocks until committed; a number
        waits at most that long. Returns whether the checkpoint was taken (and, with ``wait``, committed).

        Every call saves the state as it is now, also outside ``ar.batches()`` (a loop of your own), where the
        step does not move: that checkpoint carries the same step and supersedes the earlier one."""
        return self._save(reason=reason, wait=wait, manual=True)

    def _save(self, *, reason: str, wait=False, event: str = "save", manual: bool = False) -> bool:
        # the loops' saves skip a position already saved; a manual one cannot know the model stayed as it was
        if self._last_saved == (self.step, self.epoch, self.batch) and not wait and not manual:
            return True
        folder = self._scratch / f"step-{self.step}-{self._saves}"
        self._saves += 1
        started = time.monotonic()
        error, ok = None, True
        try:
            self.accelerator.save_state(str(folder))   # every process: its RNG states, collectives for FSDP/DeepSpeed
            if self._place is not None:
                self._place.write(folder / LOADER.format(self._index), mid_epoch=self.batch > 0)
        except Exception as exc:  # noqa: BLE001 - raised on every process by _settle
            error = exc
        self._settle(error, "the save_state")   # every process has written its files (or all raise)
        self._save_state_s = time.monotonic() - started
        if self._main:
            try:
                position = {"format": FORMAT, "step": self.step, "epoch": self.epoch, "batch": self.batch,
                            "num_processes": self._processes, "state": self.state}
                try:
                    text = json.dumps(position, allow_nan=False)
                except (TypeError, ValueError) as exc:
                    raise CheckpointError(f"ar.state holds a value that is not JSON ({exc}): keep numbers, "
                                          f"strings, lists and dicts there; register objects with "
                                          f"accelerator.register_for_checkpointing. Nothing was saved.") from None
                (folder / POSITION).write_text(text, encoding="utf-8")
                ok = self.checkpoints.save_folder(self.step, folder, link=True, closed=True, epoch=self.epoch,
                                                  batch=self.batch,
                                                  info={"reason": reason}, wait=wait)
            except Exception as exc:  # noqa: BLE001 - raised on every process by _settle
                error = exc
            finally:
                shutil.rmtree(folder, ignore_errors=True)   # its files are linked or copied into the store
        self._settle(error, f"step {self.step} (epoch {self.epoch}, batch {self.batch})")
        self._last_saved = (self.step, self.epoch, self.batch)
        self._since_save, self._last_save_time = 0, time.time()
        self._event(event, f"step {self.step} (epoch {self.epoch}, batch {self.batch}, {reason})")
        return ok

    def _settle(self, error, what: str) -> None:
        """An error on any process raises on every process (not left waiting in the next collective)."""
        if self._dist is not None:
            self._dist.raise_if_failed(error, what, self.directory)
        elif error is not None:
            raise error

    def _estimated_save_s(self) -> float:
        measured = self.checkpoints.estimated_save_seconds()
        if measured is not None:
            return measured + (self._save_state_s or 0.0)
        nbytes = sum(p.numel() * p.element_size() for m in getattr(self.accelerator, "_models", ())
                     for p in m.parameters())
        return 0.2 + 3 * nbytes / _ASSUMED_SAVE_BYTES_PER_S   # the weights and, say, two optimizer moments

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
        committed = self._save(reason=why, wait=wait, event=event)   # ends with every process past the commit
        self.stopped_for = why
        self._event("stop", why)
        self._release_if_committed()
        if self._main:
            self._say(f"{why}: saved step {self.step} ({self._saved_where(committed)}) and stopped training. "
                      f"Re-run this cell to resume.")

    def close(self, timeout: float | None = 60.0) -> None:
        """Finish pending uploads and release the folder."""
        self.checkpoints.close(timeout)

    # -- signals ---------------------------------------------------------------------------------------------
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


# -- helpers ---------------------------------------------------------------------------------------------------

def _global_rng() -> dict:
    """The global RNG states now (in memory): put back at the saved position after the loader drew its order."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_global_rng(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def _folder_of(restored) -> Path:
    entry = _files.recorded(restored.state)
    return restored.path / _files.FILES / entry["name"]


def _scratch_root(checkpoints) -> Path:
    """Where save_state writes before the store takes the files: beside the store's staging folder (the same
    filesystem, so they are hard-linked, not copied), or in the cache when the destination is that folder."""
    staging = Path(checkpoints.local.path)
    if checkpoints.dest is not None:
        return staging.parent / f"{staging.name}.accelerate"
    digest = hashlib.sha1(str(staging.resolve()).encode()).hexdigest()[:10]
    return _config.load().resolved_cache_dir() / "accelerate" / f"{staging.name}-{digest}"


def _check_models(accelerator, folder: Path, directory, step: int) -> None:
    """The saved weights fit the prepared models: CheckpointError naming the first tensor whose shape differs
    (before load_state changes anything). Only safetensors headers are read."""
    try:
        from safetensors import safe_open
    except ImportError:   # accelerate's own check runs at load_state
        return
    for i, model in enumerate(getattr(accelerator, "_models", ())):
        path = folder / ("model.safetensors" if i == 0 else f"model_{i}.safetensors")
        if not path.is_file():
            continue
        try:
            with safe_open(str(path), framework="pt") as f:
                saved = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
        except Exception as exc:  # noqa: BLE001 - a header safetensors cannot read
            raise InvalidCheckpoint(f"{path.name} cannot be read: {exc}") from None
        # save_state wrote the prepared model's own state dict (with a DDP wrapper's "module." prefix)
        mine = {key: tuple(value.shape) for key, value in model.state_dict().items()}
        for key, shape in saved.items():
            if key not in mine:
                raise CheckpointError(f"{directory} (step {step}) holds weights of another model: {key!r} is not a "
                                      f"parameter or buffer of the prepared model {i}. Nothing was restored; use "
                                      f"another folder for another model.")
            if mine[key] != shape:
                raise CheckpointError(f"{directory} (step {step}) holds weights of another model: {key!r} has shape "
                                      f"{list(shape)} there and {list(mine[key])} in the prepared model {i}. Nothing "
                                      f"was restored; use another folder for another model.")


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{type(value).__name__} {text[:60]}..."
