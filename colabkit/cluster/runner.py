"""`colabkit run --cluster`: the local queue's loop, with each attempt of a job a Ray actor on the cluster.

Ray does the placing: an actor asks for ``num_gpus`` and starts on any machine with that many free. colabkit keeps
what it does on one machine: the run folder (logs streamed while a job runs, output notebooks, summary.json with
the machine each job runs on), ``--retries`` (a job whose machine died is started again on another one), and
Ctrl-C (SIGTERM to every job, ``--grace`` seconds, then SIGKILL).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import os
import re
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

from ..jobs.process import describe_exit
from ..jobs.queue import DEFAULT_GRACE, Runner, default_run_dir
from ..jobs.slots import Slot
from ..jobs.spec import JobError, JobState, RunReport, display_path
from . import connect as _connect

POLL_S = 0.5
NODE_LOST = -1000  # the returncode recorded for an attempt whose machine (or Ray worker) died
NODE_DEATH_WAIT_S = 60.0  # how long a lost attempt waits for Ray to mark its node dead (Ray's default: ~30 s)
MAX_RESUBMITS = 3  # attempts lost before their job started, resubmitted without using up --retries
_ANSI = re.compile(r"\x1b\[[0-9;]*m")   # Ray colours its error texts
UPLOAD_EXCLUDES = [".git/", "__pycache__/", ".ipynb_checkpoints/", "colabkit-runs/", ".venv/"]


class _Attempt:
    """One attempt of a job on the cluster: its actor and what the watcher thread learned."""

    def __init__(self, actor):
        self.actor = actor
        self.started = False     # the job's process runs (the actor was placed and started it)
        self.node: str | None = None
        self.machine: str | None = None
        self.lost: str | None = None


def run_on_cluster(jobs: list, address: str, *, gpus="auto", per_gpu: int = 1, gpus_per_job: int = 1,
                   retries: int = 0, run_dir=None, grace: float = DEFAULT_GRACE, min_free=None, max_util=None,
                   kernel: str | None = None, out=None, progress=None, shared: bool = False) -> RunReport:
    """Run prepared jobs on the Ray cluster at ``address`` (see colabkit.jobs.run_jobs)."""
    for flag, value in (("--per-gpu", per_gpu), ("--gpus-per-job", gpus_per_job)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise JobError(f"{flag} {value!r}: expected a whole number of at least 1.")
    if gpus not in ("auto", None) or min_free is not None or max_util is not None:
        raise JobError("--gpus, --min-free and --max-util choose GPUs of this machine; with --cluster, Ray chooses "
                       "free GPUs on any machine: ask for a number per job with --gpus-per-job.")
    ray, connected = _connect.connect(address)
    try:
        nodes = _connect.alive_nodes(ray)
        n_slots, num_gpus, num_cpus, description = _connect.capacity(nodes, gpus_per_job=gpus_per_job,
                                                                     per_gpu=per_gpu)
        from .. import config
        memory_growth = config.load().memory_growth
        run_dir = Path(run_dir) if run_dir is not None else default_run_dir()
        folders = {} if shared else _pack_folders(ray, jobs, run_dir, out if out is not None else sys.stdout)
        run_dir.mkdir(parents=True, exist_ok=True)   # (a folder too large: nothing started yet)
        states = [JobState(job=j, log=run_dir / f"{j.name}.log",
                           output=run_dir / f"{j.name}.ipynb" if j.kind == "notebook" else None) for j in jobs]
        slots = [Slot(f"cluster slot {i + 1}", {}) for i in range(max(1, n_slots))]
        # hang_timeout off: a job's heartbeat is written on the machine that runs it, out of the queue's sight
        runner = ClusterRunner(ray, states, slots, run_dir, retries=retries, grace=grace, kernel=kernel,
                               hang_timeout=None,
                               out=out if out is not None else sys.stdout, progress=progress, shared=shared,
                               num_gpus=num_gpus, num_cpus=num_cpus, memory_growth=memory_growth, folders=folders)
        runner.summary_extra = {"cluster": {"address": address, "nodes": [vars(n) for n in nodes],
                                            "num_gpus_per_job": num_gpus}}
        runner.say(f"colabkit run: cluster {address}: {description}; {n_slots} job(s) at a time")
        return runner.run()
    finally:
        if connected:
            ray.shutdown()


def _pack_folders(ray, jobs: list, run_dir: Path, out) -> dict:
    """{job folder: an object ref to a zip of it}, put in Ray's object store once per folder; a machine that
    runs a job unpacks it and runs the job there. Raises JobError, before anything starts, for a folder too
    large to send with every job (it belongs on shared storage: --shared)."""
    from .packing import pack
    refs = {}
    for job in jobs:
        folder = job.path.parent
        if folder in refs:
            continue
        excludes = list(UPLOAD_EXCLUDES)
        try:  # the run folder may sit inside the job's folder: never send earlier runs' logs
            excludes.append(run_dir.resolve().relative_to(folder).as_posix() + "/")
        except ValueError:
            pass
        packed = pack(folder, excludes)
        print(f"colabkit run: sending {folder} with its jobs: {packed.describe()} (what .gitignore lists stays "
              f"here)", file=out, flush=True)
        refs[folder] = ray.put(packed.data)
    return refs


class ClusterRunner(Runner):
    """colabkit.jobs.queue.Runner with each attempt of a job a Ray actor (it overrides the extension points)."""

    def __init__(self, ray, states, slots, run_dir, *, shared, num_gpus, num_cpus, memory_growth, folders,
                 **kwargs):
        super().__init__(states, slots, run_dir, **kwargs)
        self.ray, self.shared, self.folders = ray, shared, folders
        self.resubmitted: dict = {}
        self.start_failures: dict = {}  # job name -> why its last attempt could not start (the actor failed)
        self.dead_machines: dict = {}  # job name -> machines (checkpoints.lease ids) that died running it
        self.num_gpus, self.num_cpus, self.memory_growth = num_gpus, num_cpus, memory_growth
        from .worker import JobActor
        self.actor_class = ray.remote(JobActor)

    def _spec(self, state: JobState) -> dict:
        job = state.job
        return {"name": job.name, "kind": job.kind, "filename": job.path.name, "path": str(job.path),
                "params": job.params, "args": job.args, "kernel": self.kernel, "attempt": state.attempts,
                "run_dir": str(self.run_dir), "shared": self.shared, "memory_growth": self.memory_growth,
                "dead_machines": sorted(self.dead_machines.get(job.name, ())),
                "share": self.num_gpus if 0 < self.num_gpus < 1 else None}

    # processes --------------------------------------------------------------------------------------
    def launch(self, state: JobState, slot: Slot) -> None:
        state.attempts += 1
        state.status, state.started, state.ended = "running", time.time(), None
        state.device = "waiting for a machine"
        state.signalled = False
        slot.job = state
        tries = f"attempt {state.attempts}/{self.retries + 1}"
        with open(state.log, "a", encoding="utf-8") as log:
            log.write(f"=== colabkit run --cluster: {state.job.name}, {tries}, asking Ray for "
                      f"{self.num_gpus:g} GPU(s), {_dt.datetime.now().isoformat(timespec='seconds')}\n")
        try:
            options = {"num_gpus": self.num_gpus, "num_cpus": self.num_cpus, "max_restarts": 0}
            actor = self.actor_class.options(**options).remote()
        except Exception as exc:  # noqa: BLE001 - e.g. the connection to the cluster dropped
            message = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            with open(state.log, "a", encoding="utf-8") as log:
                log.write(f"=== could not submit to the cluster: {message}\n")
            self.say(f"[{self.stamp()}] could not start {state.job.name}: {message}")
            self.events.put(("exit", state, None, 127))
            return
        attempt = _Attempt(actor)
        state.process = attempt
        folder = None if self.shared else self.folders[state.job.path.parent]
        threading.Thread(target=self._watch, args=(state, attempt, self._spec(state), folder, tries),
                         daemon=True).start()
        self.say(f"[{self.stamp()}] submit  {state.job.name} ({tries}) -> {display_path(state.log)}")

    def _watch(self, state: JobState, attempt: _Attempt, spec: dict, folder, tries: str) -> None:
        """Thread: start the job on its actor, copy its log as it grows, report its end (or its machine's)."""
        ray = self.ray
        rc = NODE_LOST
        try:
            info = ray.get(attempt.actor.start.remote(spec, folder))
            if info.get("error"):
                with open(state.log, "a", encoding="utf-8") as log:
                    log.write(f"=== on {_connect.node_label(info)}: {info['error']}\n")
                rc = 127
                return
            attempt.started, attempt.node, attempt.machine = True, info.get("node"), info.get("machine")
            with open(state.log, "a", encoding="utf-8") as log:   # before any of the job's own output
                env = " ".join(f"{k}={v}" for k, v in info.get("env", {}).items())
                log.write(f"=== on {_connect.node_label(info)} ({env}), pid {info.get('pid')}\n"
                          f"=== {shlex.join(info.get('command', []))}\n")
            self.events.put(("started", state, attempt, info, tries))
            offset = 0
            while True:
                data, returncode, notebook = ray.get(attempt.actor.poll.remote(offset))
                if data:
                    offset += len(data)
                    with open(state.log, "ab") as log:
                        log.write(data)
                if returncode is not None:
                    if notebook is not None and state.output is not None:
                        tmp = state.output.with_suffix(".ipynb.tmp")
                        tmp.write_bytes(notebook)
                        os.replace(tmp, state.output)
                    if not self.shared:
                        self._bring_back_files(state, attempt)
                    rc = returncode
                    return
                time.sleep(POLL_S)
        except Exception as exc:  # noqa: BLE001 - RayActorError, ActorDiedError, NodeDiedError, ...
            text = _ANSI.sub("", str(exc))
            if not attempt.started and "creation task" in text:   # the machine is there; our actor failed on it
                why = ('colabkit is not installed there: pip install "colabkit[cluster]" on every machine'
                       if "No module named 'colabkit" in text else _first_line(_ANSI.sub("", text.split("\n", 1)[-1]))
                       or text[:300])
                with open(state.log, "a", encoding="utf-8") as log:
                    log.write(f"=== colabkit run --cluster: the job could not start on the machine Ray chose: {why}\n"
                              f"=== {text[:2000]}\n")
                self.start_failures[state.job.name] = why
                rc = 127
                return
            attempt.lost = f"{type(exc).__name__}: {_first_line(_ANSI.sub('', str(exc)))}"
            with open(state.log, "a", encoding="utf-8") as log:
                log.write(f"\n=== colabkit run --cluster: the job's machine or Ray worker was lost "
                          f"({attempt.lost})\n")
                if attempt.node is not None and self.stop_signal is None and _names_a_lost_node(text):
                    # until Ray marks the node dead it may place the next attempt there again (an actor that
                    # died alone, e.g. to the OOM killer, leaves a healthy node: no wait)
                    seconds = self._wait_for_node_death(attempt.node)
                    log.write(f"=== node {attempt.node[:8]} " + (f"marked dead by Ray after {seconds:.1f}s\n"
                              if seconds is not None else f"still alive after {NODE_DEATH_WAIT_S:g}s\n"))
                    if seconds is not None and attempt.machine:
                        self.dead_machines.setdefault(state.job.name, set()).add(attempt.machine)
        finally:
            if attempt.lost is None:
                with contextlib.suppress(Exception):  # the actor is gone already: nothing left to clean
                    ray.get(attempt.actor.cleanup.remote(), timeout=30)
            with contextlib.suppress(Exception):  # releases its GPUs; a dead actor holds none
                ray.kill(attempt.actor)
            self.events.put(("exit", state, attempt, rc))

    def _bring_back_files(self, state: JobState, attempt: _Attempt) -> None:
        """What the job wrote into its copy of the folder (a saved model, plots, a relative checkpoint folder)
        into <run>/<job>-files/, as a local run would have left it next to the job."""
        from .packing import unpack_folder
        try:
            data, count, nbytes, left_out = self.ray.get(attempt.actor.collect.remote(), timeout=600)
        except Exception as exc:  # noqa: BLE001 - the job ended; only its extra files are lost
            message = f"could not bring back the files it wrote: {type(exc).__name__}: {_first_line(exc)}"
        else:
            if not count and not left_out:
                return
            target = self.run_dir / f"{state.job.name}-files"
            if data is not None:
                unpack_folder(data, target)
            from ..units import format_size
            message = f"{count} file(s) it wrote ({format_size(nbytes)}) copied to {display_path(target)}"
            if left_out:
                message += (f"; {len(left_out)} left out as too large and removed with the job's copy "
                            f"({', '.join(left_out[:5])}{', ...' if len(left_out) > 5 else ''}): write large "
                            f"outputs to storage every machine sees")
        with open(state.log, "a", encoding="utf-8") as log:
            log.write(f"=== colabkit run --cluster: {message}\n")

    def _wait_for_node_death(self, node_id: str) -> float | None:
        began = time.monotonic()
        while time.monotonic() - began < NODE_DEATH_WAIT_S and self.stop_signal is None:   # Ctrl-C: stop waiting
            with contextlib.suppress(Exception):  # the head is busy: ask again
                if not any(n["NodeID"] == node_id and n.get("Alive") for n in self.ray.nodes()):
                    return time.monotonic() - began
            time.sleep(0.5)
        return None

    def on_exit(self, state: JobState, proc, returncode: int) -> None:
        unstarted = (isinstance(proc, _Attempt) and proc is state.process and returncode == NODE_LOST
                     and not proc.started and self.stop_signal is None
                     and self.resubmitted.get(state.job.name, 0) < MAX_RESUBMITS)
        if unstarted:  # lost before the job ran (its machine died as it was placed): not one of --retries
            self.resubmitted[state.job.name] = self.resubmitted.get(state.job.name, 0) + 1
            state.attempts -= 1
        super().on_exit(state, proc, returncode)
        if unstarted and state.history:
            state.history[-1].update(attempt=state.attempts + 1, started=False)

    def on_event(self, event: tuple) -> None:
        if event[0] != "started":
            return
        _, state, attempt, info, tries = event
        if state.process is not attempt:
            return
        state.device = _connect.node_label(info)
        self.say(f"[{self.stamp()}] start   {state.job.name} on {state.device} ({tries})")
        if self.stop_signal is not None:  # started after Ctrl-C: it gets the same signal as the others
            self.signal_job(state, signal.SIGKILL if self.killed else signal.SIGTERM)
        self.refresh()

    def signal_job(self, state: JobState, sig: int) -> None:
        attempt = state.process
        if not isinstance(attempt, _Attempt):
            return
        state.signalled = True
        with contextlib.suppress(Exception):  # an actor that is gone needs no signal
            if not attempt.started or sig == getattr(signal, "SIGKILL", None):
                if attempt.started:
                    attempt.actor.signal.remote(sig)  # the job first, then its actor
                    attempt.actor.cleanup.remote()
                else:  # still waiting for a machine: nothing to save, withdraw it
                    self.ray.kill(attempt.actor)
            else:
                attempt.actor.signal.remote(sig)

    def describe_exit(self, state: JobState, returncode: int) -> str:
        if returncode == NODE_LOST:
            return "its machine or Ray worker was lost"
        if returncode == 127 and state.job.name in self.start_failures:
            return f"could not start on the machine Ray chose: {self.start_failures.pop(state.job.name)}"
        return describe_exit(returncode)


def _names_a_lost_node(text: str) -> bool:
    """False when Ray's error says the actor alone was killed for memory (its node is fine: nothing to wait
    for); True otherwise, where the node may be dying (waiting costs time, not placing the retry there)."""
    return not re.search(r"out of memory|memory monitor|\boom\b", text, re.IGNORECASE)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""
