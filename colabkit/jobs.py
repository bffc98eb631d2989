"""`colabkit run`: run experiments side by side, one per GPU, from a queue.

    colabkit run --gpus 0,1 train_a.ipynb train_b.ipynb sweep.py -- --lr 1e-3

Each job gets its own GPU through CUDA_DEVICE_ORDER=PCI_BUS_ID + CUDA_VISIBLE_DEVICES (``--per-gpu N`` packs N
jobs on each GPU; ``--gpus-per-job N`` gives each job N GPUs, e.g. for a MirroredStrategy run; TensorFlow memory
growth is switched on for them unless the ``memory_growth`` setting is off); jobs beyond the free slots wait.
Notebooks run through papermill (``-p name value``; output notebooks are saved next to the logs), ``.py`` files
with this Python, ``.sh`` files with bash, other executable files directly. Arguments after ``--`` go to
scripts; notebooks receive ``--name value`` pairs from there as parameters. Notebooks run in their own folder,
scripts in the current one.

Every job file is checked before anything starts. Each job's output goes to ``<run dir>/<job>.log`` (all
attempts, each with a header), its state to ``<run dir>/summary.json``. A failed job is started again up to
``--retries`` times (with colabkit's AutoResume in the job, the restart resumes from its last checkpoint;
COLABKIT_JOB_ATTEMPT tells the job which attempt it is). Ctrl-C or SIGTERM stops the queue: running jobs get
SIGTERM and ``--grace`` seconds to save, then SIGKILL; a second Ctrl-C kills at once. Exit status: 0 when every
job succeeded, 1 when one failed, 130 / 143 when interrupted by SIGINT / SIGTERM.

Hung jobs (``--hang-timeout``, default ``auto``): a job that runs colabkit's training monitor
(``colabkit.monitor()``, ``colabkit.keras.Monitor``, ``AutoResume(monitor=True)``) writes a heartbeat to
``<run dir>/<job>.health.json``; with ``auto`` the queue kills the job when its monitor reports a hang (no step
for longer than the budget it learned; its stack dump is ``<run dir>/<job>.hang-*.txt``) or when the heartbeat
stops coming. ``--hang-timeout DURATION`` kills a job after DURATION without a step (jobs without a monitor:
without a new line in their log). A killed job (SIGTERM, SIGKILL 10 s later) counts as failed, so ``--retries``
restarts it, from its last checkpoint with AutoResume. ``off``: never.

A machine without GPUs runs the jobs on the CPU, ``--per-gpu`` at a time. On a GPU in MIG mode each instance is a
slot of its own (CUDA gives a process one instance).

``--cluster ADDRESS`` runs the same jobs on a Ray cluster instead, each on any machine with free GPUs
(colabkit/cluster/runner.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import importlib.util
import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

KINDS = {".ipynb": "notebook", ".py": "python", ".sh": "shell"}  # anything else: an executable file
DEFAULT_GRACE = 30.0
HANG_KILL_GRACE = 10.0   # a hung job gets SIGTERM (AutoResume saves if it still can), then SIGKILL
EXIT_FAILED, EXIT_SIGINT, EXIT_SIGTERM = 1, 130, 143


class JobError(ValueError):
    """Bad job list or options, reported before anything starts."""


@dataclasses.dataclass
class Job:
    path: Path
    kind: str
    name: str
    params: list = dataclasses.field(default_factory=list)  # [(name, value)] for notebooks
    args: list = dataclasses.field(default_factory=list)    # argv tail for scripts


@dataclasses.dataclass
class Slot:
    label: str   # "GPU 0", "MIG 0:1", "CPU"
    env: dict    # CUDA_* variables for a job in this slot
    job: "JobState | None" = None


@dataclasses.dataclass
class JobState:
    job: Job
    log: Path
    output: Path | None
    status: str = "waiting"   # waiting, running, ok, failed, stopped, not started
    attempts: int = 0
    returncode: int | None = None
    device: str | None = None
    started: float | None = None
    ended: float | None = None
    history: list = dataclasses.field(default_factory=list)
    process: subprocess.Popen | None = dataclasses.field(default=None, repr=False)
    pids: set = dataclasses.field(default_factory=set, repr=False)
    signalled: bool = dataclasses.field(default=False, repr=False)
    hung: str | None = dataclasses.field(default=None, repr=False)     # why the queue killed it as hung
    kill_at: float | None = dataclasses.field(default=None, repr=False)

    def as_dict(self) -> dict:
        return {"name": self.job.name, "path": str(self.job.path), "kind": self.job.kind, "status": self.status,
                "attempts": self.attempts, "returncode": self.returncode, "device": self.device,
                "log": str(self.log), "output": None if self.output is None else str(self.output),
                "params": self.job.params, "args": self.job.args, "history": self.history}


@dataclasses.dataclass
class RunReport:
    run_dir: Path
    jobs: list
    slots: list
    exit_code: int
    interrupted: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def table(self) -> str:
        rows = [("job", "kind", "device", "tries", "status", "exit", "time", "log")]
        for s in self.jobs:
            seconds = sum(h["seconds"] for h in s.history)
            rows.append((s.job.name, s.job.kind, s.device or "-", str(s.attempts), s.status,
                         "-" if s.returncode is None else str(s.returncode),
                         f"{seconds:.1f}s" if s.history else "-", _rel(s.log)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)

    def __str__(self) -> str:
        return self.table()


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# ------------------------------------------------------------------------------------------------ checking

def args_to_params(args: Sequence[str]) -> list:
    """`--lr 1e-3 --epochs=3 --fast` -> [("lr", "1e-3"), ("epochs", "3"), ("fast", "True")] for notebooks."""
    params, i = [], 0
    args = list(args)
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise JobError(f"Notebook jobs take the arguments after -- as --name value pairs (papermill "
                           f"parameters); {arg!r} is not one. Use -p NAME VALUE, or run notebooks and scripts "
                           f"in separate `colabkit run` calls.")
        key = arg[2:]
        if "=" in key:
            key, value = key.split("=", 1)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value, i = args[i + 1], i + 1
        else:
            value = "True"
        key = key.replace("-", "_")
        if not key.isidentifier():
            raise JobError(f"{arg!r} does not name a notebook parameter (a Python identifier).")
        params.append((key, value))
        i += 1
    return params


def prepare_jobs(paths: Sequence, *, params: Sequence = (), args: Sequence[str] = (), kernel: str | None = None,
                 names: Sequence[str] | None = None) -> list:
    """Check every job file and build the jobs; raises JobError listing every problem at once."""
    if not paths:
        raise JobError("No jobs given: name notebooks (.ipynb), scripts (.py, .sh) or executables to run.")
    problems, jobs, used = [], [], {}
    params = [(str(k), str(v)) for k, v in params]
    for k, _ in params:
        if not k.isidentifier():
            problems.append(f"-p {k!r}: a parameter name must be a Python identifier")
    notebook_params = None
    kernels_needed = {}
    for raw in paths:
        path = Path(os.path.expanduser(str(raw)))
        if not path.exists():
            problems.append(f"{raw}: no such file")
            continue
        if not path.is_file():
            problems.append(f"{raw}: not a file")
            continue
        kind = KINDS.get(path.suffix.lower())
        if kind is None:
            if not os.access(path, os.X_OK):
                problems.append(f"{raw}: not a notebook (.ipynb), a script (.py, .sh) or an executable file")
                continue
            kind = "executable"
        job = Job(path=path.resolve(), kind=kind, name="")
        if kind == "notebook":
            try:
                with open(path, encoding="utf-8") as fh:
                    nb = json.load(fh)
                if not isinstance(nb, dict) or "cells" not in nb:
                    raise ValueError("no cells")
            except (OSError, ValueError) as exc:
                problems.append(f"{raw}: not a readable Jupyter notebook ({exc})")
                continue
            name = kernel or (nb.get("metadata", {}).get("kernelspec") or {}).get("name")
            if not name:
                problems.append(f"{raw}: the notebook names no kernel (metadata.kernelspec); pass --kernel python3")
            else:
                kernels_needed.setdefault(name, []).append(str(raw))
            if notebook_params is None:
                try:
                    notebook_params = args_to_params(args)
                except JobError as exc:
                    problems.append(str(exc))
                    notebook_params = []
            job.params = params + notebook_params
        else:
            job.args = list(args)
        jobs.append(job)
    for i, job in enumerate(jobs):
        base = names[i] if names else re.sub(r"[^\w.-]+", "_", job.path.stem) or "job"
        n = used[base] = used.get(base, 0) + 1
        job.name = base if n == 1 else f"{base}-{n}"
    if kernels_needed:
        if importlib.util.find_spec("papermill") is None:
            problems.append('Running notebooks needs papermill, which is not installed: '
                            'pip install "colabkit[notebook]"')
        else:
            problems += _check_kernels(kernels_needed)
    if problems:
        raise JobError("Nothing was started:\n  " + "\n  ".join(problems))
    return jobs


def _check_kernels(needed: dict) -> list:
    try:
        from jupyter_client.kernelspec import KernelSpecManager
        available = set(KernelSpecManager().find_kernel_specs())
    except Exception:  # noqa: BLE001 - papermill will report it per job
        return []
    available.add("python3")  # ipykernel's native kernel is always available where papermill runs
    return [f"{', '.join(files)}: no Jupyter kernel named {name!r} (installed: {', '.join(sorted(available))})"
            for name, files in needed.items() if name not in available]


def plan_slots(gpus="auto", *, per_gpu: int = 1, gpus_per_job: int = 1, min_free=None, max_util=None,
               memory_growth=None):
    """(slots, note): `per_gpu` slots per chosen GPU (per group of `gpus_per_job` GPUs), or CPU slots where the
    machine has none."""
    from . import devices
    for flag, value in (("--per-gpu", per_gpu), ("--gpus-per-job", gpus_per_job)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise JobError(f"{flag} {value!r}: expected a whole number of at least 1.")
    if memory_growth is None:
        from . import config
        memory_growth = config.load().memory_growth
    request = devices.parse_request(gpus) if isinstance(gpus, str) else gpus
    chosen = devices.select_gpus(request, min_free=min_free, max_util=max_util, one_process=gpus_per_job > 1)
    if not chosen:
        env = {} if chosen.leave_env else {devices.ORDER_VAR: "PCI_BUS_ID", devices.VISIBLE_VAR: devices.NO_GPUS}
        return [Slot("CPU", dict(env)) for _ in range(per_gpu)], chosen.note
    groups, note = _group(list(chosen), gpus_per_job)
    slots = []
    for _ in range(per_gpu):  # round robin: a second job goes to another GPU before doubling up
        for group in groups:
            env = {devices.ORDER_VAR: "PCI_BUS_ID", devices.VISIBLE_VAR: ",".join(g.cuda_id for g in group)}
            if memory_growth and devices.GROWTH_VAR not in os.environ:
                env[devices.GROWTH_VAR] = "true"
            kind = "MIG" if group[0].is_mig else "GPU" if len(group) == 1 else "GPUs"
            slots.append(Slot(f"{kind} {','.join(g.label for g in group)}", env))
    return slots, note


def _group(chosen: list, size: int) -> tuple[list, str | None]:
    """The chosen GPUs in groups of `size`: neighbours in PCI order among them (these tend to share a PCIe switch)."""
    if size == 1:
        return [[g] for g in chosen], None
    if any(g.is_mig for g in chosen):
        raise JobError(f"--gpus-per-job {size}: the chosen devices are MIG instances "
                       f"({', '.join(g.label for g in chosen if g.is_mig)}), and CUDA gives a process at most one; "
                       f"MIG instances cannot be grouped. Use --gpus-per-job 1, or whole GPUs.")
    if len(chosen) < size:
        raise JobError(f"--gpus-per-job {size}: only {len(chosen)} GPU(s) chosen "
                       f"({', '.join(g.label for g in chosen)}). Ask for at most {len(chosen)}, or choose more "
                       f"GPUs with --gpus.")
    ordered = sorted(chosen, key=lambda g: g.index)
    usable = len(ordered) - len(ordered) % size
    groups = [ordered[i:i + size] for i in range(0, usable, size)]
    spare = ordered[usable:]
    note = None
    if spare:
        note = (f"{len(ordered)} GPUs do not split into groups of {size}; "
                f"{'GPU' if len(spare) == 1 else 'GPUs'} {', '.join(g.label for g in spare)} left idle.")
    return groups, note


def _command(job: Job, output: Path | None, kernel: str | None) -> tuple:
    if job.kind == "notebook":
        cmd = [sys.executable, "-m", "papermill", str(job.path), str(output), "--log-output", "--no-progress-bar",
               "--cwd", str(job.path.parent)]
        if kernel:
            cmd += ["-k", kernel]
        for name, value in job.params:
            cmd += ["-p", name, value]
        return cmd, None
    if job.kind == "python":
        return [sys.executable, "-u", str(job.path), *job.args], None
    if job.kind == "shell":
        return ["bash", str(job.path), *job.args], None
    return [str(job.path), *job.args], None


# ------------------------------------------------------------------------------------------------- running

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
    """Run the job files over the chosen GPUs (see the module docs); returns a RunReport (``exit_code``).

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
    from .health.watchdog import parse_timeout
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
        from .cluster.runner import run_on_cluster
        return run_on_cluster(jobs, cluster, gpus=gpus, per_gpu=per_gpu, gpus_per_job=gpus_per_job,
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
    runner = _Runner(states, slots, run_dir, retries=retries, grace=float(grace), kernel=kernel,
                     out=out if out is not None else sys.stdout, progress=progress, hang_timeout=hang_timeout)
    if note:
        runner.say(f"colabkit run: {note}")
    return runner.run()


class _Runner:
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
        if self.bar is not None and not self.bar.disable:
            self.bar.write(line, file=self.out)
        else:
            print(line, file=self.out, flush=True)

    def _stamp(self) -> str:
        return time.strftime("%H:%M:%S")

    def _refresh(self) -> None:
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
                "jobs": [s.as_dict() for s in self.states]}
        tmp = self.run_dir / "summary.json.tmp"
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, self.run_dir / "summary.json")

    # processes --------------------------------------------------------------------------------------
    def _launch(self, state: JobState, slot: Slot) -> None:
        state.attempts += 1
        state.status, state.device, state.started, state.ended = "running", slot.label, time.time(), None
        slot.job = state
        cmd, cwd = _command(state.job, state.output, self.kernel)
        env = dict(os.environ)
        env.update(slot.env)
        env.update({"COLABKIT_JOB": state.job.name, "COLABKIT_JOB_ATTEMPT": str(state.attempts),
                    "COLABKIT_RUN_DIR": str(self.run_dir), "PYTHONUNBUFFERED": "1",
                    "COLABKIT_HANG_TIMEOUT": "off" if self.hang_timeout is None else str(self.hang_timeout)})
        state.hung, state.kill_at = None, None
        tries = f"attempt {state.attempts}/{self.retries + 1}"
        with open(state.log, "a", encoding="utf-8") as log:
            cuda = " ".join(f"{k}={v}" for k, v in slot.env.items())
            log.write(f"=== colabkit run: {state.job.name}, {tries}, on {slot.label} ({cuda or 'no CUDA_* set'}), "
                      f"{_dt.datetime.now().isoformat(timespec='seconds')}\n=== {shlex.join(cmd)}\n")
            log.flush()
            try:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=env, cwd=cwd, start_new_session=True)
            except OSError as exc:
                log.write(f"=== could not start: {exc}\n")
                self.events.put(("exit", state, None, 127))
                self.say(f"[{self._stamp()}] could not start {state.job.name}: {exc}")
                return
        state.process, state.pids = proc, {proc.pid}
        threading.Thread(target=self._wait, args=(state, proc), daemon=True).start()
        self.say(f"[{self._stamp()}] start   {state.job.name} on {slot.label} ({tries}) -> {_rel(state.log)}")

    def _wait(self, state: JobState, proc: subprocess.Popen) -> None:
        self.events.put(("exit", state, proc, proc.wait()))

    def _signal_job(self, state: JobState, sig: int) -> None:
        proc = state.process
        if proc is None:
            return
        state.signalled = True
        if not hasattr(os, "killpg"):  # Windows: no process groups or SIGKILL; terminate() is TerminateProcess
            with contextlib.suppress(OSError):
                proc.terminate()
            return
        state.pids |= _descendants(proc.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)  # its process group (start_new_session)
        for pid in state.pids:  # and children that made their own group, such as a Jupyter kernel
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    # main loop --------------------------------------------------------------------------------------
    def run(self) -> RunReport:
        handlers = self._install_handlers()
        try:
            self._refresh()
            self._loop()
        finally:
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
        failed = [s.job.name for s in self.states if s.status == "failed"]
        if report.interrupted:
            self.say(f"colabkit run: interrupted by {report.interrupted}; logs in {_rel(self.run_dir)}")
        elif failed:
            self.say(f"colabkit run: {len(failed)} of {len(self.states)} job(s) failed ({', '.join(failed)}); "
                     f"logs in {_rel(self.run_dir)}")
        else:
            self.say(f"colabkit run: all {len(self.states)} job(s) succeeded; logs in {_rel(self.run_dir)}")
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
                for slot in self.slots:
                    if slot.job is None and self.waiting:
                        self._launch(self.waiting.pop(0), slot)
                self._refresh()
            if not self._running():
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
                self._on_exit(*event[1:])
            elif event is not None:
                self._on_event(event)
            if self.deadline is not None and not self.killed and time.monotonic() >= self.deadline:
                self._kill_all(f"grace period of {self.grace:g}s is over")
            if self.stop_signal is None:
                self._check_hangs()

    # hung jobs --------------------------------------------------------------------------------------
    def _check_hangs(self) -> None:
        now = time.time()
        for state in self._running():
            if state.hung is not None:
                if state.kill_at is not None and time.monotonic() >= state.kill_at:
                    state.kill_at = None
                    self._signal_job(state, getattr(signal, "SIGKILL", signal.SIGTERM))
                continue
            why = self._hung_because(state, now)
            if why is None:
                continue
            state.hung = why
            self.say(f"[{self._stamp()}] hung    {state.job.name}: {why}; stopping it (SIGTERM, SIGKILL in "
                     f"{HANG_KILL_GRACE:g}s)")
            with contextlib.suppress(OSError), open(state.log, "a", encoding="utf-8") as log:
                log.write(f"\n=== colabkit run: hung: {why}; stopping it\n")
            self._signal_job(state, signal.SIGTERM)
            state.kill_at = time.monotonic() + HANG_KILL_GRACE

    def _hung_because(self, state: JobState, now: float) -> str | None:
        """Why ``state``'s job counts as hung now, or None (the heartbeat protocol: health/watchdog.py)."""
        if self.hang_timeout is None or state.started is None:
            return None
        from .health.watchdog import job_hang_reason
        return job_hang_reason(self.run_dir / f"{state.job.name}.health.json", attempt=state.attempts,
                               started=state.started, log=state.log, timeout=self.hang_timeout, now=now,
                               show_path=_rel)

    def _on_event(self, event: tuple) -> None:
        """Events other than a signal or a job's exit (the cluster runner reports where a job started)."""

    def _describe(self, state: JobState, returncode: int) -> str:
        return _describe_exit(returncode)

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.stop_signal is None:
            self.stop_signal = signum
            running = self._running()
            for state in running:
                self._signal_job(state, signal.SIGTERM)
            self.deadline = time.monotonic() + self.grace
            self.say(f"[{self._stamp()}] {name}: stopping the queue; sent SIGTERM to {len(running)} running job(s), "
                     f"SIGKILL in {self.grace:g}s ({'press Ctrl-C again' if signum == signal.SIGINT else 'signal again'}"
                     f" to kill now); {len(self.waiting)} waiting job(s) will not start")
            self._refresh()
        elif not self.killed:
            self._kill_all(f"second {name}")

    def _kill_all(self, why: str) -> None:
        self.killed = True
        running = self._running()
        for state in running:
            self._signal_job(state, getattr(signal, "SIGKILL", signal.SIGTERM))
        if running:
            self.say(f"[{self._stamp()}] {why}: sent SIGKILL to {', '.join(s.job.name for s in running)}")

    def _on_exit(self, state: JobState, proc, returncode: int) -> None:
        if proc is not None and state.process is not proc:
            return
        state.ended, state.returncode, state.process = time.time(), returncode, None
        seconds = state.ended - state.started
        state.history.append({"attempt": state.attempts, "device": state.device, "returncode": returncode,
                              "started": state.started, "ended": state.ended, "seconds": round(seconds, 3)})
        for slot in self.slots:
            if slot.job is state:
                slot.job = None
        if proc is not None and (self.killed or state.hung is not None):
            # a stopped or hung job's leftovers (e.g. a Jupyter kernel stuck in the hung cell) must not outlive
            # it: they would hold the GPU while its retry starts
            for pid in state.pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))
        how = self._describe(state, returncode)
        if state.hung is not None:
            state.history[-1]["hung"] = state.hung
            state.signalled, state.kill_at = False, None
            how = f"hung, {how}"
        if state.signalled:  # stopped by the queue, even if it then exited cleanly (after saving)
            state.status = "stopped"
            self.say(f"[{self._stamp()}] stopped {state.job.name} ({how})")
        elif returncode == 0 and state.hung is None:
            state.status = "ok"
            self.say(f"[{self._stamp()}] done    {state.job.name} in {seconds:.1f}s")
        elif self.stop_signal is not None:
            state.status = "failed"
            self.say(f"[{self._stamp()}] failed  {state.job.name} ({how}) while the queue was stopping")
        elif state.attempts <= self.retries:
            state.status = "waiting"
            self.waiting.insert(0, state)
            self.say(f"[{self._stamp()}] failed  {state.job.name} ({how}) after {seconds:.1f}s; retrying "
                     f"({state.attempts}/{self.retries} retries used), see {_rel(state.log)}")
        else:
            state.status = "failed"
            self.say(f"[{self._stamp()}] failed  {state.job.name} ({how}) after {seconds:.1f}s"
                     f"{f' and {state.attempts} attempts' if state.attempts > 1 else ''}; see {_rel(state.log)}")
        if self.bar is not None and state.status in ("ok", "failed", "stopped"):
            self.bar.update(1)
        self._refresh()


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def _descendants(pid: int) -> set:
    """PIDs of every process below `pid` (Linux /proc; elsewhere none, and the process group is signalled)."""
    children: dict = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


# ------------------------------------------------------------------------------------------------------ CLI

def add_arguments(parser) -> None:
    """The `colabkit run` options (cli.py registers the subcommand)."""
    parser.add_argument("jobs", nargs="+", metavar="JOB",
                        help="notebooks (.ipynb, run with papermill), scripts (.py, .sh) or executables; "
                             "arguments after -- go to every script, and as --name value parameters to notebooks")
    parser.add_argument("--gpus", default="auto",
                        help="which GPUs: auto (default: all), a count (2), indices (0,1; 1, for GPU 1 alone) "
                             "or UUIDs")
    parser.add_argument("--per-gpu", type=int, default=1, metavar="N",
                        help="jobs at a time on each GPU (or group of --gpus-per-job GPUs; default 1)")
    parser.add_argument("--gpus-per-job", type=int, default=1, metavar="N",
                        help="GPUs each job gets: the chosen GPUs grouped in PCI order (default 1; 2+ for a "
                             "MirroredStrategy job)")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="a papermill parameter for notebook jobs (repeatable)")
    parser.add_argument("--retries", type=int, default=0, metavar="N",
                        help="start a failed job again up to N times (default 0)")
    parser.add_argument("--grace", type=float, default=DEFAULT_GRACE, metavar="SECONDS",
                        help=f"on Ctrl-C/SIGTERM, seconds between SIGTERM and SIGKILL (default {DEFAULT_GRACE:g})")
    parser.add_argument("--hang-timeout", default="auto", metavar="auto|DURATION|off",
                        help="kill a hung job and count it as failed (so --retries restarts it): auto (default) "
                             "when the job's colabkit monitor reports a hang or its heartbeat stops; DURATION "
                             "(e.g. 20min) after that long without a step (without a monitor: without output); "
                             "off: never")
    parser.add_argument("--run-dir", metavar="DIR", help="where logs, output notebooks and summary.json go "
                                                         "(default ./colabkit-runs/<date-time>)")
    parser.add_argument("--min-free", metavar="SIZE", help="only GPUs with this much free memory, e.g. 8GiB")
    parser.add_argument("--max-util", type=float, metavar="PCT", help="only GPUs at most this busy (%%)")
    parser.add_argument("--kernel", metavar="NAME", help="Jupyter kernel for notebooks (default: the notebook's)")
    parser.add_argument("--cluster", metavar="ADDRESS",
                        help="run the jobs on a Ray cluster: ray://HOST:10001, HOST:6379 or auto; each job asks "
                             "Ray for --gpus-per-job GPUs and runs on any machine with free ones "
                             '(needs pip install "colabkit[cluster]")')
    parser.add_argument("--shared", action="store_true",
                        help="with --cluster: the job files are on storage every machine sees at the same path "
                             "(default: each job's folder is uploaded to the machine that runs it)")


def main_from_args(args) -> int:
    report = run_jobs(args.jobs, gpus=args.gpus, per_gpu=args.per_gpu, gpus_per_job=args.gpus_per_job,
                      params=args.parameter, args=getattr(args, "passthrough", []) or [], retries=args.retries,
                      run_dir=args.run_dir,
                      grace=args.grace, min_free=args.min_free, max_util=args.max_util, kernel=args.kernel,
                      hang_timeout=args.hang_timeout, cluster=args.cluster, shared=args.shared)
    return report.exit_code
