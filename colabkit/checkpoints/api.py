"""`colabkit.Checkpoints`: framework-neutral crash-safe checkpoints with verified restore."""
from __future__ import annotations

import atexit
import dataclasses
import hashlib
import logging
import time
import warnings
import weakref
from pathlib import Path

from .. import config as _config
from ..locations import resolve
from . import state as _state
from . import writer as _writer
from .folder import CheckpointError, CheckpointFolder, CheckpointInfo, CorruptCheckpoint, new_name
from .manifest import ManifestError
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


def local_cache_for(destination, cache_dir: Path) -> Path:
    """Local staging folder for a destination (a Path, or a back end with ``name``): stable, readable name."""
    digest = hashlib.sha1(str(destination).encode()).hexdigest()[:10]
    return cache_dir / "checkpoints" / f"{getattr(destination, 'name', '') or 'root'}-{digest}"


class Checkpoints:
    """Crash-safe checkpoints in ``directory`` ("drive:runs/gan", or any folder).

    ``save(step, state)`` snapshots the state on the calling thread, then writes it to fast local disk,
    commits it (manifest last) and copies it to the destination in a background thread. A checkpoint is
    visible to ``restore()`` only once its manifest is complete and its files match it.

    keep: committed checkpoints kept per folder (older ones are deleted only after a newer one is committed).
    keep_every: also keep one checkpoint per this interval ("6h"), like tf.train.CheckpointManager.
    local_dir: override the local staging folder (default: under the configured cache_dir).
    resume_from: a Google Drive share link to a checkpoint (folder, or .zip/.tar of one): restored when
    ``directory`` has none yet; training then continues into ``directory``.

    One writing process per folder: the first save (or ``claim()``) claims it on this machine, and a second
    process that tries gets FolderInUse (a CheckpointError); writers on different machines are not detected.
    At interpreter exit, pending uploads get up to 60 s to finish.
    """

    def __init__(self, directory, *, keep: int | None = None, keep_every=None, local_dir=None, resume_from=None):
        if directory is None or (isinstance(directory, str) and not directory.strip()):
            raise ValueError(f"directory={directory!r} is empty: pass a checkpoint folder such as "
                             f"\"drive:runs/mnist\" or \"checkpoints/mnist\".")
        settings = _config.load()
        self.keep = _validate_keep(settings.keep if keep is None else keep)
        from ..units import parse_duration
        self.keep_every = None if keep_every is None else parse_duration(keep_every, name="keep_every")
        if resume_from is not None:  # a shared link, pulled when `directory` has no checkpoint yet
            from ..links import parse_link
            parse_link(resume_from)
        self.resume_from = resume_from
        self.location = directory
        self.destination = resolve(directory)
        local = Path(local_dir) if local_dir is not None else local_cache_for(
            self.destination, settings.resolved_cache_dir())
        self.local = CheckpointFolder(local)
        if not isinstance(self.destination, Path):
            self.dest = self.destination      # a back end that is not a filesystem (see CheckpointFolder)
        elif local.resolve() == self.destination.resolve():
            self.dest = None                  # the destination is the local folder: nothing to upload
        else:
            self.dest = CheckpointFolder(self.destination)
        self._uploader = Uploader(self.local, self.dest, keep=self.keep, keep_every=self.keep_every,
                                  on_warning=self._warn)
        self._seq = 0
        self.last_snapshot_s: float | None = None
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
             wait: bool | float = False, _copy_arrays: bool = True, _release=None) -> bool:
        """Checkpoint ``state`` as ``step``. Returns once the state is snapshotted; the rest is background.

        wait: True blocks until the checkpoint is on the destination; a number waits at most that many
        seconds. Returns True when the checkpoint is committed as asked (always True without ``wait``).
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step={step!r} is invalid: pass a non-negative integer (e.g. the global batch count).")
        self.claim()
        started = time.monotonic()
        snap = _state.snapshot(state, copy_arrays=_copy_arrays)
        local_dir = self.local.path / new_name(step)
        self._uploader.reserve(local_dir.name)
        local_dir.mkdir(parents=True)
        _state.write_trackables(snap, local_dir)
        self.last_snapshot_s = time.monotonic() - started
        self._seq += 1
        self._uploader.submit(Job(seq=self._seq, local_dir=local_dir, step=step, epoch=epoch, batch=batch,
                                  info=info or {}, write=lambda d, s=snap: _state.write_data(s, d),
                                  release=_release))
        if wait is False:
            return True
        return self.wait(None if wait is True else float(wait))

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the newest save is committed on the destination. False on timeout or failure."""
        return self._uploader.wait(self._seq, timeout)

    def close(self, timeout: float | None = 60.0) -> None:
        """Finish pending uploads (up to ``timeout`` seconds) and stop the background thread.

        An upload still running at the timeout goes on in the background until it succeeds or fails; after
        close nothing is retried, and what did not reach the destination stays committed on local disk."""
        self._uploader.close(timeout)
        self.release()
        _OPEN.discard(self)

    def claim(self) -> None:
        """Claim the folder for this process before writing (``save`` does it too). Raises FolderInUse when
        another process on this machine is writing to it."""
        _writer.claim(self.local.path, self, self.location)

    def release(self) -> None:
        """Let other processes write to the folder (``close`` does it too)."""
        _writer.release(self.local.path, self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- reading --------------------------------------------------------------------------------------
    def list(self) -> list[CheckpointInfo]:
        """Committed checkpoints (destination and local copies), oldest first, one entry per checkpoint."""
        return sorted((group[0] for group in self._copies().values()), key=CheckpointInfo.order_key)

    def _copies(self) -> dict:
        """name -> the committed copies of that checkpoint, the local one first (it reads faster; it was
        committed before the upload, and the destination's copy is the fallback when it is damaged)."""
        copies = {}
        for c in self.local.committed():
            copies.setdefault(c.name, []).append(c)
        if self.dest is not None:
            try:
                for c in self.dest.committed():
                    copies.setdefault(c.name, []).append(c)
            except OSError as exc:
                self._warn(f"cannot read checkpoints at {self.destination} ({exc}); looking at local copies only")
        return copies

    def restore(self, into: dict | None = None) -> Restored | None:
        """The newest valid checkpoint, or None when there is none.

        Files are checked against the manifest (sizes and sha256); a damaged checkpoint gives a warning
        and the previous valid one is used. A destination that fails while it is read (a dropped mount) is
        retried, then raises CheckpointError rather than silently resuming from an older checkpoint.
        ``into`` maps state names to TensorFlow objects (models, tf.Variables, tf.Module) that are restored
        in place. With ``resume_from`` (a shared link) and no checkpoint of its own yet, the shared
        checkpoint is downloaded, verified and restored first.
        """
        copies = self._copies()
        pulled = None
        if not copies and self.resume_from is not None:
            from ..links import pull_checkpoint
            pulled = pull_checkpoint(self.resume_from, self.local)
            copies = {pulled.name: [pulled]}
        for group in sorted(copies.values(), key=lambda g: g[0].order_key(), reverse=True):
            for info in group:
                from_local = info.path.parent == self.local.path
                try:
                    info = info if from_local else self._download(info)
                    if from_local:
                        self.local.verify(info, full=True)
                    state = _state.read(info.path, into=into)
                except _state.StateError as exc:
                    raise CheckpointError(str(exc)) from None
                except (CorruptCheckpoint, ManifestError, OSError, ValueError, KeyError) as exc:
                    what = (f"shared checkpoint from {self.resume_from}" if pulled is not None
                            else f"{'local' if from_local else 'destination'} copy of checkpoint")
                    self._warn(f"{what} {info.name} (step {info.step}) is damaged or unreadable ({exc}); trying the "
                               f"next copy")
                    continue
                source = "link" if pulled is not None else "local" if from_local else "destination"
                return Restored(step=info.step, epoch=info.epoch, batch=info.batch, state=state, path=info.path,
                                source=source, manifest=info.manifest)
        return None

    def _download(self, info: CheckpointInfo, attempts: int = 4) -> CheckpointInfo:
        """One read of a destination checkpoint into local disk, checked against its manifest on the way.
        Transient errors (not a missing or damaged file) are retried with back-off, then raise."""
        for attempt in range(attempts):
            try:
                return self.dest.download(info, self.local)
            except (CorruptCheckpoint, FileNotFoundError):
                raise
            except OSError as exc:
                if attempt == attempts - 1:
                    raise CheckpointError(
                        f"could not read checkpoint {info.name} (step {info.step}) from {self.destination}: "
                        f"{exc}. Nothing was restored; re-run when the destination is reachable again.") from None
                time.sleep(2 ** attempt)
        raise AssertionError("unreachable")

    def _warn(self, message: str) -> None:
        log.warning("colabkit: %s", message)
        warnings.warn(f"colabkit: {message}", RuntimeWarning, stacklevel=3)


@atexit.register
def _flush_open_checkpoints():
    for ckpt in list(_OPEN):
        ckpt.close(timeout=60.0)
