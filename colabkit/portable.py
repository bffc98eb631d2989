"""Portable stand-ins for Colab-only calls: one notebook that runs on Colab and on a home rig.

``colabkit migrate`` rewrites Colab notebooks to call these; they are plain functions and work in any script::

    import colabkit
    colabkit.mount_drive()                      # Colab: google.colab.drive.mount; elsewhere: the drive_root folder
    df = pd.read_csv(colabkit.drive("data/train.csv"))   # a file in "My Drive", wherever that is here
    token = colabkit.secret("HF_TOKEN")         # Colab: notebook secrets; elsewhere: the environment variable
    if colabkit.on_colab():                     # code that only makes sense on Colab
        from google.colab import output

Every function takes the Colab branch when it runs on Colab (detected without importing google.colab) and calls
the real ``google.colab`` function with the same arguments. Elsewhere it does the nearest honest thing, or raises
an error that says what to do on this machine; nothing is silently skipped.

Settings and variables used off Colab:

- ``drive_root`` (config file or ``COLABKIT_DRIVE_ROOT``): the folder that stands for "My Drive"
  (Google Drive for desktop, an rclone mount, any folder); default ``~/colabkit-drive``.
- ``COLABKIT_WORKDIR``: the folder that stands for Colab's ``/content``; default: the current directory the first
  time it is asked for (in Jupyter: the notebook's folder).
- ``COLABKIT_UPLOADS``: the folder ``upload()`` takes "uploaded" files from; default ``<workdir>/uploads``.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from . import config as _config
from . import locations as _locations
from .runtime import detect_kind

__all__ = ["on_colab", "drive", "drive_mounted", "workdir", "portable_path", "mount_drive", "flush_and_unmount_drive",
           "upload",
           "download", "secret", "authenticate_user", "cv2_imshow", "SecretNotFoundError", "AuthenticationError",
           "classify_colab_path", "ColabPath"]

COLAB_CONTENT = Path("/content")  # Colab's working directory (module attribute so tests can point it elsewhere)
_MY_DRIVE = "MyDrive"

# Colab path spellings, most specific first. kind: "drive" (inside My Drive), "mountpoint" (the Drive mount point
# or a folder beside My Drive: Shared drives, shortcuts), "content" (Colab's /content working area).
# spelling: "current" (what Colab writes today), "old" (older mount points and the "My Drive" folder name),
# "relative" (relative to /content, Colab's default working directory), "escaped" ("My\\ Drive" with a shell escape).
COLAB_PATH_PREFIXES = (
    ("/content/drive/MyDrive", "drive", "current"),
    ("/content/drive/My Drive", "drive", "old"),
    ("/content/gdrive/MyDrive", "drive", "old"),
    ("/content/gdrive/My Drive", "drive", "old"),
    ("/gdrive/MyDrive", "drive", "old"),
    ("/gdrive/My Drive", "drive", "old"),
    ("drive/MyDrive", "drive", "relative"),
    ("drive/My Drive", "drive", "relative"),
    ("gdrive/MyDrive", "drive", "relative"),
    ("gdrive/My Drive", "drive", "relative"),
    # "My\ Drive": a shell-escaped space copied into a Python string (works in a shell line only)
    ("/content/drive/My\\ Drive", "drive", "escaped"),
    ("/content/gdrive/My\\ Drive", "drive", "escaped"),
    ("/gdrive/My\\ Drive", "drive", "escaped"),
    ("drive/My\\ Drive", "drive", "escaped"),
    ("/content/drive", "mountpoint", "current"),
    ("/content/gdrive", "mountpoint", "old"),
    ("/gdrive", "mountpoint", "old"),
    ("/content", "content", "current"),
)


@dataclasses.dataclass(frozen=True)
class ColabPath:
    """A path string recognised as Colab-specific: ``prefix`` + ("/" + ``rest``)."""
    kind: str            # "drive", "mountpoint" or "content"
    spelling: str        # "current", "old", "relative" or "escaped"
    prefix: str          # the matched prefix, e.g. "/content/drive/My Drive"
    rest: str            # the part below the prefix, without a leading "/" ("" for the prefix itself)
    trailing_slash: bool  # the original ended with "/" right after the prefix (rest == "")


def classify_colab_path(path: str) -> ColabPath | None:
    """Recognise a Colab path ("/content/drive/MyDrive/x", "/content/x", ...); None for any other path."""
    if not isinstance(path, str):
        return None
    relative_only = path.startswith("./")
    candidate = path[2:] if relative_only else path
    for prefix, kind, spelling in COLAB_PATH_PREFIXES:
        if relative_only and spelling != "relative":
            continue
        if candidate.startswith(prefix) and (len(candidate) == len(prefix) or candidate[len(prefix)] == "/"):
            below = candidate[len(prefix):]
            rest = below.lstrip("/")
            return ColabPath(kind=kind, spelling=spelling, prefix=prefix, rest=rest,
                             trailing_slash=bool(below) and not rest)
    return None


# --- where we run ---------------------------------------------------------------------------------------------

def on_colab() -> bool:
    """True on Google Colab (not Kaggle, which shares Colab's image). Never imports google.colab."""
    return detect_kind() == "colab"


def _shell_quote(path: str) -> str:
    return subprocess.list2cmdline([path]) if os.name == "nt" else shlex.quote(path)


def _join(root: str, path) -> str:
    if path is None:
        return root
    path = os.fspath(path)
    if not isinstance(path, str):
        raise TypeError(f"Expected a path string, got {path!r}.")
    return os.path.join(root, path.lstrip("/\\")) if path else root


# --- Google Drive ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _State:
    mountpoint: str | None = None   # where mount_drive() mounted Drive on Colab
    workdir: str | None = None      # the off-Colab working area, fixed on first use


_state = _State()


def _drive_root() -> str:
    settings = _config.load()
    if settings.drive_root == _config.AUTO and on_colab() and _state.mountpoint:
        my_drive = os.path.join(_state.mountpoint, _MY_DRIVE)
        if os.path.isdir(my_drive):
            return my_drive
    return str(_locations.drive_root(settings))


def drive(path=None, *, quoted: bool = False) -> str:
    """The path of ``path`` inside "My Drive": ``/content/drive/MyDrive/<path>`` on Colab (mounting Drive on first
    use), ``<drive_root>/<path>`` elsewhere. ``drive()`` is the root itself. A trailing "/" is kept.

    quoted=True returns the path quoted for a shell command line (``!cp {colabkit.drive("a b", quoted=True)} .``).
    Nothing is created or checked: reading a missing file fails where it is read, naming the full path.
    """
    full = _join(_drive_root(), path)
    return _shell_quote(full) if quoted else full


def drive_mounted() -> bool:
    """Whether "My Drive" is there, without mounting it (so without Colab's consent dialog): on Colab, whether
    Drive is mounted; elsewhere, whether the drive_root folder exists. The portable form of a notebook's
    ``os.path.exists('/content/drive')`` before ``drive.mount(...)``."""
    settings = _config.load()
    if settings.drive_root == _config.AUTO and on_colab():
        if _state.mountpoint and os.path.isdir(os.path.join(_state.mountpoint, _MY_DRIVE)):
            return True
        try:
            return _locations.mounted_colab_drive() is not None
        except OSError:  # a Drive mount whose FUSE process died ("Transport endpoint is not connected")
            return False
    return os.path.isdir(_locations.drive_root(settings))


def workdir(path=None, *, quoted: bool = False) -> str:
    """The path of ``path`` in the notebook's working area: ``/content/<path>`` on Colab; elsewhere under
    ``COLABKIT_WORKDIR``, or the current directory the first time this is called (in Jupyter: the notebook's
    folder), so a later ``%cd`` does not move it. ``workdir()`` is the folder itself."""
    if on_colab():
        root = str(COLAB_CONTENT)
    else:
        explicit = os.environ.get("COLABKIT_WORKDIR", "").strip()
        if explicit:
            root = os.path.abspath(os.path.expanduser(explicit))
        else:
            if _state.workdir is None:
                _state.workdir = os.getcwd()
            root = _state.workdir
    full = _join(root, path)
    return _shell_quote(full) if quoted else full


def portable_path(path) -> str:
    """Map a Colab path to this machine: "/content/drive/MyDrive/x" (and the older spellings) -> ``drive("x")``,
    "/content/x" -> ``workdir("x")``; any other path comes back unchanged. For paths known only at run time,
    e.g. a Colab form field: ``data_dir = colabkit.portable_path(data_dir)``.

    A path in quotes, as Colab form fields hold paths meant for shell lines (``"\"/content/drive/MyDrive/x.zip\""``),
    is mapped inside its quotes.

    Raises ValueError off Colab for a Drive path outside My Drive (the mount point itself, Shared drives,
    shortcuts), which has no equivalent under drive_root.
    """
    text = os.fspath(path)
    if isinstance(text, str) and len(text) > 2 and text[0] == text[-1] and text[0] in "'\"" and \
            classify_colab_path(text[1:-1]) is not None:
        return text[0] + portable_path(text[1:-1]) + text[0]
    found = classify_colab_path(text) if isinstance(text, str) else None
    if found is None:
        return text
    if found.kind == "drive":
        mapped = drive(found.rest or None)
        return mapped + "/" if found.trailing_slash else mapped
    if found.kind == "content":
        if on_colab():
            return text
        mapped = workdir(found.rest or None)
        return mapped + "/" if found.trailing_slash else mapped
    if on_colab():
        return text
    raise ValueError(
        f"{text!r} is a Google Drive path outside My Drive (the mount point, Shared drives or a shortcut); off "
        f'Colab only My Drive has an equivalent (drive_root = {_drive_root()}). Use colabkit.drive("...") for '
        f"files in My Drive, or a local path.")


def mount_drive(mountpoint=None, force_remount: bool = False, timeout_ms: int = 120000,
                readonly: bool = False) -> str:
    """Make Google Drive available and return the "My Drive" folder.

    On Colab: ``google.colab.drive.mount(mountpoint, force_remount, timeout_ms, readonly)``, mountpoint
    defaulting to /content/drive. Elsewhere nothing is mounted: "My Drive" is the drive_root folder (set it to a
    Google Drive for desktop or rclone folder to see the same files). The default ~/colabkit-drive is created if
    missing; a configured drive_root that does not exist raises FileNotFoundError (is the sync client running?).
    """
    if on_colab():
        from google.colab import drive as colab_drive
        target = str(_locations.COLAB_MOUNTPOINT) if mountpoint is None else os.fspath(mountpoint)
        colab_drive.mount(target, force_remount=force_remount, timeout_ms=timeout_ms, readonly=readonly)
        _state.mountpoint = target
        return _drive_root()
    settings = _config.load()
    root = Path(_locations.drive_root(settings))
    if not root.is_dir():
        if settings.drive_root != _config.AUTO:
            raise FileNotFoundError(
                f"drive_root {root} (from {settings.sources.get('drive_root', 'settings')}) is not a folder. Start "
                f"the program that provides it (Google Drive for desktop, rclone mount) or set drive_root to an "
                f"existing folder (config file or COLABKIT_DRIVE_ROOT).")
        root.mkdir(parents=True, exist_ok=True)
    print(f"Not on Colab: Google Drive is the folder {root} (set drive_root to change it).")
    return str(root)


def flush_and_unmount_drive(timeout_ms: int = 24 * 60 * 60 * 1000) -> None:
    """On Colab: ``google.colab.drive.flush_and_unmount`` (pushes pending writes to Drive, then unmounts).
    Elsewhere drive_root is an ordinary folder: writes are already on disk and nothing is unmounted; a sync client
    (Google Drive for desktop, rclone) uploads them on its own schedule."""
    if on_colab():
        from google.colab import drive as colab_drive
        colab_drive.flush_and_unmount(timeout_ms=timeout_ms)
        _state.mountpoint = None
        return
    print(f"Not on Colab: nothing to flush or unmount; files under {_drive_root()} are already on disk.")


# --- files, secrets, credentials --------------------------------------------------------------------------------

def _uploads_folder() -> Path:
    explicit = os.environ.get("COLABKIT_UPLOADS", "").strip()
    return Path(os.path.expanduser(explicit)) if explicit else Path(workdir("uploads"))


def upload(target_dir: str = "") -> dict:
    """Files the user provides, as ``{name: bytes}``, also saved under ``target_dir`` (default: the current
    directory), like ``google.colab.files.upload()``.

    On Colab this shows the browser's upload button. Elsewhere there is no browser to ask: the files are taken
    from the uploads folder (``COLABKIT_UPLOADS``, default ``<workdir>/uploads``); put them there once. An empty
    or missing folder raises FileNotFoundError saying so.
    """
    if on_colab():
        from google.colab import files
        return files.upload(target_dir) if target_dir else files.upload()
    folder = _uploads_folder()
    chosen = sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
    if not chosen:
        raise FileNotFoundError(
            f"colabkit.upload(): off Colab there is no upload button. Put the files this notebook asks for into "
            f"{folder} (or point COLABKIT_UPLOADS at a folder holding them) and run the cell again.")
    uploaded = {}
    for source in chosen:
        destination = Path(target_dir or ".") / source.name
        data = source.read_bytes()
        if not (destination.exists() and os.path.samefile(source, destination)):
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)
        print(f"Saving {source.name} to {destination}")
        uploaded[source.name] = data
    return uploaded


def download(filename) -> str:
    """On Colab: ``google.colab.files.download`` (the browser saves the file). Elsewhere the file is already on
    this machine: its absolute path is printed and returned. A missing file raises FileNotFoundError, as on Colab."""
    if on_colab():
        from google.colab import files
        files.download(filename)
        return os.fspath(filename)
    path = os.path.abspath(os.fspath(filename))
    if not os.path.exists(path):
        raise FileNotFoundError(f"Cannot find file: {filename}")
    print(f"Not on Colab: {filename} is already on this machine at {path}")
    return path


class SecretNotFoundError(KeyError):
    """A secret is not set: on Colab the notebook secret, elsewhere the environment variable."""

    def __str__(self):
        return str(self.args[0]) if self.args else "secret not found"


_NO_DEFAULT = object()


def secret(name: str, default=_NO_DEFAULT) -> str:
    """A secret such as an API token: ``google.colab.userdata.get(name)`` on Colab (its errors propagate: a
    missing secret, or one this notebook was not granted), the environment variable ``name`` elsewhere.
    ``default`` is returned instead of raising SecretNotFoundError when the variable is not set off Colab."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"secret({name!r}): the name of a secret is a non-empty string such as 'HF_TOKEN'.")
    if on_colab():
        from google.colab import userdata
        return userdata.get(name)
    value = os.environ.get(name)
    if value is not None:
        return value
    if default is not _NO_DEFAULT:
        return default
    raise SecretNotFoundError(
        f"Secret {name!r} not found: off Colab, colabkit.secret() reads the environment variable {name}. Set it "
        f"where Jupyter starts (export {name}=...) or in the kernel's environment, then restart the kernel.")


class AuthenticationError(RuntimeError):
    """No Google Cloud credentials are available on this machine."""


def _adc_candidates() -> list:
    found = []
    explicit = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS", "").strip()
    if explicit:
        found.append(Path(os.path.expanduser(explicit)))
    gcloud = os.environ.get("CLOUDSDK_CONFIG", "").strip()
    if gcloud:
        base = Path(os.path.expanduser(gcloud))
    elif os.name == "nt":
        base = Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming") / "gcloud"
    else:
        base = Path.home() / ".config" / "gcloud"
    found.append(base / "application_default_credentials.json")
    return found


def authenticate_user(clear_output: bool = True, project_id: str | None = None) -> str | None:
    """Google Cloud credentials for this notebook (BigQuery, Cloud Storage, gspread, ...).

    On Colab: ``google.colab.auth.authenticate_user`` (an interactive sign-in). Elsewhere client libraries use
    Application Default Credentials; this checks that they exist (``GOOGLE_APPLICATION_CREDENTIALS`` or the file
    ``gcloud auth application-default login`` writes), sets ``GOOGLE_CLOUD_PROJECT`` when ``project_id`` is
    given, and returns the credentials file. Raises AuthenticationError with the command to run when there are none.
    """
    if on_colab():
        from google.colab import auth
        if project_id is None:
            auth.authenticate_user(clear_output=clear_output)
        else:
            auth.authenticate_user(clear_output=clear_output, project_id=project_id)
        return None
    candidates = _adc_candidates()
    for candidate in candidates:
        if candidate.is_file():
            if project_id:
                os.environ["GOOGLE_CLOUD_PROJECT"] = project_id
            print(f"Not on Colab: using Google Cloud credentials from {candidate}")
            return str(candidate)
    raise AuthenticationError(
        "No Google Cloud credentials on this machine (looked for " + ", ".join(str(c) for c in candidates) + "). "
        "Run once: gcloud auth application-default login  (or set GOOGLE_APPLICATION_CREDENTIALS to a "
        "service-account key file), then run the cell again.")


# --- images -----------------------------------------------------------------------------------------------------

def _png(rgb) -> bytes:
    """Encode an HxW (gray), HxWx3 (RGB) or HxWx4 (RGBA) uint8 array as PNG with zlib only."""
    import struct
    import zlib
    import numpy as np
    height, width = rgb.shape[:2]
    color_type = 0 if rgb.ndim == 2 else {3: 2, 4: 6}[rgb.shape[2]]
    rows = np.ascontiguousarray(rgb).reshape(height, -1)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)

    def chunk(tag, data):
        body = tag + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def cv2_imshow(a) -> None:
    """Show an OpenCV image (a numpy array in BGR / BGRA order, or grayscale) in the notebook.

    On Colab: ``google.colab.patches.cv2_imshow``. Elsewhere the same conversion (clip to 0..255, BGR to RGB),
    shown as a PNG with IPython.display; needs numpy and IPython only (no OpenCV or Pillow).
    """
    if on_colab():
        from google.colab.patches import cv2_imshow as colab_imshow
        colab_imshow(a)
        return
    import numpy as np
    array = np.asarray(a)
    if array.ndim not in (2, 3) or (array.ndim == 3 and array.shape[2] not in (1, 3, 4)):
        raise ValueError(f"cv2_imshow expects an HxW, HxWx3 (BGR) or HxWx4 (BGRA) array, got shape {array.shape}.")
    array = array.clip(0, 255).astype("uint8")
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    elif array.ndim == 3:
        array = array[:, :, [2, 1, 0, 3][: array.shape[2]]]  # BGR(A) -> RGB(A)
    from .optional import require
    display = require("IPython.display", "notebook", "Showing an image in the notebook")
    display.display(display.Image(data=_png(array), format="png"))

