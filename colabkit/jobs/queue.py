"""The queue of `colabkit run`: run_jobs and the public Runner, which runs jobs side by side in their slots."""
from __future__ import annotations

import contextlib
import datetime as _dt
import importlib
import json
import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path
from collections.abc import Callable, Sequence

from ..health.recorder import ensure_recording
from . import process
from .thermal import JobThermal
from .slots import Slot, claim_request, plan_slots
from .spec import JobError, JobState, RunReport, display_path, prepare_jobs

DEFAULT_GRACE = 30.0
HANG_KILL_GRACE = 10.0   # a hung job gets SIGTERM (AutoResume saves if it still can), then SIGKILL
EXIT_FAILED, EXIT_SIGINT, EXIT_SIGTERM = 1, 130, 143

# run_jobs(cluster=ADDRESS) hands the checked jobs to a cluster runner: a function (jobs, address, *, gpus,
# per_gpu, gpus_per_job, retries, run_dir, grace, min_free, max_util, kernel, out, progress, shared) -> RunReport.
# colabkit.cluster (Ray) builds on Runner, so jobs/ never imports it: this table says where the runner lives and
# it is imported on the first cluster run (as papermill finds its engines); register_cluster_runner replaces it.
CLUSTER_RUNNERS: dict = {"ray": "colabkit.cluster.runner:run_on_cluster"}
DEFAULT_CLUSTER_RUNNER = "ray"


def register_cluster_runner(run: Callable | str, name: str = DEFAULT_CLUSTER_RUNNER) -> None:
    """Make ``run_jobs(cluster=...)`` and `colabkit run --cluster` hand their jobs to ``run`` (a function, or
    "module:function" imported on first use)."""
    CLUSTER_RUNNERS[name] = run


def cluster_runner(name: str = DEFAULT_CLUSTER_RUNNER) -> Callable:
    """The registered cluster runner ``name``, imported now if it was registered by its "module:function"."""
    run = CLUSTER_RUNNERS[name]
    if isinstance(run, str):
        module, _, attr = run.partition(":")
        run = CLUSTER_RUNNERS[name] = getattr(importlib.import_module(module), attr)
    return run


def default_run_dir() -> Path:
    base = Path.cwd() / "colabkit-runs" / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def run_jobs(paths: Sequence, *, gpus="auto", per_gpu: int = 1, gpus_per_job: int = 1, params: Sequence = (),
             args: Sequence[str] = (), retries: int = 0, run_dir=None, grace: float = DEFAULT_GRACE, min_free=None,
             max_util=None, kernel: str | None = None, out=None, progress: bool | None = None,
             hang_timeout="auto", cluster=None, shared: bool = False) -> RunReport:
    """Run the job files over the chosen GPUs (see the colabkit.jobs docs); returns a RunReport (``exit_code``).

    gpus: as for ``colabkit.use_gpus`` ("auto", a count, "0,1", UUIDs). gpus_per_job: GPUs in each job's
    CUDA_VISIBLE_DEVICES (the chosen GPUs grouped in PCI order; spare ones stay idle). params: [(name, value)] for
    notebooks.
    args: the argv tail for scripts (and ``--name value`` parameters for notebooks). out: where progress lines go
    (default stdout). progress: a tqdm bar (default: on a terminal or in a notebook). hang_timeout: "auto",
    "off" or a duration: see the module docs (local runs only: with a cluster, a job's heartbeat is written on
    the machine that runs it, so the queue cannot watch it; "auto" then means off).
    cluster: a Ray address ("ray://host:10001", "host:6379" or "auto"): each job becomes a Ray actor asking for
    its GPUs, placed on any machine of the cluster with free ones (see colabkit.cluster). shared: with a
    cluster, the job files are on storage every machine sees at the same path (otherwise each job's folder is
    uploaded to the machine that runs it).
    """
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise JobError(f"--retries {retries!r}: expected a whole number of at least 0.")
    if not isinstance(grace, (int, float)) or isinstance(grace, bool) or not 0 <= grace < float("inf"):
        raise JobError(f"--grace {grace!r}: expected a number of seconds of at least 0.")
    from ..health.watchdog import parse_timeout
    try:
        hang_timeout = parse_timeout(hang_timeout, name="--hang-timeout")
    except ValueError as exc:
        raise JobError(str(exc)) from None
    jobs = prepare_jobs(paths, params=params, args=args, kernel=kernel)
    if cluster is not None:
        if hang_timeout not in (None, "auto"):
            raise JobError("--hang-timeout DURATION watches local jobs only: on a cluster a job's heartbeat is "
                           "written on the machine that runs it. Drop it (the job's own monitor still dumps "
                           "its stacks there), or run the job locally.")
        return cluster_runner()(jobs, cluster, gpus=gpus, per_gpu=per_gpu, gpus_per_job=gpus_per_job,
                                retries=retries, run_dir=run_dir, grace=float(grace), min_free=min_free,
                                max_util=max_util, kernel=kernel, out=out, progress=progress, shared=shared)
    if shared:
        raise JobError("--shared is for --cluster runs (job files on storage every machine sees); "
                       "drop it, or pass --cluster ADDRESS.")
    slots, note = plan_slots(gpus, per_gpu=per_gpu, gpus_per_job=gpus_per_job, min_free=min_free,
                             max_util=max_util)
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    states = [JobState(job=j, log=run_dir / f"{j.name}.log",
                       output=run_dir / f"{j.name}.ipynb" if j.kind == "notebook" else None) for j in jobs]
    runner = Runner(states, slots, run_dir, retries=retries, grace=float(grace), kernel=kernel,
                    out=out if out is not None else sys.stdout, progress=progress, hang_timeout=hang_timeout)
    if note:
        runner.say(f"colabkit run: {note}")
    return runner.run()


class Runner:
    """The queue: starts waiting jobs in free slots, restarts failed ones up to ``retries`` times, stops every
    job on SIGINT / SIGTERM (SIGTERM, ``grace`` seconds, SIGKILL), kills hung ones, and keeps
    ``<run_dir>/summary.json`` and the progress lines up to date; ``run()`` returns the RunReport.

    It runs each attempt as a process on this machine. A runner that runs them elsewhere (colabkit.cluster's
    ClusterRunner) subclasses it and overrides the extension points:

    - ``launch(state, slot)``: start an attempt of ``state``'s job in ``slot`` (count it in ``state.attempts``,
      set ``state.status`` / ``started`` / ``device``, ``slot.job = state``, and keep its handle in
      ``state.process``); when it ends, put ``("exit", state, handle, returncode)`` on ``events`` (``handle``
      None: it never started).
    - ``signal_job(state, sig)``: send ``sig`` to the running attempt (and set ``state.signalled``).
    - ``on_exit(state, handle, returncode)``: the bookkeeping of an ended attempt (retry, fail, done); an
      override calls it.
    - ``on_event(event)``: any other event tuple put on ``events`` (e.g. where an attempt started).
    - ``describe_exit(state, returncode)``: how an attempt ended, in progress lines.

    and uses ``say(line)``, ``stamp()``, ``refresh()`` and the attributes ``events``, ``stop_signal`` (the
    signal that stops the queue, or None), ``killed`` (SIGKILL sent), ``retries``, ``kernel``, ``run_dir`` and
    ``summary_extra`` (more top-level summary.json fields).
    """

    def __init__(self, states, slots, run_dir: Path, *, retries, grace, kernel, out, progress, hang_timeout="auto"):
        self.states, self.slots, self.run_dir = states, slots, run_dir
        self.hang_timeout = hang_timeout
        self.retries, self.grace, self.kernel, self.out = retries, grace, kernel, out
        self.waiting = list(states)
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # put() is safe in signal handlers
        self.stop_signal: int | None = None
        self.deadline: float | None = None
        self.killed = False
        self.started_at = time.time()
        self.summary_extra: dict = {}  # more top-level summary.json fields (the cluster runner: its address)
        self.bar = self._bar(progress)
        self.line = None               # this queue's place in the machine's GPU line (devices.claims.Line)
        self.blocked_said: dict = {}   # slot label -> the reason last said for not starting a job there
        self.costs: dict = {}          # job name -> [health.runcost.RunCost], one per attempt
        self._rapl = None              # the CPU's energy counters, read once for all running jobs
        self._next_energy = 0.0
        self.thermal = JobThermal(self)   # stops a job (SIGSTOP) while its GPU is too hot

    # output -----------------------------------------------------------------------------------------
    def _bar(self, progress):
        in_notebook = "ipykernel" in sys.modules
        if progress is False or (progress is None and not in_notebook and not _isatty(sys.stderr)):
            return None  # a bar nobody sees: not even worth importing tqdm
        try:
            from tqdm.auto import tqdm
            return tqdm(total=len(self.states), desc="colabkit run", unit="job", leave=False,
                        disable=None if (progress is None and not in_notebook) else False)
        except Exception:  # noqa: BLE001 - a progress bar is never worth failing a run
            return None

    def say(self, line: str) -> None:
        """Print a progress line (above the bar, where there is one)."""
        if self.bar is not None and not self.bar.disable:
            self.bar.write(line, file=self.out)
        else:
            print(line, file=self.out, flush=True)

    def stamp(self) -> str:
        """The time of day that starts a progress line."""
        return time.strftime("%H:%M:%S")

    def refresh(self) -> None:
        """Bring the bar's counts and summary.json up to date."""
        counts = {}
        for s in self.states:
            counts[s.status] = counts.get(s.status, 0) + 1
        if self.bar is not None:
            self.bar.set_postfix_str(", ".join(f"{k} {v}" for k, v in counts.items()), refresh=True)
        self._write_summary("running")

    def _write_summary(self, status: str, exit_code: int | None = None) -> None:
        data = {"run_dir": str(self.run_dir), "status": status, "exit_code": exit_code,
                "started": self.started_at, "updated": time.time(),
                "interrupted_by": None if self.stop_signal is None else signal.Signals(self.stop_signal).name,
                "slots": [s.label for s in self.slots], **self.summary_extra,
                "jobs": [dict(s.as_dict(), energy=self.job_energy(s.job.name)) for s in self.states]}
        tmp = self.run_dir / "summary.json.tmp"
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, self.run_dir / "summary.json")

    # processes --------------------------------------------------------------------------------------
    def claim_slot(self, slot: Slot, state: JobState) -> bool:
        """Claim ``slot``'s GPUs machine-wide for ``state``'s next attempt (devices.claims): False, with a progress
        line, when other processes hold them (the job waits; this queue keeps its place in line until it gets a
        claim, then a later wait joins the line at its end)."""
        if not slot.gpus:
            return True
        from ..devices import GPUsTaken, claims
        if self.line is None:
            where = claims.folder()
            if where is None:
                return True
            self.line = claims.Line(where, f"colabkit run ({display_path(self.run_dir)})", "colabkit run")
        mine = claims.working_under()   # GPUs a parent process (a notebook, another run) or this one claimed
        gpus = {g.uuid: g for s in self.slots for g in s.gpus}   # the queue waits for any of its slots' GPUs
        want = claims.want_of(list(gpus.values()), fraction=slot.share, mine=mine)
        claim = self.line.try_claim(lambda view: claim_request(slot, view, mine=mine), retry=(GPUsTaken,),
                                    what=f"colabkit run job {state.job.name} ({display_path(self.run_dir)})",
                                    want=want)
        if claim is None:
            if self.blocked_said.get(slot.label) != self.line.reason:
                self.blocked_said[slot.label] = self.line.reason
                self.say(f"[{self.stamp()}] waiting {state.job.name} for {slot.label}: {self.line.reason}")
            return False
        self.blocked_said.pop(slot.label, None)
        slot.claim = claim
        return True

    def release_slot(self, slot: Slot) -> None:
        if slot.claim is not None:
            claim, slot.claim = slot.claim, None
            claim.release()

    def launch(self, state: JobState, slot: Slot) -> None:
        """Start an attempt of ``state``'s job in ``slot``: a process on this machine."""
        state.attempts += 1
        state.status, state.device, state.started, state.ended = "running", slot.label, time.time(), None
        slot.job = state
        state.hung, state.kill_at = None, None
        tries = f"attempt {state.attempts}/{self.retries + 1}"
        env = dict(slot.env)
        if slot.claim is not None:
            from ..devices import claims
            shares = [g["share"] for g in slot.claim.gpus if g.get("share")]
            ids = claims.working_under() | {slot.claim.id}
            env.update(claims.child_env(ids, min(shares) if shares else None))
        proc, error = process.start(state, slot.label, env, run_dir=self.run_dir, kernel=self.kernel,
                                    hang_timeout=self.hang_timeout, tries=tries)
        if proc is None:
            self.events.put(("exit", state, None, 127))
            self.say(f"[{self.stamp()}] could not start {state.job.name}: {error}")
            return
        state.process, state.pids = proc, {proc.pid}
        self._start_cost(state, slot, proc.pid)
        threading.Thread(target=self._wait, args=(state, proc), daemon=True).start()
        self.thermal.watch(state, slot)
        self.say(f"[{self.stamp()}] start   {state.job.name} on {slot.label} ({tries}) -> "
                 f"{display_path(state.log)}")

    # energy and money ---------------------------------------------------------------------------------
    def _start_cost(self, state: JobState, slot: Slot, pid: int) -> None:
        """Meter the attempt's energy by its slot's GPUs (its process tree is the run's own on them)."""
        try:
            from ..devices.nvml import open_nvml
            from ..health.energy import Rapl, own_process_tree
            from ..health.runcost import RunCost
            handles = []
            if slot.gpus:
                nv = open_nvml()
                for g in slot.gpus:
                    with contextlib.suppress(nv.NVMLError):
                        handles.append((g.index, nv.nvmlDeviceGetHandleByUUID(g.uuid)))
            if self._rapl is None:
                self._rapl = Rapl()
            cost = RunCost("job", fallback=state.job.name, gpus=handles, cpu=False,
                           own_pids=lambda: own_process_tree(pid)).start()
            self.costs.setdefault(state.job.name, []).append(cost)
        except Exception as exc:  # noqa: BLE001 - a cost figure is never worth failing a job
            self.say(f"[{self.stamp()}] no energy figures for {state.job.name}: {exc}")

    def _sample_costs(self, force: bool = False) -> None:
        if not force and time.monotonic() < self._next_energy:
            return
        self._next_energy = time.monotonic() + 1.0
        running = [c for costs in self.costs.values() for c in costs if not c.final]
        cpu_j = self._rapl.sample() if self._rapl is not None and self._rapl.available else None
        for cost in running:
            if cpu_j is not None:
                # the whole CPU's energy, split evenly between the jobs running now: an estimate when shared
                cost.meter.add_cpu(cpu_j / len(running), estimate=len(running) > 1)
            cost.sample()

    def _end_cost(self, state: JobState, lost: bool) -> str:
        """Book the attempt that just ended (its GPU-hours count as lost when it failed or hung); its line."""
        costs = self.costs.get(state.job.name) or []
        if not costs or costs[-1].final:
            return ""
        self._sample_costs(force=True)
        cost = costs[-1]
        if lost:
            cost.lost_gpu_hours = cost.meter.reading()["gpu_hours"]
        cost.book(final=True)
        return cost.summary()["text"]

    def job_energy(self, name: str) -> dict | None:
        """The job's attempts together: gpu_hours, kwh, gpu_kwh, cpu_kwh, money, cloud_cost, lost_gpu_hours,
        estimate, currency, attempts: [each attempt's summary]."""
        costs = self.costs.get(name)
        if not costs:
            return None
        parts = [c.summary() for c in costs]
        out = {"attempts": [{k: v for k, v in p.items() if k != "text"} for p in parts],
               "estimate": any(p["estimate"] for p in parts), "currency": parts[-1]["currency"],
               "gpus": parts[-1]["gpus"]}
        for key in ("gpu_hours", "kwh", "gpu_kwh", "cpu_kwh", "money", "cloud_cost", "lost_gpu_hours"):
            values = [p[key] for p in parts if p.get(key) is not None]
            out[key] = sum(values) if values else None
        return out

    def energy_total(self) -> str:
        """Every attempt of this run together, in one line ("" when nothing was metered)."""
        parts = [c.summary() for costs in self.costs.values() for c in costs]
        if not parts:
            return ""
        from ..health.prices import num
        approx = "~" if any(p["estimate"] for p in parts) else ""
        kwh = [p["kwh"] for p in parts if p["kwh"] is not None]
        money = [p["money"] for p in parts if p["money"] is not None]
        cloud = [p["cloud_cost"] for p in parts if p["cloud_cost"] is not None]
        lost = sum(p["lost_gpu_hours"] for p in parts)
        text = f"energy of all jobs: {num(sum(p['gpu_hours'] for p in parts))} GPU-h"
        text += f" · {approx}{num(sum(kwh))} kWh" if kwh else " · kWh n/a"
        if money:
            text += f" · {approx}{num(sum(money))} {parts[0]['currency']}"
        if cloud:
            text += f" · cloud {num(sum(cloud))} {parts[0]['cloud']['currency']}"
        if lost:
            text += f" · lost to failed or hung attempts {num(lost)} GPU-h"
        return text + " (colabkit costs sums them over time)"

    def _wait(self, state: JobState, proc) -> None:
        self.events.put(("exit", state, proc, proc.wait()))

    def signal_job(self, state: JobState, sig: int) -> None:
        """Send ``sig`` to the running attempt's process group and every process below it."""
        proc = state.process
        if proc is None:
            return
        state.signalled = True
        process.signal_tree(proc, state.pids, sig)
        if state.paused is not None:   # a stopped process acts on no signal but SIGKILL until it continues
            self.thermal.cont(state, f"{signal.Signals(sig).name} sent by the queue")

    # main loop --------------------------------------------------------------------------------------
    def run(self) -> RunReport:
        """Run the queue until every job ended or it was stopped; prints the report table and returns it."""
        handlers = self._install_handlers()
        ensure_recording()    # the flight recorder, for the whole queue (colabkit health --last after a freeze)
        try:
            self.refresh()
            self._loop()
        finally:
            for slot in self.slots:
                self.release_slot(slot)
            if self.line is not None:
                self.line.close()
            for sig, old in handlers.items():
                signal.signal(sig, old)
            if self.bar is not None:
                self.bar.close()
        for s in self.states:
            if s.status == "waiting":
                s.status = "not started"
        if self.stop_signal is not None:
            code = EXIT_SIGINT if self.stop_signal == signal.SIGINT else EXIT_SIGTERM
        else:
            code = EXIT_FAILED if any(s.status != "ok" for s in self.states) else 0
        self._write_summary("interrupted" if self.stop_signal is not None else "done", code)
        report = RunReport(self.run_dir, self.states, [s.label for s in self.slots], code,
                           None if self.stop_signal is None else signal.Signals(self.stop_signal).name)
        self.say(report.table())
        total = self.energy_total()
        if total:
            self.say(f"colabkit run: {total}")
        failed = [s.job.name for s in self.states if s.status == "failed"]
        where = display_path(self.run_dir)
        if report.interrupted:
            self.say(f"colabkit run: interrupted by {report.interrupted}; logs in {where}")
        elif failed:
            self.say(f"colabkit run: {len(failed)} of {len(self.states)} job(s) failed ({', '.join(failed)}); "
                     f"logs in {where}")
        else:
            self.say(f"colabkit run: all {len(self.states)} job(s) succeeded; logs in {where}")
        return report

    def _install_handlers(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        handlers = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[sig] = signal.getsignal(sig)
            signal.signal(sig, lambda signum, frame: self.events.put(("signal", signum)))
        return handlers

    def _running(self) -> list:
        return [s.job for s in self.slots if s.job is not None]

    def _loop(self) -> None:
        while True:
            if self.stop_signal is None and self.waiting and any(slot.job is None for slot in self.slots):
                launched = False
                for slot in self.slots:
                    if slot.job is None and self.waiting and self.claim_slot(slot, self.waiting[0]):
                        self.launch(self.waiting.pop(0), slot)
                        launched = True
                if launched:
                    self.refresh()
            if self.line is not None and (not self.waiting or self.stop_signal is not None):
                self.line.leave()   # nothing of this queue waits for a GPU any more
            if not self._running() and (not self.waiting or self.stop_signal is not None):
                return
            timeout = 0.5
            if self.deadline is not None:
                timeout = max(0.0, min(timeout, self.deadline - time.monotonic()))
            try:
                event = self.events.get(timeout=timeout)
            except queue.Empty:
                event = None
            if event is not None and event[0] == "signal":
                self._on_signal(event[1])
            elif event is not None and event[0] == "exit":
                self.on_exit(*event[1:])
            elif event is not None:
                self.on_event(event)
            if self.deadline is not None and not self.killed and time.monotonic() >= self.deadline:
                self._kill_all(f"grace period of {self.grace:g}s is over")
            if self.stop_signal is None:
                self.thermal.check()
                self._check_hangs()
            self._sample_costs()

    # hung jobs --------------------------------------------------------------------------------------
    def _check_hangs(self) -> None:
        now = time.time()
        for state in self._running():
            if state.paused is not None:   # stopped on purpose while its GPU cools: not hung
                continue
            if state.hung is not None:
                if state.kill_at is not None and time.monotonic() >= state.kill_at:
                    state.kill_at = None
                    self.signal_job(state, getattr(signal, "SIGKILL", signal.SIGTERM))
                continue
            why = process.hang_reason(state, self.run_dir, self.hang_timeout, now)
            if why is None:
                continue
            state.hung = why
            self.say(f"[{self.stamp()}] hung    {state.job.name}: {why}; stopping it (SIGTERM, SIGKILL in "
                     f"{HANG_KILL_GRACE:g}s)")
            with contextlib.suppress(OSError), open(state.log, "a", encoding="utf-8") as log:
                log.write(f"\n=== colabkit run: hung: {why}; stopping it\n")
            self.signal_job(state, signal.SIGTERM)
            state.kill_at = time.monotonic() + HANG_KILL_GRACE

    # events -----------------------------------------------------------------------------------------
    def on_event(self, event: tuple) -> None:
        """Events other than a signal or an attempt's exit (the cluster runner reports where a job started)."""

    def describe_exit(self, state: JobState, returncode: int) -> str:
        """How an attempt ended, for progress lines ("exit status 1", "killed by SIGKILL")."""
        return process.describe_exit(returncode)

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.stop_signal is None:
            self.stop_signal = signum
            running = self._running()
            for state in running:
                self.signal_job(state, signal.SIGTERM)
            self.deadline = time.monotonic() + self.grace
            self.say(f"[{self.stamp()}] {name}: stopping the queue; sent SIGTERM to {len(running)} running job(s), "
                     f"SIGKILL in {self.grace:g}s "
                     f"({'press Ctrl-C again' if signum == signal.SIGINT else 'signal again'}"
                     f" to kill now); {len(self.waiting)} waiting job(s) will not start")
            self.refresh()
        elif not self.killed:
            self._kill_all(f"second {name}")

    def _kill_all(self, why: str) -> None:
        self.killed = True
        running = self._running()
        for state in running:
            self.signal_job(state, getattr(signal, "SIGKILL", signal.SIGTERM))
        if running:
            self.say(f"[{self.stamp()}] {why}: sent SIGKILL to {', '.join(s.job.name for s in running)}")

    def on_exit(self, state: JobState, proc, returncode: int) -> None:
        """An attempt ended (``proc``: its handle, None if it never started): free its slot, then retry the job,
        or count it as done, failed or stopped."""
        if proc is not None and state.process is not proc:
            return
        stopped = state.paused is not None    # ended while the queue held it stopped (SIGSTOP) for a hot GPU
        self.thermal.forget(state)
        state.ended, state.returncode, state.process = time.time(), returncode, None
        seconds = state.ended - state.started
        state.history.append({"attempt": state.attempts, "device": state.device, "returncode": returncode,
                              "started": state.started, "ended": state.ended, "seconds": round(seconds, 3)})
        freed = [slot for slot in self.slots if slot.job is state]
        for slot in freed:
            slot.job = None
        if proc is not None and (self.killed or state.hung is not None or stopped):
            # a stopped or hung job's leftovers (e.g. a Jupyter kernel stuck in the hung cell, or the workers of
            # a job killed while stopped for a hot GPU) must not outlive it: they would hold the GPU while its
            # retry starts
            process.kill_pids(state.pids)
        for slot in freed:
            self.release_slot(slot)
        how = self.describe_exit(state, returncode)
        # a failed or hung attempt's GPU-hours are lost; one the queue was told to stop is not (it saved)
        energy = self._end_cost(state, lost=state.hung is not None or (returncode != 0 and not state.signalled))
        if state.hung is not None:
            state.history[-1]["hung"] = state.hung
            state.signalled, state.kill_at = False, None
            how = f"hung, {how}"
        if state.signalled:  # stopped by the queue, even if it then exited cleanly (after saving)
            state.status = "stopped"
            self.say(f"[{self.stamp()}] stopped {state.job.name} ({how})")
        elif returncode == 0 and state.hung is None:
            state.status = "ok"
            self.say(f"[{self.stamp()}] done    {state.job.name} in {seconds:.1f}s" + (f"; {energy}" if energy else ""))
        elif self.stop_signal is not None:
            state.status = "failed"
            self.say(f"[{self.stamp()}] failed  {state.job.name} ({how}) while the queue was stopping")
        elif state.attempts <= self.retries:
            state.status = "waiting"
            self.waiting.insert(0, state)
            self.say(f"[{self.stamp()}] failed  {state.job.name} ({how}) after {seconds:.1f}s; retrying "
                     f"({state.attempts}/{self.retries} retries used), see {display_path(state.log)}")
        else:
            state.status = "failed"
            tries = f" and {state.attempts} attempts" if state.attempts > 1 else ""
            self.say(f"[{self.stamp()}] failed  {state.job.name} ({how}) after {seconds:.1f}s{tries}; "
                     f"see {display_path(state.log)}")
        if self.bar is not None and state.status in ("ok", "failed", "stopped"):
            self.bar.update(1)
        self.refresh()


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
