"""The training monitor: step time, input-wait share, GPU/host samples, verdicts and the hang watchdog.

    with colabkit.monitor() as mon:                # a custom loop
        for x, y in mon.wrap(loader):              # times each next(): the input wait
            loss = train_step(x, y)
            mon.step(loss=loss)
    mon.report()                                   # a plain dict; mon.text() for people

How it measures (framework-neutral part; the Keras callback feeds the same object, see keras_monitor.py):
- step time: the interval between consecutive ``step()`` calls, divided by the batches it covers (``n``); the
  first step (compilation) and time spent in a ``phase()`` (validation, checkpoint saves) are left out;
- input wait: the time spent in ``next()`` of an iterable passed through ``wrap()`` (or inside ``with
  mon.input():``), as a share of step time. Without either, the input share is None (not measured);
- GPUs and host: a background thread samples NVML and psutil every ``sample_every`` (sampler.py);
- the watchdog runs in the same thread (watchdog.py).

Per step the monitor does a few clock reads and appends to ring buffers; everything else happens in its
thread (see bench/monitor_overhead.py for the measured cost).
"""
from __future__ import annotations

import collections
import contextlib
import logging
import os
import statistics
import sys
import threading
import time
import weakref
from pathlib import Path

from ..units import parse_duration
from . import verdicts as _verdicts
from .watchdog import (
    DEFAULT_CEILING,
    DEFAULT_FIRST,
    DEFAULT_FLOOR,
    Budgets,
    classify_stall,
    dump_stacks,
    short_duration,
    write_heartbeat,
)

log = logging.getLogger("colabkit")

MIN_STEPS_FOR_VERDICT = 20
MIN_INPUT_SAMPLES = 6
WINDOW_STEPS = 50
_live: list = []     # weakrefs to started monitors, newest last (the panel and %monitor show the newest)


def latest_monitor():
    """The most recently started training monitor still alive, or None."""
    for ref in reversed(_live):
        mon = ref()
        if mon is not None:
            return mon
    return None


def input_kind_of(iterable) -> str:
    """'tf.data', 'numpy', 'generator', 'PyDataset', 'DataLoader' or 'unknown', by type name (no imports)."""
    names = {c.__module__.split(".")[0] + "." + c.__name__ for c in type(iterable).__mro__}
    if any(n.startswith("tensorflow.") and "Dataset" in n for n in names):
        return "tf.data"
    if any(n.endswith(".DataLoader") for n in names):
        return "DataLoader"
    if any(n.endswith(".PyDataset") for n in names):
        return "PyDataset"
    if type(iterable).__name__ == "ndarray":
        return "numpy"
    if type(iterable).__name__ == "generator":
        return "generator"
    return "unknown"


class HealthMonitor:
    """Training health for any loop; see the module docs. All arguments are optional.

    Args:
        directory: where hang stack dumps go (default: ``$COLABKIT_RUN_DIR`` under ``colabkit run``, else
            ./colabkit-runs/health-<time>, made only when a dump is written).
        hang_timeout: "auto" (a budget learned from the run), "off"/None, or a duration ("10min").
        hang_floor, hang_ceiling: bounds of a learned budget (default 60s, 2h).
        first_step_timeout: budget of the first step and of the first of each other phase (default 30min).
        sample_every: GPU/host sampling interval (default 1s).
        gpus: sample GPUs through NVML (default True; False: host only).
        verbose: 1 prints each verdict once and hang reports; 0 only logs.
        input_kind: "tf.data", "numpy", "generator", "PyDataset", "DataLoader" for the advice (``wrap()``
            finds it from the iterable).
        project: what the run is booked under in the cost ledger (default: the ``project`` setting, else the
            job's name under `colabkit run`, else the working folder's name; see colabkit.health.ledger).

    Energy and money (``report()["energy"]``): see colabkit.health.runcost; the run's totals go to the cost
    ledger every few minutes and at ``stop()`` (under `colabkit run` the queue books the job instead).
    """

    def __init__(self, directory=None, *, hang_timeout="auto", hang_floor=DEFAULT_FLOOR, hang_ceiling=DEFAULT_CEILING,
                 first_step_timeout=DEFAULT_FIRST, sample_every="1s", gpus=True, verbose=1, input_kind=None,
                 history=5000, project=None):
        queue_timeout = os.environ.get("COLABKIT_HANG_TIMEOUT")   # `colabkit run --hang-timeout DURATION`
        if hang_timeout == "auto" and queue_timeout not in (None, "", "auto", "off"):
            hang_timeout = queue_timeout
        self.budgets = Budgets(hang_timeout, floor=hang_floor, ceiling=hang_ceiling, first=first_step_timeout)
        self.sample_every = parse_duration(sample_every, name="sample_every")
        if self.sample_every <= 0:
            raise ValueError(f"sample_every={sample_every!r}: expected a positive duration such as '1s'.")
        run_dir = os.environ.get("COLABKIT_RUN_DIR")
        self.directory = Path(directory) if directory is not None else (
            Path(run_dir) if run_dir else Path.cwd() / "colabkit-runs" / time.strftime("health-%Y%m%d-%H%M%S"))
        job = os.environ.get("COLABKIT_JOB")
        self.heartbeat_path = Path(run_dir) / f"{job}.health.json" if run_dir and job else None
        self.verbose, self.input_kind, self._gpus_wanted = verbose, input_kind or "unknown", gpus
        self.input_note = ""                    # why the input share is not measured, where that is known
        self.sampler = None
        self.steps = 0
        # "first", "step", "validation", "checkpoint", "epoch_end", "paused" (see paused()), "done"
        self.current_phase = "first"
        self.events: list = []                  # (wall time, kind, detail) for the panel
        self.hangs: list = []
        self.epochs: list = []                  # (epoch, {loss, val_loss, ...}) from log_epoch()
        self._history = history
        self._step_times = collections.deque(maxlen=history)   # seconds per batch (step_time_s)
        # seconds per step() call (n batches): what the watchdog compares a stall with, since a stall spans a call
        self._call_times = collections.deque(maxlen=history)
        self._step_walls = collections.deque(maxlen=history)   # (wall time, step count, s per batch, input share)
        self._losses = collections.deque(maxlen=history)       # (step count, loss)
        self._input = collections.deque(maxlen=200)            # (input s, step s) per measured step
        self._durations = {"step": self._call_times, "validation": collections.deque(maxlen=50),
                           "checkpoint": collections.deque(maxlen=50), "epoch_end": collections.deque(maxlen=50)}
        self._last_step_end = None
        self._pending_input = 0.0
        self._input_measured = False
        self._pending_share = None
        self._last_progress = time.monotonic()
        self._phase_started = self._last_progress
        self._stall = None                      # the hang being reported, until progress resumes
        self._said = set()
        self._thread = None
        self._stop = threading.Event()
        self._started_at = None
        self.owner = None                       # (thread id, frame): the fit() this monitor watches, if known
        self.project = project                  # the cost ledger's project (None: see health.ledger)
        self.cost = None                        # runcost.RunCost: energy, money, the ledger record

    # -- life cycle -----------------------------------------------------------------------------------
    def start(self) -> HealthMonitor:
        """Start the sampling/watchdog thread (idempotent). step() and wrap() start it too."""
        if self._thread is not None and self._thread.is_alive():
            return self
        if self.sampler is None:
            from .sampler import Sampler
            self.sampler = Sampler(history=self._history, gpus=self._gpus_wanted)
        if self.cost is None or self.cost.final:
            self.cost = self._start_cost()
        self._stop.clear()
        self._started_at = time.time()
        self._last_progress = self._phase_started = time.monotonic()
        _live[:] = [r for r in _live if r() is not None and r() is not self] + [weakref.ref(self)]
        self._thread = threading.Thread(target=self._run, name="colabkit-health", daemon=True)
        self._thread.start()
        from .recorder import ensure_recording
        ensure_recording()    # the flight recorder (colabkit health --last after a freeze)
        return self

    def stop(self) -> None:
        """Stop the thread (the measurements stay for report())."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        if self._stall is not None:
            self._watch(time.monotonic())     # a stall that ended since the thread's last look
        if self.sampler is not None:
            try:
                self._announce()   # a verdict whose evidence came in since the thread's last look
            except Exception:
                log.debug("colabkit: health verdicts failed", exc_info=True)
        self.current_phase = "done"
        self.owner = None     # its frame holds everything fit() was given: never keep that past the run
        if self.cost is not None:
            with contextlib.suppress(Exception):
                self.cost.sample()
            self.cost.book(final=True)
        self._heartbeat()

    def _start_cost(self):
        """The run's energy meter and ledger record; a job under `colabkit run` is booked by the queue."""
        try:
            from .runcost import RunCost
            return RunCost("fit", project=self.project, fallback=os.environ.get("COLABKIT_JOB"),
                           gpus=None if self._gpus_wanted else [],
                           book=not os.environ.get("COLABKIT_JOB")).start()
        except Exception as exc:  # noqa: BLE001 - never fail training for a cost figure
            log.warning("colabkit: no energy figures: %s", exc)
            return None

    def add_lost_steps(self, steps: int) -> None:
        """Batches this run trains a second time (a resume restored an older step than the last one reached)."""
        if self.cost is not None and steps > 0:
            self.cost.lost_steps += int(steps)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- what the training loop calls -----------------------------------------------------------------
    def step(self, n: int = 1, *, loss=None, count_time: bool = True) -> None:
        """One training step (or ``n`` batches in one call) has ended. ``loss``: a float for the plots.
        ``count_time=False``: the interval is not a normal step (e.g. a retrace) and stays out of the stats."""
        now = time.perf_counter()
        if self._thread is None:
            self.start()
        n = max(1, int(n))
        last, self._last_step_end = self._last_step_end, now
        self._last_progress = time.monotonic()
        self.steps += n
        if self.current_phase != "step" or last is None:
            # the first step (compilation) or one that ends a phase nobody left: not a normal step's time
            self._leave_phase("step")
            self._last_step_end = now
            self._pending_input, self._input_measured = 0.0, False
            if loss is not None:
                self._losses.append((self.steps, float(loss)))
            return
        elapsed = now - last
        per_batch = elapsed / n
        share = None
        if self._input_measured:
            share = min(1.0, self._pending_input / elapsed) if elapsed > 0 else 0.0
            if count_time:
                self._input.append((self._pending_input, elapsed))
            self._pending_input, self._input_measured = 0.0, False
        elif self._pending_share is not None:
            share = self._pending_share
        self._pending_share = None
        if count_time:
            self._step_times.append(per_batch)
            self._call_times.append(elapsed)
            self._step_walls.append((time.time(), self.steps, per_batch, share))
        if loss is not None:
            self._losses.append((self.steps, float(loss)))

    def record_input(self, input_s: float, total_s: float) -> None:
        """A measured split of one step (the Keras callback's sampled steps): ``input_s`` of ``total_s``."""
        self._input.append((max(0.0, input_s), max(total_s, 1e-9)))
        self._pending_share = min(1.0, max(0.0, input_s) / max(total_s, 1e-9))   # for the next step()'s record

    def wrap(self, iterable):
        """Iterate ``iterable``, timing each ``next()`` as input wait. Sets the input kind for the advice.
        When it is exhausted the monitor counts what follows as an epoch's end (a budget of its own) until
        the next ``step()``; call ``stop()`` (or use ``with``) when training is over."""
        if self.input_kind == "unknown":
            self.input_kind = input_kind_of(iterable)
        if self._thread is None:
            self.start()
        iterator = iter(iterable)
        clock = time.perf_counter
        while True:
            t0 = clock()
            try:
                item = next(iterator)
            except StopIteration:
                if self.current_phase == "step":
                    self.enter_phase("epoch_end")   # what follows an epoch has its own (first: generous) budget
                return
            self._pending_input += clock() - t0
            self._input_measured = True
            try:
                yield item
            except GeneratorExit:
                # the loop was left (an exception, a break) before the input ended: nothing is left to
                # watch, so no hang can be reported for it; a later step() or wrap() starts watching again
                self.stop()
                raise

    @contextlib.contextmanager
    def input(self):
        """``with mon.input(): batch = next(it)``: the block's time counts as input wait."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._pending_input += time.perf_counter() - t0
            self._input_measured = True

    @contextlib.contextmanager
    def phase(self, name: str):
        """``with mon.phase("validation"):`` (or "checkpoint", "epoch_end"): its time is not step time and it
        has a hang budget of its own."""
        self.enter_phase(name)
        try:
            yield
        finally:
            self._leave_phase("step" if self.current_phase == name else self.current_phase)

    def enter_phase(self, name: str) -> None:
        if name not in self._durations or name == "step":
            raise ValueError(f"phase {name!r}: expected one of 'validation', 'checkpoint', 'epoch_end'.")
        if self._thread is None:
            self.start()
        if self.current_phase == name:
            return
        if self.current_phase not in ("step", "first", "done"):
            self._leave_phase(name)
        self.current_phase, self._phase_started = name, time.monotonic()
        self._last_progress = self._phase_started

    @contextlib.contextmanager
    def paused(self):
        """``with mon.paused():`` training waits on purpose (the thermal guard, for a hot GPU): the watchdog reports
        no hang meanwhile, the heartbeat says phase "paused" (so `colabkit run` kills nothing), and the time counts
        as no step's."""
        previous, began = self.current_phase, time.monotonic()
        if previous == "done":
            yield
            return
        self.current_phase = "paused"
        try:
            yield
        finally:
            now = time.monotonic()
            if self.current_phase == "paused":
                self.current_phase = previous
            self._phase_started += now - began
            self._last_progress = now
            if self._last_step_end is not None:
                self._last_step_end += now - began

    def _leave_phase(self, next_phase: str) -> None:
        now = time.monotonic()
        old = self.current_phase
        if old in self._durations and old != "step":
            self._durations[old].append(now - self._phase_started)
        elif old == "first":
            self._durations.setdefault("first", collections.deque(maxlen=5)).append(now - self._phase_started)
        spent = now - self._phase_started
        self.current_phase, self._phase_started, self._last_progress = next_phase, now, now
        if old not in ("step", "first") and self._last_step_end is not None:
            # the phase's time is not the step's; what the step did before and after it still is
            self._last_step_end += spent

    def progress(self) -> None:
        """Something moved (a validation batch, a chunk of a save): resets the watchdog's clock."""
        self._last_progress = time.monotonic()

    def log_epoch(self, epoch: int, logs: dict | None) -> None:
        """Epoch-level values (loss, val_loss, ...) for the plots and report()."""
        values = {k: float(v) for k, v in (logs or {}).items() if isinstance(v, (int, float))}
        self.epochs.append((int(epoch), dict(values, step=self.steps)))

    # -- the thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        next_sample = next_beat = next_verdict = 0.0
        tick = min(0.25, self.sample_every)
        while not self._stop.is_set():
            now = time.monotonic()
            for due, task in ((now >= next_sample, self.sampler.sample),
                              (now >= next_sample and self.cost is not None, lambda: self.cost.sample()),
                              (True, lambda now=now: self._watch(now)),
                              (now >= next_verdict, self._announce),
                              (now >= next_beat and self.heartbeat_path is not None, self._heartbeat)):
                if not due:
                    continue
                try:
                    task()
                except Exception:
                    log.debug("colabkit: health monitor task failed", exc_info=True)
            if now >= next_sample:
                next_sample = now + self.sample_every
            if now >= next_verdict:
                next_verdict = now + 1.0
            if now >= next_beat:
                next_beat = now + 1.0
            self._stop.wait(tick)

    def budget(self) -> tuple:
        """(seconds or None, how) for the phase now running."""
        return self.budgets.budget(self.current_phase, self._durations)

    def _watch(self, now: float) -> None:
        stalled = now - self._last_progress
        stall = self._stall
        if stall is not None:
            if stalled < stall["stalled_s"]:    # progress again
                self._stall = None
                moved_at = time.time() - stalled
                stall["resumed_after_s"] = moved_at - (stall["at"] - stall["stalled_s"])
                self._event("resumed", f"progress again after {short_duration(stall['resumed_after_s'])}")
                self._say(f"training moved again after {short_duration(stall['resumed_after_s'])} without progress "
                          f"({'it was a slow step, not a hang' if stall['gpu'] == 'gpu_busy' else 'the stall ended'})")
            return
        if self.current_phase in ("done", "paused"):
            return
        if not self._owner_running():
            # its fit() was left by an exception (Keras calls no callback then): nothing is hung, nothing to
            # watch; the heartbeat says so, or `colabkit run` would take its staleness for a frozen process
            self.current_phase = "done"
            self.owner = None
            self._stop.set()
            self._heartbeat()
            return
        budget, how = self.budget()
        if budget is None or stalled <= budget:
            return
        self._report_hang(stalled, budget, how)

    def _owner_running(self) -> bool:
        if self.owner is None or self.owner[1] is None:
            return True
        thread_id, frame = self.owner
        current = sys._current_frames().get(thread_id)
        while current is not None:
            if current is frame:
                return True
            current = current.f_back
        return False

    def _report_hang(self, stalled: float, budget: float, how: str) -> None:
        wall = time.time()
        window = self.sampler.window(since=wall - stalled) if self.sampler else {"gpus": []}
        gpu, gpu_text = classify_stall(window)
        what = {"first": "the first step (compilation)", "step": "a training step", "validation": "validation",
                "checkpoint": "a checkpoint save", "epoch_end": "the end of an epoch",
                }.get(self.current_phase, self.current_phase)
        headline = (f"no progress for {short_duration(stalled)} in {what} (after step {self.steps}; budget "
                    f"{short_duration(budget)}: {how}): {gpu_text}")
        dump = None
        try:
            dump = dump_stacks(self.directory, f"colabkit hang report, {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                                               f"pid {os.getpid()}\n{headline}")
        except OSError as exc:
            log.warning("colabkit: could not write the stack dump: %s", exc)
        hang = {"at": wall, "phase": self.current_phase, "step": self.steps, "stalled_s": stalled, "budget_s": budget,
                "budget_how": how, "gpu": gpu, "gpu_text": gpu_text, "dump": None if dump is None else str(dump),
                "gpu_utilization": [g.get("utilization") for g in window.get("gpus", [])] or None,
                "text": headline + (f"; stacks of every thread in {dump}" if dump else "")}
        self._stall = hang
        self.hangs.append(hang)
        self._event("hang", hang["text"])
        log.warning("colabkit: hang: %s", hang["text"])
        if self.verbose:
            print(f"colabkit: HANG? {hang['text']}", flush=True)
        self._heartbeat()

    def _heartbeat(self) -> None:
        if self.heartbeat_path is None:
            return
        budget, how = self.budget() if self.current_phase not in ("done", "paused") else (None, self.current_phase)
        write_heartbeat(self.heartbeat_path, {
            "pid": os.getpid(), "updated": time.time(), "steps": self.steps, "phase": self.current_phase,
            "last_progress": time.time() - (time.monotonic() - self._last_progress),
            "budget_s": budget, "budget_how": how, "hung": self._stall is not None,
            "hang": None if self._stall is None else {k: v for k, v in self._stall.items() if k != "gpu_utilization"},
            "stale_after_s": max(30.0, 2 * budget) if budget else None,
            "attempt": os.environ.get("COLABKIT_JOB_ATTEMPT")})

    def _announce(self) -> None:
        """Print each verdict kind once, when the evidence is in; an input verdict once more if it gets worse
        (moderately, then highly input-bound), never when it eases."""
        rank = {"moderate": 1, "high": 2}
        for v in self._current_verdicts(final=False):
            key = (v.kind, v.severity if v.kind == "input" else "")
            said = [severity for kind, severity in self._said if kind == v.kind]
            if said and (v.kind != "input" or rank.get(v.severity, 0) <= max(rank.get(x, 0) for x in said)):
                continue
            self._said.add(key)
            self._event("verdict", v.text)
            log.info("colabkit: health: %s", v.text)
            if self.verbose and v.kind != "ok":
                print(f"colabkit: {v.text}", flush=True)

    def _event(self, kind: str, detail: str) -> None:
        self.events.append((time.time(), kind, detail))
        del self.events[:-200]

    def _say(self, text: str) -> None:
        log.info("colabkit: %s", text)
        if self.verbose:
            print(f"colabkit: {text}", flush=True)

    # -- results --------------------------------------------------------------------------------------
    def step_time(self) -> float | None:
        recent = list(self._step_times)[-WINDOW_STEPS:]
        return statistics.median(recent) if recent else None

    def input_fraction(self) -> tuple:
        """(share 0..1 or None, number of measured steps) over the recent measured steps."""
        recent = list(self._input)[-30:]
        total = sum(t for _, t in recent)
        if not recent or total <= 0:
            return None, 0
        return min(1.0, sum(i for i, _ in recent) / total), len(recent)

    def _window(self) -> dict:
        if self.sampler is None:
            return {"gpus": [], "host": {}, "note": "not started"}
        return self.sampler.window(since=time.time() - 120)

    def _current_verdicts(self, final: bool = True, window=None) -> list:
        window = self._window() if window is None else window
        out = []
        if self._stall is not None:
            out.append(_verdicts.Verdict("hang", "high", f"hung: {self._stall['text']}"))
        share, samples = self.input_fraction()
        if len(self._step_times) >= (1 if final else MIN_STEPS_FOR_VERDICT) and samples >= (
                1 if final else MIN_INPUT_SAMPLES):
            v = _verdicts.input_verdict(share, self.step_time(), self.input_kind, samples)
            if v is not None:
                out.append(v)
        gpu_samples = min([g["samples"] for g in window.get("gpus", [])] or [0])
        if gpu_samples >= (1 if final else 3):
            out.extend(_verdicts.throttle_verdicts(window))
            idle = _verdicts.idle_gpu_verdict(window, share)
            if idle is not None:
                out.append(idle)
        order = {"hang": 0, ("input", "high"): 1, "throttle": 2, "idle_gpu": 3, ("input", "moderate"): 4, "ok": 5}
        return sorted(out, key=lambda v: order.get((v.kind, v.severity), order.get(v.kind, 9)))

    def report(self) -> dict:
        """A plain dict: step_time_s, input_fraction, input_kind, gpu_utilization (per GPU, None without GPUs),
        gpus, host, throttled {share, reasons, per_gpu}, verdict (the first line), verdicts, hangs, energy (GPU-hours,
        kWh, money, cloud equivalent: see colabkit.health.runcost; None if not measured), text."""
        window = self._window()
        share, samples = self.input_fraction()
        gpus = window.get("gpus", [])
        per_gpu = []
        for g in gpus:
            viol = g.get("violation") or {}
            reasons = g.get("reasons") or {}
            thr = max(list(viol.values()) + list(reasons.values()) + [0.0])
            per_gpu.append({"index": g["index"], "share": thr, "reasons": sorted(reasons), "violation": viol})
        verdict_list = self._current_verdicts(final=True, window=window)
        data = {
            "steps": self.steps, "phase": self.current_phase, "step_time_s": self.step_time(),
            "input_fraction": share, "input_samples": samples, "input_kind": self.input_kind,
            "input_note": self.input_note if share is None else "",
            "gpu_utilization": [g["utilization"] for g in gpus] if gpus else None,
            "gpus": gpus, "host": window.get("host", {}), "gpu_note": window.get("note", ""),
            "throttled": {"share": max([p["share"] for p in per_gpu] + [0.0]) if per_gpu else None,
                          "reasons": sorted({r for p in per_gpu for r in p["reasons"]}), "per_gpu": per_gpu},
            "verdict": verdict_list[0].text if verdict_list else "not enough steps measured yet",
            "verdicts": [v.as_dict() for v in verdict_list],
            "hang_budget_s": self.budget()[0] if self.current_phase != "done" else None,
            "hangs": [dict(h) for h in self.hangs],
            "epochs": [dict(values, epoch=e) for e, values in self.epochs],
            "updated": time.time(),
            "energy": self._energy(),
        }
        data["text"] = _text(data)
        return data

    def _energy(self) -> dict | None:
        if self.cost is None:
            return None
        try:
            if self.running:
                self.cost.sample()
            return self.cost.summary()
        except Exception:
            log.debug("colabkit: energy summary failed", exc_info=True)
            return None

    def text(self) -> str:
        return self.report()["text"]

    def __repr__(self):
        return f"<colabkit HealthMonitor: {self.steps} steps, phase {self.current_phase}>"

    def series(self) -> dict:
        """What the plots draw: steps (wall, step, s per batch, input share), losses, epochs, GPU series."""
        return {"steps": list(self._step_walls), "losses": list(self._losses), "epochs": list(self.epochs),
                "gpus": self.sampler.series() if self.sampler else {},
                "names": {g.index: g.name for g in (self.sampler.gpus if self.sampler else [])}}


def _gib(value) -> str:
    return "n/a" if value is None else f"{value / 2 ** 30:.1f}"


def _text(r: dict) -> str:
    st = r["step_time_s"]
    share = r["input_fraction"]
    lines = [(f"colabkit health · {r['steps']} steps · step {short_duration(st) if st else 'n/a'}"
              f" · input {'not measured' if share is None else f'{share:.0%}'} ({r['input_kind']})")]
    for g in r["gpus"]:
        parts = [f"GPU {g['index']} ({g['name']}):",
                 "n/a busy" if g["utilization"] is None else f"{g['utilization']:.0f}% busy",
                 f"{_gib(g['memory_used'])}/{_gib(g['memory_total'])} GiB"]
        if g["temperature"] is not None:
            slow = (g.get("thresholds") or {}).get("slowdown")
            parts.append(f"{g['temperature']:.0f} C" + (f" (slowdown {slow:.0f} C)" if slow is not None else ""))
        if g["power"] is not None:
            parts.append(f"{g['power']:.0f}" + (f"/{g['power_limit']:.0f}" if g["power_limit"] else "") + " W")
        if g["reasons"]:
            parts.append("throttled: " + ", ".join(f"{_verdicts.REASON_WORDS.get(k, k)} {v:.0%}"
                                                   for k, v in g["reasons"].items()))
        lines.append(" ".join(parts))
    if r.get("input_note"):
        lines.append(f"input share: {r['input_note']}")
    if not r["gpus"]:
        lines.append(f"GPU: none ({r['gpu_note'] or 'no GPU figures'})")
    h = r["host"]
    if h.get("cpu_percent") is not None:
        lines.append(f"host: CPU {h['cpu_percent']:.0f}% · RAM {h['ram_percent']:.0f}% · this process "
                     f"{_gib(h['rss'])} GiB")
    if r.get("energy"):
        lines.append(r["energy"]["text"])
    lines.append(f"verdict: {r['verdict']}")
    lines += [f"also: {v['text']}" for v in r["verdicts"][1:]]
    for hang in r["hangs"][-3:]:
        lines.append(f"hang at step {hang['step']}: {hang['text']}")
    return "\n".join(lines)
