"""Google Drive shared links ("Anyone with the link"): parse them, download with gdown, unpack archives safely.

Downloads go to a temporary folder beside the destination and are moved into place only when complete: a
failure leaves nothing at the destination. Archive members may not escape the folder they are extracted into.
gdown is imported on first use.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import tarfile
import tempfile
import urllib.parse
import zipfile
from pathlib import Path, PurePosixPath

from ..optional import require

_HOSTS = ("drive.google.com", "docs.google.com", "drive.usercontent.google.com")
_ID = r"[-\w]{10,}"
_FOLDER_PATHS = (rf"^/drive/(?:u/\d+/)?folders/({_ID})/?$", r"^/embeddedfolderview$")
_FILE_PATHS = (rf"^/file/(?:u/\d+/)?d/({_ID})(?:/(?:view|edit|preview))?/?$", r"^/(?:uc|open|download)$")
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
TIMEOUT_S = 60.0   # a share-link request whose server stays silent this long fails (gdown's timeout)
RETRIES = 3        # and is tried again this many times (gdown's retries: timeouts and dropped connections)
_BINARY = getattr(os, "O_BINARY", 0)   # Windows opens descriptors in text mode without it
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)   # a link at the name fails the open (ELOOP) instead of being followed


class LinkError(OSError):
    """A shared link is malformed, points nowhere, or does not hold what was asked for."""


def parse_link(url) -> tuple[str, str]:
    """("folder" | "file", id) of a Google Drive share link; raises ValueError naming what is wrong."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"{url!r} is not a link; pass a Google Drive share link such as "
                         f"https://drive.google.com/drive/folders/<id> or https://drive.google.com/file/d/<id>/view.")
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not a URL; expected a Google Drive share link "
                         f"(https://drive.google.com/...).")
    if parts.hostname not in _HOSTS:
        raise ValueError(f"{url!r} is not a Google Drive link (host {parts.hostname}); expected "
                         f"https://drive.google.com/drive/folders/<id> or https://drive.google.com/file/d/<id>/view.")
    query = urllib.parse.parse_qs(parts.query)
    for kind, patterns in (("folder", _FOLDER_PATHS), ("file", _FILE_PATHS)):
        for pattern in patterns:
            m = re.match(pattern, parts.path)
            if m:
                found = m.group(1) if m.groups() else (query.get("id") or [""])[0]
                if re.fullmatch(_ID, found or ""):
                    return kind, found
                raise ValueError(f"The link {url!r} has no file or folder id; copy the whole link from Drive's "
                                 f"Share dialog (\"Anyone with the link\").")
    raise ValueError(f"The link {url!r} has no file or folder id; copy the whole link from Drive's Share dialog "
                     f"(it looks like https://drive.google.com/drive/folders/<id>).")


def is_link(text) -> bool:
    return isinstance(text, str) and text.strip().lower().startswith(("http://", "https://"))


def download_shared(kind: str, file_id: str, into: Path, *, quiet: bool) -> Path:
    """Download the shared ``kind`` ("folder" or "file", as parse_link says) into the empty folder ``into``;
    returns the file or folder written there. Raises LinkError."""
    gdown = require("gdown", "drive", "Downloading Google Drive shared links")
    from gdown.exceptions import FileURLRetrievalError
    try:
        from gdown.exceptions import DownloadError
    except ImportError:  # older gdown
        DownloadError = FileURLRetrievalError
    what = f"shared {kind} {file_id}"
    import inspect
    accepted = inspect.signature(gdown.download).parameters
    extra = {k: v for k, v in (("timeout", TIMEOUT_S), ("retries", RETRIES)) if k in accepted}
    try:
        if kind == "folder":
            target = into / "folder"
            files = gdown.download_folder(id=file_id, output=str(target), quiet=quiet, **extra)
            if files is None:
                raise LinkError(f"Google Drive would not list the {what}")
            return target
        out = gdown.download(id=file_id, output=str(into) + os.sep, quiet=quiet, **extra)
        if not out:
            raise LinkError(f"Google Drive returned nothing for the {what}")
        return Path(out)
    except (FileURLRetrievalError, DownloadError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "too many users" in str(exc).lower():     # Google's download quota for a popular shared file
            raise LinkError(f"Google Drive is refusing the {what} for now: too many users have viewed or downloaded "
                            f"it recently (Google's download quota for shared files). Try again later (often "
                            f"within 24 hours), or make a copy in your own Drive and use that.") from None
        raise LinkError(f"Cannot download the {what}: it does not exist, or it is not shared as \"Anyone with "
                        f"the link\" ({first}).") from None
    except OSError as exc:
        if isinstance(exc, LinkError):
            raise
        raise LinkError(f"Cannot download the {what} ({type(exc).__name__}: {exc}).") from None
    except Exception as exc:  # noqa: BLE001 - requests' errors and gdown's parse errors
        raise LinkError(f"Cannot download the {what} ({type(exc).__name__}: {exc}).") from None


def fetch(url: str, dest, *, quiet: bool = False) -> Path:
    """Download a shared file or folder into the folder ``dest`` (created); returns the downloaded path.

    A file lands as ``dest/<its name>``; a folder's contents land in ``dest`` (which must be empty or absent).
    gdown shows a progress bar per file unless ``quiet``. Nothing is left at ``dest`` on failure.
    """
    kind, file_id = parse_link(url)
    dest = Path(os.path.expanduser(str(dest))).absolute()
    if kind == "folder" and dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"{dest} exists and is not an empty folder; pass a new folder for the shared folder.")
    if dest.exists() and not dest.is_dir():
        raise FileExistsError(f"{dest} is a file; pass a folder to download into.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.fetch-", dir=dest.parent))
    try:
        got = download_shared(kind, file_id, tmp, quiet=quiet)
        if kind == "folder":
            if dest.exists():
                dest.rmdir()
            os.replace(got, dest)
            return dest
        dest.mkdir(exist_ok=True)
        final = dest / got.name
        if final.exists():
            raise FileExistsError(f"{final} exists already; remove it or pass another folder.")
        os.replace(got, final)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- archives -------------------------------------------------------------------------------------------
def is_archive(name) -> bool:
    return str(name).lower().endswith(ARCHIVE_SUFFIXES)


def unpacked_size(archive: Path) -> int:
    """Bytes a .zip/.tar archive unpacks to, from the sizes its headers declare (reading a member never yields
    more than its header says); ValueError for an archive that cannot be read."""
    try:
        if archive.name.lower().endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                return sum(i.file_size for i in zf.infolist())
        with tarfile.open(archive) as tf:
            return sum(m.size for m in tf.getmembers() if m.isfile())
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as exc:
        raise ValueError(f"{archive.name} is not a readable archive ({exc}).") from None


def _check_room(archive: Path, into: Path) -> None:
    """Refuse an archive whose members would not fit on the disk of ``into`` (a zip bomb, or just too big)."""
    try:
        need = unpacked_size(archive)
    except ValueError as exc:
        raise LinkError(str(exc)) from None
    free = shutil.disk_usage(into).free
    if need > free:
        from ..units import format_size
        raise LinkError(f"{archive.name} would unpack to {format_size(need)}, and only {format_size(free)} is free at "
                        f"{into}; refusing to extract it.")


def new_file(path, mode: int = 0o666) -> int:
    """A descriptor open for writing on a new, empty file at ``path``. Whatever was at that name (a part file
    of an interrupted run, a symbolic link someone planted) is removed first, and the file is created with
    O_EXCL|O_NOFOLLOW: it is never written through a link."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY, mode)


def extract_archive(archive: Path, into: Path) -> None:
    """Extract a .zip/.tar/.tar.gz into ``into``: regular files and folders only, no member outside it, each
    file created anew (never written through a link at its name)."""
    into.mkdir(parents=True, exist_ok=True)
    root = into.resolve()
    _check_room(archive, into)

    def safe(name: str) -> Path:
        rel = PurePosixPath(name.replace("\\", "/"))
        target = (root / rel).resolve()
        if rel.is_absolute() or ".." in rel.parts or root not in (target, *target.parents):
            raise LinkError(f"{archive.name} holds {name!r}, which points outside the folder; refusing it.")
        return target

    try:
        if archive.name.lower().endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                for info in zf.infolist():
                    target = safe(info.filename)
                    if (info.external_attr >> 16) & 0o170000 == 0o120000:
                        raise LinkError(f"{archive.name} holds a symbolic link ({info.filename}); refusing it.")
                    if info.is_dir():
                        target.mkdir(parents=True, exist_ok=True)
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(info) as src, os.fdopen(new_file(target), "wb") as out:
                        shutil.copyfileobj(src, out, 4 << 20)
        else:
            with tarfile.open(archive) as tf:
                for member in tf:
                    target = safe(member.name)
                    if member.isdir():
                        target.mkdir(parents=True, exist_ok=True)
                    elif member.isfile():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        with tf.extractfile(member) as src, os.fdopen(new_file(target), "wb") as out:
                            shutil.copyfileobj(src, out, 4 << 20)
                    else:
                        raise LinkError(f"{archive.name} holds {member.name!r}, which is not a regular file or "
                                        f"folder (a link or device); refusing it.")
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as exc:
        raise LinkError(f"{archive.name} is not a readable archive ({exc}).") from None
