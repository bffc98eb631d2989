"""Lightning on colabkit's crash-safe store: a ``CheckpointIO`` plugin and an ``AutoResume`` callback.

    ar = colabkit.torch_lightning.AutoResume("drive:runs/lit", save_freq=200, every="15min")
    trainer = lightning.Trainer(callbacks=[ar], max_epochs=10)
    trainer.fit(model, train_loader, ckpt_path="last")   # resumes from the newest committed checkpoint

The callback installs its ``CheckpointIO`` (``ar.checkpoint_io``) in the trainer, so every save Lightning makes
(``trainer.save_checkpoint``, the callback's own) goes through `colabkit.Checkpoints`: the
commit protocol, Drive locations, background upload, retention (``keep``). Lightning's checkpoint dict is stored
as JSON with its tensors as NumPy arrays (``.npz``); nothing is unpickled on restore. The callback adds saves every
``save_freq`` batches and ``every`` interval, deadline saves (runtime cap, idle cutoff), and saves on SIGTERM and
the interrupt button, each after a batch's step; it also stores the RNG states (torch, CUDA, NumPy, Python), which
Lightning's checkpoints do not hold. ``ckpt_path="last"`` finds the store's newest checkpoint; Lightning's own
resume (weights, optimizers, schedulers, loops, a ``StatefulDataLoader``'s position) does the rest.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import time
from pathlib import Path

import numpy as np

from ..optional import require

torch = require("torch", "torch", "colabkit.torch_lightning")
lightning = require("lightning", "lightning", "colabkit.torch_lightning")

from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import CheckpointIO as _LightningCheckpointIO  # noqa: E402
from lightning.pytorch.plugins.io import TorchCheckpointIO  # noqa: E402
from lightning.pytorch.utilities.exceptions import SIGTERMException  # noqa: E402

from ..checkpoints import untrusted  # noqa: E402
from ..checkpoints.api import CheckpointError, Checkpoints  # noqa: E402
from ..checkpoints.destinations import resolve_destination  # noqa: E402
from ..deadline import watch_for  # noqa: E402
from ..health.recorder import ensure_recording  # noqa: E402
from ..health.progress import start_mark  # noqa: E402
from ..health.thermal import guard_for, pause_must_end  # noqa: E402
from .checks import check_generators, check_optimizer_state, check_rng, check_schedule  # noqa: E402
from .loader import generators_of, set_generators  # noqa: E402
from .state import (  # noqa: E402
    Stopped,
    _copy_into,
    _decode,
    _encode,
    _fill,
    _host_dtype,
    _rng_state,
    _set_rng,
    _Spec,
)
from ..resume import schedule  # noqa: E402
from ..resume.schedule import SaveContext, SavePolicy  # noqa: E402
from ..resume.run import Run, RunAttributes  # noqa: E402
from ..resume.signals import SignalLatch  # noqa: E402
from ..units import format_duration  # noqa: E402

log = logging.getLogger("colabkit")

FORMAT = "colabkit.lightning/1"
POINTER = "colabkit.lightning.pointer/1"   # the local file ckpt_path="last" resolves to: a pointer, no state
STATE_KEY = "colabkit.AutoResume"          # the callback's entry in a checkpoint's "callbacks"


class CheckpointIO(_LightningCheckpointIO):
    """Lightning's checkpoint storage on `colabkit.Checkpoints` in ``directory`` ("drive:runs/x" or a folder).

    ``save_checkpoint`` stores Lightning's checkpoint dict as a colabkit checkpoint (step: ``global_step``): its
    tensors copied once into reused host buffers, written and committed in the background. Values that are
    neither tensors, arrays nor JSON (an ``nn.Module`` in ``hyper_parameters``, say) are refused with their key.
    ``load_checkpoint`` of the callback's pointer (what ``ckpt_path="last"`` resolves to) restores the newest
    valid committed checkpoint; another path is read with ``torch.load(weights_only=True)``.
    ``remove_checkpoint`` deletes nothing from the store: its retention (``keep``) decides, and never deletes
    the last good checkpoint before a newer one is committed.
    A save at another path than the callback's pointer (a ``ModelCheckpoint``'s) leaves a pointer file there
    naming its step, which ``remove_checkpoint`` deletes; loading one restores the store's newest checkpoint if
    it is that step (waiting for this process's save still being written), and otherwise says so, as it does
    for a pointer into another folder's store. ``teardown`` closes the store once its newest checkpoint is
    uploaded (no uploader thread is left; otherwise the upload goes on retrying); the next save or load opens
    it again. Neither the plugin nor the callback can be pickled (``ddp_spawn``).
    """

    def __init__(self, directory, *, keep=None, keep_every=None, local_dir=None, resume_from=None, verbose=1):
        self.directory, self.verbose = directory, verbose
        self._store_args = {"keep": keep, "keep_every": keep_every, "local_dir": local_dir, "resume_from": resume_from}
        self.checkpoints = Checkpoints(directory, **self._store_args)
        self._closed = False        # teardown closed the store (no uploader thread); the next use opens it again
        self.pointer = _pointer_path(self.checkpoints)
        self.frozen = None          # why later saves are skipped (training stopped after its final save), or None
        self.last_step = None       # the step of the last save taken
        self._periodic = False      # set by the callback around its periodic saves: skip when buffers are busy
        self._wait = False          # set by the callback around final saves: wait this long for the commit
        self._committed = True
        self._state_nbytes = 0
        self.module = None          # the LightningModule being resumed (set by the callback), checked against
        self._checked = None        # Lightning's checkpoint dict that _check decoded, for load_checkpoint
        # Which training a save belongs to, kept in the save and in a ModelCheckpoint's pointer file: a training
        # that starts again in this folder counts its steps from 0 again, and an earlier training's file naming
        # the same step must not load the later training's save. A save at a lower step than the last starts one.
        self._training = None
        self._checked_training = None
        self.write_pointer()

    # -- Lightning's interface -----------------------------------------------------------------------------
    def save_checkpoint(self, checkpoint, path, storage_options=None):
        if self.frozen is not None:
            log.info("colabkit: not saving %s: training stopped (%s) and its checkpoint is the one to resume",
                     os.path.basename(str(path)), self.frozen)
            return
        if storage_options is not None:
            raise TypeError(f"colabkit.torch_lightning.CheckpointIO takes no storage_options (got "
                            f"{storage_options!r}); where checkpoints go is the directory it was given.")
        _check_storable(checkpoint, "")
        tensors = []
        tree = _encode(checkpoint, tensors)
        specs = [_Spec(tuple(t.shape), _host_dtype(t)) for t in tensors]
        self._state_nbytes = sum(int(np.prod(s.shape)) * s.dtype.itemsize for s in specs)
        name = os.path.basename(str(path))

        step = int(checkpoint.get("global_step") or 0)
        if self._training is None or (self.last_step is not None and step < self.last_step):
            self._training = secrets.token_hex(8)
        training = self._training

        def fill(buffers):
            return {"format": FORMAT, "name": name, "training": training, "checkpoint": _fill(tree, buffers)}

        committed = self.store().save_snapshot(
            step, specs, fill, periodic=self._periodic, epoch=checkpoint.get("epoch"), batch=_batch_of(checkpoint),
            info={"reason": "lightning", "name": name}, wait=self._wait,
            copy=lambda index, buffer: _copy_into(buffer, tensors[index]))
        if committed is None:
            self.last_step = None   # the buffers are being written: the callback asks again at the next batch
            return
        self._committed = committed
        self.last_step = step
        self.write_pointer()
        if Path(path).absolute() != self.pointer.absolute():
            # a ModelCheckpoint's file: a pointer to this step, so that its links, best_model_path and
            # ckpt_path="last" / "best" / the path name something
            _write_pointer_file(Path(path), self.directory, step, training)

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        pointer = _read_pointer(path)
        if pointer is None:
            # a checkpoint file of Lightning's own: read without unpickling arbitrary objects
            return TorchCheckpointIO().load_checkpoint(path, map_location=map_location, weights_only=True)
        if not _same_folder(pointer.get("directory"), self.directory):
            raise CheckpointError(f"{path} points into {pointer.get('directory')}, not into {self.directory}, the "
                                  f"folder this colabkit.torch_lightning.CheckpointIO stores in; load it with a "
                                  f"CheckpointIO({pointer.get('directory')!r}). Nothing was restored.")
        wanted = pointer.get("step")
        if not self._closed and wanted is not None and wanted == self.last_step:
            # this process's newest save may still be writing: the path just saved (trainer.save_checkpoint(p),
            # then ckpt_path=p, as Lightning's tuner does) names it, and it is the newest once committed
            self.checkpoints.wait(schedule.final_wait_s(self.estimated_save_s()))
        restored = self.store().restore(check=self._check)
        if restored is None:
            raise CheckpointError(f"{self.directory} holds no valid committed checkpoint to resume from (the "
                                  f"pointer {path} is stale); start without ckpt_path, or pass the folder that "
                                  f"holds one.")
        checkpoint, self._checked = self._checked, None
        if wanted is not None and wanted != restored.step:
            raise CheckpointError(f"{path} names step {wanted} in {self.directory}, whose newest checkpoint is step "
                                  f"{restored.step}; {_ONLY_NEWEST}")
        if pointer.get("training") is not None and pointer["training"] != self._checked_training:
            raise CheckpointError(f"{path} names step {wanted} of another training in {self.directory} (an earlier "
                                  f"one, counted from step 0 again since); the newest checkpoint there, step "
                                  f"{restored.step}, is not that save. {_ONLY_NEWEST}")
        if self._checked_training is not None:
            self._training = self._checked_training   # a resumed training goes on as the same one
        self._say(f"resuming Lightning from step {restored.step} (epoch {restored.epoch}, batch "
                  f"{restored.batch}) in {self.directory}")
        return checkpoint

    def _check(self, restored):
        """Everything a candidate checkpoint holds, checked before Lightning loads any of it (the store calls
        this in restore()): a value that cannot be valid raises InvalidCheckpoint (the store warns and tries
        the previous checkpoint); a valid checkpoint of another model raises CheckpointError."""
        epoch, _ = untrusted.position(restored)
        state = untrusted.mapping(restored.state, "the state")
        if state.get("format") != FORMAT:
            raise CheckpointError(f"{self.directory} holds a checkpoint that colabkit.torch_lightning did not write "
                                  f"(format {state.get('format')!r}); use another folder for Lightning runs.")
        checkpoint = untrusted.mapping(_decode(state.get("checkpoint"), "Lightning's checkpoint"),
                                       "Lightning's checkpoint")
        training = state.get("training")   # absent in saves of earlier versions
        if training is not None and not isinstance(training, str):
            raise untrusted.invalid("its training", training, "a string")
        if untrusted.whole(checkpoint.get("global_step"), "its global_step") != restored.step:
            raise untrusted.invalid("its global_step", checkpoint["global_step"],
                                    f"the manifest's step {restored.step}")
        if untrusted.whole(checkpoint.get("epoch"), "its epoch") != epoch and restored.epoch is not None:
            raise untrusted.invalid("its epoch", checkpoint["epoch"], f"the manifest's epoch {epoch}")
        weights = untrusted.mapping(checkpoint.get("state_dict"), "its state_dict")
        for i, saved in enumerate(untrusted.sequence(checkpoint.get("optimizer_states") or [], "its optimizer_states")):
            check_optimizer_state(saved, f"its optimizer_states[{i}]")
        for i, saved in enumerate(untrusted.sequence(checkpoint.get("lr_schedulers") or [], "its lr_schedulers")):
            untrusted.mapping(saved, f"its lr_schedulers[{i}]")
        untrusted.mapping(checkpoint.get("loops") or {}, "its loops")
        callbacks = untrusted.mapping(checkpoint.get("callbacks") or {}, "its callbacks")
        mine = callbacks.get(STATE_KEY)
        if mine is not None:
            mine = untrusted.mapping(mine, "AutoResume's state")
            check_rng(mine.get("rng"), "AutoResume's RNG states")
            if mine.get("epoch_generators") is not None:
                saved = untrusted.sequence(mine["epoch_generators"], "AutoResume's epoch generators")
                if len(saved) != 2:
                    raise untrusted.invalid("AutoResume's epoch generators", saved, "[epoch, generator states]")
                untrusted.whole(saved[0], "AutoResume's epoch generators' epoch")
                check_generators(saved[1], "AutoResume's epoch generators")
            if not isinstance(mine.get("epoch_end", False), bool):
                raise untrusted.invalid("AutoResume's epoch_end", mine["epoch_end"], "True or False")
        if self.module is not None:
            self._check_fits(restored, weights)
        self._checked, self._checked_training = checkpoint, training

    def _check_fits(self, restored, weights):
        """The weights against the module being resumed: the same keys (unless it loads non-strictly) and shapes."""
        current = self.module.state_dict()
        where = f"The checkpoint at step {restored.step} in {self.directory} does not fit this model"
        if getattr(self.module, "strict_loading", True):
            missing = [k for k in current if k not in weights]
            unexpected = [k for k in weights if k not in current]
            if missing or unexpected:
                raise CheckpointError(f"{where}: " + (f"missing {missing[:5]}" if missing else "")
                                      + ("; " if missing and unexpected else "")
                                      + (f"unexpected {unexpected[:5]}" if unexpected else "")
                                      + ". Resume with the same model, or use another folder. Nothing was restored.")
        for key, value in current.items():
            saved = weights.get(key)
            if isinstance(value, torch.Tensor) and isinstance(saved, torch.Tensor) and saved.shape != value.shape:
                raise CheckpointError(f"{where}: {key} has shape {tuple(saved.shape)} in the checkpoint and "
                                      f"{tuple(value.shape)} now. Resume with the same model, or use another "
                                      f"folder. Nothing was restored.")

    def __getstate__(self):
        raise _not_copyable("colabkit.torch_lightning.CheckpointIO")

    def remove_checkpoint(self, path):
        # a ModelCheckpoint's pointer goes, as its file would; the store's retention (keep) decides what it keeps
        if Path(path).absolute() != self.pointer.absolute() and _read_pointer(path) is not None:
            Path(path).unlink(missing_ok=True)
        log.debug("colabkit: Lightning asked to remove %s; the store's retention (keep) decides instead", path)

    def teardown(self):
        """At the end of fit: wait for the newest checkpoint's upload (at least a minute), then close the store:
        its uploader thread ends, and the folder is freed for other writers. A checkpoint not uploaded by then
        keeps the store open, its upload retried in the background."""
        if not self.checkpoints.wait(schedule.final_wait_s(self.estimated_save_s())):
            # left open: a closed store's uploader gives up at its next failed try, and the newest checkpoint
            # would stay on this VM's disk only; open, it retries with back-off while the process lives
            self._say(f"the newest checkpoint is not on {self.directory} yet: "
                      f"{self.checkpoints.status.last_error or 'its upload is still running'}; it goes on in the "
                      f"background, retried until it is there")
        else:
            self.checkpoints.close(timeout=60.0)
            self._closed = True
        self.write_pointer()

    # -- colabkit's additions ------------------------------------------------------------------------------
    def store(self) -> Checkpoints:
        """The store, opened again when a teardown closed it (a later fit, or trainer.save_checkpoint after fit)."""
        if self._closed:
            self.checkpoints = Checkpoints(self.directory, **self._store_args)
            self._closed = False
        return self.checkpoints

    def estimated_save_s(self) -> float:
        measured = self.checkpoints.estimated_save_seconds()
        return measured if measured is not None else 0.2 + self._state_nbytes / 10e6

    def write_pointer(self) -> None:
        """Keep the pointer that ``ckpt_path="last"`` resolves to: present exactly when the store holds a
        committed checkpoint (or this process has saved one)."""
        try:
            has = self.last_step is not None or bool(self.checkpoints.list())
        except OSError as e:   # Drive unreadable for a moment: the pointer stays as it is
            log.warning("colabkit: could not list %s (%s); the ckpt_path=\"last\" pointer is left as it was",
                        self.directory, e)
            return
        if has:
            self.pointer.parent.mkdir(parents=True, exist_ok=True)
            self.pointer.write_text(json.dumps({"format": POINTER, "directory": str(self.directory)}))
        else:
            self.pointer.unlink(missing_ok=True)

    def _say(self, message):
        _say(message, self.verbose)


class AutoResume(RunAttributes, OnExceptionCheckpoint):
    """A Lightning callback: saves on ``save_freq`` / ``every`` / deadlines / SIGTERM / interrupt into a colabkit
    location, and ``ckpt_path="last"`` resumes from it.

    Args:
        directory: where checkpoints go ("drive:runs/x" or a folder).
        save_freq: also save every this many training batches (None: no batch-count saves).
        every: also save on a wall-clock interval, e.g. "15min".
        deadline: "auto" (save and stop before the runtime cap; also before the idle cutoff when %keepalive is
            on), None, a time budget ("11h30m") counted from the start of training, or a datetime.
        deadline_margin: the least time before a deadline at which the final save starts (default 60s).
        keep, keep_every, local_dir, resume_from: as for `colabkit.Checkpoints`.
        verbose: 1 prints one line per resume/stop; 0 is silent (logging still records).
        thermal_guard: None (the thermal_guard setting, on by default), True, False, or a
            ``colabkit.health.ThermalGuard``: training waits between batches while a GPU stays too hot.

    The callback installs ``self.checkpoint_io`` in the trainer (pass your own ``CheckpointIO`` of another kind
    and it refuses). It is a ``Checkpoint`` callback, so Lightning adds no default ``ModelCheckpoint``: it saves
    at each training epoch's end itself, and after a batch's step (``on_train_batch_end``) when one is due. A
    ``ModelCheckpoint`` of your own beside it is refused (its files would be in the store, not at its path), and
    so is a trainer of several processes (``world_size > 1``: the ranks would not agree when to save).

    On SIGTERM the checkpoint is saved and committed, then training ends with Lightning's ``SIGTERMException``
    (exit status 143). On an interrupt (the notebook's stop button) and before a deadline that ends training, it
    saves, commits and raises `Stopped` (one line in a notebook). Not KeyboardInterrupt: Lightning answers that
    with ``sys.exit(1)`` and leaves SIGINT ignored; a second press before the save is done does just that. After
    such a stop no other save is taken (so the end of a partial epoch is never recorded as a finished one).
    Exceptions of other kinds save nothing: the newest committed checkpoint stays the one to resume.

    Exact resume: the weights, optimizer, scheduler, loop counters (Lightning's) and the RNG states (this
    callback's, restored just before the first training step after the resume; Lightning has fetched the first
    batch by then, so what that fetch draws from the global RNGs, random augmentation say, is fresh). The data
    position mid-epoch is exact with ``torchdata.stateful_dataloader.StatefulDataLoader`` (Lightning saves and
    loads its state); with a plain DataLoader Lightning starts a fresh iterator, so the rest of that epoch sees
    other batches. The
    loader's generators are stored too: mid-epoch they go on as after that epoch's shuffle, and a resume from an
    epoch's end sets them before the next epoch's order is drawn (for a loader passed to ``fit()`` directly).
    """

    def __init__(self, directory, *, save_freq=None, every=None, deadline="auto", deadline_margin=None, keep=None,
                 keep_every=None, local_dir=None, resume_from=None, verbose=1, thermal_guard=None):
        every = check_schedule(save_freq, every)
        watch_for(deadline, started_at=time.time())   # validate it now, not at the first batch
        self._thermal = guard_for(thermal_guard)   # pauses between batches while a GPU is too hot
        self.checkpoint_io = CheckpointIO(directory, keep=keep, keep_every=keep_every, local_dir=local_dir,
                                          resume_from=resume_from, verbose=verbose)
        pointer = self.checkpoint_io.pointer
        super().__init__(dirpath=str(pointer.parent), filename=pointer.stem)
        # what the status panel shows of this run: its store is the CheckpointIO's
        self.record = Run(self, "colabkit.torch_lightning.AutoResume", checkpoints=self.checkpoint_io.checkpoints,
                          deadline=deadline, margin_floor=schedule.margin_floor(deadline_margin), verbose=verbose)
        self.directory, self.save_freq, self.every = directory, save_freq, every
        self.stopped_for = None      # why training was stopped (a deadline, a signal), or None
        self._pending_rng = None     # RNG states of the checkpoint being resumed, set before its next step
        self._at_epoch_end = False   # saving at an epoch's end (the next epoch's order comes from the generators)
        self._epoch_generators = None   # (epoch, the train loader's generator states once the epoch drew from them)
        self._since_save, self._last_save_time = 0, time.time()
        self._step_mark = None       # health.progress.StepMark: the last step reached, for the next resume
        self._signals = SignalLatch()
        self._watch = None
        if self._thermal is not None:
            self._thermal.attach(self.record)

    @property
    def state_key(self) -> str:
        return STATE_KEY

    # -- Lightning hooks -----------------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage):
        if trainer.world_size > 1:
            # each rank would decide on its own clock when a deadline/every/signal save is due, and
            # trainer.save_checkpoint ends in a barrier: ranks that disagree would hang
            raise ValueError(f"colabkit.torch_lightning.AutoResume runs in one process; this trainer has "
                             f"world_size={trainer.world_size} (strategy {type(trainer.strategy).__name__}). Train "
                             f"with devices=1 (and num_nodes=1), or use colabkit.torch.AutoResume in a plain "
                             f"PyTorch loop, which agrees every save across ranks under torchrun.")
        others = [type(c).__name__ for c in trainer.callbacks if isinstance(c, ModelCheckpoint)]
        if others:
            # its files would live in the store, not at its dirpath: best_model_path and ckpt_path="best" break
            raise ValueError(f"the trainer has a {others[0]} callback beside colabkit.torch_lightning.AutoResume, "
                             f"which stores every checkpoint in {self.directory} and saves at each epoch's end "
                             f"itself. Remove the ModelCheckpoint from Trainer(callbacks=...); to keep a best "
                             f"model, save its weights yourself (torch.save(model.state_dict(), ...)) when the "
                             f"metric improves.")
        current = trainer.strategy._checkpoint_io
        if current is not None and current is not self.checkpoint_io and type(current) is not TorchCheckpointIO:
            raise ValueError(f"the trainer already has a CheckpointIO plugin ({type(current).__name__}); "
                             f"colabkit.torch_lightning.AutoResume stores checkpoints through its own "
                             f"(ar.checkpoint_io). Remove the other plugin from Trainer(plugins=...).")
        trainer.strategy.checkpoint_io = self.checkpoint_io
        self.record.checkpoints = self.checkpoint_io.store()
        self.checkpoint_io.frozen = None
        self.checkpoint_io.module = pl_module   # what a resume's checkpoint is checked against before loading
        _check_storable_before_training(trainer, pl_module)

    def on_train_start(self, trainer, pl_module):
        ensure_recording()    # the flight recorder (colabkit health --last after a freeze)
        self.stopped_for, self._interrupt = None, None
        self._since_save, self._last_save_time = 0, time.time()
        self._watch = watch_for(self.deadline, started_at=time.time(), margin_floor=self.margin_floor)
        loader = getattr(trainer, "train_dataloader", None)
        stateless = loader is not None and not callable(getattr(loader, "state_dict", None))
        if stateless and self._resumed_mid_epoch(trainer):
            self._say(f"the training DataLoader ({type(loader).__name__}) has no state_dict: Lightning resumes this "
                      f"epoch from a fresh iterator, so its remaining batches are not the uninterrupted run's. Use "
                      f"torchdata.stateful_dataloader.StatefulDataLoader for an exact mid-epoch resume.")
        if trainer.global_rank == 0:
            self.checkpoint_io.store().claim()
            # books the steps this resume trains again in the cost ledger
            self._step_mark = start_mark(self.directory, trainer.global_step)
        self._install_signal_handlers()
        if self._thermal is not None:
            self._thermal.start()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        generators = generators_of(trainer.train_dataloader) if trainer.train_dataloader is not None else []
        pending, self._pending_rng = self._pending_rng, None
        if pending is not None:   # just before the resumed run's first step draws from them
            _set_rng(pending["rng"])
            saved = pending.get("epoch_generators")
            # resumed mid-epoch: the loader's position is Lightning's (a StatefulDataLoader's state), and its
            # generators go on as they were after this epoch's shuffle, so the next epoch's order is the same
            if saved is not None and saved[0] == trainer.current_epoch:
                set_generators(saved[1], generators)
        if self._epoch_generators is None or self._epoch_generators[0] != trainer.current_epoch:
            # the epoch's iterator has drawn its order (and its workers' seed) from them by now
            self._epoch_generators = (trainer.current_epoch, [g.get_state().numpy().copy() for g in generators])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._since_save += 1
        if self._step_mark is not None:
            self._step_mark.reached(trainer.global_step)
        if self._thermal is not None:   # a hot GPU: wait here, between two batches (a signal or deadline ends it)
            self._thermal.wait_if_hot(lambda: pause_must_end(self._interrupt, self._watch,
                                                             self.checkpoint_io.estimated_save_s))
        if _on_last_batch(trainer):
            # Lightning's loops restored from a save taken after an epoch's last step skip the next epoch
            # (Lightning 2.6): what is due now is saved at the epoch's end instead, as that epoch's end
            return
        decision, name, deadline = self._due(trainer)
        if not self._stop_or_deadline_save(trainer, decision, name, deadline) and decision:
            self._save(trainer, decision.reason, periodic=True)

    def on_train_epoch_end(self, trainer, pl_module):
        # as Lightning's default ModelCheckpoint would (this callback, a Checkpoint, takes its place); a stop or
        # deadline due now (or on the epoch's last batch) is saved here too
        self._at_epoch_end = True
        try:
            if not self._stop_or_deadline_save(trainer, *self._due(trainer)):
                self._save(trainer, "epoch")
        finally:
            self._at_epoch_end = False

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        """Resumed from an epoch's end: Lightning makes the next epoch's iterator before any other hook that can
        reach the loader, drawing its order from the loader's generator, which this process has just seeded.
        Put the generators where the finished epoch left them first (a DataLoader passed to fit() directly)."""
        mine = (checkpoint.get("callbacks") or {}).get(self.state_key) or {}
        saved = mine.get("epoch_generators")
        loader = getattr(getattr(trainer.fit_loop, "_data_source", None), "instance", None)
        if not mine.get("epoch_end") or saved is None or not isinstance(loader, torch.utils.data.DataLoader):
            return
        set_generators(saved[1], generators_of(loader))

    def on_exception(self, trainer, pl_module, exception):
        # only a stop this callback did not see coming (Lightning's own SIGTERMException at an epoch's end)
        # saves here; any other exception may have left a half-done step, so the newest checkpoint stays
        if isinstance(exception, SIGTERMException) and self.stopped_for is None:
            self._final_save(trainer, "SIGTERM received")
        self._restore_signal_handlers()
        if self._thermal is not None:
            self._thermal.stop()

    def on_train_end(self, trainer, pl_module):
        # before Lightning's teardown puts back the handlers it found: restored after it, they would be
        # Lightning's per-run ones (SIGTERM ignored, the trainer kept alive)
        self._restore_signal_handlers()
        if self._thermal is not None:
            self._thermal.stop()

    def teardown(self, trainer, pl_module, stage):
        self.checkpoint_io.module = None   # never removes anything: the store keeps what it committed

    def __getstate__(self):
        raise _not_copyable("colabkit.torch_lightning.AutoResume")

    def state_dict(self):
        epoch_generators = None if self._epoch_generators is None else list(self._epoch_generators)
        return {"rng": _rng_state(), "epoch_generators": epoch_generators, "epoch_end": self._at_epoch_end}

    def load_state_dict(self, state_dict):
        self._pending_rng = state_dict
        self._epoch_generators = None

    # -- saving ----------------------------------------------------------------------------------------------
    def _save(self, trainer, reason, *, wait=False, periodic=False, event="save") -> bool:
        io = self.checkpoint_io
        io._periodic, io._wait = periodic, wait
        try:
            trainer.save_checkpoint(self.ckpt_path, weights_only=False)
        finally:
            io._periodic, io._wait = False, False
        if io.last_step is None:   # buffers busy with the previous write: asked again at the next batch
            return False
        self._since_save, self._last_save_time = 0, time.time()
        self.record.event(event, f"step {trainer.global_step} ({reason})")
        return io._committed

    def _due(self, trainer):
        """(the save decision, the signal received or None, the deadline due or None) now."""
        name = self._interrupt
        deadline = None
        if not name and self._watch is not None:
            deadline = self._watch.due(self.checkpoint_io.estimated_save_s())
        policy = SavePolicy(self.save_freq, self.every)
        decision = policy.should_save(trainer.global_step, SaveContext(
            self._since_save, policy.every_due(time.time() - self._last_save_time), name, deadline))
        return decision, name, deadline

    def _stop_or_deadline_save(self, trainer, decision, name, deadline) -> bool:
        """Save for a signal (then stop) or a deadline (then stop, or go on before the idle cutoff); True when
        it saved, False when neither is due."""
        if decision.reason == "signal":
            self._final_save(trainer, f"{name} received")
            self._restore_signal_handlers()
            if name == "SIGTERM":
                raise SIGTERMException(128 + signal.SIGTERM)
            # not KeyboardInterrupt: Lightning turns that into sys.exit(1) and leaves SIGINT ignored afterwards
            raise Stopped(f"{name} received: saved step {trainer.global_step} and stopped training. Re-run this "
                          f"cell (trainer.fit(..., ckpt_path=\"last\")) to resume.")
        if decision.reason != "deadline":
            return False
        self._watch.mark_handled(deadline)
        left = max(1.0, deadline.at - time.time())
        if deadline.stop_training:
            why = f"{deadline.reason} is {format_duration(deadline.at - time.time())} away"
            self._final_save(trainer, why, timeout=left, event="deadline-save")
            raise Stopped(f"{why}: saved step {trainer.global_step} and stopped training. Re-run this cell "
                          f"(trainer.fit(..., ckpt_path=\"last\")) to resume.")
        self._save(trainer, f"before {deadline.reason}", wait=left, event="deadline-save")
        self._say(f"saved step {trainer.global_step} before {deadline.reason}; training continues")
        return True

    def _final_save(self, trainer, why, timeout=None, event="save"):
        wait = self.record.final_wait_s(self.checkpoint_io.estimated_save_s()) if timeout is None else timeout
        committed = self._save(trainer, why, wait=wait, event=event)
        self.stopped_for = why
        self.record.event("stop", why)
        self.checkpoint_io.frozen = why
        where = (f"committed to {self.directory}" if committed else
                 f"NOT yet on {self.directory}: {self.checkpoint_io.checkpoints.status.last_error or 'upload running'}")
        self._say(f"{why}: saved step {trainer.global_step} ({where}) and stopped training. Re-run this cell to "
                  f"resume.")

    def _resumed_mid_epoch(self, trainer) -> bool:
        progress = trainer.fit_loop.epoch_loop.batch_progress
        return trainer.fit_loop.restarting and progress.current.completed > 0

    # -- signals ---------------------------------------------------------------------------------------------
    def _install_signal_handlers(self):
        self._signals.install()

    def _restore_signal_handlers(self):
        self._signals.restore()


# -- helpers ------------------------------------------------------------------------------------------------

_ONLY_NEWEST = ("colabkit.torch_lightning.CheckpointIO restores only the newest (ckpt_path=\"last\", or the path of "
                "the newest save). Nothing was restored.")

def _not_copyable(what) -> ValueError:
    """Why the plugin and the callback cannot be pickled: they hold the store's uploader thread and its claim on the
    folder, which belong to this process. strategy="ddp_spawn" pickles the trainer to start its processes, so it
    is refused here, before any starts, as every trainer of several processes is."""
    return ValueError(f"{what} runs in one process and cannot be pickled (it holds this process's background "
                      f"uploader and its claim on the checkpoint folder). A trainer with strategy=\"ddp_spawn\" "
                      f"pickles it to start its processes; torch.save(trainer) pickles it too. Train with devices=1 "
                      f"(and num_nodes=1), or use colabkit.torch.AutoResume in a plain PyTorch loop under torchrun, "
                      f"which agrees every save across ranks; save the weights with "
                      f"torch.save(model.state_dict(), path) (trainer.save_checkpoint(path) saves into the store "
                      f"and leaves only a pointer file at path).")


def _say(message, verbose):
    log.info("colabkit: %s", message)
    if verbose:
        print(f"colabkit: {message}", flush=True)


def _pointer_path(checkpoints) -> Path:
    """A local file per destination, beside the store's local staging folder (a fresh VM has none until the
    store is found to hold a checkpoint)."""
    local = Path(checkpoints.local.path)
    return local.parent / f"{local.name}.lightning" / "last.ckpt"


def _read_pointer(path) -> dict | None:
    """The pointer file at ``path`` ({"format", "directory", and "step" for a ModelCheckpoint's}), or None when
    it is not one (a checkpoint file of Lightning's own, or nothing)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    if POINTER.encode() not in head:
        return None
    try:
        pointer = json.loads(head)
    except ValueError:
        return None
    return pointer if isinstance(pointer, dict) and isinstance(pointer.get("step", 0), int) else None


def _same_folder(named, directory) -> bool:
    """Whether a pointer's ``directory`` (as written) names the store in ``directory``, however spelled."""
    if named is None or str(named) == str(directory):
        return True
    try:
        return str(resolve_destination(named)) == str(resolve_destination(directory))
    except (ValueError, OSError):
        return False


def _write_pointer_file(path: Path, directory, step: int, training: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)   # a link ModelCheckpoint made there: replace the link, not what it points to
    path.write_text(json.dumps({"format": POINTER, "directory": str(directory), "step": step,
                                "training": training}))


def _on_last_batch(trainer) -> bool:
    """Whether the batch just trained is its epoch's last (as Lightning's training epoch loop decides it)."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return progress.is_last_batch or progress.current.ready == trainer.num_training_batches


def _batch_of(checkpoint) -> int | None:
    try:
        return int(checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["processed"])
    except (KeyError, TypeError, ValueError):
        return None


def _check_storable(value, where, outcome="Nothing was saved."):
    """Refuse, naming the key, a value (or a dict key) that could only be stored by pickling it."""
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor, np.ndarray, np.generic,
                                           torch.dtype, torch.device)):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int, float, type(None))):   # JSON's scalars, as the store's codec
                _refuse(f"{where} with a key {key!r} of type {type(key).__name__}", where, type(key), outcome)
            _check_storable(item, f"{where}[{key!r}]", outcome)
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_storable(item, f"{where}[{i}]", outcome)
        return
    _refuse(f"{where} of type {type(value).__name__}", where, type(value), outcome)


def _refuse(what, where, kind, outcome):
    if "hyper_parameters" not in where:
        hint = " Return only tensors, numbers, strings, lists and dicts with string keys from state_dict()."
    elif kind.__module__.split(".")[0] == "omegaconf":   # a DictConfig / ListConfig
        hint = " Save plain values: self.save_hyperparameters(OmegaConf.to_container(cfg, resolve=True))."
    else:
        hint = (" Leave it out of the saved hyperparameters (self.save_hyperparameters(ignore=[...])) or save a "
                "name or number instead.")
    raise CheckpointError(f"Lightning's checkpoint holds {what}, which colabkit stores only by pickling, and it "
                          f"never pickles.{hint} {outcome}")


def _check_storable_before_training(trainer, pl_module):
    """What every save will hold besides tensors and loop counters (the hyperparameters, the callbacks' states),
    checked at setup: a value that needs pickle is refused now, not at the first save an epoch later."""
    outcome = "Refused before training: nothing was trained or saved."
    for owner, key in ((pl_module, "hyper_parameters"), (trainer.datamodule, "datamodule_hyper_parameters")):
        hparams = getattr(owner, "hparams", None)
        if hparams:   # as Lightning stores them: a dict's items, or the config object itself
            _check_storable(dict(hparams) if isinstance(hparams, dict) else hparams, f"[{key!r}]", outcome)
    for callback in trainer.callbacks:
        state = callback.state_dict()
        if state:
            _check_storable(state, f"['callbacks'][{callback.state_key!r}]", outcome)
