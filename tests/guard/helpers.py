"""Running the guard as a user does (`python -m colabkit guard ...` in a process of its own), killing its whole
process tree as a reclaimed VM does, and reading what reached the destination."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from colabkit.proctree import descendants

SCRIPTS = Path(__file__).resolve().parent / "scripts"
REPO = Path(__file__).resolve().parents[2]


def vm_env(tmp_path: Path, name: str) -> dict:
    """The environment of a fresh VM: its own empty cache (local staging)."""
    cache = tmp_path / f"{name}-cache"
    cache.mkdir(exist_ok=True)
    return {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(REPO)}


def guard_args(watch, to, *options, resume="--resume_from_checkpoint={latest}"):
    """`colabkit guard` with quick settings; ``options`` end with "--" and the training command."""
    args = [sys.executable, "-m", "colabkit", "guard", "--watch", str(watch), "--to", str(to), "--settle", "0.3",
            "--every", "0.2", "--deadline", "off"]
    if resume:
        args += ["--resume-arg", resume]
    return args + list(options)


def start(args, env, tmp_path: Path, name: str) -> subprocess.Popen:
    out = open(tmp_path / f"{name}.out", "wb")
    err = open(tmp_path / f"{name}.err", "wb")
    return subprocess.Popen(args, env=env, stdout=out, stderr=err, start_new_session=True, cwd=tmp_path)


def output(tmp_path: Path, name: str) -> tuple[str, str]:
    return ((tmp_path / f"{name}.out").read_text(errors="replace"),
            (tmp_path / f"{name}.err").read_text(errors="replace"))


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the guard and everything below it at once, as when the VM is reclaimed."""
    pids = {proc.pid} | descendants(proc.pid)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids - {proc.pid}):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def committed(dest: Path) -> list:
    from colabkit.checkpoints.folder import CheckpointFolder
    if not dest.exists():
        return []
    return sorted(CheckpointFolder(dest).committed(), key=lambda c: c.step)


def wait_until(condition, timeout: float, what: str, proc=None, step: float = 0.1):
    end = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the guard exited ({proc.returncode}) before {what}")
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(step)


def result(folder: Path) -> dict:
    return json.loads((folder / "result.json").read_text())
