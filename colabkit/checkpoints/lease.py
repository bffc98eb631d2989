"""One writer per checkpoint destination, across machines: a lease record in the destination folder.

The local claim (writer.py) sees only processes on this machine. Two VMs, or Colab and a home rig sharing a
Drive folder, would each prune and resume the other's checkpoints. So a writer also keeps a small record in
the destination itself, ``.colabkit-lease.json``: who holds it (host, process, a random token), when it was
taken and when it was last renewed. A background thread renews it every ``RENEW_S``; another writer that
finds a lease renewed within ``TIMEOUT_S`` gets FolderInUse naming the holder, and takes over (with a
warning) a lease that was not renewed for longer, as one left by a VM that was reclaimed. A holder that ran
on this machine in this boot and whose process is gone is taken over at once. One held on a machine that
`colabkit run --cluster` saw die while the job ran there (it names such machines in COLABKIT_DEAD_MACHINES for
the job's next attempt) is taken over once it went unrenewed for two renewal periods (2 x ``RENEW_S``, 60 s by
default) instead of ``TIMEOUT_S``: Ray declaring a machine dead does not stop its processes (after a network cut
the old job can run on), and a writer that still renews is still there, so it gets FolderInUse.

What it cannot guarantee: Drive has no atomic create-if-absent, so two writers starting within moments of
each other can both write a record. Each reads the record back after writing it, and every renewal checks
that the record is still its own: the writer that finds another's record stops uploading and pruning (its
checkpoints stay on its local disk) and says so. Staleness compares the holder's clock with the reader's, so
machines whose clocks differ by more than ``TIMEOUT_S`` could take over a live lease; the renewal check then
stops the older writer.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time

from .folder import LEASE_NAME, CheckpointError  # noqa: F401 - LEASE_NAME is part of this module's story

log = logging.getLogger("colabkit")

RENEW_S = float(os.environ.get("COLABKIT_LEASE_RENEW_S", 30.0))
TIMEOUT_S = float(os.environ.get("COLABKIT_LEASE_TIMEOUT_S", 180.0))
READ_BACK_LAG_S = 1.0   # Drive's listings are eventually consistent


class FolderInUse(CheckpointError):
    """Another process (on this machine or another) is writing checkpoints to the same folder."""


def in_use_message(holder: str, destination, where: str = "") -> str:
    return (f"{holder} is already writing checkpoints to {destination}{where}; two runs in one folder would prune and "
            f"resume each other's checkpoints. Give each run its own folder (in `colabkit run` jobs, e.g. "
            f"f\"drive:runs/mnist-{{os.environ['COLABKIT_JOB']}}\"), or stop the other run first.")


def _machine_id() -> str:
    """This boot of this machine: the hostname and Linux's boot id (a reboot, or another machine with the same
    name, reads as another machine)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _dead_here(record: dict) -> bool:
    """True when the record's holder ran on this machine, in this boot, and its process is gone (a killed
    run re-started on the same VM need not wait for the lease to expire)."""
    if record.get("machine") != _machine_id():
        return False
    try:
        os.kill(int(record.get("pid", -1)), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError):
        return False
    return False


def _known_dead_machine(record: dict) -> bool:
    """True when the record's machine is one that `colabkit run --cluster` saw die (it names them in
    COLABKIT_DEAD_MACHINES for the job's next attempt, which need not wait for the lease to expire)."""
    dead = {m for m in os.environ.get("COLABKIT_DEAD_MACHINES", "").split(",") if m}
    return bool(dead) and record.get("machine") in dead


def _describe(record: dict) -> str:
    return f"process {record.get('pid', '?')} on host {record.get('host', '?')}"


def _age(record: dict, now: float) -> str:
    return f" (its lease was renewed {max(0.0, now - float(record.get('renewed', 0))):.0f}s ago)"


_shared: dict[str, "Lease"] = {}
_shared_lock = threading.Lock()


def lease_for(dest, location, on_warning) -> "Lease":
    """This process's one Lease on ``dest`` (several Checkpoints objects on a folder, as a notebook cell run
    twice makes, share it as they share the local claim)."""
    key = str(dest.path)
    with _shared_lock:
        lease = _shared.get(key)
        if lease is None or not (lease.held or lease._owners):
            lease = _shared[key] = Lease(dest, location, on_warning)   # bound to the newest client
        return lease


class Lease:
    """This process's lease on one destination (a CheckpointFolder or an API back end with read_lease,
    write_lease and remove_lease). ``acquire(owner)`` raises FolderInUse or OSError; the record goes when the
    last owner releases; ``lost`` turns True when another writer's record replaced ours."""

    def __init__(self, dest, location, on_warning):
        self.dest, self.location, self._on_warning = dest, location, on_warning
        self._owners: set[int] = set()
        self.token = secrets.token_hex(8)
        self.held = False
        self.lost = False
        self._beat = 0
        self._started = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def _record(self) -> dict:
        now = time.time()
        return {"token": self.token, "host": socket.gethostname(), "machine": _machine_id(), "pid": os.getpid(),
                "started": self._started or now, "renewed": now, "beat": self._beat,
                "location": str(self.location)}

    def _read(self) -> dict | None:
        data = self.dest.read_lease()
        if data is None:
            return None
        try:
            record = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None   # a torn record (written in place) says nothing about a live holder
        return record if isinstance(record, dict) else None

    def acquire(self, owner) -> None:
        """Take the lease for ``owner`` (held already: no-op). FolderInUse when another writer renewed its
        lease recently."""
        with self._lock:
            if self.held:
                self._owners.add(id(owner))
                self._start_renewing()   # in case a release was under way
                return
            current = self._read()
            now = time.time()
            if current is not None and current.get("token") != self.token:
                age = now - float(current.get("renewed", 0))
                if current.get("machine") == _machine_id() and current.get("pid") == os.getpid():
                    pass   # our own, left by an earlier release that could not remove it
                elif _known_dead_machine(current) and current.get("machine") != _machine_id():
                    # dead to Ray is not stopped: after a network cut the old job may run (and commit) on.
                    # It renews every RENEW_S; silence for two beats is the proof it stopped.
                    if self._renewed_within(current, 2 * RENEW_S):
                        raise FolderInUse(in_use_message(_describe(current), self.location, _age(current, time.time()))
                                          + " Its machine left the cluster, but its writer still renews the lease: "
                                            "it still runs there (a network cut?). Stop it, or wait until it stops.")
                    self._on_warning(f"taking over {self.location} from {_describe(current)}: its machine "
                                     f"left the cluster while the job ran there and its lease went unrenewed for "
                                     f"{2 * RENEW_S:.0f}s")
                elif _dead_here(current):
                    log.info("colabkit: taking over %s from %s, which has ended", self.location,
                             _describe(current))
                elif age < TIMEOUT_S:
                    raise FolderInUse(in_use_message(_describe(current), self.location, _age(current, now)) +
                                      f" A writer that stopped without a word (a reclaimed VM) is taken over "
                                      f"{TIMEOUT_S - age:.0f}s from now.")
                else:
                    self._on_warning(f"taking over {self.location} from {_describe(current)}: its writer "
                                     f"stopped renewing the lease more than {TIMEOUT_S:.0f}s ago (a reclaimed VM "
                                     f"or a killed process)")
            self._started = now
            self.dest.write_lease(json.dumps(self._record()).encode())
            back = self._read()   # two writers at once: the record that stays wins
            if back is None or back.get("token") != self.token:
                time.sleep(READ_BACK_LAG_S)   # or a listing that lags behind our write: decide on a second look
                back = self._read()
            if back is not None and back.get("token") != self.token:
                raise FolderInUse(in_use_message(_describe(back), self.location))
            self.held, self.lost = True, False
            self._owners.add(id(owner))
            self._start_renewing()

    def _renewed_within(self, record: dict, quiet_s: float) -> bool:
        """Wait until ``quiet_s`` have passed since ``record`` was last renewed (its clock); True when its
        writer renewed (or replaced) it in the meantime, False when it stayed silent or was removed."""
        first = (record.get("token"), record.get("renewed"), record.get("beat"))
        while True:
            left = float(record.get("renewed", 0)) + quiet_s - time.time()
            if left <= 0:
                return False
            time.sleep(min(left, 1.0))
            current = self._read()
            if current is None:
                return False
            if (current.get("token"), current.get("renewed"), current.get("beat")) != first:
                return True

    def _start_renewing(self) -> None:
        if self._thread is not None and self._thread.is_alive() and not self._stop.is_set():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="colabkit-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                self.renew()
            except OSError as exc:   # the destination is down: the uploader says so; try at the next beat
                log.debug("colabkit: could not renew the lease on %s: %s", self.location, exc)

    def renew(self) -> None:
        with self._lock:
            if not self.held:
                return
            current = self._read()
            if current is not None and current.get("token") != self.token:
                self.held, self.lost = False, True
                self._stop.set()
                self._on_warning(f"{_describe(current)} took over {self.location}; this run stops "
                                 f"uploading and pruning there (its checkpoints stay on local disk)")
                return
            self._beat += 1
            self.dest.write_lease(json.dumps(self._record()).encode())

    def release(self, owner) -> None:
        """``owner`` is done; after the last owner, remove our record (only ours) and stop renewing. Errors
        are left for the lease to expire."""
        with self._lock:
            self._owners.discard(id(owner))
            if self._owners:
                return
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)
        with self._lock:
            if not self.held or self._owners:
                if self._owners and self.held:
                    self._start_renewing()   # taken again while we waited for the renewal thread
                return
            self.held = False
            try:
                current = self._read()
                if current is not None and current.get("token") == self.token:
                    self.dest.remove_lease()
            except OSError as exc:
                log.debug("colabkit: could not remove the lease on %s: %s", self.location, exc)
