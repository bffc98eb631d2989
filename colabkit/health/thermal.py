"""The thermal guard: training pauses between steps while a GPU it uses is too hot, and resumes once it cooled.

"Too hot": a GPU stays in thermal slowdown (NVML's sw/hw thermal slowdown clock-event reasons) for
``thermal_slowdown_for`` (30 s), or stays above ``max_gpu_temperature`` (when set) that long. The pause lasts until
every hot GPU is out of thermal slowdown and below its resume temperature: ``max_gpu_temperature`` minus
``thermal_resume_margin`` (5 C), or for a slowdown its slowdown threshold minus the margin (the temperature it had
when the pause began, minus the margin, where the board reports no threshold).

A background thread reads NVML every ``poll_s`` seconds; ``wait_if_hot()`` between steps costs one attribute read
while the GPUs are fine. It only waits: no step is skipped or repeated. ``should_stop`` (a signal latched, a deadline
near) ends a pause early, so that the training loop saves and stops as it would have.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from pathlib import Path

from .. import config
from ..devices.nvml import SourceUnavailable, call, open_nvml, visible_handles
from ..units import format_duration
from .sampler import REASONS

__all__ = ["ThermalGuard", "guard_for", "pause_must_end", "runner_note"]

log = logging.getLogger("colabkit")

THERMAL_REASONS = frozenset(name for name in REASONS.values() if "thermal" in name)
_FROM_SETTINGS = object()


class _Pause:
    """One pause: why it began and, per hot GPU, the temperature it must cool below (None: out of slowdown)."""

    def __init__(self, index, temperature, why, resume_below):
        self.index, self.temperature, self.why = index, temperature, why
        self.resume_below = {index: resume_below}
        self.started = time.time()
        self.cooled_to = None     # the first hot GPU's temperature when the pause ended

    def until(self) -> str:
        below = self.resume_below[self.index]
        return f"it cools below {below:.0f} C" if below is not None else "its thermal slowdown ends"


class ThermalGuard:
    """Pauses a training loop between steps while one of its GPUs is too hot (see the module's docstring).

    Args (each defaults to the setting of the same name, see colabkit.config):
        max_gpu_temperature: C, or None for thermal slowdown only.
        resume_margin: C below the trigger temperature at which training resumes (thermal_resume_margin).
        slowdown_for: seconds (or "30s") a GPU must stay hot before training pauses (thermal_slowdown_for).
        power_limit: "250W" / "80%" / "off": also lower a hot GPU's power limit (thermal_power_limit).
        poll_s: seconds between NVML reads.
        gpus: NVML indexes of the GPUs to watch (None: those this process sees, CUDA_VISIBLE_DEVICES).
        tell_job_runner: in a `colabkit run` job, leave a note for the runner that this process pauses itself
            between steps (so the runner does not stop the whole process when a GPU is hot).

    ``attach(run)`` sends its messages and events to a run record (colabkit.resume.run.Run); ``start()`` /
    ``stop()`` around training; ``wait_if_hot(should_stop)`` between steps.
    """

    def __init__(self, *, max_gpu_temperature=_FROM_SETTINGS, resume_margin=_FROM_SETTINGS,
                 slowdown_for=_FROM_SETTINGS, power_limit=_FROM_SETTINGS, poll_s: float = 5.0, gpus=None,
                 tell_job_runner: bool = True):
        settings = None
        values = {}
        for name, arg in (("max_gpu_temperature", max_gpu_temperature), ("thermal_resume_margin", resume_margin),
                          ("thermal_slowdown_for", slowdown_for), ("thermal_power_limit", power_limit)):
            if arg is _FROM_SETTINGS:
                settings = settings or config.load()
                values[name] = getattr(settings, name)
            else:
                values[name] = config.check(name, arg)
        self.max_gpu_temperature = values["max_gpu_temperature"]
        self.resume_margin = values["thermal_resume_margin"]
        self.slowdown_for = values["thermal_slowdown_for"]
        self.power_limit = values["thermal_power_limit"]
        if isinstance(poll_s, bool) or not isinstance(poll_s, (int, float)) or not 0 < poll_s <= 600:
            raise ValueError(f"ThermalGuard(poll_s={poll_s!r}): expected seconds between NVML reads, above 0 and "
                             f"at most 600 (e.g. 5).")
        self.poll_s = float(poll_s)
        self.gpu_indexes = None if gpus is None else [int(i) for i in gpus]
        self.tell_job_runner = tell_job_runner
        self.pauses: list = []        # (started, ended, GPU index, why) of every pause so far
        self.note = ""                # why the guard watches nothing (no NVML, no GPU), or ""
        self._say = lambda message: log.info("colabkit: %s", message)
        self._event = lambda kind, detail: None
        self._pause = None            # the pause in force (set by the watcher thread), or None
        self._last_pause = None       # the pause that ended last
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = None
        self._gpus = []               # [(index, handle, slowdown threshold C or None)]
        self._nv = None
        self._hot_since: dict = {}    # GPU index -> (since when in slowdown or None, since when above max or None)
        self._old_limits: dict = {}   # GPU index -> the power limit (mW) in force before the guard lowered it

    def attach(self, run) -> ThermalGuard:
        """Say things through ``run.say`` and record pauses with ``run.event`` ("thermal-pause", "thermal-resume")."""
        self._say, self._event = run.say, run.event
        return self

    def _monitors(self) -> list:
        """The training monitors that must not take a pause for a hang: the newest running one of this process."""
        from .health_monitor import latest_monitor
        mon = latest_monitor()
        return [mon] if mon is not None and mon.running else []

    # -- the watcher thread ----------------------------------------------------------------------------------
    def start(self) -> bool:
        """Open NVML (in this thread) and start watching the GPUs this process sees. False where there is nothing
        to watch (no NVML, no GPU): ``wait_if_hot`` then never waits."""
        if self._thread is not None:
            return True
        try:
            self._nv = nv = open_nvml()
            handles = (visible_handles(nv) if self.gpu_indexes is None else
                       [(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in self.gpu_indexes])
        except SourceUnavailable as exc:
            self.note = f"no GPU temperatures: {exc}"
            return False
        except Exception as exc:  # noqa: BLE001 - never fail training for the guard
            self.note = f"no GPU temperatures: NVML failed ({exc})"
            return False
        slowdown = getattr(nv, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", None)
        self._gpus = [(i, h, None if slowdown is None else call(nv, "nvmlDeviceGetTemperatureThreshold", h, slowdown))
                      for i, h in handles]
        if not self._gpus:
            self.note = "NVML sees no GPU for this process"
            return False
        self._stopping.clear()
        try:
            self.check()   # a GPU already too hot pauses the first step
        except Exception:  # a failed read is no reason to stop training
            log.debug("colabkit: thermal guard read failed", exc_info=True)
        self._thread = threading.Thread(target=self._watch, name="colabkit-thermal-guard", daemon=True)
        self._thread.start()
        if self.tell_job_runner:
            _tell_job_runner()
        return True

    def stop(self) -> None:
        """Stop watching and put back any power limit the guard lowered."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stopping.set()
            thread.join(timeout=self.poll_s + 5)
        self._pause = None
        self._hot_since.clear()
        self._restore_power_limits()

    def _watch(self) -> None:
        while True:
            try:
                self.check()
            except Exception:  # a failed read is no reason to stop training
                log.debug("colabkit: thermal guard read failed", exc_info=True)
            if self._stopping.wait(self.poll_s):
                return

    def _read(self, handle):
        """(temperature C or None, set of thermal slowdown reasons) of one GPU."""
        nv = self._nv
        temperature = call(nv, "nvmlDeviceGetTemperature", handle, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
        bits = call(nv, "nvmlDeviceGetCurrentClocksEventReasons", handle)
        if bits is None:
            bits = call(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        reasons = {name for bit, name in REASONS.items() if bits and bits & bit} & THERMAL_REASONS
        return (None if temperature is None else float(temperature)), reasons

    def check(self, now: float | None = None) -> None:
        """Read every GPU once and start or end the pause (the watcher thread calls this every ``poll_s``)."""
        now = time.time() if now is None else now
        pause = self._pause
        for index, handle, threshold in self._gpus:
            temperature, thermal = self._read(handle)
            slowdown_since, above_since = self._hot_since.get(index, (None, None))
            slowdown_since = (slowdown_since or now) if thermal else None
            above = (self.max_gpu_temperature is not None and temperature is not None
                     and temperature > self.max_gpu_temperature)
            above_since = (above_since or now) if above else None
            self._hot_since[index] = (slowdown_since, above_since)
            if pause is not None and index in pause.resume_below:
                below = pause.resume_below[index]
                # out of slowdown, and below the resume temperature where the board reports one
                if not thermal and (below is None or temperature is None or temperature < below):
                    del pause.resume_below[index]
                    if index == pause.index:
                        pause.cooled_to = temperature
                continue
            trigger = None
            if slowdown_since is not None and now - slowdown_since >= self.slowdown_for:
                start = threshold if threshold else temperature
                trigger = (f"thermal slowdown for {format_duration(now - slowdown_since)}",
                           None if start is None else start - self.resume_margin)
                if self.max_gpu_temperature is not None:   # and not above the user's own limit either
                    trigger = (trigger[0], min(v for v in (trigger[1], self.max_gpu_temperature - self.resume_margin)
                                               if v is not None))
            elif above_since is not None and now - above_since >= self.slowdown_for:
                trigger = (f"above max_gpu_temperature {self.max_gpu_temperature:.0f} C for "
                           f"{format_duration(now - above_since)}", self.max_gpu_temperature - self.resume_margin)
            if trigger is None:
                continue
            if pause is None:
                pause = _Pause(index, temperature, trigger[0], trigger[1])
            else:
                pause.resume_below[index] = trigger[1]
            self._lower_power_limit(index, handle)
        if pause is not None and not pause.resume_below:
            self._last_pause, pause = pause, None
        with self._lock:
            self._pause = pause

    # -- the training thread ---------------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        """A GPU is too hot now: the next ``wait_if_hot`` waits."""
        return self._pause is not None

    def describe(self) -> str | None:
        """The pause in force in words ("GPU 1 at 92 C (thermal slowdown for 45s)"), or None."""
        pause = self._pause
        if pause is None:
            return None
        temperature = "?" if pause.temperature is None else f"{pause.temperature:.0f}"
        return f"GPU {pause.index} at {temperature} C ({pause.why})"

    def until(self) -> str | None:
        """What ends the pause in force ("it cools below 85 C"), or None."""
        pause = self._pause
        return None if pause is None else pause.until()

    def cooled(self) -> str:
        """What the last pause's GPU did once it ended ("GPU 1 cooled to 84 C")."""
        pause = self._last_pause
        if pause is None:
            return "the GPUs cooled"
        return f"GPU {pause.index} cooled" + ("" if pause.cooled_to is None else f" to {pause.cooled_to:.0f} C")

    def wait_if_hot(self, should_stop=None) -> float:
        """Between two steps: while a GPU is too hot, wait until it cooled (checking every 0.2 s whether
        ``should_stop()`` returns a reason, such as "SIGTERM received", to end the pause early). Returns the
        seconds waited (0.0 at once when no GPU is too hot)."""
        pause = self._pause
        if pause is None:
            return 0.0
        began = time.monotonic()
        message = f"{self.describe()}: training paused until {pause.until()}"
        self._say(message)
        self._event("thermal-pause", message)
        why = None
        with contextlib.ExitStack() as stack:
            for mon in self._monitors():
                stack.enter_context(mon.paused())
            while self._pause is pause and self._thread is not None:
                why = should_stop() if should_stop is not None else None
                if why:
                    break
                self._stopping.wait(min(0.2, self.poll_s))
        waited = time.monotonic() - began
        if why:
            message = f"thermal pause ended early after {format_duration(waited)}: {why}"
        else:
            message = f"{self.cooled()} after {format_duration(waited)}; training resumes"
        self._say(message)
        self._event("thermal-resume", message)
        self.pauses.append((pause.started, time.time(), pause.index, pause.why))
        return waited

    # -- power limits ----------------------------------------------------------------------------------------
    def _lower_power_limit(self, index, handle) -> None:
        if self.power_limit is None or index in self._old_limits:
            return
        nv = self._nv
        value, unit = config.power_limit_parts(self.power_limit)
        try:
            old = nv.nvmlDeviceGetPowerManagementLimit(handle)
            low, high = nv.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            if unit == "%":
                default = call(nv, "nvmlDeviceGetPowerManagementDefaultLimit", handle) or old
                target = int(default * value / 100)
            else:
                target = int(value * 1000)
            target = max(low, min(high, target))
            if target >= old:
                return
            nv.nvmlDeviceSetPowerManagementLimit(handle, target)
        except (nv.NVMLError, AttributeError) as exc:
            self._old_limits[index] = None    # said once
            self._say(f"cannot lower GPU {index}'s power limit (thermal_power_limit): {exc}; setting it needs root "
                      f"(sudo) and a board that allows it")
            return
        self._old_limits[index] = old
        self._say(f"lowered GPU {index}'s power limit from {old / 1000:.0f} W to {target / 1000:.0f} W while it is "
                  f"hot; the old limit is put back when training ends")

    def _restore_power_limits(self) -> None:
        for index, handle, _ in self._gpus:
            old = self._old_limits.pop(index, None)
            if old is None:
                continue
            try:
                self._nv.nvmlDeviceSetPowerManagementLimit(handle, old)
                self._say(f"put GPU {index}'s power limit back to {old / 1000:.0f} W")
            except self._nv.NVMLError as exc:
                self._say(f"could not put GPU {index}'s power limit back to {old / 1000:.0f} W: {exc}")
        self._old_limits.clear()


def runner_note(run_dir, job: str) -> Path:
    """The file by which a `colabkit run` job says its training pauses itself while a GPU is hot."""
    return Path(run_dir) / f"{job}.thermal-guard.json"


def _tell_job_runner() -> None:
    run_dir, job = os.environ.get("COLABKIT_RUN_DIR"), os.environ.get("COLABKIT_JOB")
    if not run_dir or not job:
        return
    try:
        runner_note(run_dir, job).write_text(json.dumps({"pid": os.getpid(),
                                                         "attempt": os.environ.get("COLABKIT_JOB_ATTEMPT")}))
    except OSError:
        log.debug("colabkit: could not leave the thermal-guard note for colabkit run", exc_info=True)


def guard_for(option, run=None) -> ThermalGuard | None:
    """The guard an AutoResume uses: ``option`` None follows the thermal_guard setting, True/False turn it on/off,
    a ThermalGuard is used as it is. Attached to ``run`` (its messages and events) when given."""
    if option is None:
        option = config.load().thermal_guard
    if isinstance(option, ThermalGuard):
        guard = option
    elif option is True:
        guard = ThermalGuard()
    elif option is False:
        return None
    else:
        raise TypeError(f"thermal_guard={option!r}: expected True, False, None (the thermal_guard setting) or a "
                        f"colabkit.health.ThermalGuard.")
    return guard.attach(run) if run is not None else guard


def pause_must_end(interrupt, watch, estimated_save_s) -> str | None:
    """Why an AutoResume's thermal pause must end now, or None: ``interrupt`` (the signal latched, e.g. "SIGTERM"),
    or a deadline of ``watch`` (colabkit.deadline.DeadlineWatch, or None) whose save is due, given the estimated
    seconds a save takes (``estimated_save_s()``)."""
    if interrupt:
        return f"{interrupt} received"
    deadline = watch.due(estimated_save_s()) if watch is not None else None
    return None if deadline is None else f"{deadline.reason} is {format_duration(deadline.at - time.time())} away"
