"""One job's processes: its command line, starting an attempt, signalling and killing what it started, hangs."""
from __future__ import annotations

import contextlib
import datetime as _dt
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from ..proctree import descendants
from .spec import Job, JobState, display_path

def job_command(job: Job, output: Path | None, kernel: str | None) -> list:
    """The command line that runs ``job`` (papermill writes a notebook's executed copy to ``output``)."""
    if job.kind == "notebook":
        cmd = [sys.executable, "-m", "papermill", str(job.path), str(output), "--log-output", "--no-progress-bar",
               "--cwd", str(job.path.parent)]
        if kernel:
            cmd += ["-k", kernel]
        for name, value in job.params:
            cmd += ["-p", name, value]
        return cmd
    if job.kind == "python":
        return [sys.executable, "-u", str(job.path), *job.args]
    if job.kind == "shell":
        return ["bash", str(job.path), *job.args]
    return [str(job.path), *job.args]


def start(state: JobState, slot_label: str, slot_env: dict, *, run_dir: Path, kernel: str | None, hang_timeout,
          tries: str) -> tuple[subprocess.Popen | None, OSError | None]:
    """Start an attempt of ``state``'s job in its own session, its output appended to its log after a header:
    (the process, None), or (None, the error) when it could not start (also written to the log)."""
    cmd = job_command(state.job, state.output, kernel)
    env = dict(os.environ)
    env.update(slot_env)
    env.update({"COLABKIT_JOB": state.job.name, "COLABKIT_JOB_ATTEMPT": str(state.attempts),
                "COLABKIT_RUN_DIR": str(run_dir), "PYTHONUNBUFFERED": "1",
                "COLABKIT_HANG_TIMEOUT": "off" if hang_timeout is None else str(hang_timeout)})
    with open(state.log, "a", encoding="utf-8") as log:
        cuda = " ".join(f"{k}={v}" for k, v in slot_env.items())
        log.write(f"=== colabkit run: {state.job.name}, {tries}, on {slot_label} ({cuda or 'no CUDA_* set'}), "
                  f"{_dt.datetime.now().isoformat(timespec='seconds')}\n=== {shlex.join(cmd)}\n")
        log.flush()
        try:
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True), None
        except OSError as exc:
            log.write(f"=== could not start: {exc}\n")
            return None, exc


def signal_tree(proc: subprocess.Popen, pids: set, sig: int) -> None:
    """Send ``sig`` to ``proc``'s process group and to every process below it (children that made their own
    group, such as a Jupyter kernel); ``pids`` collects them, for kill_pids once ``proc`` is gone."""
    if not hasattr(os, "killpg"):  # Windows: no process groups or SIGKILL; terminate() is TerminateProcess
        with contextlib.suppress(OSError):
            proc.terminate()
        return
    pids |= descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # its process group (start_new_session)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill_pids(pids: set) -> None:
    """SIGKILL what is left of a job (e.g. a Jupyter kernel stuck in a hung cell) after its process ended."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))


def describe_exit(returncode: int) -> str:
    """"exit status 3", "killed by SIGKILL": how a job's process ended, for progress lines."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def hang_reason(state: JobState, run_dir: Path, timeout, now: float) -> str | None:
    """Why ``state``'s running job counts as hung now, or None (the heartbeat protocol: health/watchdog.py)."""
    if timeout is None or state.started is None:
        return None
    from ..health.watchdog import job_hang_reason
    return job_hang_reason(run_dir / f"{state.job.name}.health.json", attempt=state.attempts,
                           started=state.started, log=state.log, timeout=timeout, now=now, show_path=display_path,
                           quiet_from=state.resumed_at)
