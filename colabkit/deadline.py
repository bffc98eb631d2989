"""Clocks that say when the runtime may vanish, feeding one save-before-the-deadline mechanism.

Two clocks ship with colabkit: the runtime cap (VM uptime vs the configured cap) and any clock another
part registers (the keep-alive feature registers an idle clock). Each clock answers ``next_deadline()``
with a Deadline or None. A Deadline with ``stop_training`` ends training after its save (the cap); one
without only forces an uploaded checkpoint (an idle cutoff that a returning browser can still prevent).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import threading
import time

from .units import DURATION_FORMS, parse_duration


@dataclasses.dataclass(frozen=True)
class Deadline:
    at: float              # wall-clock time (time.time()) by which a checkpoint must be committed
    reason: str            # shown to the user: "the 12h runtime cap", "the 90min idle cutoff"
    stop_training: bool    # True: save, then stop; False: save and upload now, keep training
    key: str               # the same key means the same event; it is handled once


class RuntimeCapClock:
    """The VM's runtime cap from the session clock (colabkit.env())."""

    def __init__(self, environment=None):
        from .runtime import env
        self.environment = environment or env()

    def next_deadline(self) -> Deadline | None:
        e = self.environment
        if e.cap_at is None:
            return None
        from .units import format_duration
        return Deadline(at=e.cap_at, reason=f"the {format_duration(e.runtime_cap)} runtime cap ({e.kind})",
                        stop_training=True, key=f"cap@{e.cap_at:.0f}")


class FixedClock:
    """A deadline at a fixed wall-clock time (a simulated cap, or a user's own budget)."""

    def __init__(self, at: float, reason: str = "the configured deadline"):
        self.at, self.reason = at, reason

    def next_deadline(self) -> Deadline:
        return Deadline(at=self.at, reason=self.reason, stop_training=True, key=f"fixed@{self.at:.3f}")


_registered: list = []
_lock = threading.Lock()


def register(clock) -> None:
    """Add a clock consulted by every ``deadline="auto"`` (e.g. the idle clock of %keepalive)."""
    with _lock:
        if clock not in _registered:
            _registered.append(clock)


def unregister(clock) -> None:
    with _lock:
        if clock in _registered:
            _registered.remove(clock)


def registered() -> list:
    with _lock:
        return list(_registered)


MARGIN_FLOOR_S = 60.0   # the least time before a deadline at which the final save starts (deadline_margin)


class DeadlineWatch:
    """The clocks one training run listens to, and the rule for when to start the final save."""

    def __init__(self, clocks: list, *, margin_floor: float = MARGIN_FLOOR_S, safety_factor: float = 3.0,
                 include_registered: bool = False):
        self.clocks = clocks
        self.include_registered = include_registered
        self.margin_floor, self.safety_factor = margin_floor, safety_factor
        self.handled: set[str] = set()

    def margin(self, estimated_save_s: float) -> float:
        """Seconds before a deadline at which the save starts: measured save+upload time x safety, floored."""
        return max(self.margin_floor, self.safety_factor * estimated_save_s)

    def due(self, estimated_save_s: float, now: float | None = None) -> Deadline | None:
        """The earliest unhandled deadline whose save must start now, or None."""
        now = time.time() if now is None else now
        clocks = self.clocks + (registered() if self.include_registered else [])
        due = []
        for clock in clocks:
            d = clock.next_deadline()
            if d is not None and d.key not in self.handled and now >= d.at - self.margin(estimated_save_s):
                due.append(d)
        return min(due, key=lambda d: d.at) if due else None

    def mark_handled(self, deadline: Deadline) -> None:
        self.handled.add(deadline.key)


def watch_for(deadline, *, started_at: float, margin_floor: float = MARGIN_FLOOR_S) -> DeadlineWatch:
    """Build the watch for AutoResume's ``deadline`` argument.

    "auto": the runtime cap of this session (if any) and registered clocks (idle cutoff);
    None / "off": no deadline; a duration ("11h30m", seconds): a time budget from ``started_at``;
    a datetime (ValueError once it has passed) or an object with next_deadline(): as given.
    """
    if deadline is None or (isinstance(deadline, str) and deadline.strip().lower() in ("off", "none")):
        return DeadlineWatch([], margin_floor=margin_floor)
    if isinstance(deadline, str) and deadline.strip().lower() == "auto":
        return DeadlineWatch([RuntimeCapClock()], margin_floor=margin_floor, include_registered=True)
    if isinstance(deadline, _dt.datetime):
        if deadline.timestamp() <= time.time():
            zone = "" if deadline.tzinfo else " (a datetime without tzinfo is read in this machine's time zone)"
            now = _dt.datetime.now(deadline.tzinfo)
            raise ValueError(f"deadline={deadline!r} ({deadline:%Y-%m-%d %H:%M:%S}) has already passed: it is "
                             f"{now:%Y-%m-%d %H:%M:%S} now{zone}. Pass a later time, a time budget such as "
                             f"\"11h30m\", or \"auto\".")
        return DeadlineWatch([FixedClock(deadline.timestamp())], margin_floor=margin_floor)
    if hasattr(deadline, "next_deadline"):
        return DeadlineWatch([deadline], margin_floor=margin_floor)
    try:
        budget = parse_duration(deadline, name="deadline")
    except ValueError:
        raise ValueError(f"deadline={deadline!r} is invalid; expected \"auto\", None, a datetime, or {DURATION_FORMS} "
                         f"(a time budget counted from the start of training).") from None
    from .units import format_duration
    return DeadlineWatch([FixedClock(started_at + budget, reason=f"the {format_duration(budget)} time budget")],
                         margin_floor=margin_floor)
