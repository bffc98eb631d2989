"""Reaching a Ray cluster: the address forms `colabkit run --cluster` takes, a reachability check that fails in
seconds with one line (ray.init would retry for a minute), and what the cluster offers.

Address forms: ``auto`` (the cluster this machine is part of, as `ray start` left it), ``HOST:PORT`` (the head's
GCS port, 6379 unless `ray start --head --port` said otherwise; a bare ``HOST`` means port 6379) and
``ray://HOST:PORT`` (Ray Client, port 10001 on the head: for a laptop that is not a node of the cluster).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time

from ..jobs.spec import JobError

GCS_PORT, CLIENT_PORT = 6379, 10001
PROBE_TIMEOUT_S = 5.0
# Ray Client starts a server process on the head for each connection; on a busy head that process can die while
# it starts ("Initialization failure from server"), and the next connection gets a fresh one
CLIENT_INIT_ATTEMPTS, CLIENT_INIT_BACKOFF_S = 3, 2.0


def import_ray():
    """The ray module, or an ImportError with the install hint (the CLI prints it as one line)."""
    from ..optional import require
    return require("ray", "cluster", "Running jobs on a Ray cluster (--cluster)")


def parse_address(address) -> tuple[str, str | None, int | None]:
    """(address for ray.init, host, port); host and port are None for "auto"."""
    if not isinstance(address, str) or not address.strip():
        raise JobError(f"--cluster {address!r}: expected a Ray address: ray://HOST:{CLIENT_PORT}, HOST:{GCS_PORT} "
                       f"or auto.")
    text = address.strip()
    if text == "auto":
        return text, None, None
    client = text.startswith("ray://")
    rest = text[len("ray://"):] if client else text
    if "://" in rest or "/" in rest:
        raise JobError(f"--cluster {address!r}: expected ray://HOST:{CLIENT_PORT}, HOST:{GCS_PORT} or auto "
                       f"(no other scheme or path).")
    host, sep, port_text = rest.rpartition(":")
    if not sep:
        host, port_text = rest, str(CLIENT_PORT if client else GCS_PORT)
    host = host.strip("[]")
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise JobError(f"--cluster {address!r}: {port_text!r} is not a port number; expected "
                       f"ray://HOST:{CLIENT_PORT} or HOST:{GCS_PORT}.")
    port = int(port_text)
    return (f"ray://{host}:{port}" if client else f"{host}:{port}"), host, port


def probe(host: str, port: int, address: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise JobError with one line when nothing answers at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc)).lower()
        start = (f"`ray start --head --port={port}`" if not address.startswith("ray://")
                 else f"`ray start --head` (Ray Client listens on port {CLIENT_PORT})")
        raise JobError(f"--cluster {address}: cannot reach a Ray cluster at {host}:{port} ({why}). Start one with "
                       f"{start} on that machine, or check the address and that the port is open in its "
                       f"firewall.") from None


@dataclasses.dataclass
class Node:
    node_id: str
    ip: str
    name: str
    gpus: float
    cpus: float

    @property
    def label(self) -> str:
        return f"{self.name} ({self.node_id[:8]})" if self.name and self.name != self.ip else \
            f"{self.ip} ({self.node_id[:8]})"


def _connected_elsewhere(ray, target: str, host: str | None, port: int | None) -> str | None:
    """The GCS address this process is connected to when HOST:PORT names another cluster, else None (for
    "auto" and ray:// addresses, whose GCS port is not known here, None)."""
    if host is None or target.startswith("ray://"):
        return None
    try:
        current = ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 - a Ray Client connection has no GCS address to compare
        return None
    current_host, _, current_port = str(current or "").rpartition(":")
    if not current_host:
        return None
    try:
        same_host = socket.gethostbyname(host) == socket.gethostbyname(current_host)
    except OSError:
        same_host = host == current_host
    return None if same_host and str(port) == current_port else str(current)


def connect(address: str):
    """Connect this process to the cluster (reusing a connection it already has); returns (ray, we_connected)."""
    ray = import_ray()
    target, host, port = parse_address(address)
    if ray.is_initialized():   # run_jobs() called from a program that already connected
        current = _connected_elsewhere(ray, target, host, port)
        if current is not None:
            raise JobError(f"--cluster {address}: this process is already connected to the Ray cluster at "
                           f"{current}; call ray.shutdown() first, or pass that address (or \"auto\").")
        return ray, False
    if host is not None:
        probe(host, port, target)
    try:
        _init(ray, target)
    except ConnectionError as exc:
        raise JobError(f"--cluster {address}: could not connect to a Ray cluster ({str(exc).splitlines()[0]}). "
                       f"Start one with `ray start --head` and pass its address (HOST:{GCS_PORT})."
                       + _auth_hint()) from None
    except Exception as exc:  # noqa: BLE001 - a handshake that fails (version mismatch, ...): one line
        raise JobError(f"--cluster {address}: connecting to the Ray cluster failed: "
                       f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}."
                       + _auth_hint()) from None
    return ray, True


def _init(ray, target: str) -> None:
    """ray.init, again (with a fresh Ray Client server on the head) when a ray:// connection's server failed to
    start; any other failure is raised at once."""
    attempts = CLIENT_INIT_ATTEMPTS if target.startswith("ray://") else 1
    for attempt in range(1, attempts + 1):
        try:
            # job output goes to the run folder's logs, not to this terminal
            ray.init(address=target, log_to_driver=False, logging_level=logging.WARNING)
            return
        except ConnectionAbortedError:
            if attempt == attempts:
                raise
            ray.shutdown()
            time.sleep(CLIENT_INIT_BACKOFF_S * attempt)


def _auth_hint() -> str:
    """A cluster with Ray's token authentication refuses a driver that has no token: say how to give it one."""
    if os.environ.get("RAY_AUTH_MODE") == "token":
        return " The cluster may also have refused this machine's Ray token (RAY_AUTH_TOKEN or ~/.ray/auth_token)."
    return (" If the cluster uses Ray's token authentication, set RAY_AUTH_MODE=token here and put the cluster's "
            "token in ~/.ray/auth_token (or RAY_AUTH_TOKEN).")


def alive_nodes(ray) -> list:
    nodes = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        resources = n.get("Resources") or {}
        nodes.append(Node(node_id=n["NodeID"], ip=n.get("NodeManagerAddress", "?"),
                          name=n.get("NodeManagerHostname") or n.get("NodeName") or "",
                          gpus=float(resources.get("GPU", 0)), cpus=float(resources.get("CPU", 0))))
    return nodes


def capacity(nodes: list, *, gpus_per_job: int, per_gpu: int) -> tuple[int, float, float, str]:
    """(jobs the cluster runs at once, num_gpus, num_cpus per job, a line describing the cluster).

    A job's GPUs are on one machine, so a node with fewer GPUs than gpus_per_job takes none. A cluster without
    GPUs runs the jobs on CPUs, per_gpu at a time on each node (as `colabkit run` does on one machine).
    """
    total_gpus = sum(n.gpus for n in nodes)
    desc = (f"{len(nodes)} node(s), {total_gpus:g} GPU(s): "
            + ", ".join(f"{n.label} {n.gpus:g} GPU" for n in nodes))
    if total_gpus == 0:
        if gpus_per_job > 1:
            raise JobError(f"--gpus-per-job {gpus_per_job}: the cluster has no GPUs (its machines declared none to "
                           f"Ray: `ray start` counts them through NVML, or pass --num-gpus). {desc}.")
        return per_gpu * len(nodes), 0.0, 1.0, desc + "; no GPUs: the jobs run on CPUs"
    if per_gpu > 1 and gpus_per_job > 1:
        raise JobError(f"--per-gpu {per_gpu} with --gpus-per-job {gpus_per_job}: on a cluster Ray shares a GPU only "
                       f"between jobs that ask for a fraction of one; use one of the two.")
    biggest = max(n.gpus for n in nodes)
    if biggest < gpus_per_job:
        raise JobError(f"--gpus-per-job {gpus_per_job}: no machine of the cluster has that many GPUs (the most on "
                       f"one is {biggest:g}; a job's GPUs must be on one machine). {desc}.")
    slots = sum(int(n.gpus // gpus_per_job) for n in nodes) * per_gpu
    return slots, (gpus_per_job if per_gpu == 1 else 1.0 / per_gpu), 0.0, desc


def node_label(info: dict) -> str:
    """Where a job runs, as the live summary shows it: host, node id, GPUs."""
    where = info.get("host") or info.get("ip") or "?"
    if info.get("ip") and info["ip"] != where:
        where += f" {info['ip']}"
    gpus = info.get("gpus") or []
    return f"{where} node {info.get('node', '?')[:8]} " + (f"GPU {','.join(map(str, gpus))}" if gpus else "CPU")
