"""Background writing of snapshots and copy of committed local checkpoints to the destination: coalescing,
retries, back-off.

The training thread hands over snapshots; this thread writes them, commits them, and uploads the newest
committed one. A destination on a local disk (``direct``) is written and committed directly, once; when that
fails, snapshots are staged locally and uploaded as for a network destination until an upload succeeds again.
If snapshots arrive faster than the destination takes them, older ones are dropped before they are written
(coalescing) so memory and queue stay bounded: one pending, one in flight.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from collections.abc import Callable

from .folder import CheckpointFolder, CheckpointInfo
from .storage import remove_tree

log = logging.getLogger("colabkit")

BACKOFF_START, BACKOFF_MAX = 1.0, 60.0
LEFTOVER_GRACE_S = 3600.0   # another writer's folder without a manifest may still be uploading until then
SETTLE_S = 1800.0           # a network mount may still be pushing a new commit to the cloud until then
SETTLING_MAX = 2            # superseded checkpoints kept beyond `keep` for that reason, at most


@dataclasses.dataclass
class Job:
    """A checkpoint the training thread has handed over: its local folder and a writer for the rest."""
    seq: int
    local_dir: Path
    step: int
    epoch: int | None
    batch: int | None
    info: dict
    write: Callable[[Path], dict | None]          # writes the data files; returns what it hashed (folder.commit)
    release: Callable[[], None] | None = None   # called once the snapshot's memory is no longer needed
    generation: int = 0
    blake3_since: float | None = None           # when the folder's first BLAKE3 checkpoint was made (manifest.build)
    sha256_before: list | None = None           # the sha256 checkpoints the folder held then (manifest.build)
    direct: bool = False                        # may be written straight into the destination (nothing staged)

    def done_with_snapshot(self) -> None:
        if self.release is not None:
            self.release()
            self.release = None


@dataclasses.dataclass
class UploadStatus:
    """What the uploader has done so far (read by the status panel and tests)."""
    state: str = "idle"                    # idle / writing / uploading / retrying / stopped
    last_local: CheckpointInfo | None = None
    last_uploaded: CheckpointInfo | None = None
    last_error: str | None = None
    saves_dropped: int = 0                 # snapshots coalesced away because a newer one arrived
    last_write_s: float | None = None      # local write + commit duration
    last_upload_s: float | None = None     # copy to destination + commit duration


class _LeaseLost(Exception):
    pass


class Uploader:
    """The background thread. ``lease`` (lease.Lease, for a destination other machines can see) is taken
    before the first upload and checked before every one; ``settles`` says the destination uploads to the
    cloud after a write returns (a Drive mount): a checkpoint then stays until the one after it has been
    committed for SETTLE_S, whatever ``keep`` says (at most SETTLING_MAX such extra checkpoints).
    ``on_stop`` runs on this thread when it ends."""

    def __init__(self, local: CheckpointFolder, dest: CheckpointFolder | None, *, keep: int,
                 keep_every: float | None, on_warning: Callable[[str], None], lease=None, lease_owner=None,
                 settles: bool = False, on_stop: Callable[[], None] | None = None, direct: bool = False):
        self.local, self.dest = local, dest
        self.direct = direct and dest is not None
        self._direct_ok = True      # False from a failed direct write until an upload succeeds again
        self.keep, self.keep_every = keep, keep_every
        self.lease, self._lease_owner, self.settles, self._on_stop = lease, lease_owner, settles, on_stop
        self.status = UploadStatus()
        self._on_warning = on_warning
        self._own: set[str] = set()                # folders this writer made or began deleting (per folder)
        self._first_seen_incomplete: dict[str, float] = {}
        self._dest_commits: list[tuple[float, str]] = []   # (monotonic time, name) of this writer's uploads
        self._blocked: str | None = None           # why uploads cannot go on (the lease is another writer's)
        self.check_first: Callable[[], None] | None = None   # run (and passed) before the first upload
        self._cond = threading.Condition()
        self._pending: Job | None = None
        self._writing: Job | None = None
        self._reserved: set[str] = set()
        self._needs_upload = False
        self._uploaded_seq = 0
        self._committed_seq = 0
        self._failed_seq = 0
        self._warned = False
        self._closed = False
        self._wake = False
        self._thread = threading.Thread(target=self._run, name="colabkit-uploader", daemon=True)
        self._thread.start()

    # -- called from the training thread -------------------------------------------------------------
    def reserve(self, name: str) -> None:
        """Protect a checkpoint folder the training thread is about to create from pruning."""
        with self._cond:
            self._reserved.add(name)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def alive(self) -> bool:
        """Whether the background thread still runs (it calls a job's release once done with it)."""
        return self._thread.is_alive()

    def unreserve(self, name: str) -> None:
        with self._cond:
            self._reserved.discard(name)

    def submit(self, job: Job) -> None:
        with self._cond:
            self._reserved.discard(job.local_dir.name)
            if self._closed:
                raise RuntimeError("This Checkpoints object is closed; create a new one to save again.")
            if self._pending is not None:
                remove_tree(self._pending.local_dir)
                self._pending.done_with_snapshot()
                self.status.saves_dropped += 1
            self._pending = job
            self._wake = True
            self._cond.notify_all()

    def drop_pending(self) -> bool:
        """Discard the snapshot waiting to be written, if any (a newer one is about to be taken)."""
        with self._cond:
            job, self._pending = self._pending, None
            if job is None:
                return False
            remove_tree(job.local_dir)
            self.status.saves_dropped += 1
        job.done_with_snapshot()
        return True

    def is_in_progress(self, name: str) -> bool:
        """True for a checkpoint folder that is reserved, pending or being written (never to be pruned)."""
        with self._cond:
            return name in self._reserved or any(
                j is not None and j.local_dir.name == name for j in (self._pending, self._writing))

    def wait(self, seq: int, timeout: float | None = None) -> bool:
        """Block until the checkpoint ``seq`` (or a newer one) is on the destination; False on timeout
        or when that checkpoint could not be written locally."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                done = self._uploaded_seq if self.dest is not None else self._committed_seq
                if done >= seq:
                    return True
                if self._failed_seq >= seq and self._committed_seq < seq:
                    return False
                if self._blocked is not None and self.dest is not None:
                    return False
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining if remaining is not None else 1.0)

    def close(self, timeout: float | None = None) -> bool:
        """Stop after the pending work; True when the thread has ended within ``timeout``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the background thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # pragma: no cover - a bug; say so instead of hanging every wait()
            log.error("colabkit: the checkpoint uploader stopped: %r", exc)
            with self._cond:
                self._closed, self.status.state = True, "stopped"
                self._failed_seq = 1 << 62
                self._cond.notify_all()
            raise
        finally:
            if self._on_stop is not None:
                self._on_stop()

    def _loop(self) -> None:
        backoff = BACKOFF_START
        while True:
            with self._cond:
                while not (self._pending or self._needs_upload or self._closed):
                    self._cond.wait()
                if self._closed and not self._pending and not self._needs_upload:
                    self.status.state = "stopped"
                    self._cond.notify_all()
                    return
                job, self._pending = self._pending, None
                self._writing = job
                self._wake = False
            if job is not None:
                self._write_local(job)
            if self.dest is not None and self._needs_upload:
                if self._upload():
                    backoff = BACKOFF_START
                else:
                    if self._closed:
                        with self._cond:
                            self.status.state = "stopped"
                            self._cond.notify_all()
                        return
                    self._sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)

    def _write_local(self, job: Job) -> None:
        staged_instead = job.direct and self.direct
        if staged_instead and self._direct_ok and self._write_direct(job):
            return
        self.status.state = "writing"
        started = time.monotonic()
        try:
            try:
                if staged_instead:   # uploaded when the destination takes it again
                    job.local_dir.mkdir(parents=True, exist_ok=True)
                written = job.write(job.local_dir)
            finally:
                job.done_with_snapshot()
            info = self.local.commit(job.local_dir, step=job.step, epoch=job.epoch, batch=job.batch, info=job.info,
                                     generation=job.generation, blake3_since=job.blake3_since,
                                     sha256_before=job.sha256_before,
                                     written=written)
        except Exception as exc:  # noqa: BLE001 - any failure here must not kill the thread
            try:
                _remove_uncommitted(job.local_dir)
            except OSError:
                pass   # a full or read-only disk: without a manifest it is a known leftover (pruned later)
            self._warn(f"could not write checkpoint step {job.step} to local disk {self.local.path}: {exc}")
            with self._cond:
                self._writing = None
                self._failed_seq = max(self._failed_seq, job.seq)
                self._cond.notify_all()
            return
        self.status.last_write_s = time.monotonic() - started
        with self._cond:
            self._writing = None
            self.status.last_local = info
            self._committed_seq = max(self._committed_seq, job.seq)
            self._needs_upload = self.dest is not None
            self._cond.notify_all()
        self._prune(self.local)

    def _write_direct(self, job: Job) -> bool:
        """Write and commit a snapshot straight into the destination (a local disk): the data once, fsynced,
        the manifest last. False when that failed: nothing is committed there, the snapshot is still held,
        and the caller stages it instead."""
        self.status.state = "writing"
        started = time.monotonic()
        target = self.dest.path / job.local_dir.name
        try:
            if self.lease is not None:
                if self.lease.lost:
                    raise _LeaseLost(f"another writer took over {self.dest.path}")
                self.lease.acquire(self._lease_owner)
            if self.check_first is not None:
                self.check_first()
                self.check_first = None
            self._own.add(("dest", target.name))
            target.mkdir(parents=True)
            written = job.write(target)
            info = self.dest.commit(target, step=job.step, epoch=job.epoch, batch=job.batch, info=job.info,
                                    generation=job.generation, blake3_since=job.blake3_since,
                                     sha256_before=job.sha256_before,
                                     written=written)
        except Exception as exc:  # noqa: BLE001 - any failure here must not kill the thread
            from .folder import CheckpointError
            from .lease import FolderInUse
            try:
                _remove_uncommitted(target)
            except OSError:
                pass   # without a manifest it is a known leftover of this writer (pruned later)
            self._direct_ok = False
            blocked = isinstance(exc, (_LeaseLost, FolderInUse, CheckpointError))
            with self._cond:
                self.status.last_error = f"{type(exc).__name__}: {exc}"
                if blocked:   # no wait() hangs on these
                    self._blocked = str(exc)
            if blocked:
                self._warn(f"checkpoint step {job.step} is not written to {self.dest.path} ({exc}); it is kept "
                           f"on local disk at {self.local.path}")
            else:
                self._warn(f"could not write checkpoint step {job.step} to {self.dest.path} ({exc}); training "
                           f"continues, checkpoints are kept on local disk at {self.local.path} and copied to "
                           f"{self.dest.path} with back-off until it works again")
            return False
        job.done_with_snapshot()
        self.status.last_write_s, self.status.last_upload_s = time.monotonic() - started, 0.0
        if self._warned:
            log.warning("colabkit: destination %s is writable again; checkpoint step %s committed there",
                        self.dest.path, job.step)
            self._warned = False
        with self._cond:
            self._writing = None
            self.status.last_local = self.status.last_uploaded = info
            self.status.last_error = None
            self._committed_seq = max(self._committed_seq, job.seq)
            self._uploaded_seq = max(self._uploaded_seq, job.seq)
            self._needs_upload = False   # the destination has the newest checkpoint
            self.status.state = "idle"
            self._cond.notify_all()
        self._prune(self.dest)
        return True

    def _upload(self) -> bool:
        """Upload the newest locally committed checkpoint. True on success (or nothing to do)."""
        with self._cond:
            seq, newest = self._committed_seq, self.status.last_local
        if newest is None or newest.path.parent == getattr(self.dest, "path", None):
            self._needs_upload = False
            return True
        self.status.state = "uploading"
        started = time.monotonic()
        try:
            if self.lease is not None:
                if self.lease.lost:
                    raise _LeaseLost(f"another writer took over {self.dest.path}")
                self.lease.acquire(self._lease_owner)
            if self.check_first is not None:
                self.check_first()
                self.check_first = None
            self._own.add(("dest", newest.name))     # until it is committed there: then it is nobody's leftover
            copied = self.dest.copy_in(newest)
            self._own.discard(("dest", newest.name))
        except Exception as exc:  # noqa: BLE001 - OSError from a mount, or a back end's own errors: retry all
            from .folder import CheckpointError
            from .lease import FolderInUse
            with self._cond:  # a reader seeing "retrying" also sees why
                self.status.last_error = f"{type(exc).__name__}: {exc}"
                self.status.state = "retrying"
                if isinstance(exc, (_LeaseLost, FolderInUse, CheckpointError)):   # no wait() hangs on these
                    self._blocked = str(exc)
                self._cond.notify_all()
            self._warn(f"could not upload checkpoint step {newest.step} to {self.dest.path} ({exc}); training "
                       f"continues, checkpoints are kept on local disk at {self.local.path} and the upload is "
                       f"retried with back-off")
            return False
        self.status.last_upload_s = time.monotonic() - started
        now = time.monotonic()
        self._dest_commits = [c for c in self._dest_commits if now - c[0] < 2 * SETTLE_S] + [(now, newest.name)]
        self._blocked = None
        if self._warned:
            log.warning("colabkit: destination %s is reachable again; checkpoint step %s uploaded",
                        self.dest.path, newest.step)
            self._warned = False
        self._direct_ok = True
        with self._cond:
            self.status.last_uploaded = copied
            self.status.last_error = None
            self._uploaded_seq = max(self._uploaded_seq, seq)
            self._needs_upload = self._committed_seq > seq
            self.status.state = "idle"
            self._cond.notify_all()
        self._prune(self.dest)
        return True

    def _prune(self, folder: CheckpointFolder) -> None:
        """Retention after a commit. Housekeeping only: any error skips this round (see folder.prune)."""
        where = "local" if folder is self.local else "dest"
        if where == "dest" and self.lease is not None and not self.lease.held:
            return
        keep, settling = self.keep, set()
        if where == "dest" and self.settles:
            # a network mount may still be pushing a commit to the cloud: a checkpoint stays until the one
            # after it has been committed for SETTLE_S (for the earlier run's newest: our first commit)
            now, commits = time.monotonic(), self._dest_commits
            # (at most SETTLING_MAX of them: frequent saves must not fill the Drive)
            settling = {name for (_, name), (t_next, _) in zip(commits, commits[1:])
                        if now - t_next < SETTLE_S}
            settling = set(sorted(settling, key=[n for _, n in commits].index)[-SETTLING_MAX:])
            if commits and now - commits[0][0] < SETTLE_S:
                keep += 1
        just_committed = {i.name for i in (self.status.last_local, self.status.last_uploaded) if i is not None}
        asked = set()

        def abandoned(name):
            asked.add(name)
            return self._abandoned(where, name)
        try:
            folder.prune(keep, keep_every=self.keep_every,
                         protect=lambda name: name in just_committed or name in settling or self.is_in_progress(name),
                         abandoned=abandoned,
                         on_delete=lambda name: self._own.add((where, name)))
        except Exception as exc:  # noqa: BLE001 - pruning is housekeeping; it must never stop uploads
            log.debug("colabkit: pruning %s skipped this round: %s", folder.path, exc)
        if where == "dest":   # the grace counts how long a folder stayed without a manifest, without a break
            for name in set(self._first_seen_incomplete) - asked:
                del self._first_seen_incomplete[name]

    def _abandoned(self, where: str, name: str) -> bool:
        """A folder without a manifest is a leftover to delete only when this writer made it (its write was
        interrupted), or it has stayed without one for LEFTOVER_GRACE_S (another writer's abandoned upload;
        Drive listings can show a folder before its manifest). Timed on this machine's monotonic clock."""
        if (where, name) in self._own or where == "local":
            return True   # the local staging folder has one writer: this process (writer.py)
        first = self._first_seen_incomplete.setdefault(name, time.monotonic())
        return time.monotonic() - first >= LEFTOVER_GRACE_S

    def _sleep(self, seconds: float) -> None:
        """Back-off that ends early when a new snapshot arrives or the uploader closes."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while not (self._wake or self._closed):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._cond.wait(remaining)

    def _warn(self, message: str) -> None:
        if not self._warned:  # once per outage, not once per retry
            self._warned = True
            self._on_warning(message)
        else:
            log.debug("colabkit: %s", message)


def _remove_uncommitted(folder: Path) -> None:
    """Delete a checkpoint folder whose commit failed: its manifest first, so that a removal that stops half
    way leaves a folder that is plainly incomplete, never one that looks committed with files missing."""
    from .manifest import MANIFEST_NAME
    try:
        (folder / MANIFEST_NAME).unlink()
    except FileNotFoundError:
        pass
    remove_tree(folder)
