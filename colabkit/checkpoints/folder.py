"""One folder of checkpoints (the destination, or its local staging copy): list, commit, verify, prune.

Layout::

    <folder>/ckpt-000000001200-3f9a1c/   one checkpoint (step 1200); the suffix keeps names unique
        arrays.npz  state.json  tf/...  files of the state
        MANIFEST.json                   written last; without a valid one the folder is a leftover
"""
from __future__ import annotations

import dataclasses
import re
import secrets
from pathlib import Path

from . import manifest as _manifest
from .storage import copy_file, fsync_dir, remove_tree, write_bytes

_NAME = re.compile(r"^ckpt-(\d{12})-([0-9a-f]{6})$")


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be used (e.g. it does not fit the model being resumed), or the folder
    cannot be written (another run on this machine is writing to it)."""


class CorruptCheckpoint(Exception):
    """A committed checkpoint whose files do not match its manifest."""


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint: where it is and what its manifest says."""
    path: Path
    manifest: dict

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def step(self) -> int:
        return self.manifest["step"]

    @property
    def epoch(self):
        return self.manifest.get("epoch")

    @property
    def batch(self):
        return self.manifest.get("batch")

    @property
    def created(self) -> float:
        return self.manifest["created"]

    @property
    def size(self) -> int:
        return sum(meta["size"] for meta in self.manifest["files"].values())

    def order_key(self):
        return (self.step, self.created)


def names_to_keep(committed: list, keep: int, keep_every: float | None) -> set[str]:
    """Retention: the ``keep`` most recently committed, plus the first of each ``keep_every`` seconds.

    Ranked by commit time, not step: a run that starts over, or resumes from an older checkpoint, must not
    see its new checkpoints deleted because older ones carry higher steps."""
    committed = sorted(committed, key=lambda c: c.created)
    names = {c.name for c in committed[-keep:]}
    if keep_every:
        last_kept_at = None
        for c in committed:
            if last_kept_at is None or c.created - last_kept_at >= keep_every:
                names.add(c.name)
                last_kept_at = c.created
    return names


def new_name(step: int) -> str:
    if step < 0:
        raise ValueError(f"step={step!r} must be a non-negative integer.")
    return f"ckpt-{step:012d}-{secrets.token_hex(3)}"


class CheckpointFolder:
    """Checkpoints in one filesystem folder. All methods raise OSError when the folder is unreachable.

    This is also the destination protocol: a back end that is not a filesystem (an API-backed Drive
    folder) is used as a destination when it provides ``path`` (for messages), ``committed()``,
    ``copy_in(source)`` (upload a committed local checkpoint: data first, manifest last), ``download(info,
    into)``, ``verify(info, full=...)`` and ``prune(keep, keep_every=..., protect=...)`` with the meanings below.
    """

    def __init__(self, path: Path):
        self.path = Path(path)

    def __repr__(self):
        return f"CheckpointFolder({str(self.path)!r})"

    def _candidates(self) -> list[Path]:
        if not self.path.is_dir():
            return []
        return [p for p in self.path.iterdir() if _NAME.match(p.name) and p.is_dir()]

    def read_manifest(self, ckpt_dir: Path) -> dict:
        """The checkpoint's manifest; raises ManifestError (or OSError) when it is not committed."""
        try:
            data = (ckpt_dir / _manifest.MANIFEST_NAME).read_bytes()
        except FileNotFoundError:
            raise _manifest.ManifestError(f"{ckpt_dir} has no {_manifest.MANIFEST_NAME}") from None
        return _manifest.loads(data, where=str(ckpt_dir / _manifest.MANIFEST_NAME))

    def committed(self) -> list[CheckpointInfo]:
        """Committed checkpoints, oldest first. Folders without a valid manifest are skipped."""
        found = []
        for path in self._candidates():
            try:
                found.append(CheckpointInfo(path, self.read_manifest(path)))
            except (_manifest.ManifestError, OSError):
                continue
        return sorted(found, key=CheckpointInfo.order_key)

    def leftovers(self) -> list[str]:
        """Names of checkpoint folders without a valid manifest (interrupted writes), sorted."""
        committed = {c.name for c in self.committed()}
        return sorted(p.name for p in self._candidates() if p.name not in committed)

    def verify(self, info: CheckpointInfo, *, full: bool = True) -> None:
        """Check every file's size (and, with ``full``, sha256) against the manifest; raises CorruptCheckpoint."""
        for rel, meta in info.manifest["files"].items():
            file = info.path / rel
            try:
                size = file.stat().st_size
            except FileNotFoundError:
                raise CorruptCheckpoint(f"{file} is missing") from None
            if size != meta["size"]:
                raise CorruptCheckpoint(f"{file} has {size} bytes, the manifest says {meta['size']}")
            if full:
                digest, _ = _manifest.sha256_file(file)
                if digest != meta["sha256"]:
                    raise CorruptCheckpoint(f"{file} does not match its sha256 in the manifest")

    def commit(self, ckpt_dir: Path, *, step: int, epoch=None, batch=None, info: dict | None = None) -> CheckpointInfo:
        """Hash the files already written in ``ckpt_dir`` (inside this folder) and write the manifest last."""
        files = {}
        for file in sorted(p for p in ckpt_dir.rglob("*") if p.is_file()):
            rel = file.relative_to(ckpt_dir).as_posix()
            if rel == _manifest.MANIFEST_NAME:
                continue
            digest, size = _manifest.sha256_file(file, fsync=True)  # data durable before the manifest
            files[rel] = {"size": size, "sha256": digest}
        manifest = _manifest.build(step=step, epoch=epoch, batch=batch, files=files, info=info)
        fsync_dir(ckpt_dir)
        write_bytes(ckpt_dir / _manifest.MANIFEST_NAME, _manifest.dumps(manifest))
        fsync_dir(ckpt_dir)
        return CheckpointInfo(ckpt_dir, manifest)

    def copy_in(self, source: CheckpointInfo, *, check_hashes: bool = False, durable: bool = True) -> CheckpointInfo:
        """Copy a committed checkpoint into this folder under the same name: data files first, manifest last.

        Sizes are always checked; with ``check_hashes`` every file's sha256 is checked while it is copied
        (one read of a slow source), and a mismatch raises CorruptCheckpoint with nothing committed.
        ``durable=False`` skips fsync: for copies that are re-verified before every use (restore copies).
        An earlier, interrupted copy under that name is replaced (it was never committed).
        """
        target = self.path / source.name
        remove_tree(target)
        self.path.mkdir(parents=True, exist_ok=True)
        target.mkdir()
        for rel, meta in source.manifest["files"].items():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            digest, size = copy_file(source.path / rel, target / rel, durable=durable)
            problem = (f"{source.path / rel} has {size} bytes, the manifest says {meta['size']}"
                       if size != meta["size"] else
                       f"{source.path / rel} does not match its sha256 in the manifest"
                       if check_hashes and digest != meta["sha256"] else None)
            if problem:
                remove_tree(target)
                raise CorruptCheckpoint(problem)
        if durable:
            fsync_dir(target)
        write_bytes(target / _manifest.MANIFEST_NAME, _manifest.dumps(source.manifest))
        fsync_dir(target)
        return CheckpointInfo(target, self.read_manifest(target))

    def download(self, info: CheckpointInfo, into: "CheckpointFolder") -> CheckpointInfo:
        """Copy one of this folder's checkpoints into the local folder ``into``, checking sha256 on the way."""
        return into.copy_in(info, check_hashes=True, durable=False)

    def prune(self, keep: int, *, keep_every: float | None = None, protect=lambda name: False) -> list[str]:
        """Delete committed checkpoints beyond the newest ``keep`` (plus one per ``keep_every`` seconds),
        and leftovers of interrupted writes (a single writer per folder is assumed). ``protect(name)`` is
        asked for each folder after listing, right before deleting it: True for a checkpoint being written
        now (reserved before its folder is created, so a folder that was listed is always known to it).
        Returns the deleted names.

        The manifest goes first, so a half-deleted checkpoint is invisible rather than corrupt.
        """
        keep_names = names_to_keep(self.committed(), keep, keep_every)
        deleted = []
        for path in self._candidates():
            if path.name in keep_names or protect(path.name):
                continue
            try:
                (path / _manifest.MANIFEST_NAME).unlink(missing_ok=True)
                remove_tree(path)
                deleted.append(path.name)
            except OSError:
                continue
        return deleted


