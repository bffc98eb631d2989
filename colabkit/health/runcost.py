"""One run's cost as it goes: its energy meter, the prices, and its ledger record (appended every few minutes and
at the end). Used by the training monitor (a fit) and by `colabkit run` (each job attempt)."""
from __future__ import annotations

import logging
import time

from . import ledger, prices
from .energy import EnergyMeter

log = logging.getLogger("colabkit")


class RunCost:
    """``start()``, then ``sample()`` every second or so, ``summary()`` for reports, ``book()`` for the ledger.

    Args:
        kind: "fit" or "job" (the ledger's record kind).
        project: the ledger's project; None: the ``project`` setting, else ``fallback`` (a job's name), else
            the working folder's name.
        gpus, own_pids, cpu: see :class:`colabkit.health.energy.EnergyMeter`.
        book: append to the ledger (False: report only, e.g. a fit inside a `colabkit run` job, which the queue
            books).
    """

    def __init__(self, kind: str = "fit", *, project: str | None = None, fallback: str | None = None, gpus=None,
                 own_pids=None, cpu=True, book: bool = True, settings=None):
        if settings is None:
            from .. import config
            settings = config.load()
        self.settings, self.kind, self.book_enabled = settings, kind, book
        self.project = project or ledger.default_project(settings, fallback)
        self.meter = EnergyMeter(gpus, own_pids=own_pids, cpu=cpu)
        self.id = ledger.new_id()
        self.started = None
        self.lost_gpu_hours = 0.0
        self.lost_steps = 0
        self._next_book = 0.0
        self.final = False

    def start(self) -> RunCost:
        self.started = time.time()
        self.meter.start()
        self._next_book = time.monotonic() + ledger.APPEND_EVERY
        return self

    def sample(self, cpu_share: float = 1.0) -> None:
        self.meter.sample(cpu_share)
        if self.book_enabled and not self.final and time.monotonic() >= self._next_book:
            self._next_book = time.monotonic() + ledger.APPEND_EVERY
            self.book()

    def summary(self) -> dict:
        """The reading (energy.EnergyMeter.reading) with money, currency, cloud, saved and a ``text`` line."""
        reading = self.meter.reading()
        priced = prices.costs_of(reading, self.settings)
        out = dict(reading, **priced, project=self.project, lost_gpu_hours=self.lost_gpu_hours,
                   lost_steps=self.lost_steps)
        out["cloud_cost"] = priced["cloud"]["cost"] if priced["cloud"] else None
        out["text"] = prices.line(reading, priced)
        return out

    def book(self, final: bool = False) -> dict | None:
        """Append the totals so far to the ledger (the last record of this run's id counts); never raises."""
        if not self.book_enabled or self.started is None or self.final:
            return None
        self.final = final
        try:
            reading = self.meter.reading()
            record = ledger.record_of(self.id, self.kind, reading, prices.costs_of(reading, self.settings),
                                      project=self.project, start=self.started,
                                      lost_gpu_hours=self.lost_gpu_hours, lost_steps=self.lost_steps, final=final)
            ledger.append(record, ledger.ledger_path(self.settings))
            return record
        except Exception as exc:  # noqa: BLE001 - a ledger that cannot be written never fails the run
            log.warning("colabkit: could not append to the cost ledger: %s", exc)
            return None
