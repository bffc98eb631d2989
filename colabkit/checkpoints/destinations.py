"""Where the store keeps checkpoints: the Destination protocol and the scheme -> back-end table (as papermill's
I/O handlers by URL scheme).

A location string resolves (colabkit.locations) to a filesystem folder, which the store reads and writes as a
CheckpointFolder, or to a RemoteLocation, which BACK_ENDS turns into the back end for its scheme. A back end's
dependencies (pydrive2 for ``gdrive://``) load only when a location of its scheme is used.
"""
from __future__ import annotations

from pathlib import Path, PurePath
from typing import Protocol, runtime_checkable
from collections.abc import Callable

from ..locations import RemoteLocation, resolve
from .folder import CheckpointFolder, CheckpointInfo, Listing


@runtime_checkable
class Destination(Protocol):
    """A place the store uploads committed checkpoints to and restores them from: a CheckpointFolder (a
    filesystem folder, read for the meanings of each method), or a back end that is not a filesystem
    (DriveApiFolder). Methods raise OSError when the destination cannot be reached; the store retries later."""

    @property
    def path(self) -> PurePath:
        """Where it is, for messages and as the parent of its checkpoints' CheckpointInfo.path (for a back end
        that is not a filesystem, never equal to a local path)."""

    def scan(self, *, confirm: bool = False) -> Listing:
        """One look: committed (oldest first), incomplete, unreadable and invalid checkpoints. ``confirm`` (for
        restores): look again where a listing may lag behind writes."""

    def committed(self) -> list[CheckpointInfo]:
        """Committed checkpoints, oldest first; OSError when one that might be committed cannot be read."""

    def copy_in(self, source: CheckpointInfo) -> CheckpointInfo:
        """Copy a committed local checkpoint here under its name: data files first, the manifest last. A copy
        already committed by an earlier try (its answer lost) is kept."""

    def download(self, info: CheckpointInfo, into: CheckpointFolder) -> CheckpointInfo:
        """Copy one of these checkpoints into the local folder ``into``, checking hashes on the way."""

    def verify(self, info: CheckpointInfo, *, full: bool = True) -> None:
        """Check each file's size (and, with ``full``, hash) against the manifest; CorruptCheckpoint if not."""

    def prune(self, keep: int, *, keep_every: float | None = None, protect=lambda name: False,
              abandoned=lambda name: False, on_delete=lambda name: None) -> list[str]:
        """Retention: delete committed checkpoints beyond ``keep`` (plus one per ``keep_every``) and known
        leftovers, the manifest first; nothing when a manifest cannot be read. Returns the deleted names."""

    def read_lease(self) -> bytes | None:
        """The writer's lease record (lease.py), or None when there is none."""

    def write_lease(self, data: bytes) -> None:
        """Replace the writer's lease record."""

    def remove_lease(self) -> None:
        """Remove the writer's lease record (none is fine)."""

    def remove_all(self) -> None:
        """Delete every checkpoint here, then the folder itself if nothing else is in it."""


def _drive_api(path: str) -> Destination:
    from .drive_api import DriveApiFolder   # imports the Drive client (pydrive2 loads when it connects)
    return DriveApiFolder(path)


# a RemoteLocation's scheme -> the back end for its path
BACK_ENDS: dict[str, Callable[[str], Destination]] = {
    "gdrive://": _drive_api,
}


def resolve_destination(location) -> Path | Destination:
    """Where the store keeps the checkpoints of ``location``: a filesystem folder (Path), or the back end for a
    location on one that is not a filesystem. Raises as colabkit.locations.resolve does for a bad location."""
    where = resolve(location)
    if not isinstance(where, RemoteLocation):
        return where
    try:
        back_end = BACK_ENDS[where.scheme]
    except KeyError:
        raise ValueError(f"The location {location!r} ({where}) has no checkpoint back end; use \"drive:<folder>\", "
                         f"\"gdrive://<folder>\" or a local path.") from None
    return back_end(where.path)
