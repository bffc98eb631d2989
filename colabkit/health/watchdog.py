"""The hang watchdog: no progress for longer than a budget learned from the run itself means a hang.

Budgets, per phase (``auto``):
- the first step (tracing/compilation, cuDNN autotuning, the first batch being loaded) and the first of every
  other phase: ``first_step_timeout`` (default 30 min);
- a training step: 10x the median step time or 3x the longest step seen, whichever is larger;
- validation, checkpoint saves, an epoch's end (other callbacks' work): 3x the longest one seen;
each clamped to [floor, ceiling] (defaults 60 s and 2 h). ``hang_timeout=DURATION`` fixes every budget (the
first step gets at least ``first_step_timeout``).

A hang is reported once per stall: every thread's stack is dumped with faulthandler to a file in the run's
folder, a warning goes to the log (and the panel), and the GPU's utilization during the stall tells a
GPU-idle hang (the host side is stuck: input pipeline, a lock, I/O, a dead peer) from a slow step (the GPU is
busy: a very long step or a kernel that does not end). When progress resumes, that is logged too.

Under ``colabkit run`` (COLABKIT_RUN_DIR set) a heartbeat file ``<run dir>/<job>.health.json`` is rewritten
every second; the queue kills a job whose heartbeat says hung (or stops coming) and counts it as a failure.
"""
from __future__ import annotations

import faulthandler
import json
import os
import statistics
import time
from pathlib import Path

from ..units import format_duration, parse_duration

DEFAULT_FLOOR = 60.0
DEFAULT_CEILING = 2 * 3600.0
DEFAULT_FIRST = 30 * 60.0
STEP_MEDIAN_FACTOR, STEP_MAX_FACTOR, PHASE_FACTOR = 10.0, 3.0, 3.0


def short_duration(seconds: float) -> str:
    """'12.3 ms', '4.2s', '3m 10s': precise enough for step times."""
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    return format_duration(seconds)


def parse_timeout(value, name="hang_timeout"):
    """"auto" -> "auto"; None/"off"/False -> None; a duration ("90s", 120) -> seconds."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() == "off"):
        return None
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        seconds = parse_duration(value, name=name)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected 'auto', 'off' (or None) or a duration such as '10min' "
                         f"or 600 (seconds).") from None
    if seconds <= 0:
        raise ValueError(f"{name}={value!r}: a hang timeout must be more than 0 seconds; use 'off' for none.")
    return seconds


class Budgets:
    """How long each phase may go without progress, learned from the durations the monitor recorded."""

    def __init__(self, timeout="auto", floor=DEFAULT_FLOOR, ceiling=DEFAULT_CEILING, first=DEFAULT_FIRST):
        self.timeout = parse_timeout(timeout)
        self.floor = parse_duration(floor, name="hang_floor")
        self.ceiling = parse_duration(ceiling, name="hang_ceiling")
        self.first = parse_duration(first, name="first_step_timeout")
        if self.floor > self.ceiling:
            raise ValueError(f"hang_floor ({format_duration(self.floor)}) is above hang_ceiling "
                             f"({format_duration(self.ceiling)}); pass a floor below the ceiling.")

    def budget(self, phase: str, durations: dict) -> tuple:
        """(seconds, how it was chosen) for ``phase`` given {phase: [durations]}; (None, "off") when off."""
        if self.timeout is None:
            return None, "off"
        seen = list(durations.get(phase) or ())[-200:]
        if phase == "first" or not seen:
            if self.timeout == "auto":
                return self.first, f"first {phase if phase != 'first' else 'step'}: first_step_timeout"
            return max(self.timeout, self.first), "first step: at least first_step_timeout"
        if self.timeout != "auto":
            return self.timeout, "hang_timeout"
        if phase == "step":
            median = statistics.median(seen)
            raw = max(STEP_MEDIAN_FACTOR * median, STEP_MAX_FACTOR * max(seen))
            how = f"10x the median step ({short_duration(median)})"
        else:
            raw = PHASE_FACTOR * max(seen[-20:])
            how = f"3x the longest {phase.replace('_', ' ')} ({short_duration(max(seen[-20:]))})"
        clamped = min(self.ceiling, max(self.floor, raw))
        if clamped != raw:
            how += f", {'floor' if clamped == self.floor else 'ceiling'} {short_duration(clamped)}"
        return clamped, how


def dump_stacks(folder: Path, header: str) -> Path:
    """Write ``header`` and every thread's stack (faulthandler, which needs a real file) to a new file."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    prefix = os.environ.get("COLABKIT_JOB", "")
    base = f"{prefix + '.' if prefix else ''}hang-{stamp}"
    path, n = folder / f"{base}.txt", 1
    while path.exists():
        n += 1
        path = folder / f"{base}-{n}.txt"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(header.rstrip() + "\n\nStacks of every thread (most recent call first):\n")
        fh.flush()
        faulthandler.dump_traceback(file=fh, all_threads=True)
    return path


def classify_stall(window: dict) -> tuple:
    """("gpu_idle" | "gpu_busy" | "no_gpu" | "unknown", text) from the sampler's window over the stall."""
    utils = [g["utilization"] for g in window.get("gpus", []) if g.get("utilization") is not None]
    if not window.get("gpus"):
        return "no_gpu", "no GPU figures to tell a host-side hang from a slow step; the stacks show where it waits"
    if not utils:
        return "unknown", "the GPU reported no utilization during the stall"
    busy = max(utils)
    if busy < 10:
        return "gpu_idle", (f"the GPU is idle ({busy:.0f}% busy): the host side is stuck (input pipeline, a lock, "
                            f"I/O, a collective waiting for a dead peer)")
    if busy >= 50:
        return "gpu_busy", (f"the GPU is busy ({busy:.0f}%): a very slow step or a kernel that does not end, "
                            f"rather than a host-side hang")
    return "unknown", f"the GPU is partly busy ({busy:.0f}%)"


def write_heartbeat(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass   # a full or vanished run folder must not stop training


def read_heartbeat(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def job_hang_reason(heartbeat: Path, *, attempt: int, started: float, log: Path, timeout, now: float,
                    show_path=str, quiet_from: float | None = None) -> str | None:
    """For `colabkit run`: why a job counts as hung now, or None.

    timeout "auto": its monitor's heartbeat says hung, or stopped coming (``stale_after_s``); a job without a
    monitor never counts as hung. A number of seconds: that long since the monitor's last progress, or, without
    a monitor, since the job's log last grew. ``quiet_from``: no silence before this wall time counts (the job was
    stopped while its GPU cooled, and continued then)."""
    quiet_from = started if quiet_from is None else max(started, quiet_from)
    beat = read_heartbeat(heartbeat)
    if beat is not None and (beat.get("attempt") != str(attempt) or beat.get("updated", 0) < started):
        beat = None    # an earlier attempt's
    if beat is not None and beat.get("phase") in ("done", "paused"):   # paused: the thermal guard waits on purpose
        return None
    if timeout == "auto":
        if beat is None:
            return None
        if beat.get("hung"):
            hang = beat.get("hang") or {}
            dump = hang.get("dump")
            text = hang.get("text") or "no progress past its budget"
            return f"its monitor reports a hang: {text}" + (
                "" if not dump or dump in text else f"; stacks in {show_path(Path(dump))}")
        stale = beat.get("stale_after_s")
        if stale and now - max(beat.get("updated", now), quiet_from) > stale:
            return (f"its monitor's heartbeat stopped {short_duration(now - beat['updated'])} ago (the process may "
                    f"be frozen)")
        return None
    if beat is not None:
        quiet = now - max(beat.get("last_progress", beat.get("updated", now)), quiet_from)
        if quiet > timeout:
            return f"no training step for {short_duration(quiet)} (--hang-timeout {short_duration(timeout)})"
        return None
    try:
        last = max(log.stat().st_mtime, quiet_from)
    except OSError:
        last = quiet_from
    if now - last > timeout:
        return (f"no output for {short_duration(now - last)} and no training monitor "
                f"(--hang-timeout {short_duration(timeout)})")
    return None
