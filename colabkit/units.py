"""Parsing and formatting of human units: durations ("15min", "1h30m") and sizes ("8GiB")."""
from __future__ import annotations

import re

_DURATION_UNITS = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": 86400, "day": 86400, "days": 86400,
}
_DURATION_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*")
DURATION_FORMS = 'a number of seconds or a string such as "90s", "15min", "1.5h", "1h30m", "2 days"'

_SIZE_UNITS = {
    "b": 1, "": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30, "t": 2**40, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
SIZE_FORMS = 'a number of bytes or a string such as "512MiB", "8GiB", "2GB"'


def parse_duration(value, *, name: str = "duration") -> float:
    """Seconds from a number or a string like "15min" / "1h30m". Raises ValueError naming `name`."""
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not a duration; expected {DURATION_FORMS}.")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            seconds = _parse_duration_text(text, value, name)
    else:
        raise ValueError(f"{name}={value!r} is not a duration; expected {DURATION_FORMS}.")
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError(f"{name}={value!r} must be a positive duration; expected {DURATION_FORMS}.")
    return seconds


def _parse_duration_text(text: str, original, name: str) -> float:
    pos, total, matched = 0, 0.0, False
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if not m or m.group(2).lower() not in _DURATION_UNITS:
            raise ValueError(f"{name}={original!r} is not a duration; expected {DURATION_FORMS}.")
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]
        pos, matched = m.end(), True
    if not matched:
        raise ValueError(f"{name}={original!r} is not a duration; expected {DURATION_FORMS}.")
    return total


def parse_size(value, *, name: str = "size") -> int:
    """Bytes from a number or a string like "8GiB". Raises ValueError naming `name`."""
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not a size; expected {SIZE_FORMS}.")
    if isinstance(value, (int, float)):
        if not 0 <= value < float("inf"):  # also rejects NaN
            raise ValueError(f"{name}={value!r} must be a finite size of at least 0; expected {SIZE_FORMS}.")
        return int(value)
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m and m.group(2).lower() in _SIZE_UNITS:
            return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    raise ValueError(f"{name}={value!r} is not a size; expected {SIZE_FORMS}.")


def format_duration(seconds: float | None) -> str:
    """'3h 05m', '4m 10s', '12s'; 'n/a' for None."""
    if seconds is None or not abs(seconds) < float("inf"):  # None, NaN, infinity
        return "n/a"
    sign = "-" if seconds < 0 else ""
    s = int(round(abs(seconds)))
    if s >= 86400:
        return f"{sign}{s // 86400}d {s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{sign}{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{sign}{s // 60}m {s % 60:02d}s"
    return f"{sign}{s}s"


def format_size(n: float | None) -> str:
    """'1.5 GiB', '300 MiB', '12 B'; 'n/a' for None."""
    if n is None or not abs(n) < float("inf"):
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
