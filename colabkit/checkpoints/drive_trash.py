"""Checkpoints deleted on Google Drive's mount go to Drive's Trash, where they count against the storage quota for
30 days (transformers #14922 fills Drive that way). DriveMountFolder is the checkpoint folder on the mount: what its
retention deletes, it then deletes for good through the Drive API when the user is signed in (colabkit's own
items only, by name, never the rest of Trash); otherwise it says once how much it put in Trash and how to empty it.
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from .. import mounts as _mounts
from ..units import format_size
from .folder import LEASE_NAME, CheckpointFolder

log = logging.getLogger("colabkit")

TRASH_URL = "https://drive.google.com/drive/trash"


def my_drive_of(path: Path) -> Path | None:
    """The My Drive folder of the Drive mount that holds ``path`` (``/content/drive/MyDrive``), or None when
    ``path`` is not on Google Drive's mount (or is in a shared drive there, which has a Trash of its own)."""
    if _mounts.filesystem_of(path) != _mounts.DRIVE_FSTYPE:
        return None
    real = Path(os.path.realpath(path))
    for mountpoint in _mounts.drive_mounts():
        for name in ("MyDrive", "My Drive"):   # "My Drive" on older mounts
            root = Path(mountpoint) / name
            if root in real.parents:
                return root
    return None


def _tree_size(path: Path) -> int:
    """Bytes of the files below ``path``; what cannot be read counts 0 (a size only informs a message)."""
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass   # gone meanwhile: not ours to count
    return total


class DriveMountFolder(CheckpointFolder):
    """A CheckpointFolder below My Drive on Drive's mount whose deletes do not stay in Drive's Trash (see the
    module docstring). ``warn(message)`` says the one message of a run that cannot empty Trash itself."""

    def __init__(self, path: Path, my_drive: Path, *, warn):
        super().__init__(path)
        self.relative = Path(os.path.realpath(path)).relative_to(my_drive).as_posix()   # its path in My Drive
        self._warn = warn
        self._pending: dict[str, int] = {}   # names deleted here, still in Drive's Trash as far as we know -> bytes
        self.trashed_bytes = 0               # what this run's deletes put in Trash and did not delete for good
        self._said = False
        self._lock = threading.Lock()        # the uploader prunes while a release may remove the lease

    def prune(self, keep: int, *, on_delete=lambda name: None, **kwargs) -> list[str]:
        def noting(name):
            self._note(name, _tree_size(self.path / name))
            on_delete(name)
        deleted = super().prune(keep, on_delete=noting, **kwargs)
        self._settle()
        return deleted

    def remove_lease(self) -> None:
        try:
            self._note(LEASE_NAME, os.lstat(self.path / LEASE_NAME).st_size)
        except OSError:
            pass   # none, or the mount fails: the unlink below says which
        super().remove_lease()
        self._settle(say=False)   # a lease of a few hundred bytes is not worth a warning at every close

    def remove_all(self) -> None:
        for path in self._candidates():
            self._note(path.name, _tree_size(path))
        super().remove_all()
        self._settle()

    def _note(self, name: str, nbytes: int) -> None:
        with self._lock:
            self._pending[name] = self._pending.get(name, 0) + nbytes
            self.trashed_bytes += nbytes

    def _settle(self, *, say: bool = True) -> None:
        """Delete for good, through the API, what is pending and has reached Drive's Trash; when not signed in,
        say it once (``say``). Housekeeping: a failure leaves the items pending for the next round."""
        with self._lock:
            self._settle_locked(say)

    def _settle_locked(self, say: bool) -> None:
        if not self._pending:
            return
        client = _signed_in_client()
        if client is None:
            if say:
                self._say_once()
            return
        try:
            for name in _empty_ours(client, self.relative, set(self._pending)):
                self.trashed_bytes -= self._pending.pop(name)
        except Exception as exc:  # noqa: BLE001 - housekeeping: never fail a save or a release; next round retries
            log.debug("colabkit: deleting old checkpoints from Drive's Trash failed this round: %s", exc)

    def _say_once(self) -> None:
        if self._said:
            return
        self._said = True
        self._warn(f"retention deleted old checkpoints ({format_size(self.trashed_bytes)} so far) from {self.path}, "
                   f"on Google Drive's mount, where deleted files go to Drive's Trash and count against your "
                   f"storage for 30 days. Empty it at {TRASH_URL} (Empty trash), or sign in to Drive's API with "
                   f"`colabkit drive login` so that colabkit deletes its own old checkpoints from Trash for good, "
                   f"or save to \"gdrive://{self.relative}\", where retention deletes for good.")


def _signed_in_client():
    """colabkit's Drive API client when the user has signed in (a credentials file exists), else None."""
    from .. import gdrive as _gdrive
    from ..gdrive.auth import credentials_path
    if not credentials_path().exists():
        return None
    try:
        return _gdrive.connect()
    except Exception as exc:  # noqa: BLE001 - a sign-in that no longer works, pydrive2 missing: say it instead
        log.debug("colabkit: Drive API sign-in unusable for emptying Trash: %s", exc)
        return None


def _empty_ours(client, relative: str, names: set[str]) -> list[str]:
    """Delete for good the trashed items named ``names`` directly in My Drive's folder ``relative`` (a folder
    goes with everything below it). Returns the names done; those not in Trash yet (the mount uploads late)
    are left for a later round."""
    folder = client.folder(relative, create=False)
    if folder is None:
        return []
    done = []
    for item in client.trashed_children(folder):
        if item.get("title") in names:
            client.delete(item["id"])
            done.append(item["title"])
    return sorted(set(done))
