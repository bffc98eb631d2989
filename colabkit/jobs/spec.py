"""The job model of `colabkit run`: a job, its state and the run's report, and the checks every job file passes."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path
from collections.abc import Sequence

KINDS = {".ipynb": "notebook", ".py": "python", ".sh": "shell"}  # anything else: an executable file


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
class JobState:
    """A job in the queue: its attempts so far and, while one runs, the handle of its process (``process``: a
    subprocess.Popen on this machine, whatever the runner uses elsewhere)."""
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
    # the thermal pause (jobs/thermal.py): {"since", "why"} while stopped for a hot GPU; every pause so far
    paused: dict | None = None
    pauses: list = dataclasses.field(default_factory=list)
    resumed_at: float | None = dataclasses.field(default=None, repr=False)   # when the last pause ended

    def as_dict(self) -> dict:
        return {"name": self.job.name, "path": str(self.job.path), "kind": self.job.kind, "status": self.status,
                "attempts": self.attempts, "returncode": self.returncode, "device": self.device,
                "log": str(self.log), "output": None if self.output is None else str(self.output),
                "params": self.job.params, "args": self.job.args, "history": self.history,
                "paused": self.paused, "thermal_pauses": self.pauses}


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
                         f"{seconds:.1f}s" if s.history else "-", display_path(s.log)))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)

    def __str__(self) -> str:
        return self.table()


def display_path(path: Path) -> str:
    """``path`` as progress lines and reports show it: relative to the current folder where it lies below it."""
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


def prepare_jobs(paths: Sequence, *, params: Sequence = (), args: Sequence[str] = (),
                 kernel: str | None = None) -> list:
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
    for job in jobs:
        base = re.sub(r"[^\w.-]+", "_", job.path.stem) or "job"
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
