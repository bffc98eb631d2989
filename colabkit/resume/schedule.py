"""When an AutoResume saves: the final-save wait and the deadline margin, defined once for every adapter."""
from __future__ import annotations

from ..deadline import MARGIN_FLOOR_S as DEADLINE_MARGIN_S
from ..units import parse_duration

__all__ = ["DEADLINE_MARGIN_S", "FINAL_WAIT_FLOOR_S", "final_wait_s", "margin_floor"]

FINAL_WAIT_FLOOR_S = 60.0   # a final save waits at least this long for its upload


def final_wait_s(estimated_save_s: float) -> float:
    """How long a final save waits for its upload: generous, but bounded, so a destination that stays down (a
    dropped mount cannot come back while the cell runs) does not hang the notebook."""
    return max(FINAL_WAIT_FLOOR_S, 3 * estimated_save_s)


def margin_floor(deadline_margin) -> float:
    """AutoResume's ``deadline_margin`` argument in seconds (None: the default, DEADLINE_MARGIN_S)."""
    return DEADLINE_MARGIN_S if deadline_margin is None else parse_duration(deadline_margin, name="deadline_margin")
