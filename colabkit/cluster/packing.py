"""A job's folder as bytes to send to the machine that runs it, and back into a folder there.

Sent through Ray's object store (put once per folder, fetched by each machine that runs a job from it).
What git ignores in the folder stays home, as with Ray's own working_dir. Large folders (datasets, earlier
checkpoints) do not belong in every job's luggage: above max_bytes() the run stops before it starts and says to
put the folder on shared storage (``--shared``). What a job writes into its copy comes back (pack_changes).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import subprocess
import tempfile
import zipfile
from pathlib import Path

from ..jobs import JobError
from ..units import format_size

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
MAX_VAR = "COLABKIT_CLUSTER_MAX_UPLOAD"


def max_bytes() -> int:
    """The most a job folder may weigh: $COLABKIT_CLUSTER_MAX_UPLOAD (bytes) or 256 MiB."""
    raw = os.environ.get(MAX_VAR, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    if not raw.isdigit():
        raise JobError(f"{MAX_VAR}={raw!r}: expected a number of bytes (e.g. {DEFAULT_MAX_BYTES} for 256 MiB).")
    return int(raw)


@dataclasses.dataclass
class Packed:
    data: bytes
    files: int
    nbytes: int      # before compression

    def describe(self) -> str:
        return f"{self.files} file(s), {format_size(self.nbytes)}"


def _excluded(rel: str, excludes: list) -> bool:
    parts = rel.split("/")
    for pattern in excludes:
        pattern = pattern.rstrip("/")
        if "/" in pattern:
            if rel == pattern or rel.startswith(pattern + "/"):
                return True
        elif pattern in parts:
            return True
    return False


def _git_ignored(folder: Path, rels: list) -> set:
    """The paths of ``rels`` that git ignores: the .gitignore files in and above ``folder`` (with the repository's
    own excludes when it is in a git work tree; a folder outside one is read as a work tree of its own), as Ray's
    own working_dir upload does. Empty when git is not installed."""
    if not rels:
        return set()

    def check(*git_args):
        return subprocess.run(["git", *git_args, "check-ignore", "-z", "--stdin"], input="\0".join(rels).encode(),
                              capture_output=True, timeout=60, check=False, cwd=folder)
    try:
        done = check()
        if done.returncode not in (0, 1):   # 128: not in a work tree
            with tempfile.TemporaryDirectory(prefix="colabkit-git-") as empty:
                subprocess.run(["git", "init", "-q", empty], capture_output=True, timeout=60, check=True)
                done = check(f"--git-dir={empty}/.git", f"--work-tree={folder}")
    except (OSError, subprocess.SubprocessError):
        return set()
    if done.returncode not in (0, 1):
        return set()
    return {p for p in done.stdout.decode("utf-8", "replace").split("\0") if p}


def _files(folder: Path, excludes: list) -> list:
    files = []
    for root, dirs, names in os.walk(folder):
        rel_root = Path(root).relative_to(folder).as_posix()
        rel_root = "" if rel_root == "." else rel_root + "/"
        dirs[:] = [d for d in dirs if not _excluded(rel_root + d, excludes)]
        for name in names:
            rel = rel_root + name
            path = Path(root) / name
            if not _excluded(rel, excludes) and path.is_file():
                files.append((rel, path))
    ignored = _git_ignored(folder, [rel for rel, _ in files])
    return [(rel, path) for rel, path in files if rel not in ignored]


def _zip(files: list) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for rel, path in files:
            info = zipfile.ZipInfo.from_file(path, rel)
            with open(path, "rb") as fh:
                zf.writestr(info, fh.read(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=1)
    return buffer.getvalue()


def pack(folder: Path, excludes: list, limit: int | None = None) -> Packed:
    """A zip of ``folder`` without the excluded names (a name, or a path relative to the folder) and without
    what git ignores there (.env files, keys, data listed in .gitignore stay home)."""
    limit = max_bytes() if limit is None else limit
    files, total = _files(folder, excludes), 0
    for _, path in files:
        total += path.stat().st_size
        if total > limit:
            raise JobError(f"{folder}: more than {format_size(limit)} to send with each job (the job's "
                           f"folder is copied to the machine that runs it). Put the data on storage every "
                           f"machine sees and pass --shared, list it in .gitignore, or move the job into a "
                           f"folder of its own.")
    return Packed(_zip(files), len(files), total)


def pack_folder(folder: Path, excludes: list, max_bytes: int | None = None) -> bytes:
    """pack(...)'s zip alone."""
    return pack(folder, excludes, max_bytes).data


def snapshot(folder: Path) -> dict:
    """{relative path: (size, mtime_ns)} of every file under folder."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root) / name
            with contextlib.suppress(OSError):
                st = path.stat()
                out[path.relative_to(folder).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def pack_changes(folder: Path, before: dict, limit: int) -> tuple:
    """(zip of the files under folder that are new or changed since ``before``, how many, their bytes, and the
    paths left out because they would pass ``limit``)."""
    files, left_out, total = [], [], 0
    for rel, stat in sorted(snapshot(folder).items()):
        if before.get(rel) == stat or _excluded(rel, ["__pycache__/", ".ipynb_checkpoints/"]):
            continue
        if total + stat[0] > limit:
            left_out.append(rel)
            continue
        total += stat[0]
        files.append((rel, folder / rel))
    return (_zip(files) if files else None), len(files), total, left_out


def unpack_folder(data: bytes, target: Path) -> None:
    """Unpack a pack_folder() zip into target, keeping file modes (an executable job stays executable)."""
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            dest = (target / info.filename).resolve()
            if target.resolve() not in dest.parents:
                raise ValueError(f"refusing to unpack {info.filename!r} outside {target}")
            zf.extract(info, target)
            mode = info.external_attr >> 16
            if mode:
                os.chmod(dest, mode & 0o777)
