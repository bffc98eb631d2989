"""The run record: what an AutoResume did (events, messages) and what the status panel shows of it.

Every AutoResume (Keras, PyTorch, Lightning) keeps one `Run` and writes its events and messages there; the status
panel (colabkit.widgets, ``%colabkit``) reads them through ``latest_run_and_store()``. ``track(obj)`` makes a run, an
AutoResume or a bare ``Checkpoints`` visible to the panel; the registry holds weak references (nothing is kept alive
by it).
"""
from __future__ import annotations

import logging
import sys
import threading
import time
import weakref

from . import schedule

__all__ = ["Run", "latest_run_and_store", "recorded", "track"]

log = logging.getLogger("colabkit")

DEADLINE_EVENTS = ("stop", "deadline-save")   # the events the panel's "last deadline save" row shows


class Run:
    """The record of one AutoResume (``name``, as the panel shows it): ``events`` ((wall time, kind, detail):
    "restore", "save", "deadline-save", "stop"), its store (``checkpoints``), ``deadline`` and ``margin_floor``
    (for the panel's next deadline save) and ``verbose`` (``say`` prints only then, and only where ``quiet`` is
    False: rank 0 of a distributed run).
    ``owner`` is the AutoResume (weakly). It registers itself with the panel."""

    def __init__(self, owner, name: str, *, checkpoints=None, deadline="auto",
                 margin_floor=schedule.DEADLINE_MARGIN_S, verbose=1, quiet=False):
        self._owner = weakref.ref(owner)
        self.name = name   # what the panel calls it: "colabkit.keras.AutoResume"
        self.checkpoints, self.deadline, self.margin_floor = checkpoints, deadline, margin_floor
        self.verbose, self.quiet = verbose, quiet
        self.events: list = []
        self.created = time.time()
        track(self)

    @property
    def owner(self):
        """The AutoResume this run belongs to, or None once it is gone."""
        return self._owner()

    def event(self, kind: str, detail: str) -> None:
        self.events.append((time.time(), kind, detail))

    def say(self, message: str) -> None:
        """Log ``message``; print it too when verbose."""
        log.info("colabkit: %s", message)
        if self.verbose and not self.quiet:
            print(f"colabkit: {message}", flush=True)

    def final_wait_s(self, estimated_save_s: float) -> float:
        """How long a final save waits for its upload (see schedule.final_wait_s)."""
        return schedule.final_wait_s(estimated_save_s)

    def last_deadline_save(self):
        """(wall time, detail) of the newest deadline save or stop, or None."""
        for t, kind, detail in reversed(list(self.events)):
            if kind in DEADLINE_EVENTS:
                return t, detail
        return None


class recorded:
    """An AutoResume attribute that lives in its run record (``self.record``): ``events = recorded("events")``."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj.record, self.name)

    def __set__(self, obj, value):
        setattr(obj.record, self.name, value)

class RunAttributes:
    """What every AutoResume keeps in its run record (``self.record``) and its signal latch (``self._signals``),
    read and written as attributes of its own."""
    events = recorded("events")             # (wall time, event, detail) for timelines and the status panel
    deadline = recorded("deadline")
    margin_floor = recorded("margin_floor")
    verbose = recorded("verbose")

    def _say(self, message: str):
        self.record.say(message)

    def _event(self, kind: str, detail: str):
        self.record.event(kind, detail)

    @property
    def _interrupt(self):
        """"SIGINT" / "SIGTERM" once received (latched by the signal handler), else None."""
        return self._signals.received

    @_interrupt.setter
    def _interrupt(self, name):
        self._signals.received = name


# -- the registry the status panel reads ---------------------------------------------------------------------
_tracked: list = []          # weakref.ref to Run and Checkpoints objects, oldest first
_tracked_lock = threading.Lock()


def track(obj):
    """Make a run record, an AutoResume (its ``record``) or a Checkpoints visible to the status panel, weakly.
    Returns ``obj``."""
    target = getattr(obj, "record", None)
    target = target if isinstance(target, Run) else obj
    with _tracked_lock:
        _tracked[:] = [r for r in _tracked if r() is not None]
        if not any(r() is target for r in _tracked):
            _tracked.append(weakref.ref(target))
    return obj


def _is_store(obj) -> bool:
    return hasattr(obj, "status") and hasattr(obj, "list") and hasattr(obj, "destination")


def latest_run_and_store():
    """(Run or None, Checkpoints or None): the store that saved most recently and the run writing to it (the
    newest run when no store is known)."""
    with _tracked_lock:
        objs = [o for o in (r() for r in _tracked) if o is not None]
    runs = [o for o in objs if isinstance(o, Run) and o.owner is not None]
    stores = [o for o in objs if not isinstance(o, Run) and _is_store(o)]
    stores += [r.checkpoints for r in runs if r.checkpoints is not None]
    api = sys.modules.get("colabkit.checkpoints.api")
    stores += list(getattr(api, "_OPEN", ()) or ())   # open Checkpoints, also those nobody tracked
    unique = list({id(s): s for s in stores}.values())
    if not unique:
        return (runs[-1] if runs else None), None

    def activity(item):
        """When the store was last active: its newest save, or a run of it starting or saying something (a run
        that has not saved yet must not be hidden behind an older store that has)."""
        index, store = item
        info = _last_info(store)
        times = [info.created] if info is not None else []
        for run in runs:
            if run.checkpoints is store:
                times += [run.created] + [t for t, _, _ in run.events[-1:]]
        return (max(times, default=float("-inf")), index)

    _, store = max(enumerate(unique), key=activity)
    run = next((r for r in reversed(runs) if r.checkpoints is store), None)
    return run, store


def _last_info(store):
    try:
        s = store.status
    except Exception:  # noqa: BLE001 - a closed or half-built store
        return None
    return s.last_local or s.last_uploaded
