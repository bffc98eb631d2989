"""A job's folder as bytes to send to the machine that runs it, and back into a folder there.

Sent through Ray's object store (put once per folder, fetched by each machine that runs a job from it).
Large folders (datasets, earlier checkpoints) do not belong in every job's luggage: above ``MAX_BYTES`` the
run stops before it starts and says to put the folder on shared storage (``--shared``).
"""
from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

from ..jobs import JobError
from ..units import format_size

MAX_BYTES = int(os.environ.get("COLABKIT_CLUSTER_MAX_UPLOAD", str(256 * 1024 * 1024)))


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


def pack_folder(folder: Path, excludes: list, max_bytes: int = MAX_BYTES) -> bytes:
    """A zip of ``folder`` without the excluded names (a name, or a path relative to the folder)."""
    files, total = [], 0
    for root, dirs, names in os.walk(folder):
        rel_root = Path(root).relative_to(folder).as_posix()
        rel_root = "" if rel_root == "." else rel_root + "/"
        dirs[:] = [d for d in dirs if not _excluded(rel_root + d, excludes)]
        for name in names:
            rel = rel_root + name
            path = Path(root) / name
            if _excluded(rel, excludes) or not path.is_file():
                continue
            total += path.stat().st_size
            if total > max_bytes:
                raise JobError(f"{folder}: more than {format_size(max_bytes)} to send with each job (the job's "
                               f"folder is copied to the machine that runs it). Put the data on storage every "
                               f"machine sees and pass --shared, or move the job into a folder of its own.")
            files.append((rel, path))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for rel, path in files:
            info = zipfile.ZipInfo.from_file(path, rel)
            with open(path, "rb") as fh:
                zf.writestr(info, fh.read(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=1)
    return buffer.getvalue()


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
