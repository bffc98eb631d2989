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

A record that cannot be trusted (torn or damaged, a field of the wrong type or out of range, or renewed more than
``CLOCK_SKEW_S`` ahead of the reader's clock, e.g. ten years) is neither proof of a live holder nor free to
overwrite: its dates say nothing, so the reader watches the record for two renewal periods. A writer still
there rewrites it within one, and the reader gets FolderInUse; a record that stayed the same is taken over with
a warning that names it. What is left of a write of our own that failed (the mount writes in place, so an empty
or cut-short record) is ours, and written again at once.

What it cannot guarantee: Drive has no atomic create-if-absent, so two writers starting within moments of
each other can both write a record. Each reads the record back after writing it, and every renewal checks
that the record is still its own: the writer that finds another's record stops uploading and pruning (its
checkpoints stay on its local disk) and says so. Staleness compares the holder's clock with the reader's, so
machines whose clocks differ by more than ``TIMEOUT_S`` could take over a live lease; the renewal check then
stops the older writer.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import secrets
import socket
import threading
import time

from .folder import LEASE_NAME, CheckpointError

log = logging.getLogger("colabkit")

RENEW_S = float(os.environ.get("COLABKIT_LEASE_RENEW_S", 30.0))
TIMEOUT_S = float(os.environ.get("COLABKIT_LEASE_TIMEOUT_S", 180.0))
READ_BACK_LAG_S = 1.0   # Drive's listings are eventually consistent
CLOCK_SKEW_S = 300.0    # how far ahead another machine's clock may be; a record dated further ahead is not trusted


class FolderInUse(CheckpointError):
    """Another process (on this machine or another) is writing checkpoints to the same folder."""


def in_use_message(holder: str, destination, where: str = "") -> str:
    return (f"{holder} is already writing checkpoints to {destination}{where}; two runs in one folder would prune and "
            f"resume each other's checkpoints. Give each run its own folder (in `colabkit run` jobs, e.g. "
            f"f\"drive:runs/mnist-{{os.environ['COLABKIT_JOB']}}\"), or stop the other run first.")


def machine_id() -> str:
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
    if record["machine"] != machine_id():
        return False
    try:
        os.kill(record["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _known_dead_machine(record: dict) -> bool:
    """True when the record's machine is one that `colabkit run --cluster` saw die (it names them in
    COLABKIT_DEAD_MACHINES for the job's next attempt, which need not wait for the lease to expire)."""
    dead = {m for m in os.environ.get("COLABKIT_DEAD_MACHINES", "").split(",") if m}
    return bool(dead) and record["machine"] in dead


def _describe(record: dict) -> str:
    return f"process {record['pid']} on host {record['host']}"


def _age(record: dict, now: float) -> str:
    return f" (its lease was renewed {max(0.0, now - record['renewed']):.0f}s ago)"


def _number(value) -> float | None:
    """``value`` as a finite float, or None (text, null, a bool, NaN, infinity or an int too big for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _is_count(value, high: float = math.inf) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < high


_CHECKS = {   # field -> (is it valid, what it must be)
    "token": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "host": (lambda v: isinstance(v, str), "a string"),
    "machine": (lambda v: isinstance(v, str), "a string"),
    "location": (lambda v: isinstance(v, str), "a string"),
    "pid": (lambda v: _is_count(v, 2 ** 31) and v > 0, "a process id (a whole number from 1)"),
    "beat": (_is_count, "a whole number from 0"),
    "started": (lambda v: _number(v) is not None and v >= 0, "a time (seconds since 1970)"),
    "renewed": (lambda v: _number(v) is not None and v >= 0, "a time (seconds since 1970)"),
}


@dataclasses.dataclass(frozen=True)
class _Found:
    """One read of the lease record: its bytes, and what they hold (``record``) or why they cannot be trusted
    (``problem``, then ``record`` is None)."""
    raw: bytes
    record: dict | None
    problem: str | None = None

    def ours(self, token: str) -> bool:
        return self.record is not None and self.record["token"] == token

    def holder(self) -> str:
        return "another writer" if self.record is None else _describe(self.record)


def _parse(raw: bytes, now: float) -> _Found:
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return _Found(raw, None, "cannot be read as JSON (a torn or damaged write)")
    if not isinstance(record, dict):
        return _Found(raw, None, f"holds a JSON {type(record).__name__}, not a lease record")
    for name, (valid, expected) in _CHECKS.items():
        if not valid(record.get(name)):
            return _Found(raw, None, f"has {name}={record.get(name)!r} where {expected} belongs")
    if record["renewed"] > now + CLOCK_SKEW_S:
        return _Found(raw, None, f"says it was renewed {record['renewed'] - now:.0f}s ahead of this machine's "
                                 f"clock (more than the {CLOCK_SKEW_S:.0f}s clocks may differ)")
    return _Found(raw, dict(record, renewed=float(record["renewed"])))


_shared: dict[str, Lease] = {}
_shared_lock = threading.Lock()


def lease_for(dest, location, on_warning) -> Lease:
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
        self._failed_write = None   # the record a write of ours failed on: what is left of it there is ours
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def _record(self) -> dict:
        now = time.time()
        return {"token": self.token, "host": socket.gethostname(), "machine": machine_id(), "pid": os.getpid(),
                "started": self._started or now, "renewed": now, "beat": self._beat,
                "location": str(self.location)}

    def _read(self) -> _Found | None:
        data = self.dest.read_lease()
        return None if data is None else _parse(data, time.time())

    def acquire(self, owner) -> None:
        """Take the lease for ``owner`` (held already: no-op). FolderInUse when another writer renewed its
        lease recently."""
        with self._lock:
            if self.held:
                self._owners.add(id(owner))
                self._start_renewing()   # in case a release was under way
                return
            found = self._read()
            now = time.time()
            current = None if found is None else found.record
            if found is not None and current is None:
                if self._failed_write is not None and self._failed_write.startswith(found.raw):
                    log.info("colabkit: the lease record in %s is what is left of a write of ours that failed; "
                             "writing it again", self.location)
                else:
                    self._take_over_untrusted(found)
            elif current is not None and current["token"] != self.token:
                age = now - current["renewed"]
                if current["machine"] == machine_id() and current["pid"] == os.getpid():
                    pass   # our own, left by an earlier release that could not remove it
                elif _known_dead_machine(current) and current["machine"] != machine_id():
                    # dead to Ray is not stopped: after a network cut the old job may run (and commit) on.
                    # It renews every RENEW_S; silence for two beats is the proof it stopped.
                    if self._changes_before(found, current["renewed"] + 2 * RENEW_S):
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
            self._write(json.dumps(self._record()).encode())
            back = self._read()   # two writers at once: the record that stays wins
            if back is None or not back.ours(self.token):
                time.sleep(READ_BACK_LAG_S)   # or a listing that lags behind our write: decide on a second look
                back = self._read()
            if back is not None and not back.ours(self.token):
                raise FolderInUse(in_use_message(back.holder(), self.location))
            self.held, self.lost = True, False
            self._owners.add(id(owner))
            self._start_renewing()

    def _write(self, record: bytes) -> None:
        """Write our record. Drive's mount writes in place: a write that fails can leave the file empty or cut
        short, which our next acquire() must know for ours rather than watch as a stranger's torn record."""
        try:
            self.dest.write_lease(record)
        except OSError:
            self._failed_write = record
            raise
        self._failed_write = None

    def _take_over_untrusted(self, found: _Found) -> None:
        """A record whose dates cannot be trusted: FolderInUse when it changes within two renewal periods (a
        writer still renews it), otherwise a warning, and the caller takes it over."""
        quiet_s = 2 * RENEW_S
        what = f"the lease record {LEASE_NAME} in {self.location} {found.problem}"
        log.warning("colabkit: %s; watching it for %.0fs to see whether a writer still renews it", what, quiet_s)
        if self._changes_before(found, time.time() + quiet_s):
            raise FolderInUse(in_use_message("another writer", self.location) +
                              f" {what[0].upper()}{what[1:]}, but it still changes: a writer renews it. Stop that "
                              f"run; if none runs, delete {LEASE_NAME} there and start again.")
        self._on_warning(f"taking over {self.location}: {what}, and it did not change for {quiet_s:.0f}s, so no "
                         f"writer renews it")

    def _changes_before(self, found: _Found, until: float) -> bool:
        """Watch the record until ``until`` (time.time()); True when it changed meanwhile (its writer renewed
        or replaced it), False when it stayed the same or was removed."""
        while True:
            left = until - time.time()
            if left <= 0:
                return False
            time.sleep(min(left, 1.0))
            current = self.dest.read_lease()
            if current is None:
                return False
            if current != found.raw:
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
            found = self._read()   # a record that cannot be read is rewritten: the writer that made it stops
            current = None if found is None else found.record
            if current is not None and current["token"] != self.token:
                self.held, self.lost = False, True
                self._stop.set()
                self._on_warning(f"{_describe(current)} took over {self.location}; this run stops "
                                 f"uploading and pruning there (its checkpoints stay on local disk)")
                return
            self._beat += 1
            self._write(json.dumps(self._record()).encode())

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
                if current is not None and current.ours(self.token):
                    self.dest.remove_lease()
            except OSError as exc:
                log.debug("colabkit: could not remove the lease on %s: %s", self.location, exc)
