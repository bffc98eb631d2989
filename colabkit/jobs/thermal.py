"""`colabkit run` and hot GPUs: a job whose GPU is too hot is stopped whole (SIGSTOP to its process tree) until the
GPU cooled (SIGCONT), unless its training pauses itself between steps (a colabkit AutoResume's thermal guard,
which leaves a note in the run folder).

A job using no AutoResume cannot be paused between steps; SIGSTOP is the closest real thing: the GPU finishes the
kernels already queued and idles. While stopped, a job is never counted as hung, and its hang clock starts again
when it continues. The pause shows in the progress lines and in summary.json ("paused", "thermal_pauses").
"""
from __future__ import annotations

import json
import signal
import time

from .. import config
from ..health.thermal import ThermalGuard, runner_note
from ..units import format_duration
from . import process

RUNNER_POLL_S = 2.0   # seconds between the runner's NVML reads of a running job's GPUs


class JobThermal:
    """The thermal watch of one Runner's local jobs (one ThermalGuard per running job with GPUs)."""

    def __init__(self, runner):
        self.runner = runner
        self.enabled = hasattr(signal, "SIGSTOP") and config.load().thermal_guard
        self.guards: dict = {}    # job name -> its ThermalGuard
        self.left_alone: set = set()   # jobs too hot now whose training pauses itself (said once per pause)

    def watch(self, state, slot) -> None:
        """Start watching the GPUs of ``state``'s attempt that just started in ``slot``."""
        self.forget(state)
        if not self.enabled or not slot.gpus:
            return
        guard = ThermalGuard(gpus=sorted({g.index for g in slot.gpus}), poll_s=RUNNER_POLL_S, tell_job_runner=False)
        if guard.start():
            self.guards[state.job.name] = guard

    def check(self) -> None:
        """Stop the running jobs whose GPUs are too hot, continue those whose GPUs cooled."""
        for state in self.runner._running():
            guard = self.guards.get(state.job.name)
            if guard is None or state.process is None:
                continue
            if not guard.paused:
                self.left_alone.discard(state.job.name)
            if state.paused is None and guard.paused and state.hung is None and not state.signalled:
                if not self._pauses_itself(state):
                    self._stop(state, guard)
                elif state.job.name not in self.left_alone:
                    self.left_alone.add(state.job.name)
                    self.runner.say(f"[{self.runner.stamp()}] hot     {state.job.name}: {guard.describe()}; its "
                                    f"training pauses itself between steps")
            elif state.paused is not None and not guard.paused:
                self.cont(state, f"{guard.cooled()} after {format_duration(time.time() - state.paused['since'])}")

    def _pauses_itself(self, state) -> bool:
        try:
            note = json.loads(runner_note(self.runner.run_dir, state.job.name).read_text())
        except (OSError, ValueError):
            return False
        return note.get("attempt") == str(state.attempts)

    def _stop(self, state, guard) -> None:
        why = f"{guard.describe()}; stopped (SIGSTOP) until {guard.until()}"
        process.signal_tree(state.process, state.pids, signal.SIGSTOP)
        state.paused = {"since": time.time(), "why": why}
        self._log(state, f"paused: {why}")
        self.runner.say(f"[{self.runner.stamp()}] paused  {state.job.name}: {why}")
        self.runner.refresh()

    def cont(self, state, why: str) -> None:
        """Continue ``state``'s stopped job (SIGCONT); ``why`` goes to the progress line and its log."""
        if state.paused is None:
            return
        if state.process is not None:
            process.signal_tree(state.process, state.pids, signal.SIGCONT)
        now = time.time()
        state.pauses.append({"since": state.paused["since"], "until": now, "why": state.paused["why"],
                             "ended": why, "seconds": round(now - state.paused["since"], 3)})
        state.paused, state.resumed_at = None, now
        self._log(state, f"continued: {why}")
        self.runner.say(f"[{self.runner.stamp()}] resumed {state.job.name}: {why}")
        self.runner.refresh()

    def forget(self, state) -> None:
        """The attempt ended (or another starts): stop watching its GPUs."""
        guard = self.guards.pop(state.job.name, None)
        if guard is not None:
            guard.stop()
        if state.paused is not None:
            self.cont(state, "the attempt ended while stopped")

    @staticmethod
    def _log(state, line: str) -> None:
        try:
            with open(state.log, "a", encoding="utf-8") as log:
                log.write(f"\n=== colabkit run: {line}\n")
        except OSError:
            pass
