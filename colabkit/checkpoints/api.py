"""`colabkit.Checkpoints`: framework-neutral crash-safe checkpoints with verified restore."""
from __future__ import annotations

import atexit
import dataclasses
import hashlib
import logging
import os
import threading
import time
import warnings
import weakref
import zipfile
from pathlib import Path

from .. import config as _config
from .. import mounts as _mounts
from . import digest as _digest
from . import files as _files
from . import state as _state
from . import streaming as _streaming
from . import writer as _writer
from .buffers import TOO_BIG, SnapshotBuffers, total_nbytes
from .destinations import resolve_destination
from .drive_trash import DriveMountFolder, my_drive_of
from .folder import (CheckpointError, CheckpointFolder, CheckpointInfo, CorruptCheckpoint, InvalidCheckpoint, new_name,
                     written_alongside_by_older_version)
from .lease import lease_for
from .manifest import MAX_STEP, ManifestError
from .storage import remove_tree
from .uploader import Job, Uploader

log = logging.getLogger("colabkit")

_OPEN = weakref.WeakSet()


@dataclasses.dataclass(frozen=True)
class Restored:
    """What `Checkpoints.restore()` found: the step and state of the newest valid checkpoint."""
    step: int
    epoch: int | None
    batch: int | None
    state: dict
    path: Path
    source: str          # "destination", "local" (a committed local copy on this machine) or "link" (resume_from)
    manifest: dict


def _validate_keep(keep) -> int:
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep={keep!r} is invalid: pass a whole number of checkpoints to keep, at least 1.")
    return keep


def _refuse_a_file(path, argument: str) -> None:
    """ValueError at once for a folder argument that names a file (reading it would fail as if a mount were
    down, and be retried for minutes)."""
    if isinstance(path, Path) and os.path.isfile(path):   # False also when it cannot be read now (a mount down)
        raise ValueError(f"{argument}: {path} is a file, not a folder; pass a folder for the checkpoints (it is "
                         f"created when missing), such as \"drive:runs/mnist\" or \"checkpoints/mnist\".")


def local_cache_for(destination, cache_dir: Path) -> Path:
    """Local staging folder for a destination (a Path, or a back end with ``name``): stable, readable name."""
    digest = hashlib.sha1(str(destination).encode()).hexdigest()[:10]
    return cache_dir / "checkpoints" / f"{getattr(destination, 'name', '') or 'root'}-{digest}"


class Checkpoints:
    """Crash-safe checkpoints in ``directory`` ("drive:runs/gan", or any folder).

    ``save(step, state)`` snapshots the state on the calling thread; a background thread writes it, hashing
    it on the way, and commits it (data fsynced, manifest last). A training loop saves with
    ``save_snapshot(step, specs, fill)`` instead: its arrays are copied once, into host buffers the store
    reuses. A destination on a local disk is written once, directly; for Drive or another network mount (or
    with ``local_dir``) the checkpoint is committed on fast local disk first and copied to the destination in
    the background. A checkpoint is visible to ``restore()`` only once its manifest is complete and its files
    match it.

    keep: committed checkpoints kept per folder (older ones are deleted only after a newer one is committed).
    keep_every: also keep one checkpoint per this interval ("6h"), like tf.train.CheckpointManager.
    local_dir: stage every checkpoint in this folder, then copy it to the destination. Default: a folder under
    the configured cache_dir for a network destination (a Drive mount); none for a destination on a local disk,
    which is committed directly (if writing there fails, checkpoints are staged until it works again).
    resume_from: a Google Drive share link to a checkpoint (folder, or .zip/.tar of one): restored when
    ``directory`` has none yet; training then continues into ``directory``.
    fresh: start a new run in a folder that holds another run's checkpoints. Without it, saving a lower step
    than the folder's newest checkpoint raises CheckpointError (restore first to continue that run); with it,
    this run's checkpoints outrank the earlier run's, which retention then deletes as this run commits.
    read_timeout: how long restore() retries a destination it cannot read (a dropped mount) before raising
    CheckpointError (default: the configured ``read_timeout``, 2 minutes).

    One writing process per folder: the first save (or ``claim()``) claims it, with an OS lock on this machine
    and a lease record in the destination for other machines; a second writer gets FolderInUse (a
    CheckpointError) naming the holder. At interpreter exit, pending uploads get up to 60 s to finish.
    """

    def __init__(self, directory, *, keep: int | None = None, keep_every=None, local_dir=None, resume_from=None,
                 fresh: bool = False, read_timeout=None):
        if directory is None or (isinstance(directory, str) and not directory.strip()):
            raise ValueError(f"directory={directory!r} is empty: pass a checkpoint folder such as "
                             f"\"drive:runs/mnist\" or \"checkpoints/mnist\".")
        settings = _config.load()
        self.keep = _validate_keep(settings.keep if keep is None else keep)
        from ..units import parse_duration
        self.keep_every = None if keep_every is None else parse_duration(keep_every, name="keep_every")
        self.read_timeout = settings.read_timeout if read_timeout is None else parse_duration(
            read_timeout, name="read_timeout")
        if not isinstance(fresh, bool):
            raise ValueError(f"fresh={fresh!r} is invalid: pass True to start a new run in a folder that holds "
                             f"another run's checkpoints, or False (the default) to continue it.")
        self.fresh = fresh
        if resume_from is not None:  # a shared link, pulled when `directory` has no checkpoint yet
            from ..gdrive.links import parse_link
            parse_link(resume_from)
        self.resume_from = resume_from
        self.location = directory
        self.destination = resolve_destination(directory)
        _refuse_a_file(self.destination, f"directory={directory!r}")
        local = Path(local_dir) if local_dir is not None else local_cache_for(
            self.destination, settings.resolved_cache_dir())
        _refuse_a_file(local, f"local_dir={local_dir!r}")
        self.local = CheckpointFolder(local)
        if not isinstance(self.destination, Path):
            self.dest = self.destination      # a back end that is not a filesystem (see destinations.py)
        elif local.resolve() == self.destination.resolve():
            self.dest = None                  # the destination is the local folder: nothing to upload
        else:
            my_drive = my_drive_of(self.destination)   # on Drive's mount deletes go to Trash: see drive_trash.py
            self.dest = CheckpointFolder(self.destination) if my_drive is None else DriveMountFolder(
                self.destination, my_drive, warn=self._warn)
        # the lease stays in the folder written in place too: a deleted lock file must not let a second writer in
        self._lease = lease_for(self.local if self.dest is None else self.dest, directory, self._warn)
        network = isinstance(self.destination, Path) and self.dest is not None and _mounts.on_network_fs(
            self.destination)
        settles = network
        # a destination on a local disk is as fast as the staging folder: write it once, there
        self._direct = isinstance(self.dest, CheckpointFolder) and local_dir is None and not network
        self._uploader = Uploader(self.local, self.dest, keep=self.keep, keep_every=self.keep_every,
                                  on_warning=self._warn, lease=self._lease, lease_owner=self, settles=settles,
                                  on_stop=self.release, direct=self._direct)
        self._generation = None       # this run's generation, settled by the first save (see _settle_run)
        self._blake3_since = None     # carried into every manifest (see folder.written_alongside_by_older_version)
        self._sha256_before = None    # carried likewise: the sha256 checkpoints the folder held before its first BLAKE3
        self._sha256_seen = set()     # the sha256 checkpoints read here, recorded if this run's save is that first
        self._sha256_unsure = False   # the first save could not read the destination: _sha256_seen may lack some
        self._lease_tried = False
        self._invalid_warned = set()  # (folder, name) of invalid entries already warned about
        self._restored_once = False   # restore() has read the folder: _newest_seen is what it holds
        self._newest_seen = None      # the newest checkpoint restore() found, and the damaged ones it skipped
        self._damaged_seen: set[str] = set()
        self._seq = 0
        self._snapshot_buffers = SnapshotBuffers()   # host buffers save_snapshot copies into, reused
        self.last_snapshot_s: float | None = None
        self._said_copied = False     # save_folder copied (not linked) files: said once
        self._said_streamed = False   # a save was written variable by variable: said once
        _OPEN.add(self)

    def __repr__(self):
        return f"Checkpoints({self.location!r}, keep={self.keep})"

    @property
    def status(self):
        """The uploader's status: state, last local and uploaded checkpoint, last error."""
        return self._uploader.status

    def estimated_save_seconds(self) -> float | None:
        """Measured snapshot + local write + upload time of the last save (None before the first)."""
        s = self.status
        parts = [self.last_snapshot_s, s.last_write_s, s.last_upload_s if self.dest else 0.0]
        return None if any(p is None for p in parts) else sum(parts)

    # -- saving ---------------------------------------------------------------------------------------
    def save(self, step: int, state: dict, *, epoch=None, batch=None, info: dict | None = None,
             wait: bool | float = False) -> bool:
        """Checkpoint ``state`` as ``step``. Returns once the state is snapshotted (its arrays copied); the rest
        is background.

        wait: True blocks until the checkpoint is on the destination; a number waits at most that many
        seconds. Returns True when the checkpoint is committed as asked (always True without ``wait``).
        """
        self._submit(step, state, epoch=epoch, batch=batch, info=info, copy_arrays=True, release=None)
        return self._waited(wait)

    def save_snapshot(self, step: int, specs, fill, *, periodic: bool = False, epoch=None, batch=None,
                      info: dict | None = None, wait: bool | float = False, write: bool = True,
                      copy=None) -> bool | None:
        """Checkpoint a training loop's state as ``step``, copying its arrays once, into host buffers this store
        keeps and reuses from save to save: the copy the loop waits for is only the device-to-host copy (into
        memory already touched: one memcpy, no page faults); writing, hashing and uploading are background.

        specs: one entry per array to snapshot, each with ``shape`` and ``dtype`` (a NumPy dtype or its name):
        NumPy arrays, framework variables, or any object with those two attributes.
        fill(buffers): called with one host array per spec, in order, of that shape and dtype; it copies the
        loop's arrays in (the device-to-host copy) and returns the state dict, whose arrays are those buffers
        (or views of them) and arrays of its own that nothing changes later: no array in it is copied again.
        periodic: a save taken on a schedule (every n batches, an interval). The buffers are one set by default
        (the ``snapshot_buffers`` setting), held from the snapshot until its write ends; a snapshot still
        waiting to be written (behind an upload) is discarded for this newer one. When every set is being
        written, a periodic save of a state above ``small_state_mb`` takes nothing and returns None: the loop
        asks again at a later batch and never waits for a write. Any other save (an epoch's end, a deadline,
        a signal, the end of training) and a small state wait for a set. A set not yet written to (see
        ``prepare_snapshot``) is touched by a background thread when a periodic save of a large state first asks
        for it; that save returns None, and a later one uses the set.
        write: False takes the snapshot (``fill`` runs under the same rules) and writes nothing: a worker of a
        multi-worker run reads its variables as the one that writes does, and leaves the writing to it.
        copy(index, buffer): copies the ``index``-th spec's array into ``buffer`` (the device-to-host copy);
        when given, the store calls it for each buffer before ``fill``, and ``fill`` only places the buffers in
        the state, as they are. Then a state whose buffers do not fit in free memory (MemAvailable, or the room
        under a container's memory limit; see streaming.py) is not refused: ``fill`` gets placeholders, and
        each array is copied into a small staging buffer, written and hashed in turn, while this call waits
        for the whole write (said once per run). The checkpoint is the same as a buffered one.

        Returns None when nothing was taken; otherwise as ``save``: True, or with ``wait``, whether the
        checkpoint was committed in time. The buffers are given back once the snapshot is written (or dropped
        for a newer one), and at once when ``fill`` or the submission raises: then nothing is saved, and the
        previous checkpoint stays the newest.
        """
        pool = self._snapshot_buffers
        nbytes = total_nbytes(specs)
        free = []   # what can_allocate saw, for the message
        can_allocate = None if copy is None else lambda: _streaming.fits(
            nbytes, free.append(_streaming.available_bytes()) or free[-1])
        buffers = pool.take(specs, wait=not periodic or pool.is_small(nbytes),
                            reclaim=self._uploader.drop_pending, can_allocate=can_allocate)
        if buffers is None:   # every set is being written: a later batch asks again
            return None
        if buffers is TOO_BIG:
            return self._save_streamed(step, specs, fill, copy, free[-1], epoch=epoch, batch=batch, info=info,
                                       wait=wait, write=write)
        give_back = lambda: pool.give_back(buffers)  # noqa: E731
        try:
            if copy is not None:
                for index, buffer in enumerate(buffers):
                    copy(index, buffer)
            state = fill(buffers)
            if write:
                self._submit(step, state, epoch=epoch, batch=batch, info=info, copy_arrays=False,
                             release=give_back)
        except BaseException:   # not handed over: the buffers are free again
            give_back()
            raise
        if not write:
            give_back()
            return True
        return self._waited(wait)

    def _save_streamed(self, step, specs, fill, copy, free, *, epoch, batch, info, wait, write) -> bool:
        """``save_snapshot`` of a state whose buffers do not fit in free memory: written variable by variable
        (streaming.py) while the caller waits."""
        stream = _streaming.StreamedSave(specs, copy)
        if not write:
            stream.read_all()
            fill(stream.placeholders)
            return True
        started = time.monotonic()
        state = fill(stream.placeholders)
        written = threading.Event()

        def release():
            stream.close()
            written.set()

        self._submit(step, state, epoch=epoch, batch=batch, info=info, copy_arrays=False, release=release,
                     stream=stream)
        # the variables are read while they are written: training waits until the writer is done with them
        while not written.wait(1.0):
            if not self._uploader.alive:
                break
        if not self._said_streamed:
            self._said_streamed = True
            log.warning("colabkit: the training state (%.1f GB) does not fit twice in free memory (%.1f GB): "
                        "saves are written variable by variable and training waits for each (about %.1f s)",
                        stream.nbytes / 1e9, free / 1e9, time.monotonic() - started)
        return self._waited(wait)

    def save_folder(self, step: int, source, *, link: bool = True, closed: bool = False, epoch=None, batch=None,
                    info: dict | None = None, wait: bool | float = False) -> bool:
        """Checkpoint a folder or a file that another program wrote as ``step``: a Trainer's ``checkpoint-500``,
        an accelerate ``save_state`` folder, a script's ``last.pt``. It is committed, verified, uploaded and
        kept like any checkpoint, under its own name; ``restore_folder()`` brings it back. Returns once the
        files are taken (the rest is background); ``wait`` as for ``save``.

        link: hard-link the files into the staging folder where the filesystem allows it, which costs the
        calling thread nothing whatever their size; the background thread then gives the checkpoint copies of its
        own, hashing them on the way. For programs that write each checkpoint's files once (a Trainer's
        checkpoint-N folders): a file rewritten in place before that copy is done makes that save fail with a
        warning (the previous checkpoint stays the newest), never commit a mix of two writes. Where the staging
        folder is on another filesystem the files are copied on the calling thread (said once, with the fix).
        False: copy the files on the calling thread, each copied again if it changed during its copy (a file a
        script rewrites in place, such as last.pt).
        closed: the caller knows every file is written whole and closed (it wrote them itself and returned, as
        a Trainer's on_save): the checks for another program still writing them (a quiet time, open files in
        /proc) are skipped.
        """
        source = _files.check_source(source)
        # without a destination of its own, the staging folder holds the only copy: it must not share files
        link = link and self.dest is not None
        self._submit(step, None, files=(source, link, closed), epoch=epoch, batch=batch, info=info, copy_arrays=False,
                     release=None)
        return self._waited(wait)

    def prepare_snapshot(self, specs) -> int:
        """Allocate the first set of snapshot buffers for ``specs`` (as ``save_snapshot`` takes them) unless one
        exists, without touching its memory: a training loop calls it before its first step, so that its first
        periodic save costs no allocation. Returns the size of a set (the state's arrays) in bytes."""
        return self._snapshot_buffers.prefill(
            specs, can_allocate=lambda: _streaming.fits(total_nbytes(specs), _streaming.available_bytes()))

    @property
    def snapshot_buffer_sets(self) -> int:
        """How many sets of snapshot buffers ``save_snapshot`` has allocated so far, each the size of the state's
        arrays: 1 while every snapshot reused the one set (the ``snapshot_buffers`` setting allows more)."""
        return self._snapshot_buffers.sets_allocated

    def _waited(self, wait) -> bool:
        if wait is False:
            return True
        return self.wait(None if wait is True else float(wait))

    def _submit(self, step, state, *, epoch, batch, info, copy_arrays, release, files=None, stream=None) -> None:
        """Snapshot ``state`` (or take ``files``: (source, link), see save_folder) and hand it to the uploader;
        once handed over, the uploader calls ``release``."""
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
            raise ValueError(f"step={step!r} is invalid: pass a whole number from 0 to {MAX_STEP} (e.g. the global "
                             f"batch count; a count of samples or tokens fits too).")
        for name, value in (("epoch", epoch), ("batch", batch)):
            # what a manifest may hold is what restore() accepts: a save it would refuse is a lost save
            if value is not None and (isinstance(value, bool) or not hasattr(value, "__index__")
                                      or not 0 <= value.__index__() <= MAX_STEP):
                raise ValueError(f"{name}={value!r} is invalid: pass None or a whole number from 0 to {MAX_STEP}.")
        if self._uploader.closed:
            raise RuntimeError("This Checkpoints object is closed; create a new one to save again.")
        first = self._generation is None
        self.claim()
        if first:
            try:
                self._settle_run(step)
            except BaseException:
                self.release()   # nothing was saved: the folder stays free for the run that owns it
                raise
        started = time.monotonic()
        local_dir = self.local.path / new_name(step)
        taken = None
        if files is None:
            snap = _state.snapshot(state, copy_arrays=copy_arrays)
            # TensorFlow writes trackables into the staging folder, on this thread
            direct = self._direct and not snap.trackables
        else:
            direct = False   # the program's files are taken into the staging folder, on this thread
        self._uploader.reserve(local_dir.name)
        if not direct:
            try:
                local_dir.mkdir(parents=True)
                if files is None:
                    _state.write_trackables(snap, local_dir)
                else:
                    taken = _files.take(files[0], local_dir, link=files[1], closed=files[2])
                    if taken.copied_instead and not self._said_copied:
                        self._said_copied = True
                        self._warn(f"{files[0]} is on another filesystem than the staging folder {self.local.path}, "
                                   f"so each checkpoint of it is copied while the caller waits instead of linked; "
                                   f"put the two on one filesystem (local_dir=, or the cache_dir setting) to "
                                   f"save without that wait")
                    snap = _state.snapshot(taken.state())
            except BaseException:
                try:
                    remove_tree(local_dir)
                finally:
                    self._uploader.unreserve(local_dir.name)
                raise
        self.last_snapshot_s = time.monotonic() - started
        self._seq += 1
        if stream is not None:   # each array copied in just before it is written
            write = lambda d, s=snap: _state.write_data(stream.snapshot(s), d)  # noqa: E731
        elif taken is None:
            write = lambda d, s=snap: _state.write_data(s, d)  # noqa: E731
        else:
            write = lambda d, s=snap: {**_files.hash_linked(taken, d), **_state.write_data(s, d)}  # noqa: E731
        self._uploader.submit(Job(seq=self._seq, local_dir=local_dir, step=step, epoch=epoch, batch=batch,
                                  info=info or {}, write=write,
                                  release=release, generation=self._generation,
                                  blake3_since=self._blake3_since, sha256_before=self._sha256_before,
                                  direct=direct))

    def _settle_run(self, step: int) -> None:
        """Before the first save: this run's generation, and a clear error instead of a silent mix when the
        folder already holds a newer step of a run this one did not resume."""
        newest = self._newest_seen
        if not self._restored_once:
            try:
                infos = self._listing(strict=True)
            except OSError:
                if self.fresh:   # its generation must outrank what is there: read it, or say why not
                    infos = self._read_with_retries(lambda: self._listing(strict=True), "the list of checkpoints")
                else:            # training goes on; the uploader checks the destination before uploading
                    infos = self._listing(strict=False)
                    self._sha256_unsure = True   # the destination's sha256 checkpoints were not seen
                    self._uploader.check_first = lambda: self._check_destination(step)
            infos = [c for c in infos if c.name not in self._damaged_seen]
            newest = max(infos, key=CheckpointInfo.order_key, default=None)
            self._note_blake3_since(infos)
        generation = 0 if newest is None else newest.generation
        if self._blake3_since is None:   # the folder's first BLAKE3 checkpoint is this one
            self._blake3_since = time.time()
            # unseen ones must not pass for an older colabkit's: without the names, the time decides
            self._sha256_before = None if self._sha256_unsure else sorted(self._sha256_seen)
        if self.fresh:
            generation += 1
        elif newest is not None and newest.step > step:
            raise CheckpointError(
                f"{self.location} holds step {newest.step} of an earlier run, and this run saves step {step}. "
                f"Call restore() first to continue that run, pass fresh=True to start a new run there (the "
                f"earlier run's checkpoints are deleted as this run's are committed), or use another folder. "
                f"Nothing was saved.")
        self._generation = generation

    def _check_destination(self, step: int) -> None:
        """Run by the uploader before its first upload when the first save could not read the destination:
        an earlier run's newer checkpoints there stop the uploads (they stay on local disk) with the same
        error the first save would have raised."""
        newest = max((c for c in self.dest.committed() if c.name not in self._damaged_seen),
                     key=CheckpointInfo.order_key, default=None)
        if newest is not None and newest.order_key()[:3] > (_digest.ERA[_digest.HASH], self._generation, step):
            raise CheckpointError(
                f"{self.location} holds step {newest.step} of an earlier run, and this run started at step {step} "
                f"without restoring it; its checkpoints stay on local disk at {self.local.path} and are not "
                f"uploaded. Call restore() first to continue that run, pass fresh=True, or use another folder.")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the newest save is committed on the destination. False on timeout or failure."""
        return self._uploader.wait(self._seq, timeout)

    def close(self, timeout: float | None = 60.0) -> None:
        """Finish pending uploads (up to ``timeout`` seconds) and stop the background thread.

        An upload still running at the timeout goes on in the background until it succeeds or fails; after
        close nothing is retried, and what did not reach the destination stays committed on local disk."""
        if not self._uploader.close(timeout):   # when it ends, the uploader releases the claim (on_stop)
            log.warning("colabkit: an upload to %s is still running after %ss; it goes on in the background and "
                        "%s stays claimed by this process until it ends", self.location, timeout, self.location)
        _OPEN.discard(self)

    def claim(self) -> None:
        """Claim the folder for this process before writing (``save`` does it too). Raises FolderInUse when
        another process, on this machine or (through the destination's lease) on another, is writing to it.
        A destination that cannot be reached now is claimed before the first upload instead."""
        _writer.claim(self.local.path, self, self.location)
        if not self._lease_tried:
            self._lease_tried = True   # once: during an outage, the uploader retries, not the training thread
            try:
                self._lease.acquire(self)
            except OSError as exc:
                log.debug("colabkit: cannot take the lease on %s now (%s); the uploader will", self.location, exc)
            except BaseException:
                self.release()   # refused: this process does not write here, so it claims nothing here either
                raise

    def release(self) -> None:
        """Let other processes write to the folder (``close`` does it too)."""
        self._lease.release(self)
        self._lease_tried = False
        _writer.release(self.local.path, self)

    def delete_all(self) -> None:
        """Delete this run's checkpoints from the destination and the local staging folder (Keras'
        ``delete_checkpoint``), after ``close()``. Only checkpoint folders go: the user's other files stay, and
        so does a folder that still holds any; a folder left empty is removed."""
        if self.dest is not None:
            self.dest.remove_all()
        self.local.remove_all()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- reading --------------------------------------------------------------------------------------
    def list(self) -> list[CheckpointInfo]:
        """Committed checkpoints (destination and local copies), oldest first, one entry per checkpoint.
        Raises OSError when the destination cannot be read."""
        return sorted((group[0] for group in self._copies().values()), key=CheckpointInfo.order_key)

    def _listing(self, *, strict: bool) -> list[CheckpointInfo]:
        """Every committed copy, local ones first. ``strict``: an unreadable destination raises OSError;
        otherwise only the local copies are returned then."""
        found = self._committed_in(self.local)
        if self.dest is not None:
            try:
                found += self._committed_in(self.dest)
            except OSError:
                if strict:
                    raise
        return found

    def _committed_in(self, folder) -> list[CheckpointInfo]:
        """``folder``'s committed checkpoints; entries colabkit would never have written (a link, a manifest
        with a field out of range) are left out with one warning each."""
        listing = folder.scan(confirm=True)
        listing.raise_if_unreadable(folder.path)
        for name, why in listing.invalid.items():
            if (folder.path, name) not in self._invalid_warned:
                self._invalid_warned.add((folder.path, name))
                self._warn(f"{name} in {folder.path} is not used: {why}")
        return listing.committed

    def _copies(self) -> dict:
        """name -> the committed copies of that checkpoint, the local one first (it reads faster; it was
        committed before the upload, and the destination's copy is the fallback when it is damaged)."""
        copies = {}
        for c in self._listing(strict=True):
            copies.setdefault(c.name, []).append(c)
        return copies

    def _read_with_retries(self, read, what: str):
        """``read()``, retried with back-off while it fails with OSError, for at most ``read_timeout``
        seconds; then CheckpointError naming the location and the reason."""
        deadline, delay = time.monotonic() + self.read_timeout, 0.05
        while True:
            try:
                return read()
            except (CorruptCheckpoint, FileNotFoundError):
                raise
            except OSError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CheckpointError(
                        f"cannot read {what} from {self.location} ({exc}), retried for {self.read_timeout:.0f}s. "
                        f"Nothing was restored, and training must not start over as if the folder were empty: "
                        f"re-run when {self.location} is reachable again (on Colab, remount Drive with "
                        f"drive.mount(..., force_remount=True)).") from None
                log.debug("colabkit: reading %s from %s failed (%s); retrying", what, self.location, exc)
                time.sleep(min(delay, left))
                delay = min(delay * 2, 10.0)

    def restore(self, into: dict | None = None, *, check=None) -> Restored | None:
        """The newest valid checkpoint, or None when the folder was read and holds none.

        Files are checked against the manifest (sizes and hashes); a damaged checkpoint gives a warning
        and the previous valid one is used. A destination that cannot be read (a dropped mount, an I/O
        error, a manifest that cannot be read) is retried for ``read_timeout``, then raises CheckpointError
        rather than resuming from an older checkpoint or starting over.
        ``into`` maps state names to TensorFlow objects (models, tf.Variables, tf.Module) that are restored
        in place. With ``resume_from`` (a shared link) and no checkpoint of its own yet, the shared
        checkpoint is downloaded, verified and restored first.
        ``check(restored)``, when given, is called with each candidate before it is returned, and before the
        caller changes anything live: raising InvalidCheckpoint there skips that checkpoint with a warning and
        tries the previous one (a field out of range, a file that is not what it claims); raising anything
        else (CheckpointError: the checkpoint does not fit the objects given) ends the restore.
        """
        claimed = []

        def downloads() -> CheckpointFolder:
            """Where to download: the local staging folder, claimed first (only when a download is needed,
            so that a restore that finds nothing writes nothing); a folder of our own when another process
            on this machine writes to the staging folder."""
            if _writer.holds(self.local.path, self):
                return self.local
            try:
                _writer.claim(self.local.path, self, self.location)
            except _writer.FolderInUse:
                import tempfile
                scratch = Path(tempfile.mkdtemp(prefix="colabkit-restore-"))
                atexit.register(remove_tree, scratch)
                return CheckpointFolder(scratch)
            claimed.append(True)
            return self.local

        self._invalid_warned.clear()   # each restore says which checkpoints it could not use
        try:
            return self._restore(into, downloads, check)
        finally:
            if claimed:
                _writer.release(self.local.path, self)

    def restore_folder(self, into=None, *, check=None) -> Restored | None:
        """The newest valid checkpoint taken with ``save_folder()``, verified, or None when the folder holds none.

        into: a folder to put its files in, as ``into/<name>`` (the folder or file's own name, such as
        checkpoint-500 or last.pt); a different file or folder already there under that name is moved aside
        to ``<name>.colabkit-replaced-N``, never deleted. A function instead of a folder is called with the
        verified ``Restored`` (its ``manifest["info"]`` holds what ``save_folder(info=...)`` recorded, such as
        where the files came from) and returns the folder. None: the verified copy on local disk is used where
        it is (read it, do not write into it). ``Restored.path`` is the restored folder or file.
        check: as for ``restore()``. Damaged checkpoints are skipped as ``restore()`` skips them.
        A checkpoint saved with ``save()`` rather than ``save_folder()`` raises CheckpointError.
        """
        def folder_check(restored):
            if _files.recorded(restored.state) is None:
                raise CheckpointError(
                    f"checkpoint {restored.path.name} (step {restored.step}) in {self.location} holds a state "
                    f"saved with save(), not files saved with save_folder(): restore it with restore().")
            if check is not None:
                check(restored)

        restored = self.restore(check=folder_check)
        if restored is None:
            return None
        entry = _files.recorded(restored.state)
        path = restored.path / _files.FILES / entry["name"]
        if callable(into):
            into = into(dataclasses.replace(restored, path=path))
        if into is not None:
            _refuse_a_file(Path(into), f"into={into!r}")
            path = _files.place(restored.path, entry, Path(into))
        return dataclasses.replace(restored, path=path)

    def _restore(self, into, downloads, check):
        copies = self._read_with_retries(self._copies, "the list of checkpoints")
        committed = [group[0] for group in copies.values()]   # this folder's, before any shared one is pulled
        self._note_blake3_since(committed)   # also when none of them can be restored
        pulled = None
        if not copies and self.resume_from is not None:
            from .shared import pull_checkpoint
            pulled = pull_checkpoint(self.resume_from, downloads())
            copies = {pulled.name: [pulled]}
        for group in sorted(copies.values(), key=lambda g: g[0].order_key(), reverse=True):
            for info in group:
                from_local = info.path.parent == self.local.path
                # arrays and JSON on a filesystem are read once, checked on the way, and loaded from memory;
                # trackables (TensorFlow reads them from files) and API back ends are copied to local disk first
                in_place = set(info.manifest["files"]) <= {_state.ARRAYS, _state.STATE} and (
                    from_local or pulled is not None or isinstance(self.dest, CheckpointFolder))
                try:
                    if in_place:
                        contents = self._read_checked(info, retry=not from_local)
                        state = _decoded(_state.from_contents, contents, info.path, into=into)
                    else:
                        info = info if from_local else self._download(info, downloads())
                        if from_local:
                            self.local.verify(info, full=True)
                        state = _decoded(_state.read, info.path, into=into)
                    source = "link" if pulled is not None else "local" if from_local else "destination"
                    restored = Restored(step=info.step, epoch=info.epoch, batch=info.batch, state=state,
                                        path=info.path, source=source, manifest=info.manifest)
                    if check is not None:
                        check(restored)
                except InvalidCheckpoint as exc:
                    self._warn(f"checkpoint {info.name} (step {info.step}) in {self.location} cannot be used "
                               f"({exc}); trying the previous one")
                    self._damaged_seen.add(info.name)
                    continue
                except _state.StateError as exc:
                    raise CheckpointError(str(exc)) from None
                except (CorruptCheckpoint, ManifestError, OSError, ValueError, KeyError) as exc:
                    what = (f"shared checkpoint from {self.resume_from}" if pulled is not None
                            else f"{'local' if from_local else 'destination'} copy of checkpoint")
                    self._warn(f"{what} {info.name} (step {info.step}) is damaged ({exc}); trying the next copy")
                    self._damaged_seen.add(info.name)
                    continue
                self._damaged_seen.discard(info.name)
                self._say_older_version_alongside(committed, info)
                if self._newest_seen is None or info.order_key() > self._newest_seen.order_key():
                    self._newest_seen = info
                self._restored_once = True
                return restored
        self._restored_once = True   # read, and nothing valid there
        return None

    def _note_blake3_since(self, committed: list) -> None:
        """Carry forward when the folder's first BLAKE3 checkpoint was made and the sha256 checkpoints it found,
        from the checkpoints read; remember the sha256 ones, should this run's save be the folder's first BLAKE3."""
        self._sha256_seen.update(c.name for c in committed if c.hash_era < _digest.ERA["blake3"])
        recorded = [c.manifest["sha256_before"] for c in committed
                    if c.blake3_since is not None and "sha256_before" in c.manifest]
        if recorded:
            self._sha256_before = sorted(set(self._sha256_before or ()).union(*recorded))
        seen = [c.blake3_since for c in committed if c.blake3_since is not None]
        if self._blake3_since is not None:
            seen.append(self._blake3_since)
        self._blake3_since = min(seen, default=None)

    def _say_older_version_alongside(self, committed: list, restored: CheckpointInfo) -> None:
        """Warn when an older colabkit (before BLAKE3 manifests) started a run of its own beside this one."""
        older = written_alongside_by_older_version(committed)
        if not older or restored.hash_era == 0:
            return
        steps = sorted(c.step for c in older)
        self._warn(f"{self.location} also holds {len(older)} checkpoint(s) (steps {steps[0]}-{steps[-1]}) that an "
                   f"older colabkit wrote after this run's first: it cannot read this "
                   f"version's checkpoints and started over. Resuming step {restored.step} of this run; those rank "
                   f"below it and are kept. Upgrade colabkit on every machine that resumes this folder (pip install "
                   f"-U colabkit), then delete them (`colabkit checkpoints {self.location}` lists them).")

    def _read_checked(self, info: CheckpointInfo, *, retry: bool) -> dict:
        """The checkpoint's files, each read once and checked against the manifest (CorruptCheckpoint).
        ``retry``: transient errors are retried with back-off, then raise (a destination); otherwise they
        raise at once. The name is reserved meanwhile, so that the uploader does not prune it."""
        read = lambda: CheckpointFolder(info.path.parent).read_checked(info)  # noqa: E731
        self._uploader.reserve(info.name)
        try:
            if not retry:
                return read()
            return self._read_with_retries(read, f"checkpoint {info.name} (step {info.step})")
        finally:
            self._uploader.unreserve(info.name)

    def _download(self, info: CheckpointInfo, into: CheckpointFolder) -> CheckpointInfo:
        """One read of a destination checkpoint into local disk, checked against its manifest on the way.
        Transient errors (not a missing or damaged file) are retried with back-off, then raise. The name is
        reserved meanwhile, so that the uploader does not prune the half-copied folder."""
        self._uploader.reserve(info.name)
        try:
            return self._read_with_retries(lambda: self.dest.download(info, into),
                                           f"checkpoint {info.name} (step {info.step})")
        finally:
            self._uploader.unreserve(info.name)

    def _warn(self, message: str) -> None:
        log.warning("colabkit: %s", message)
        warnings.warn(f"colabkit: {message}", RuntimeWarning, stacklevel=3)


def _decoded(load, *args, **kwargs):
    """``load(*args, **kwargs)``'s state. Files that matched their manifest can still hold contents colabkit
    never writes
    (state.json nested 100,000 deep, an array key that is not there): InvalidCheckpoint, so that the
    previous checkpoint is tried. StateError (the state does not fit the objects given) passes through."""
    try:
        state = load(*args, **kwargs)
    except _state.StateError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, RecursionError, UnicodeDecodeError, zipfile.BadZipFile) as exc:
        raise InvalidCheckpoint(f"its state cannot be read: {type(exc).__name__}: {exc}") from None
    if not isinstance(state, dict):
        raise InvalidCheckpoint(f"its state is a {type(state).__name__}, and colabkit saves a dict")
    return state


@atexit.register
def _flush_open_checkpoints():
    for ckpt in list(_OPEN):
        ckpt.close(timeout=60.0)
