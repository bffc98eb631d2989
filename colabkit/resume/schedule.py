"""When an AutoResume saves: the save decision at each step boundary, the final-save wait and the deadline margin."""
from __future__ import annotations

import dataclasses

from ..deadline import MARGIN_FLOOR_S as DEADLINE_MARGIN_S
from ..units import DURATION_FORMS, parse_duration

__all__ = ["DEADLINE_MARGIN_S", "FINAL_WAIT_FLOOR_S", "NO_SAVE", "SaveContext", "SaveDecision", "SavePolicy",
           "check_schedule", "final_wait_s", "margin_floor"]

FINAL_WAIT_FLOOR_S = 60.0   # a final save waits at least this long for its upload


def final_wait_s(estimated_save_s: float) -> float:
    """How long a final save waits for its upload: generous, but bounded, so a destination that stays down (a
    dropped mount cannot come back while the cell runs) does not hang the notebook."""
    return max(FINAL_WAIT_FLOOR_S, 3 * estimated_save_s)


def check_schedule(save_freq, every, *, unit: str = "batches"):
    """An AutoResume's save_freq (a whole number of ``unit``, at least 1, or None) and every (a duration or None),
    checked: returns ``every`` in seconds (or None). ValueError names the value and what is expected."""
    if save_freq is not None and (isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1):
        raise ValueError(f"save_freq={save_freq!r} is invalid: pass a number of {unit} (at least 1), or None "
                         f"for no {unit}-count saves.")
    if every is not None:
        try:
            every = parse_duration(every, name="every")
        except ValueError:
            raise ValueError(f"every={every!r} is invalid: pass None or {DURATION_FORMS}.") from None
    return every


def margin_floor(deadline_margin) -> float:
    """AutoResume's ``deadline_margin`` argument in seconds (None: the default, DEADLINE_MARGIN_S)."""
    return DEADLINE_MARGIN_S if deadline_margin is None else parse_duration(deadline_margin, name="deadline_margin")


@dataclasses.dataclass(frozen=True)
class SaveContext:
    """What one step boundary knows: the steps and whether the ``every`` interval passed since the last save, the
    signal latched since (``SignalLatch.received``) and the deadline whose save is due (``DeadlineWatch.due``)."""
    steps_since_save: int = 0
    every_due: bool = False
    signal: str | None = None
    deadline: object = None     # a colabkit.deadline.Deadline, or None


@dataclasses.dataclass(frozen=True)
class SaveDecision:
    """One step boundary's decision: ``reason`` ("signal", "deadline", "save_freq", "every") or None (no save);
    ``stop``: training stops once it is saved; ``deadline``: the deadline it is for."""
    reason: str | None = None
    stop: bool = False
    deadline: object = None

    def __bool__(self) -> bool:
        return self.reason is not None


NO_SAVE = SaveDecision()


class SavePolicy:
    """When an AutoResume saves between steps (in the spirit of Orbax's SaveDecisionPolicy): a latched signal
    first (save, then stop), then a due deadline (save; stop when it ends training), then every ``save_freq``
    steps, then the ``every`` wall-clock interval (seconds). Epoch ends and the end of training are the adapters'."""

    def __init__(self, save_freq: int | None = None, every: float | None = None):
        self.save_freq, self.every = save_freq, every

    def every_due(self, seconds_since_save: float) -> bool:
        return bool(self.every) and seconds_since_save >= self.every

    def should_save(self, step: int, context: SaveContext) -> SaveDecision:
        if context.signal:
            return SaveDecision("signal", stop=True)
        if context.deadline is not None:
            return SaveDecision("deadline", stop=context.deadline.stop_training, deadline=context.deadline)
        if self.save_freq is not None and context.steps_since_save >= self.save_freq:
            return SaveDecision("save_freq")
        if context.every_due:
            return SaveDecision("every")
        return NO_SAVE
