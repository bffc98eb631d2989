"""Training runs in fresh processes, quickly: each run is a new process forked from a server that has imported
torch and transformers (and TRL) once and nothing else (no colabkit, no model, no training state), so that a
dozen runs do not each pay the seconds of a cold ``import transformers``. Each run gets its own environment (a
new cache folder stands for a new VM's local disk) and its own stdout/stderr file, which the tests read as the
user's cell output."""
from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
_CTX = None


def _context():
    global _CTX
    if _CTX is None:
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        _CTX = multiprocessing.get_context("forkserver")
        _CTX.set_forkserver_preload(["tests.hf.worker", "trl", "datasets"])
    return _CTX


def _child(spec, env, log):
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.clear()
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.default_int_handler)   # as in a notebook kernel
    from tests.hf import worker
    worker.main(spec)
    atexit._run_exitfuncs()   # a forked child ends with os._exit: run what a process's exit would run


class Run:
    """One training run in a fresh process; ``finish()`` returns (RESULT dict or None, output, explanation)."""

    def __init__(self, env, tmp_path, name, **spec):
        self.log = Path(tmp_path) / f"{name}.log"
        spec.setdefault("out", str(Path(tmp_path) / f"{name}.npz"))
        spec.setdefault("output_dir", str(Path(tmp_path) / f"{name}-output"))
        env = {**env, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.process = _context().Process(target=_child, args=(spec, env, str(self.log)), daemon=False)
        self.process.start()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for(self, marker: str, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while marker not in self.output():
            assert self.process.is_alive() and time.monotonic() < end, f"no {marker!r}:\n{self.output()}"
            time.sleep(0.05)

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)

    def finish(self, expect_rc=0, timeout: float = 300):
        self.process.join(timeout)
        if self.process.is_alive():
            self.kill()
            self.process.join()
        out = self.output()
        explain = f"exitcode={self.process.exitcode}\n--- output\n{out[-6000:]}"
        assert self.process.exitcode == expect_rc, explain
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        return (json.loads(lines[-1][len("RESULT "):]) if lines else None), out, explain


def run(env, tmp_path, name, expect_rc=0, **spec):
    return Run(env, tmp_path, name, **spec).finish(expect_rc)
