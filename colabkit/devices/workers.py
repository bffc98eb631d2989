"""A multi-worker run's worker list: which entry this machine is, and the TF_CONFIG that says so to TensorFlow."""
from __future__ import annotations

import dataclasses
import json
import os
import socket

DEFAULT_PORT = 12345
INDEX_VAR = "COLABKIT_WORKER_INDEX"


class WorkerListError(ValueError):
    """A worker list colabkit cannot turn into TF_CONFIG for this machine."""


@dataclasses.dataclass
class WorkerInfo:
    workers: list
    index: int

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    def __str__(self) -> str:
        role = "the chief" if self.is_chief else "a worker"
        return f"worker {self.index} of {len(self.workers)} ({self.workers[self.index]}), {role}"


def _normalise(workers) -> list:
    if isinstance(workers, str) or not workers:
        raise WorkerListError(f"workers={workers!r}: expected a list of hosts, e.g. [\"gpu-a:{DEFAULT_PORT}\", "
                              f"\"gpu-b:{DEFAULT_PORT}\"] (the first is the chief).")
    out = []
    for w in workers:
        text = str(w).strip()
        host, sep, port = text.rpartition(":")
        if not sep:
            host, port = text, str(DEFAULT_PORT)
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise WorkerListError(f"workers: {w!r} is not HOST or HOST:PORT.")
        out.append(f"{host}:{int(port)}")
    if len(set(out)) != len(out):
        raise WorkerListError(f"workers={list(workers)!r}: an address appears twice; each worker needs its own "
                              f"HOST:PORT.")
    return out


def _my_names() -> set:
    names = {socket.gethostname(), socket.getfqdn()}
    try:
        names |= set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    return {n.lower() for n in names if n}


def _is_this_machine(host: str, mine: set) -> bool:
    """``host`` names this machine: one of its names, or an address this machine can bind to (on Debian and
    Ubuntu the hostname resolves to 127.0.1.1, so a worker list of LAN addresses must be checked this way)."""
    if host.lower() in mine:
        return True
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, _, _, _, address in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((address[0], 0))
            return True
        except OSError:
            continue
    return False


def worker_index(workers: list, index=None) -> int:
    """Which entry of ``workers`` this process is: ``index``, else $COLABKIT_WORKER_INDEX, else the one entry
    whose host names this machine."""
    if index is None and os.environ.get(INDEX_VAR, "").strip():
        raw = os.environ[INDEX_VAR].strip()
        if not raw.isdigit():
            raise WorkerListError(f"{INDEX_VAR}={raw!r}: expected the position of this worker in the list (0, 1, ...).")
        index = int(raw)
    if index is not None:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(workers):
            raise WorkerListError(f"index={index!r}: expected 0 to {len(workers) - 1} for {len(workers)} workers "
                                  f"({', '.join(workers)}).")
        return index
    mine = _my_names()
    matches = [i for i, w in enumerate(workers) if _is_this_machine(w.rpartition(":")[0], mine)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise WorkerListError(f"the worker list ({', '.join(workers)}) does not include this host "
                              f"({', '.join(sorted(mine))}); add it, or pass index= (or set {INDEX_VAR}).")
    raise WorkerListError(f"this host is entries {matches} of the worker list ({', '.join(workers)}); say which "
                          f"one this process is with index= (or {INDEX_VAR}).")


def tf_config(workers, index=None) -> WorkerInfo:
    """Write TF_CONFIG for ``workers`` (["host:port", ...], worker 0 the chief) and this worker's position in it."""
    workers = _normalise(workers)
    i = worker_index(workers, index)
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
    return WorkerInfo(workers, i)
