"""Waiting for something another thread or process does, without guessing how long it takes."""
from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 20.0, step: float = 0.05):
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` seconds pass (then its
    last value, checked once more)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()
