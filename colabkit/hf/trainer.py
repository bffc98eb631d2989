"""`colabkit.hf.AutoResume`: a TrainerCallback that makes every checkpoint a Hugging Face Trainer writes crash-safe
(committed, verified, uploaded to Drive in the background) and resumes from the newest verified one in one line.

    ar = colabkit.hf.AutoResume("drive:runs/llm", every="15min")
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[ar])
    trainer.train(resume_from_checkpoint=ar.resume_from)   # None on a first run

It works with transformers' Trainer and the trainers built on it (TRL's SFTTrainer, DPOTrainer, ...).
"""
from __future__ import annotations

import gc
import json
import logging
import os
import signal
import sys
import time
import warnings
from pathlib import Path

from ..optional import require

transformers = require("transformers", "hf", "colabkit.hf.AutoResume")
require("accelerate", "hf", "colabkit.hf.AutoResume")   # the Trainer needs it; say so before it does

from .. import mounts  # noqa: E402
from ..checkpoints.api import Checkpoints  # noqa: E402
from ..deadline import watch_for  # noqa: E402
from ..health.recorder import ensure_recording  # noqa: E402
from ..health.progress import start_mark  # noqa: E402
from ..health.thermal import guard_for, pause_must_end  # noqa: E402
from ..resume import schedule  # noqa: E402
from ..resume.run import Run, RunAttributes, recorded  # noqa: E402
from ..resume.schedule import SaveContext, SavePolicy  # noqa: E402
from ..resume.signals import SignalLatch  # noqa: E402
from ..torch.state import Stopped  # noqa: E402 - one Stopped for every PyTorch-based adapter
from ..units import format_duration  # noqa: E402

__all__ = ["AutoResume", "Stopped"]

log = logging.getLogger("colabkit")

_ASSUMED_UPLOAD_BYTES_PER_S = 10e6   # first-save estimate before anything was measured (Drive-like)
_SIGNALS = (None, "SIGINT", "SIGTERM")   # codes the ranks of a distributed run agree on
_REASONS = (None, "save_freq", "every", "deadline", "signal", "end of training")
# what the Trainer's resume depends on besides the checkpoint: recorded with every save, compared at resume
_SHAPE_ARGS = ("world_size", "per_device_train_batch_size", "gradient_accumulation_steps")


class AutoResume(transformers.TrainerCallback, RunAttributes):
    """Crash-safe checkpoints and exact resume for a Hugging Face ``Trainer`` (and TRL's trainers), in
    ``directory`` ("drive:runs/llm" or a folder).

    Args:
        directory: where checkpoints go.
        save_freq: also save every this many optimizer steps (``state.global_step``); None: no step-count saves
            beyond the Trainer's own ``save_strategy``/``save_steps``.
        every: also save on a wall-clock interval, e.g. "15min".
        deadline: "auto" (save and stop before the runtime cap; also save before the idle cutoff when %keepalive
            is on), None, a time budget ("11h30m") counted from the start of ``trainer.train()``, or a datetime.
        deadline_margin: the least time before a deadline at which the final save starts (default 60s).
        keep: committed checkpoints to keep at the destination (default: the configured ``keep``, 3). The
            Trainer's ``save_total_limit`` only prunes its own ``output_dir`` and never deletes anything here.
        verbose: 1 prints one line per resume/deadline/interrupt; 0 is silent (logging still records).
        local_dir, keep_every, resume_from: as for `colabkit.Checkpoints`.
        thermal_guard: None (the thermal_guard setting, on by default), True, False, or a
            ``colabkit.health.ThermalGuard``: training waits between steps while a GPU stays too hot.

    Every checkpoint the Trainer writes (its whole ``checkpoint-N`` folder: weights, optimizer, scheduler, RNG
    states, trainer_state.json) is taken into the store as it is, by hard links (no copy while training waits),
    then hashed, committed and uploaded in the background. On top of the Trainer's ``save_strategy`` it saves at
    the end of training, every ``save_freq`` steps, every ``every`` interval, before a deadline, and on SIGTERM or
    an interrupt (the notebook's stop button): a signal that arrives mid-step is latched and acted on when the
    step ends (a second one of the same kind acts at once: a second interrupt raises KeyboardInterrupt without
    waiting for the save). After a deadline or a signal the save is committed before training stops, and then
    ``trainer.train()`` raises: `Stopped` for a deadline, KeyboardInterrupt for an interrupt; SIGTERM ends the
    process as it would have. Re-run the cell to resume.

    ``ar.resume_from`` is the newest verified checkpoint, copied to local disk (None when there is none):
    ``trainer.train(resume_from_checkpoint=ar.resume_from)`` resumes from it on a fresh VM as on the same one.

    What resumes exactly: the Trainer restores the weights, optimizer, scheduler, grad scaler and RNG states, and
    skips the batches of the current epoch already trained with accelerate's ``skip_first_batches`` (they are
    not replayed; the shuffle order comes from the seeded sampler). A run stopped mid-epoch and resumed ends with
    the same parameters and optimizer state, bit for bit, as one that was never stopped, given the same code,
    data, seed and process layout. Not exact, and said in one line at resume: ``ignore_data_skip=True`` (the
    resumed epoch starts again at its first batch, so its first batches are trained twice); a different number
    of processes (world size), ``per_device_train_batch_size`` or ``gradient_accumulation_steps`` than the
    checkpoint's (the Trainer resumes by counting optimizer steps, so the data position shifts, and per-process
    RNG states do not match the processes); ``save_only_model=True`` (no optimizer, scheduler or RNG state to
    resume). Evaluation that runs between a save and the next step (``eval_strategy="epoch"`` with a save at an
    epoch's last step) draws from the RNG after the checkpoint was taken, and the resumed run does not repeat it.

    In a multi-process run (torchrun, accelerate launch) the main process writes; every process takes part in
    the decision to save and stop (one small all-reduce per optimizer step), so they save and stop together.
    """

    def __init__(self, directory, *, save_freq=None, every=None, deadline="auto", deadline_margin=None, keep=None,
                 keep_every=None, local_dir=None, resume_from=None, verbose=1, thermal_guard=None):
        every = schedule.check_schedule(save_freq, every, unit="optimizer steps")
        self._rank = int(os.environ.get("RANK", "0") or 0)   # torchrun / accelerate launch; the Trainer says later
        self.record = Run(self, "colabkit.hf.AutoResume", deadline=deadline, verbose=verbose, quiet=self._rank != 0)
        self.directory, self.save_freq, self.every, self.verbose = directory, save_freq, every, verbose
        self.deadline = deadline
        self.margin_floor = schedule.margin_floor(deadline_margin)
        watch_for(deadline, started_at=time.time())   # validate it now, not when training starts
        self._thermal = guard_for(thermal_guard, self.record)   # pauses between steps while a GPU is too hot
        self.checkpoints = Checkpoints(directory, keep=keep, keep_every=keep_every, local_dir=local_dir,
                                       resume_from=resume_from)
        self.restored = None           # the restored checkpoint (colabkit.Restored; .path: the local folder)
        self.stopped_for = None        # why training was stopped (a deadline, a signal), or None
        self._signals = SignalLatch(self._loop_running, on_step_aside=self._forget_loop)
        self._loop_frame = None        # the Trainer's training-loop frame while it runs
        self._watch = None
        self._wired = False            # a Trainer has called this callback
        self._wiring_checked = False
        self._trainer_name = "Trainer"
        self._pending = None           # (reason, stop, deadline) of the save asked for at the last step end
        self._last_save = (None, time.time())   # (global step, wall time) of the last save taken
        self._stop_kind = None         # "signal" / "deadline" once training is being stopped
        self._state_nbytes = 0
        self._missing_warned = False
        self._restore()

    checkpoints = recorded("checkpoints")

    # -- restore ---------------------------------------------------------------------------------------------
    def _restore(self):
        restored = self.checkpoints.restore_folder()
        if restored is None:
            return
        self.restored = restored
        self._last_save = (restored.step, time.time())
        self._event("restore", f"step {restored.step} ({self._position(restored.epoch, restored.batch)})")
        log.info("colabkit: %s holds step %s; resume_from is %s", self.directory, restored.step, restored.path)

    @property
    def resume_from(self) -> str | None:
        """The newest verified checkpoint's folder on local disk, for ``trainer.train(resume_from_checkpoint=...)``;
        None when ``directory`` holds none yet (a first run)."""
        if not self._wiring_checked:
            self._wiring_checked = True
            if not self._wired and not self._held_by_a_trainer():
                self._warn(
                    f"ar.resume_from was read, but no Trainer has this AutoResume among its callbacks: pass "
                    f"callbacks=[ar] to Trainer(...) (or call trainer.add_callback(ar)) before trainer.train(), "
                    f"or nothing is saved to {self.directory}")
        return None if self.restored is None else str(self.restored.path)

    def _held_by_a_trainer(self) -> bool:
        """Whether a Trainer's callback list holds this callback (Trainer(callbacks=[ar]) or add_callback)."""
        handler = transformers.trainer_callback.CallbackHandler
        for ref in gc.get_referrers(self):
            if isinstance(ref, list):
                for owner in gc.get_referrers(ref):
                    if isinstance(owner, handler) or (isinstance(owner, dict) and owner.get("callbacks") is ref):
                        return True
        return False

    # -- the Trainer's events --------------------------------------------------------------------------------
    def on_init_end(self, args, state, control, **kwargs):
        self._wired = True
        self._check_output_dir(args)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._wired = True
        ensure_recording()    # the flight recorder (colabkit health --last after a freeze)
        self._rank = args.process_index
        self.record.quiet = not state.is_world_process_zero
        trainer = self._find_trainer()
        if trainer is not None:
            self._trainer_name = type(trainer).__name__
        self._check_resume(args, state)
        if model is not None:
            self._state_nbytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())
        self.stopped_for, self._stop_kind, self._pending = None, None, None
        self._signals.received = None
        self._last_save = (state.global_step, time.time())
        self._watch = watch_for(self.deadline, started_at=time.time(), margin_floor=self.margin_floor)
        if state.is_world_process_zero:
            self.checkpoints.claim()   # a second writer to the folder fails now, not at the first save
            # books the steps this resume trains again in the cost ledger
            self._step_mark = start_mark(self.directory, state.global_step)
        self._signals.install()
        if self._thermal is not None:
            self._thermal.start()

    def on_step_end(self, args, state, control, **kwargs):
        if self._thermal is not None:   # a hot GPU: wait here, between two steps (a signal or deadline ends it)
            self._thermal.wait_if_hot(lambda: pause_must_end(self._interrupt, self._watch, self._estimated_save_s))
        deadline, reason = None, None
        if getattr(self, "_step_mark", None) is not None:
            self._step_mark.reached(state.global_step)
        if state.is_world_process_zero:   # one clock decides (rank 0's); signals count from every rank
            deadline = self._watch.due(self._estimated_save_s()) if self._watch is not None else None
            policy = SavePolicy(self.save_freq, self.every)
            decision = policy.should_save(state.global_step, SaveContext(
                steps_since_save=state.global_step - (self._last_save[0] or 0),
                every_due=policy.every_due(time.time() - self._last_save[1]), deadline=deadline))
            if deadline is not None:
                self._watch.mark_handled(deadline)
            reason = decision.reason
            if reason is None and state.global_step >= state.max_steps:
                reason = "end of training"
        stop_for_deadline = deadline is not None and deadline.stop_training
        signalled, stop_for_deadline, reason = self._agree(args, self._signals.received, stop_for_deadline, reason)
        if signalled and not self._signals.received:
            self._signals.received = signalled
        if signalled:
            self._stop_kind, reason = "signal", "signal"
            self.stopped_for = f"{signalled} received"
        elif stop_for_deadline:
            self._stop_kind = "deadline"
            self.stopped_for = (f"{deadline.reason} is {format_duration(deadline.at - time.time())} away"
                                if deadline is not None else "rank 0 reached a deadline")
        if reason is not None:
            control.should_save = True
            self._pending = (reason, deadline)
        if self._stop_kind is not None:
            control.should_training_stop = True
        return control

    def on_save(self, args, state, control, train_dataloader=None, **kwargs):
        if args.world_size > 1:   # every process has written its part (its rng_state_N.pth) before it is taken
            from accelerate import PartialState
            PartialState().wait_for_everyone()
        strategy = getattr(args.save_strategy, "value", args.save_strategy)
        reason, deadline = self._pending or (f"save_strategy={strategy}", None)
        self._pending = None
        if not state.is_world_process_zero:
            self._last_save = (state.global_step, time.time())
            return control
        step = state.global_step
        folder = Path(args.output_dir) / f"{transformers.trainer_utils.PREFIX_CHECKPOINT_DIR}-{step}"
        if not folder.is_dir():
            if not self._missing_warned:
                self._missing_warned = True
                self._warn(f"the Trainer saved step {step}, but {folder} is not there (a hyperparameter "
                                f"search writes elsewhere); that save is not in {self.directory}")
            return control
        epoch, batch = self._epoch_and_batch(step, args, train_dataloader)
        final = self._stop_kind is not None or reason == "end of training"
        wait = False
        if deadline is not None:
            wait = max(1.0, deadline.at - time.time())
        elif final:
            wait = self._final_wait_s()
        info = {"reason": reason, "trainer": self._trainer_name, "folder": folder.name,
                "args": {name: getattr(args, name, None) for name in _SHAPE_ARGS}}
        committed = self.checkpoints.save_folder(step, folder, closed=True, epoch=epoch, batch=batch, info=info,
                                                 wait=wait)
        self._last_save = (step, time.time())
        kind = "deadline-save" if deadline is not None else "save"
        self._event(kind, f"step {step} ({self._position(epoch, batch)}, {reason})")
        if self._stop_kind is not None:
            self._event("stop", self.stopped_for)
            self._say(f"{self.stopped_for}: saved step {step} ({self._saved_where(committed, step)}) and stopped "
                      f"training. Re-run this cell to resume.")
        elif deadline is not None:
            self._say(f"saved step {step} before {deadline.reason} ({self._saved_where(committed, step)}); "
                      f"training continues")
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if control.should_save and self._last_save[0] == state.global_step:
            # this step is saved already: a second save would rewrite checkpoint-N in place, under the hard links
            control.should_save = False
        if self._stop_kind is not None:   # stopped mid-epoch: no epoch-end evaluation on a partial epoch
            control.should_evaluate = False
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self._signals.restore()
        self._forget_loop()
        if state.is_world_process_zero:
            committed = self.checkpoints.wait(self._final_wait_s())
            if not committed:
                self._say(f"the last checkpoint (step {self._last_save[0]}) is not on {self.directory} yet: "
                          f"{self._saved_where(False, self._last_save[0])}")
            else:
                self.checkpoints.release()   # another AutoResume (a re-run of the cell) may write there now
        signalled = self._signals.received
        if signalled == "SIGTERM":
            signal.raise_signal(signal.SIGTERM)   # the checkpoint is safe: let it end the process as it would have
        if signalled == "SIGINT":
            raise KeyboardInterrupt("training interrupted; the last checkpoint was committed first")
        if self._stop_kind == "deadline":
            raise Stopped(f"{self.stopped_for}: saved step {state.global_step} and stopped training. "
                          f"Re-run this cell to resume.")
        return control

    # -- checks at the start -----------------------------------------------------------------------------------
    def _check_output_dir(self, args):
        out = Path(args.output_dir).expanduser()
        destination = self.checkpoints.destination
        inside = isinstance(destination, Path) and (out.resolve() == destination.resolve()
                                                    or destination.resolve() in out.resolve().parents)
        if inside or mounts.on_network_fs(out):
            where = f"inside {self.directory}" if inside else "on a network mount"
            self._warn(f"output_dir={args.output_dir!r} is {where}: the Trainer writes each checkpoint there "
                            f"while training waits (and save_total_limit deletes there). Give the Trainer a local "
                            f"output_dir (on Colab: \"/content/outputs\"); AutoResume copies each checkpoint to "
                            f"{self.directory} in the background")

    def _check_resume(self, args, state):
        restored = self.restored
        if args.save_only_model:
            self._warn("save_only_model=True: the Trainer's checkpoints hold the weights only, so a resume "
                            "starts the optimizer, scheduler and RNG afresh (not an exact resume)")
        if restored is None:
            return
        if state.global_step == 0 and restored.step > 0:
            raise ValueError(
                f"{self.directory} holds step {restored.step}, but trainer.train() started from step 0: pass "
                f"resume_from_checkpoint=ar.resume_from to trainer.train() to continue that run, or give "
                f"AutoResume another directory to start over. Nothing was trained or saved.")
        if state.global_step != restored.step:
            self._warn(f"trainer.train() resumed at step {state.global_step}, not from the verified checkpoint "
                            f"of {self.directory} (step {restored.step}): pass resume_from_checkpoint=ar.resume_from")
            return
        skip = restored.batch
        if args.ignore_data_skip:
            data = ("ignore_data_skip=True: the epoch restarts at its first batch, so the steps already trained "
                    "in it are trained again (not an exact resume)")
        elif skip:
            data = (f"the Trainer skips the {skip} step(s) already trained in epoch {restored.epoch} without "
                    f"replaying them")
        else:
            data = f"epoch {restored.epoch} starts at its first batch"
        source = {"destination": "downloaded and verified", "local": "the verified copy on this machine",
                  "link": f"from {self.checkpoints.resume_from}"}.get(restored.source, restored.source)
        self._event("resume", f"step {restored.step}")
        self._say(f"resumed from step {restored.step} ({self._position(restored.epoch, restored.batch)}) of "
                  f"{self.directory} ({source}); {data}")
        changed = self._changed_shape(args, restored)
        if changed:
            self._warn(f"{changed} differ from the checkpoint's: the Trainer resumes by counting optimizer "
                            f"steps, so the data position shifts (samples repeated or skipped) and RNG states do "
                            f"not match (not an exact resume)")

    def _changed_shape(self, args, restored) -> str:
        """What differs between this run's world size, per-device batch size and gradient accumulation and the
        checkpoint's: from what AutoResume recorded with the save, else from the Trainer's own files."""
        saved = dict(restored.manifest.get("info", {}).get("args") or {})
        path = Path(restored.path)
        if not saved:
            rng_files = list(path.glob("rng_state_*.pth"))
            saved["world_size"] = len(rng_files) if rng_files else 1 if (path / "rng_state.pth").exists() else None
            try:
                state = json.loads((path / "trainer_state.json").read_text())
                saved["train_batch_size"] = state.get("train_batch_size")
            except (OSError, ValueError):
                pass
        now = {name: getattr(args, name, None) for name in _SHAPE_ARGS}
        now["train_batch_size"] = args.per_device_train_batch_size * max(1, args.n_gpu)
        diffs = [f"{name}={now[name]} (checkpoint: {value})" for name, value in saved.items()
                 if value is not None and now.get(name) is not None and value != now[name]]
        return "this run's " + ", ".join(diffs) if diffs else ""

    # -- helpers -------------------------------------------------------------------------------------------------
    @staticmethod
    def _position(epoch, batch) -> str:
        return "epoch ?" if epoch is None else f"epoch {epoch}, step {batch} of it"

    @staticmethod
    def _epoch_and_batch(step, args, train_dataloader):
        """(epoch, optimizer steps into it) by the Trainer's own resume arithmetic; (None, None) without a length."""
        try:
            batches = len(train_dataloader)
        except TypeError:
            return None, None
        accumulation = args.gradient_accumulation_steps
        per_epoch = max(batches // accumulation + int(batches % accumulation > 0), 1)
        return step // per_epoch, step % per_epoch

    def _agree(self, args, signalled, stop, reason):
        """In a multi-process run, every process learns of a signal any received and of rank 0's decision."""
        import torch
        dist = torch.distributed
        if args.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
            return signalled, stop, reason
        flags = torch.tensor([_SIGNALS.index(signalled), int(stop), _REASONS.index(reason)], device=args.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        code, stop_code, reason_code = (int(v) for v in flags.tolist())
        return _SIGNALS[code], bool(stop_code), _REASONS[reason_code]

    def _find_trainer(self):
        """The Trainer running this callback, and its training loop's frame (for the signal latch)."""
        frame, found = sys._getframe(1), None
        while frame is not None:
            owner = frame.f_locals.get("self")
            if isinstance(owner, transformers.Trainer):
                found = owner
                self._loop_frame = frame
                if frame.f_code.co_name == "_inner_training_loop":
                    break
            frame = frame.f_back
        return found

    def _loop_running(self, frame) -> bool:
        if self._loop_frame is None:
            return True   # not found: act as a latch for the whole train() call
        while frame is not None:
            if frame is self._loop_frame:
                return True
            frame = frame.f_back
        return False

    def _forget_loop(self):
        self._loop_frame = None
        if self._thermal is not None:
            self._thermal.stop()

    def _estimated_save_s(self) -> float:
        measured = self.checkpoints.estimated_save_seconds()
        return measured if measured is not None else 0.2 + self._state_nbytes / _ASSUMED_UPLOAD_BYTES_PER_S

    def _final_wait_s(self) -> float:
        return self.record.final_wait_s(self._estimated_save_s())

    def _saved_where(self, committed: bool, step) -> str:
        if committed:
            return f"committed to {self.directory}"
        status = self.checkpoints.status
        if status.last_local is not None and status.last_local.step == step:
            return (f"kept on local disk at {status.last_local.path}; the upload to {self.directory} is pending "
                    f"({status.last_error or 'still running'})")
        return f"NOT saved: {status.last_error or 'the local write failed'}"

    def _warn(self, message: str) -> None:
        log.warning("colabkit: %s", message)
        if self.record.verbose and not self.record.quiet:
            warnings.warn(f"colabkit: {message}", RuntimeWarning, stacklevel=3)

    def close(self, timeout: float | None = 60.0) -> None:
        """Finish pending uploads and release the folder."""
        self.checkpoints.close(timeout)
