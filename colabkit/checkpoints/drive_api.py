"""The store's destination on Google Drive's API (``gdrive://runs/mnist``): a Destination (destinations.py).

Each checkpoint is a Drive folder named like the local one; its files are uploaded first and
MANIFEST.json last, so a checkpoint whose upload was interrupted has no manifest and stays invisible.
Drive allows several items with one name in a folder: lookups take the newest (createdDate, then id) and
report the duplicates; a same-named folder from an interrupted earlier upload is deleted before a new upload.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path, PurePosixPath

from .. import gdrive as _gdrive
from . import digest as _digest
from . import manifest as _manifest
from .folder import (
    _NAME,
    check_name,
    LEASE_NAME,
    CheckpointError,
    CheckpointFolder,
    CheckpointInfo,
    CorruptCheckpoint,
    Listing,
    names_to_keep,
)
from .storage import remove_tree, write_bytes

log = logging.getLogger("colabkit")

LISTING_LAG_S = 1.0   # Drive's listings are eventually consistent: a second look after this long


class DriveApiFolder:
    """Checkpoints in one Drive folder, addressed by a path below My Drive, a shared drive or a folder id (see
    DriveClient.locate). Methods raise OSError (DriveError)."""

    def __init__(self, folder_path: str, client: _gdrive.DriveClient | None = None):
        self.folder_path = folder_path.strip("/")
        self.client = client or _gdrive.connect()
        self.path = PurePosixPath("gdrive:") / self.folder_path   # for messages; never equal to a local path
        self.name = PurePosixPath(self.folder_path).name
        self._root_id: str | None = None
        self._ids: dict[str, str] = {}        # checkpoint name -> Drive folder id (from the last listing)
        self._rest = self.folder_path
        self._storage_ok = False

    def __repr__(self):
        return f"DriveApiFolder('gdrive://{self.folder_path}')"

    def __str__(self):
        return f"gdrive://{self.folder_path}"

    # -- locating --------------------------------------------------------------------------------------
    def _root(self, *, create: bool, confirm: bool = False) -> str | None:
        if self._root_id is None:
            top, rest, _ = self.client.locate(self.folder_path)
            self._rest = rest
            self._root_id = self.client.folder(rest, create=create, root=top)
            if self._root_id is None and confirm:   # a listing may not show a folder yet: look once more
                time.sleep(LISTING_LAG_S)
                self._root_id = self.client.folder(rest, create=False, root=top)
        return self._root_id

    def _check_storage(self, root: str) -> None:
        """Before the first upload: a service account without storage can write only into a shared drive."""
        if self._storage_ok or not self.client.has_no_storage():
            self._storage_ok = True
            return
        if self.client.get(root).get("driveId"):
            self._storage_ok = True
            return
        raise NoDriveStorage(f"Cannot upload checkpoints to {self}: {self.client.whoami()} is a service account "
                             f"without Drive storage, and {self} is not in a shared drive (Drive would answer 403 "
                             f"storageQuotaExceeded). {_gdrive.NO_STORAGE_HELP}")

    def _folders(self, *, confirm: bool = False) -> dict[str, list[dict]]:
        """Checkpoint-named folders, grouped by name, oldest first. ``confirm``: the union of two listings,
        so that one listing that lags behind does not hide a checkpoint from a restore."""
        root = self._root(create=False, confirm=confirm)
        if root is None:
            return {}
        items = {item["id"]: item for item in self.client.children(root, folders=True)}
        if confirm:
            items.update({item["id"]: item for item in self.client.children(root, folders=True)})
        groups: dict[str, list[dict]] = {}
        for item in sorted(items.values(), key=lambda f: (f.get("createdDate", ""), f["id"])):
            if _NAME.match(item["title"]):
                groups.setdefault(item["title"], []).append(item)
        return groups

    def _read_manifest(self, folder_id: str, where: str) -> dict:
        found = self.client.pick(self.client.children(folder_id, title=_manifest.MANIFEST_NAME, folders=False),
                                 where)
        if found is None:
            raise _manifest.ManifestError(f"{where} has no {_manifest.MANIFEST_NAME}")
        data = self.client.read_bytes(found["id"], f"reading {where}/{_manifest.MANIFEST_NAME}")
        return _manifest.loads(data, where=f"{where}/{_manifest.MANIFEST_NAME}")

    # -- the destination protocol --------------------------------------------------------------------------
    def scan(self, *, confirm: bool = False) -> Listing:
        """As CheckpointFolder.scan. A folder whose manifest a listing does not show is incomplete (Drive
        listings lag behind uploads: pruning deletes such folders only when they are known leftovers).
        ``confirm`` (for restores): folders and manifests that one listing may have missed are looked for
        again (see _folders), and a folder without a manifest whose step is above the newest committed one
        is looked at once more after LISTING_LAG_S, so that a lagging listing does not resume an older step."""
        listing = self._scan(self._folders(confirm=confirm))
        newest = max((c.step for c in listing.committed), default=-1)
        doubtful = [n for n in listing.incomplete if int(_NAME.match(n).group(1)) > newest]
        if confirm and doubtful:
            time.sleep(LISTING_LAG_S)
            again = self._scan({n: items for n, items in self._folders().items() if n in doubtful})
            listing.committed = sorted(listing.committed + again.committed, key=CheckpointInfo.order_key)
            listing.incomplete = sorted(set(listing.incomplete) - {c.name for c in again.committed})
            listing.unreadable.update(again.unreadable)
        return listing

    def _scan(self, folders: dict) -> Listing:
        found, incomplete, unreadable, invalid = [], [], {}, {}
        for name, items in folders.items():
            if len(items) > 1:
                self.client.pick(items, str(self))
            info = None
            for item in reversed(items):       # newest first; the first with a valid manifest wins
                try:
                    where = f"{self}/{name}/{_manifest.MANIFEST_NAME}"
                    manifest = check_name(self._read_manifest(item["id"], f"{self}/{name}"), name, where)
                except _manifest.InvalidManifest as exc:
                    invalid[name] = str(exc)
                    continue
                except _manifest.ManifestError:
                    continue
                except OSError as exc:
                    unreadable[name] = exc
                    break
                self._ids[name] = item["id"]
                info = CheckpointInfo(self.path / name, manifest)
                break
            if info is not None:
                found.append(info)
                invalid.pop(name, None)
            elif name not in unreadable and name not in invalid:
                incomplete.append(name)
        return Listing(sorted(found, key=CheckpointInfo.order_key), sorted(incomplete), unreadable, invalid)

    def committed(self) -> list[CheckpointInfo]:
        """Committed checkpoints, oldest first, confirmed against a lagging listing (see scan)."""
        listing = self.scan(confirm=True)
        listing.raise_if_unreadable(self)
        return listing.committed

    def leftovers(self) -> list[str]:
        """Names of checkpoint folders without a valid manifest (interrupted uploads), sorted."""
        return self.scan().incomplete

    def _folder_id(self, info: CheckpointInfo) -> str:
        if info.name not in self._ids:
            self.committed()
        try:
            return self._ids[info.name]
        except KeyError:
            raise CorruptCheckpoint(f"{self}/{info.name} is no longer on Google Drive") from None

    def _files(self, info: CheckpointInfo) -> dict[str, dict]:
        where = f"{self}/{info.name}"
        files = self.client.walk(self._folder_id(info), where=where)
        if set(info.manifest["files"]) - set(files):   # a listing may lag behind the upload: look once more
            time.sleep(LISTING_LAG_S)
            files = self.client.walk(self._folder_id(info), where=where)
        for rel, meta in info.manifest["files"].items():
            item = files.get(rel)
            if item is None:
                raise CorruptCheckpoint(f"{self}/{info.name}/{rel} is missing")
            if int(item.get("fileSize", -1)) != meta["size"]:
                raise CorruptCheckpoint(f"{self}/{info.name}/{rel} has {item.get('fileSize')} bytes, the "
                                        f"manifest says {meta['size']}")
        return files

    def verify(self, info: CheckpointInfo, *, full: bool = True) -> None:
        files = self._files(info)
        if not full:
            return
        for rel, meta in info.manifest["files"].items():
            name, recorded = _digest.recorded(meta)
            digest = _digest.hasher(name)
            self.client.download(files[rel]["id"], _HashSink(digest), what=f"reading {self}/{info.name}/{rel}")
            if digest.hexdigest() != recorded:
                raise CorruptCheckpoint(f"{self}/{info.name}/{rel} does not match its {name} in the manifest")

    def copy_in(self, source: CheckpointInfo, **_ignored) -> CheckpointInfo:
        """Upload a committed local checkpoint: a new Drive folder, data files, then the manifest."""
        root = self._root(create=True)
        self._check_storage(root)
        for stale in self.client.children(root, title=source.name, folders=True):
            try:   # a retry after the manifest went up but its answer was lost: that copy is committed
                if self._read_manifest(stale["id"], f"{self}/{source.name}").get("checksum") == \
                        source.manifest.get("checksum"):
                    self._ids[source.name] = stale["id"]
                    info = CheckpointInfo(self.path / source.name, source.manifest)
                    self._files(info)
                    return info
            except (_manifest.ManifestError, CorruptCheckpoint):
                pass
            self.client.delete(stale["id"])    # an interrupted earlier upload of this checkpoint
        folder = self.client.mkdir(root, source.name)
        subfolders = {"": folder["id"]}
        for rel, meta in source.manifest["files"].items():
            parent = self._subfolder(subfolders, PurePosixPath(rel).parent.as_posix())
            try:
                uploaded = self.client.upload(Path(source.path) / rel, parent, PurePosixPath(rel).name)
            except _gdrive.DriveStorageFull as exc:     # not transient: say so, and let wait() return
                self.client.delete(folder["id"])
                raise NoDriveStorage(f"Cannot upload checkpoints to {self}: {exc}") from None
            if int(uploaded.get("fileSize", -1)) != meta["size"]:
                raise _gdrive.DriveError(f"Google Drive stored {uploaded.get('fileSize')} bytes of {rel}, "
                                         f"expected {meta['size']}; the upload is retried")
        self.client.upload(Path(source.path) / _manifest.MANIFEST_NAME, folder["id"], _manifest.MANIFEST_NAME)
        self._ids[source.name] = folder["id"]
        return CheckpointInfo(self.path / source.name, source.manifest)

    def _subfolder(self, made: dict, rel_dir: str) -> str:
        rel_dir = "" if rel_dir == "." else rel_dir
        if rel_dir not in made:
            parent = self._subfolder(made, PurePosixPath(rel_dir).parent.as_posix())
            made[rel_dir] = self.client.mkdir(parent, PurePosixPath(rel_dir).name)["id"]
        return made[rel_dir]

    def download(self, info: CheckpointInfo, into: CheckpointFolder) -> CheckpointInfo:
        """Copy a checkpoint to the local folder ``into``, checking sizes and hashes; manifest written last."""
        files = self._files(info)
        target = into.path / info.name
        remove_tree(target)
        target.mkdir(parents=True)
        try:
            for rel, meta in info.manifest["files"].items():
                dest = target / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                name, recorded = _digest.recorded(meta)
                digest = _digest.hasher(name)
                with open(dest, "wb") as fh:
                    self.client.download(files[rel]["id"], _HashSink(digest, fh),
                                         what=f"reading {self}/{info.name}/{rel}")
                if dest.stat().st_size != meta["size"] or digest.hexdigest() != recorded:
                    raise CorruptCheckpoint(f"{self}/{info.name}/{rel} does not match its manifest")
            write_bytes(target / _manifest.MANIFEST_NAME, _manifest.dumps(info.manifest))
        except BaseException:
            remove_tree(target)
            raise
        return CheckpointInfo(target, into.read_manifest(target))

    def prune(self, keep: int, *, keep_every: float | None = None, protect=lambda name: False,
              abandoned=lambda name: False, on_delete=lambda name: None) -> list[str]:
        """As CheckpointFolder.prune: nothing when a manifest is unreadable; committed ones beyond ``keep``
        (plus one per ``keep_every``), known leftovers, and same-named duplicates of a kept checkpoint (an
        interrupted upload of it); the manifest is deleted first, the first failure ends the round."""
        listing = self.scan()
        listing.raise_if_unreadable(self)
        keep_names = names_to_keep(listing.committed, keep, keep_every)
        committed = {c.name for c in listing.committed}
        incomplete = set(listing.incomplete)
        deleted = []
        for name, items in self._folders().items():
            if protect(name) or (name in incomplete and not abandoned(name)) or (
                    name not in committed and name not in incomplete):
                continue
            chosen = self._ids.get(name) if name in keep_names else None
            for item in items:
                if item["id"] == chosen:
                    continue
                on_delete(name)
                for manifest in self.client.children(item["id"], title=_manifest.MANIFEST_NAME):
                    self.client.delete(manifest["id"])
                self.client.delete(item["id"])
                if self._ids.get(name) == item["id"]:
                    del self._ids[name]
                deleted.append(name)
        return deleted

    # -- the writer's lease (lease.py) ------------------------------------------------------------------
    def _lease_items(self) -> list[dict]:
        root = self._root(create=False)
        return [] if root is None else self.client.children(root, title=LEASE_NAME, folders=False)

    def read_lease(self) -> bytes | None:
        found = self.client.pick(self._lease_items(), str(self))
        return None if found is None else self.client.read_bytes(found["id"], f"reading {self}/{LEASE_NAME}")

    def write_lease(self, data: bytes) -> None:
        """A new record, then the older ones go (Drive has no in-place overwrite through this client)."""
        import tempfile
        root = self._root(create=True)
        self._check_storage(root)
        older = self.client.children(root, title=LEASE_NAME, folders=False)
        with tempfile.TemporaryDirectory(prefix="colabkit-lease-") as tmp:
            path = Path(tmp) / LEASE_NAME
            path.write_bytes(data)
            try:
                self.client.upload(path, root, LEASE_NAME)
            except _gdrive.DriveStorageFull as exc:     # not transient: say so, and let wait() return
                raise NoDriveStorage(f"Cannot upload checkpoints to {self}: {exc}") from None
        for item in older:
            self.client.delete(item["id"])

    def remove_lease(self) -> None:
        for item in self._lease_items():
            self.client.delete(item["id"])

    def remove_all(self) -> None:
        """Delete this run's checkpoint folders from Drive (AutoResume's delete_checkpoint=True), then the folder
        itself if nothing else is in it. Other files (the user's, another writer's lease) stay, and so does the
        folder that holds them, a shared drive, and a folder given by id."""
        root = self._root(create=False)
        if root is not None:
            others = False
            for item in self.client.children(root):
                if _NAME.match(item["title"]) and item.get("mimeType") == _gdrive.FOLDER_MIME:
                    self.client.delete(item["id"])
                else:
                    others = True
            if not others and self._rest.strip("/"):
                self.client.delete(root)
        self._root_id, self._ids = None, {}


class NoDriveStorage(_gdrive.DriveStorageFull, CheckpointError):
    """The destination cannot store files for this account (a service account outside a shared drive)."""


class _HashSink:
    """A write-only file object that hashes (and optionally forwards) what MediaIoBaseDownload writes."""

    def __init__(self, digest, out=None):
        self.digest, self.out = digest, out

    def write(self, data):
        self.digest.update(data)
        if self.out is not None:
            self.out.write(data)
        return len(data)
