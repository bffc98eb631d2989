"""The subprocess probes: each framework imported in a fresh Python of its own (framework_probe.py), and an
NCCL all-reduce over every GPU, one process per GPU (allreduce_probe.py), killed when it outlasts its timeout."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROBE_TIMEOUT_S = 180.0    # importing TensorFlow and creating its GPU devices can take a minute on a cold disk
NCCL_TIMEOUT_S = 60.0      # a healthy all-reduce of one number takes seconds, most of it NCCL's start


def _child_env() -> dict:
    env = dict(os.environ)
    # the box, not this shell's choice of GPUs: every GPU must be seen (CUDA_DEVICE_ORDER stays: it is checked)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")   # device_lib creates devices: take no more than needed
    return env


def probe_framework(name: str, timeout: float = PROBE_TIMEOUT_S) -> dict:
    """What `name` ("torch" or "tensorflow") reports in a fresh process: see framework_probe.py; plus
    {"crashed": text} when it died and {"timed_out": True} when it outlasted ``timeout``."""
    try:
        done = subprocess.run([sys.executable, str(HERE / "framework_probe.py"), name], env=_child_env(),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"installed": True, "timed_out": True}
    for line in done.stdout.splitlines():
        if line.startswith("COLABKIT-PROBE "):
            return json.loads(line[len("COLABKIT-PROBE "):])
    last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return {"installed": True, "crashed": last}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def all_reduce(world_size: int, timeout: float = NCCL_TIMEOUT_S) -> dict:
    """An NCCL all-reduce of ones over GPUs 0..world_size-1. Returns {"ok": bool, "seconds", "hung": bool,
    "error": the first failing rank's last stderr line or None}."""
    env = _child_env()
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(world_size))
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="colabkit-nccl-") as logs:
        procs = []
        for rank in range(world_size):
            err = open(os.path.join(logs, f"rank{rank}.err"), "w+")
            proc = subprocess.Popen([sys.executable, str(HERE / "allreduce_probe.py")],
                                    env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                    stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
            procs.append((proc, err))
        # poll: a rank that fails leaves the others waiting for it, so the first failure ends the wait
        while any(p.poll() is None for p, _ in procs) and time.monotonic() - start < timeout:
            if any(p.returncode not in (0, None) for p, _ in procs):
                break
            time.sleep(0.1)
        failed = any(p.returncode not in (0, None) for p, _ in procs)
        hung = not failed and any(p.poll() is None for p, _ in procs)
        if hung or failed:
            for proc, _ in procs:   # the others would wait for the dead or stuck rank forever
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        seconds = time.monotonic() - start
        error = None
        for proc, err in procs:
            err.seek(0)
            if not hung and proc.returncode not in (0, -signal.SIGKILL) and error is None:
                lines = [ln for ln in err.read().splitlines() if ln.strip()]
                error = lines[-1].strip() if lines else f"exit status {proc.returncode}"
            err.close()
    return {"ok": not hung and error is None, "hung": hung, "seconds": seconds, "error": error}
