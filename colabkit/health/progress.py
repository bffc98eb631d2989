"""Batches trained twice: the last step a run reached, kept on this machine per checkpoint folder, so that the
next attempt's restore can tell how far back it went (lost = last step reached - restored step) and book it in
the cost ledger (a record of kind "resume").

The step is written at most every ``EVERY`` seconds, so a crash can hide the last few seconds of steps (the
figure is then a little low), and a resume on another machine (a new Colab VM) finds no mark and counts none.
Every AutoResume (PyTorch, Lightning, Keras, Hugging Face Trainer, AccelerateResume) calls ``start_mark()``
after its restore and ``reached()`` after each batch.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time

log = logging.getLogger("colabkit")

EVERY = 10.0    # seconds between writes of the step reached


class StepMark:
    """The step-reached mark of one checkpoint folder (``directory``: what the AutoResume was given)."""

    def __init__(self, directory, settings=None):
        from . import ledger
        if settings is None:
            from .. import config
            settings = config.load()
        self.settings = settings
        self.directory = str(directory)
        # the folder itself, not the words for it: "checkpoints" in two projects are two folders
        where = self.directory if "://" in self.directory else os.path.abspath(os.path.expanduser(self.directory))
        key = hashlib.sha1(where.encode()).hexdigest()[:16]
        self.path = ledger.ledger_path(settings).parent / "progress" / f"{key}.json"
        self._next = 0.0
        self.lost = 0

    def last(self) -> int | None:
        try:
            return int(json.loads(self.path.read_text())["step"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def restored(self, step: int) -> int:
        """The run starts from ``step`` (0: no checkpoint): books the steps the previous attempt reached beyond
        it; returns them. Never raises."""
        try:
            last = self.last()
            self.lost = max(0, last - int(step)) if last is not None else 0
            if self.lost:
                from . import ledger
                record = ledger.record_of(ledger.new_id(), "resume", {}, {}, project=ledger.default_project(
                    self.settings, os.environ.get("COLABKIT_JOB")), start=time.time(), lost_steps=self.lost,
                    final=True)
                record["checkpoints"] = self.directory
                ledger.append(record, ledger.ledger_path(self.settings))
            self._write(int(step))
        except Exception as exc:  # noqa: BLE001 - a cost figure never stops training
            log.debug("colabkit: step mark of %s: %s", self.directory, exc)
        return self.lost

    def reached(self, step: int) -> None:
        """After a batch: cheap (a clock read) until ``EVERY`` seconds have passed."""
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + EVERY
        try:
            self._write(int(step))
        except Exception as exc:  # noqa: BLE001
            log.debug("colabkit: step mark of %s: %s", self.directory, exc)

    def _write(self, step: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"step": step, "t": time.time(), "checkpoints": self.directory}))
        os.replace(tmp, self.path)


def start_mark(directory, step: int) -> StepMark | None:
    """The mark of ``directory`` after a restore at ``step`` (0: none found), the lost steps booked; None where
    it cannot be kept (a bad setting: the training goes on without it)."""
    try:
        mark = StepMark(directory)
    except Exception as exc:  # noqa: BLE001 - a cost figure never stops training
        log.debug("colabkit: no step mark for %s: %s", directory, exc)
        return None
    mark.restored(step)
    return mark
