"""The side of a cluster job that runs on the worker machine: one Ray actor per attempt of a job.

The actor starts the job as a subprocess (the same command `colabkit run` uses on one machine), in the
environment colabkit promises there, and answers the driver's polls with the log bytes written since the last
poll and, once the job ended, its exit status and output notebook. It holds no state the driver cannot lose:
if its machine dies, the driver sees the actor die and starts the job again elsewhere.

GPU numbering: Ray counts a node's GPUs through NVML, whose indices follow the PCI bus order, and hands an actor
the ids of its GPUs in CUDA_VISIBLE_DEVICES (a node started with CUDA_VISIBLE_DEVICES=2,3 hands out 2 and 3).
CUDA numbers devices fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID, so the job gets that order too, which
makes Ray's ids, nvidia-smi's and CUDA's the same GPUs.

This module must import without Ray (the driver's checks import it); Ray is imported inside the methods.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import devices
from ..devices import claims as gpu_claims
from ..jobs.process import job_command, signal_tree
from ..jobs.spec import Job

LOG_CHUNK = 1 << 20   # at most this many log bytes per poll


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the actor's process dies (Linux), as when the machine dies."""
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class JobActor:
    """Runs one attempt of one job on whichever machine Ray placed it."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.folder: Path | None = None
        self.log: Path | None = None
        self.output: Path | None = None
        self.pids: set = set()
        self.sent: dict | None = None   # the job folder's files as sent (None: --shared, it runs in place)
        self.claim = None               # the machine-wide claim (colabkit.devices.claims) on Ray's GPUs

    def start(self, spec: dict, folder_zip: bytes | None = None) -> dict:
        """Start the job (in a copy of its folder unpacked from folder_zip, or where it is on shared storage);
        returns where it runs (host, ip, node, gpus, env, command) and, if it could not start, "error"."""
        import ray
        context = ray.get_runtime_context()
        from ..checkpoints.lease import machine_id
        info = {"host": socket.gethostname(), "ip": ray.util.get_node_ip_address(), "node": context.get_node_id(),
                "machine": machine_id(), "actor_pid": os.getpid()}
        ids = [str(i) for i in ray.get_gpu_ids()]
        info["gpus"] = ids
        self.folder = Path(tempfile.mkdtemp(prefix=f"colabkit-{spec['name']}-"))
        self.log = self.folder / "job.log"
        if spec["shared"]:
            path = Path(spec["path"])
        else:
            from .packing import snapshot, unpack_folder
            unpack_folder(folder_zip, self.folder / "files")
            path = self.folder / "files" / spec["filename"]
            self.sent = snapshot(self.folder / "files")   # what the job writes beside this comes back
        if not path.is_file():
            where = "the shared path" if spec["shared"] else "the job folder sent with it"
            info["error"] = (f"{path} is not on this machine ({where}); "
                             + ("mount the shared storage at the same path on every machine, or drop --shared"
                                if spec["shared"] else "was the file excluded from the upload?"))
            return info
        job = Job(path=path, kind=spec["kind"], name=spec["name"], params=[tuple(p) for p in spec["params"]],
                  args=list(spec["args"]))
        self.output = self.folder / f"{spec['name']}.ipynb" if job.kind == "notebook" else None
        cmd = job_command(job, self.output, spec.get("kernel"))
        env = dict(os.environ)
        env[devices.ORDER_VAR] = "PCI_BUS_ID"
        env[devices.VISIBLE_VAR] = ",".join(ids) if ids else devices.NO_GPUS
        if ids and spec.get("memory_growth") and devices.GROWTH_VAR not in env:
            env[devices.GROWTH_VAR] = "true"
        self.claim = _claim_gpus(ids, spec, self.log)
        if self.claim is not None:
            shares = [g["share"] for g in self.claim.gpus if g.get("share")]
            env.update(gpu_claims.child_env({self.claim.id}, min(shares) if shares else None))
        if spec.get("dead_machines"):  # where earlier attempts died: their checkpoint leases can go at once
            env["COLABKIT_DEAD_MACHINES"] = ",".join(spec["dead_machines"])
        env.update({"COLABKIT_JOB": spec["name"], "COLABKIT_JOB_ATTEMPT": str(spec["attempt"]),
                    "COLABKIT_RUN_DIR": spec["run_dir"], "COLABKIT_CLUSTER_NODE": info["node"],
                    "PYTHONUNBUFFERED": "1"})
        info["env"] = {k: env[k] for k in (devices.ORDER_VAR, devices.VISIBLE_VAR)}
        info["command"] = cmd
        # scripts run in the job's folder here (there is no "current folder" of the driver on this machine)
        cwd = str(path.parent)
        with open(self.log, "ab") as log:
            try:
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=env, cwd=cwd, start_new_session=True,
                                             preexec_fn=_die_with_parent if sys.platform == "linux" else None)
            except OSError as exc:
                info["error"] = f"could not start {cmd[0]}: {exc}"
                return info
        self.pids = {self.proc.pid}
        info["pid"] = self.proc.pid
        return info

    def poll(self, offset: int) -> tuple:
        """(log bytes from offset, exit status or None while running, output notebook bytes or None)."""
        returncode = None if self.proc is None else self.proc.poll()
        if returncode is not None:
            self._release()
        data = b""
        if self.log is not None and self.log.exists():
            with open(self.log, "rb") as fh:
                fh.seek(offset)
                data = fh.read(LOG_CHUNK)
        more = len(data) == LOG_CHUNK
        if returncode is None or more:
            return data, None, None
        notebook = self.output.read_bytes() if self.output is not None and self.output.exists() else None
        return data, returncode, notebook

    def collect(self) -> tuple:
        """After the job ended: (zip or None, count, bytes, paths left out) of the files it created or changed
        in its copy of the folder (at most the upload limit; the copy is removed by cleanup())."""
        if self.sent is None or self.folder is None:
            return None, 0, 0, []
        from .packing import max_bytes, pack_changes
        return pack_changes(self.folder / "files", self.sent, max_bytes())

    def signal(self, sig: int) -> bool:
        """Send sig to the job's process group and every process below it (a Jupyter kernel makes its own)."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        signal_tree(self.proc, self.pids, sig)
        return True

    def cleanup(self) -> None:
        """Kill what is left of the job and remove its scratch folder (called before the actor is released)."""
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        self._release()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _release(self) -> None:
        if self.claim is not None:
            claim, self.claim = self.claim, None
            claim.release()


def _claim_gpus(ids: list, spec: dict, log_path: Path):
    """Claim the GPUs Ray gave this job on this machine (colabkit.devices.claims), so that notebooks, scripts and
    `colabkit run` queues here see them and keep off. Ray does not know about claims: when another process holds
    one of them, the job waits in line for it (the wait is written to the job's log). None without claims."""
    where = gpu_claims.folder()
    if where is None or not ids:
        return None
    inventory = devices.gpus(processes=False, claims=False)
    chosen = [g for g in inventory if not g.is_mig and str(g.index) in ids]
    if not chosen:
        return None
    fraction = spec.get("share")

    def choose(view):
        taken, _ = gpu_claims.taken(chosen, view, mine=set(), share=None, fraction=fraction)
        if taken:
            short = "; ".join(f"GPU {g.label} {taken[g.uuid]}" for g in chosen if g.uuid in taken)
            raise devices.GPUsTaken.with_short(short, short)
        return None, [{"uuid": g.uuid, "index": g.index, "label": g.label,
                       "share": None if fraction is None or g.memory_total is None else int(fraction * g.memory_total)}
                      for g in chosen]

    def say(text: str) -> None:
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"=== {text}\n")

    _, claim = gpu_claims.acquire(choose, path=where, wait=float("inf"), retry=(devices.GPUsTaken,), say=say,
                                      what=f"colabkit run --cluster job {spec['name']}",
                                      request=f"GPU {','.join(ids)} (given by Ray)",
                                      want=gpu_claims.want_of(chosen, fraction=fraction))
    return claim
