"""One folder of checkpoints (the destination, or its local staging copy): list, commit, verify, prune.

Layout::

    <folder>/ckpt-000000001200-3f9a1c/   one checkpoint (step 1200); the suffix keeps names unique
        arrays.npz  state.json  tf/...  files of the state
        MANIFEST.json                   written last; without a valid one the folder is a leftover
"""
from __future__ import annotations

import dataclasses
import errno
import os
import re
import secrets
import stat
from pathlib import Path

from . import digest as _digest
from . import manifest as _manifest
from . import npz as _npz
from .manifest import InvalidManifest
from .storage import UnsafeEntry, copy_file, fsync_dir, open_inside, remove_tree, write_bytes

# the step is written with at least 12 digits; steps counted in samples or tokens have more (up to 19: int64)
_NAME = re.compile(r"^ckpt-(\d{12,19})-([0-9a-f]{6})$")
LEASE_NAME = ".colabkit-lease.json"   # see lease.py


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be used (e.g. it does not fit the model being resumed), or the folder
    cannot be written (another run on this machine is writing to it)."""


class CorruptCheckpoint(Exception):
    """A committed checkpoint whose files do not match its manifest."""


class InvalidCheckpoint(CorruptCheckpoint):
    """A checkpoint whose files match its manifest but whose contents cannot be valid (a field of the wrong
    type or out of range, a file that is not what it claims): raised by a restore's ``check`` before anything
    live is changed, so that the store skips it with a warning and tries the previous valid checkpoint."""


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

    @property
    def generation(self) -> int:
        """The run generation: 0, plus one for each new run started in the folder with ``fresh=True``."""
        return self.manifest.get("generation", 0)

    @property
    def hash_era(self) -> int:
        """1 for a checkpoint whose manifest records BLAKE3, 0 for one recording sha256 (see digest.ERA)."""
        return _digest.era(self.manifest["files"])

    @property
    def blake3_since(self) -> float | None:
        """For a BLAKE3 checkpoint: when the folder's first BLAKE3 checkpoint was made, as its run carried it
        forward (that first one may be long deleted); None for a sha256 one."""
        if self.hash_era != _digest.ERA["blake3"]:
            return None
        return self.manifest.get("blake3_since", self.created)

    def order_key(self):
        """Newest = highest (hash era, generation, step). The commit time only breaks ties: machines' clocks
        differ. The era first: an older colabkit's restart beside this version's run never outranks it."""
        return (self.hash_era, self.generation, self.step, self.created, self.name)


def written_alongside_by_older_version(committed: list) -> list:
    """The sha256 checkpoints committed after the folder's first BLAKE3 one: written by a colabkit from before
    BLAKE3 while this version's run was there (it cannot read that run, so it started one of its own). They rank
    below every BLAKE3 checkpoint, and retention keeps them: they are that machine's work, not an old step of
    this run. (sha256 checkpoints made before are the run's own past, from before the upgrade.)

    Which ones those are is told by name where the first BLAKE3 checkpoint's run recorded the sha256 ones it found
    (``sha256_before``, carried forward): machines' clocks differ, and an upgraded machine whose clock ran ahead
    would otherwise take the older machine's newer checkpoints for the run's past, and retention delete them. The
    wall-clock ``blake3_since`` decides only for manifests that do not record the names."""
    recorded = [c.manifest["sha256_before"] for c in committed
                if c.hash_era == _digest.ERA["blake3"] and "sha256_before" in c.manifest]
    if recorded:
        past = set().union(*recorded)
        return [c for c in committed if c.hash_era < _digest.ERA["blake3"] and c.name not in past]
    first = min((c.blake3_since for c in committed if c.blake3_since is not None), default=None)
    if first is None:
        return []
    return [c for c in committed if c.hash_era < _digest.ERA["blake3"] and c.created > first]


@dataclasses.dataclass
class Listing:
    """One look at a folder. ``incomplete``: checkpoint folders positively without a valid manifest (being
    written, or abandoned); ``unreadable``: name -> error for folders whose manifest could not be read (a
    dropped mount, an I/O error): neither committed nor incomplete, as far as anyone can tell; ``invalid``:
    name -> reason for entries colabkit would never have written (a link, a manifest with a field out of
    range or disagreeing with the folder's name): not used, not deleted."""
    committed: list
    incomplete: list
    unreadable: dict
    invalid: dict = dataclasses.field(default_factory=dict)   # name -> why it is not used (never deleted)

    def raise_if_unreadable(self, where) -> None:
        if self.unreadable:
            name, error = next(iter(self.unreadable.items()))
            raise OSError(errno.EIO, f"cannot read {len(self.unreadable)} checkpoint(s) in {where} "
                                     f"(first: {name}: {error})")


def names_to_keep(committed: list, keep: int, keep_every: float | None) -> set[str]:
    """Retention: the ``keep`` newest by (generation, step), plus the first of each ``keep_every`` seconds.

    Ranked by step within a run's generation, never by wall-clock time alone: a machine whose clock is behind
    must not make another machine's newer-step checkpoints look old. A run that starts over in a folder says
    so (``fresh=True``) and gets a higher generation, so its checkpoints outrank the earlier run's. An older
    colabkit's checkpoints written beside a BLAKE3 run are kept (see written_alongside_by_older_version)."""
    committed = sorted(committed, key=CheckpointInfo.order_key)
    names = {c.name for c in committed[-keep:]}
    names.update(c.name for c in written_alongside_by_older_version(committed))
    if keep_every:
        last_kept_at = None
        for c in sorted(committed, key=lambda c: c.created):
            if last_kept_at is None or c.created - last_kept_at >= keep_every:
                names.add(c.name)
                last_kept_at = c.created
    return names


def new_name(step: int) -> str:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= _manifest.MAX_STEP:
        raise ValueError(f"step={step!r} must be a whole number from 0 to {_manifest.MAX_STEP} (an int64 step "
                         f"counter); pass the step as a Python int.")
    return f"ckpt-{step:012d}-{secrets.token_hex(3)}"


def check_name(manifest: dict, name: str, where: str) -> dict:
    """``manifest``, when the step in the checkpoint folder's ``name`` is the manifest's; else InvalidManifest."""
    match = _NAME.match(name)
    if match is not None and match.group(1) != f"{manifest['step']:012d}":
        raise InvalidManifest(f"{where} says step {manifest['step']}, and its folder's name says step "
                              f"{int(match.group(1))}; the checkpoint is not used")
    return manifest


class CheckpointFolder:
    """Checkpoints in one filesystem folder. All methods raise OSError when the folder is unreachable.

    It is a destinations.Destination: a back end that is not a filesystem (an API-backed Drive folder) is
    used as a destination when it provides the same methods, with the meanings below.
    """

    def __init__(self, path: Path):
        self.path = Path(path)

    def __repr__(self):
        return f"CheckpointFolder({str(self.path)!r})"

    def _candidates(self) -> list[Path]:
        """Checkpoint-named entries. A folder that does not exist holds none; any other error (ENOTCONN from
        a dropped mount) is raised: "cannot list" must never read as "empty"."""
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        return [self.path / name for name in names if _NAME.match(name)]

    def read_manifest(self, ckpt_dir: Path) -> dict:
        """The checkpoint's manifest; raises ManifestError (or OSError) when it is not committed, and
        InvalidManifest when it is not one colabkit could have written there."""
        where = str(ckpt_dir / _manifest.MANIFEST_NAME)
        try:
            with open(open_inside(ckpt_dir, _manifest.MANIFEST_NAME), "rb") as fh:
                # read(n) would allocate n bytes up front: look at the size first
                data = None if os.fstat(fh.fileno()).st_size > _manifest.MAX_MANIFEST_BYTES else fh.read()
        except FileNotFoundError:
            raise _manifest.ManifestError(f"{ckpt_dir} has no {_manifest.MANIFEST_NAME}") from None
        except UnsafeEntry as exc:
            raise InvalidManifest(str(exc)) from None
        if data is None or len(data) > _manifest.MAX_MANIFEST_BYTES:
            raise InvalidManifest(f"{where} is larger than {_manifest.MAX_MANIFEST_BYTES} bytes; it is not read")
        return check_name(_manifest.loads(data, where=where), ckpt_dir.name, where)

    def scan(self, *, confirm: bool = False) -> Listing:
        """Committed (oldest first), incomplete, unreadable and invalid checkpoint folders. Raises OSError
        when the folder itself cannot be listed (``confirm`` is for back ends whose listings lag; a
        filesystem's does not). Only real folders are read: an entry with a checkpoint's
        name that is a symbolic link is listed as invalid and never followed (nor deleted through)."""
        found, incomplete, unreadable, invalid = [], [], {}, {}
        for path in self._candidates():
            try:
                mode = os.lstat(path).st_mode
                if stat.S_ISLNK(mode):
                    invalid[path.name] = "a symbolic link, which colabkit never makes; it is not followed"
                    continue
                if not stat.S_ISDIR(mode):
                    continue                  # a file that happens to have a checkpoint's name
                found.append(CheckpointInfo(path, self.read_manifest(path)))
            except FileNotFoundError:
                continue                      # deleted while listed
            except InvalidManifest as exc:
                invalid[path.name] = str(exc)
            except _manifest.ManifestError:
                incomplete.append(path.name)
            except OSError as exc:
                unreadable[path.name] = exc
        return Listing(sorted(found, key=CheckpointInfo.order_key), sorted(incomplete), unreadable, invalid)

    def committed(self) -> list[CheckpointInfo]:
        """Committed checkpoints, oldest first. Raises OSError when the folder or a manifest cannot be read
        (a checkpoint that might be committed is not silently left out)."""
        listing = self.scan()
        listing.raise_if_unreadable(self.path)
        return listing.committed

    def leftovers(self) -> list[str]:
        """Names of checkpoint folders without a valid manifest (interrupted writes), sorted."""
        return self.scan().incomplete

    def verify(self, info: CheckpointInfo, *, full: bool = True) -> None:
        """Check every file's size (and, with ``full``, hash) against the manifest; raises CorruptCheckpoint.
        Only regular files inside the checkpoint's folder are read (see open_file)."""
        for rel, meta in info.manifest["files"].items():
            fd = open_file(info, rel)
            with open(fd, "rb") as fh:
                size = os.fstat(fd).st_size
                if size != meta["size"]:
                    raise CorruptCheckpoint(f"{info.path / rel} has {size} bytes, the manifest says {meta['size']}")
                if full:
                    name, recorded = _digest.recorded(meta)
                    if _digest.hash_file(fh, name=name)[0] != recorded:
                        raise CorruptCheckpoint(f"{info.path / rel} does not match its {name} in the manifest")

    def commit(self, ckpt_dir: Path, *, step: int, epoch=None, batch=None, info: dict | None = None,
               generation: int = 0, blake3_since: float | None = None, sha256_before=None,
               written: dict | None = None) -> CheckpointInfo:
        """Hash the files already written in ``ckpt_dir`` (inside this folder) and write the manifest last.

        ``written``: {relative name: (digest.HASH hex, size)} of files that their writer hashed while writing and
        fsynced (state.write_data): they are not read back, only their size is checked."""
        files = {}
        listed = _files_under(ckpt_dir)
        missing = sorted(set(written or ()) - set(listed))
        if missing:
            raise OSError(f"{ckpt_dir} does not list {', '.join(missing)}, written there just now; not committed")
        for rel in listed:
            file = ckpt_dir / rel
            if rel == _manifest.MANIFEST_NAME:
                continue
            known = (written or {}).get(rel)
            if known is not None and file.stat().st_size == known[1]:
                digest, size = known
            else:
                digest, size = _digest.hash_file(file, fsync=True)  # data durable before the manifest
            files[rel] = {"size": size, _digest.HASH: digest}
        manifest = _manifest.build(step=step, epoch=epoch, batch=batch, files=files, info=info, generation=generation,
                                   blake3_since=blake3_since, sha256_before=sha256_before)
        fsync_dir(ckpt_dir)
        write_bytes(ckpt_dir / _manifest.MANIFEST_NAME, _manifest.dumps(manifest))
        fsync_dir(ckpt_dir)
        return CheckpointInfo(ckpt_dir, manifest)

    def read_checked(self, info: CheckpointInfo) -> dict:
        """{relative name: contents} of every file of a committed checkpoint, each read once and checked
        against the manifest on the way (size and hash); raises CorruptCheckpoint. Contents are writable
        buffers, 64-byte aligned (see npz.read_into_memory)."""
        contents = {}
        for rel, meta in info.manifest["files"].items():
            file = info.path / rel
            name, recorded = _digest.recorded(meta)
            try:
                with open(open_file(info, rel), "rb", buffering=0) as fh:
                    data, digest = _npz.read_into_memory(fh, expected_size=meta["size"], hash_name=name)
            except EOFError:
                raise CorruptCheckpoint(f"{file} does not have the {meta['size']} bytes the manifest says") from None
            if digest != recorded:
                raise CorruptCheckpoint(f"{file} does not match its {name} in the manifest")
            contents[rel] = data
        return contents

    def copy_in(self, source: CheckpointInfo, *, check_hashes: bool = False, durable: bool = True) -> CheckpointInfo:
        """Copy a committed checkpoint into this folder under the same name: data files first, manifest last.

        Sizes are always checked; with ``check_hashes`` every file's hash is checked while it is copied
        (one read of a slow source), and a mismatch raises CorruptCheckpoint with nothing committed.
        ``durable=False`` skips fsync: for copies that are re-verified before every use (restore copies).
        An earlier, interrupted copy under that name is replaced (it was never committed).
        """
        target = self.path / source.name
        existing = None if check_hashes else self._same_commit(target, source)
        if existing is not None:
            return existing   # a retry after the manifest was written but its answer was lost: keep it
        remove_tree(target)
        self.path.mkdir(parents=True, exist_ok=True)
        target.mkdir()
        for rel, meta in source.manifest["files"].items():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            name, recorded = _digest.recorded(meta)
            digest, size = copy_file(open_file(source, rel), target / rel, durable=durable, digest=check_hashes,
                                     hash_name=name)
            problem = (f"{source.path / rel} has {size} bytes, the manifest says {meta['size']}"
                       if size != meta["size"] else
                       f"{source.path / rel} does not match its {name} in the manifest"
                       if check_hashes and digest != recorded else None)
            if problem:
                remove_tree(target)
                raise CorruptCheckpoint(problem)
        if durable:
            fsync_dir(target)
        write_bytes(target / _manifest.MANIFEST_NAME, _manifest.dumps(source.manifest))
        fsync_dir(target)
        return CheckpointInfo(target, self.read_manifest(target))

    # -- the writer's lease (lease.py) ------------------------------------------------------------------
    def read_lease(self) -> bytes | None:
        try:
            return (self.path / LEASE_NAME).read_bytes()
        except FileNotFoundError:
            return None

    def write_lease(self, data: bytes) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_bytes(self.path / LEASE_NAME, data)   # in place: Drive's mount has no atomic rename

    def remove_lease(self) -> None:
        (self.path / LEASE_NAME).unlink(missing_ok=True)

    def remove_all(self) -> None:
        """Delete every checkpoint folder here (committed or not), then the folder itself if nothing else is in
        it: other files (the user's, another writer's lease) stay, and so does the folder that holds them."""
        for path in self._candidates():
            if path.is_dir() and not path.is_symlink():
                (path / _manifest.MANIFEST_NAME).unlink(missing_ok=True)   # invisible before it is half gone
                remove_tree(path)
        try:
            self.path.rmdir()
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
                raise

    def _same_commit(self, target: Path, source: CheckpointInfo) -> CheckpointInfo | None:
        """The committed copy of ``source`` already at ``target`` (same manifest, files of the right sizes)."""
        try:
            info = CheckpointInfo(target, self.read_manifest(target))
            if info.manifest.get("checksum") != source.manifest.get("checksum"):
                return None
            self.verify(info, full=False)
            return info
        except (_manifest.ManifestError, CorruptCheckpoint, OSError):
            return None

    def download(self, info: CheckpointInfo, into: CheckpointFolder) -> CheckpointInfo:
        """Copy one of this folder's checkpoints into the local folder ``into``, checking hashes on the way."""
        return into.copy_in(info, check_hashes=True, durable=False)

    def prune(self, keep: int, *, keep_every: float | None = None, protect=lambda name: False,
              abandoned=lambda name: False, on_delete=lambda name: None) -> list[str]:
        """Delete committed checkpoints beyond the newest ``keep`` (plus one per ``keep_every`` seconds), and
        incomplete folders that ``abandoned(name)`` says are known leftovers of interrupted writes. Returns
        the deleted names.

        Only what was positively read is acted on: when any checkpoint's manifest cannot be read, nothing is
        deleted this round (an unreadable checkpoint may be the newest); the first failed delete ends the
        round. ``protect(name)`` is asked right before deleting: True for a checkpoint being written now;
        ``on_delete(name)`` is told before a deletion starts (a half-deleted folder is then a known leftover).
        The manifest goes first, so a half-deleted checkpoint is invisible rather than corrupt.
        """
        listing = self.scan()
        listing.raise_if_unreadable(self.path)
        keep_names = names_to_keep(listing.committed, keep, keep_every)
        doomed = [c.name for c in listing.committed if c.name not in keep_names]
        doomed += [name for name in listing.incomplete if abandoned(name)]
        deleted = []
        for name in doomed:
            if protect(name):
                continue
            on_delete(name)
            (self.path / name / _manifest.MANIFEST_NAME).unlink(missing_ok=True)
            remove_tree(self.path / name)
            deleted.append(name)
        return deleted


def open_file(info: CheckpointInfo, rel: str) -> int:
    """A read-only descriptor of the checkpoint's file ``rel``: a regular file inside its folder, reached
    without following links (a FIFO would hang a read, a link would read outside). CorruptCheckpoint when it
    is missing or is anything else."""
    try:
        return open_inside(info.path, rel)
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{info.path / rel} is missing") from None
    except UnsafeEntry as exc:
        raise CorruptCheckpoint(str(exc)) from None


def _files_under(root: Path) -> list[str]:
    """Relative names of the files under ``root``, sorted. A folder that cannot be listed raises: a listing
    that came back empty or short would commit a manifest that leaves files out (pathlib's glob ignores
    such errors)."""
    def fail(exc: OSError):
        raise exc

    names = []
    for folder, _, files in os.walk(root, onerror=fail):
        names += [Path(folder, name).relative_to(root).as_posix() for name in files]
    return sorted(names)
