"""Location strings ("drive:runs/mnist", "/abs/path", "rel/path", "gdrive://runs/mnist") -> where they live.

A filesystem location resolves to a Path. A location on a back end that is not a filesystem ("gdrive://")
resolves to a RemoteLocation (scheme and path, checked for syntax here); the checkpoint store turns it into
its back end (checkpoints/destinations.py). This module imports nothing above it.
"""
from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from . import config as _config
from . import mounts
from .runtime import detect_kind

COLAB_MOUNTPOINT = Path("/content/drive")
LOCAL_DRIVE_DEFAULT = Path("~/colabkit-drive")


def mounted_colab_drive() -> Path | None:
    """My Drive where this Colab VM has it mounted, without mounting: /content/drive/MyDrive, or a Drive the
    notebook mounted elsewhere (older notebooks use /content/gdrive); None when it is not mounted."""
    found = mounts.drive_mounts()
    # /content/drive first; a plain folder there (made before any mount) must not win over a real mount
    candidates = sorted(found, key=lambda m: m != str(COLAB_MOUNTPOINT)) if found else [str(COLAB_MOUNTPOINT)]
    for mountpoint in candidates:
        for name in ("MyDrive", "My Drive"):   # "My Drive" on older mounts
            if (Path(mountpoint) / name).is_dir():
                return Path(mountpoint) / name
    return None


def colab_drive_root() -> Path:
    """My Drive on Colab, mounting Google Drive at /content/drive first if it is not mounted anywhere yet."""
    mounted = mounted_colab_drive()
    if mounted is not None:
        return mounted
    try:
        from google.colab import drive
    except ImportError as exc:  # google.colab is not on PyPI: no extra can provide it
        raise ImportError(
            f"Google Drive is not mounted at {COLAB_MOUNTPOINT} and google.colab cannot be imported here "
            f"({exc}), so colabkit cannot mount it. In a Colab notebook run "
            f"`from google.colab import drive; drive.mount({str(COLAB_MOUNTPOINT)!r})`, or set drive_root "
            f"(COLABKIT_DRIVE_ROOT) to a folder.") from exc
    drive.mount(str(COLAB_MOUNTPOINT))
    return COLAB_MOUNTPOINT / "MyDrive"


def drive_root(settings: _config.Settings | None = None, *, mount: bool = True) -> Path | None:
    """The folder that "drive:" paths are relative to. ``mount=False``: None on Colab while Drive is not
    mounted, instead of mounting it."""
    settings = settings or _config.load()
    if settings.drive_root != _config.AUTO:
        return Path(settings.drive_root)
    if detect_kind() == "colab":
        return colab_drive_root() if mount else mounted_colab_drive()
    return Path(os.path.expanduser(str(LOCAL_DRIVE_DEFAULT)))


def _resolve_drive(rest: str):
    folder = rest.lstrip("/")
    # "." and ".." would name the Drive root itself or a folder outside it, which a run then fills, prunes and
    # (with delete_checkpoint) empties; a backslash separates folders where Windows reads the path
    if not folder or any(part in (".", "..") for part in re.split(r"[/\\]", folder)):
        raise ValueError(f'The location "drive:{rest}" names no folder below the Drive root; write the path of '
                         f'a folder of its own below it, without "." or "..", e.g. "drive:runs/mnist".')
    if _config.load().drive_via == "api":  # no mount here: "drive:x" means gdrive://x
        return _resolve_gdrive(folder)
    root = drive_root()
    path = root / folder
    if root not in path.parents:   # a drive letter ("drive:C:x") starts a path of its own on Windows
        raise ValueError(f'The location "drive:{rest}" names no folder below the Drive root {root}; write the '
                         f'path of a folder below it, e.g. "drive:runs/mnist".')
    return path


@dataclasses.dataclass(frozen=True)
class RemoteLocation:
    """A location on a back end that is not a filesystem: its ``scheme`` ("gdrive://") and the ``path`` after it."""
    scheme: str
    path: str

    def __str__(self):
        return f"{self.scheme}{self.path}"


def _resolve_gdrive(rest: str) -> RemoteLocation:
    """``gdrive://runs/mnist`` is My Drive/runs/mnist; ``gdrive://shared:<drive name>/runs/mnist`` a path in a
    shared drive; ``gdrive://<folder id>/runs/mnist`` (or ``id:<folder id>``) a path below a folder given by its
    id (see colabkit.gdrive.DriveClient.locate). Only the syntax is checked here: nothing connects to Drive."""
    folder = rest.strip().strip("/")
    if not folder or any(part in (".", "..") for part in folder.split("/")) or folder in ("shared:", "id:"):
        raise ValueError(f'"gdrive://{rest}" names no usable folder; write it as "gdrive://<folder path>", '
                         f'e.g. "gdrive://runs/mnist" (a path below My Drive), "gdrive://shared:<shared drive '
                         f'name>/runs/mnist" or "gdrive://<folder id>/runs/mnist".')
    return RemoteLocation("gdrive://", folder)


SCHEMES = {"drive:": _resolve_drive, "gdrive://": _resolve_gdrive}


def resolve(location) -> Path | RemoteLocation:
    """Where ``location`` lives: a filesystem folder (Path), or a RemoteLocation for back ends that are not
    filesystems ("gdrive://", and "drive:" with drive_via = "api"). Raises TypeError for a location that is not
    a str or path, ValueError for an empty or unsupported one, or one that is the Drive root itself."""
    if isinstance(location, os.PathLike):
        location = os.fspath(location)
    if not isinstance(location, str):
        raise TypeError(f"The location {location!r} is a {type(location).__name__}; a location must be a str or "
                        f"a path (pathlib.Path), such as \"drive:runs/mnist\" or \"checkpoints/mnist\".")
    if not location.strip():
        raise ValueError(f"The location {location!r} is empty; pass a folder such as \"drive:runs/mnist\" "
                         f"or a local path such as \"checkpoints/mnist\".")
    for prefix, handler in SCHEMES.items():
        if location.startswith(prefix):
            return handler(location[len(prefix):])
    if "://" in location:
        raise ValueError(f"The location {location!r} has an unknown scheme; use \"drive:<folder>\" or a local path.")
    path = Path(os.path.expanduser(location)).absolute()
    root = drive_root(mount=False)
    if root is not None and os.path.normpath(path) == os.path.normpath(root.absolute()):
        raise ValueError(f"The location {location!r} is the Drive root {root} itself; checkpoints need a folder "
                         f"of their own below it, such as \"drive:runs/mnist\".")
    return path
