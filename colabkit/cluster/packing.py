"""A job's folder as bytes to send to the machine that runs it, and back into a folder there.

Sent through Ray's object store (put once per folder, fetched by each machine that runs a job from it).
What git ignores in the folder stays home, as with Ray's own working_dir. Large folders (datasets, earlier
checkpoints) do not belong in every job's luggage: above max_bytes() the run stops before it starts and says to
put the folder on shared storage (``--shared``). What a job writes into its copy comes back (pack_changes).

Symbolic links are never followed: a link that stays inside the folder travels as a link (a zip entry of the Unix
link type holding its target), one that leaves it stays home and is named in Packed.describe(). Otherwise a link
to ~/.ssh/id_ed25519 under an innocent name would ship the key, past .gitignore, which sees only the link's name.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import stat
import subprocess
import tempfile
import zipfile
from pathlib import Path

from ..jobs.spec import JobError
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
    links: int = 0
    outside: list = dataclasses.field(default_factory=list)   # [(link, its target)] that point out of the folder

    def describe(self) -> str:
        text = f"{self.files} file(s){f' and {self.links} link(s)' if self.links else ''}, {format_size(self.nbytes)}"
        if self.outside:
            named = ", ".join(f"{rel} -> {target}" for rel, target in self.outside)
            text += (f"; not sent: {len(self.outside)} link(s) that point outside the folder (never followed): "
                     f"{named}; copy what the job needs into the folder, or put it on storage every machine sees "
                     f"and pass --shared")
        return text


@dataclasses.dataclass
class _Entry:
    rel: str
    path: Path
    link: str = None     # a link inside the folder: its target, relative to the link's own folder


def _classify_link(folder_real: str, rel: str, path: Path):
    """(_Entry for a link that stays inside the folder, None) or (None, its target as written) for one that
    leaves it. Resolving the path reads no file; the target a link travels with is the resolved one, relative, so
    it means the same in the copy on the other machine (an absolute link into the folder included)."""
    resolved = os.path.realpath(path)
    if os.path.commonpath([folder_real, resolved]) != folder_real:
        return None, os.readlink(path)
    return _Entry(rel, path, link=os.path.relpath(resolved, os.path.realpath(path.parent))), None


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


def _walk(folder: Path, excludes: list) -> tuple:
    """(entries, [(link, target)] of links out of the folder) under ``folder``, without what ``excludes`` names.
    os.walk does not descend into linked folders; such links are listed among the folder's subfolders."""
    folder_real = os.path.realpath(folder)
    entries, outside = [], []
    for root, dirs, names in os.walk(folder):
        rel_root = Path(root).relative_to(folder).as_posix()
        rel_root = "" if rel_root == "." else rel_root + "/"
        dirs[:] = [d for d in dirs if not _excluded(rel_root + d, excludes)]
        for name in [d for d in dirs if os.path.islink(os.path.join(root, d))] + names:
            rel, path = rel_root + name, Path(root) / name
            if _excluded(rel, excludes):
                continue
            if path.is_symlink():
                entry, target = _classify_link(folder_real, rel, path)
                if entry is not None:
                    entries.append(entry)
                else:
                    outside.append((rel, target))
            elif path.is_file():
                entries.append(_Entry(rel, path))
    return entries, outside


def _files(folder: Path, excludes: list) -> tuple:
    """(entries, links out of the folder) to send: _walk's, less what git ignores (a link by its own name)."""
    entries, outside = _walk(folder, excludes)
    ignored = _git_ignored(folder, [e.rel for e in entries] + [rel for rel, _ in outside])
    return [e for e in entries if e.rel not in ignored], [(rel, t) for rel, t in outside if rel not in ignored]


def _read_no_follow(path: Path) -> bytes:
    """The bytes of a regular file; a file swapped for a link since the walk is refused by the OS, not followed."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _zip(entries: list) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for entry in entries:
            if entry.link is not None:
                info = zipfile.ZipInfo(entry.rel)
                info.create_system = 3   # Unix: the mode below is read from the high bits
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
                zf.writestr(info, entry.link)
                continue
            info = zipfile.ZipInfo.from_file(entry.path, entry.rel)
            zf.writestr(info, _read_no_follow(entry.path), compress_type=zipfile.ZIP_DEFLATED, compresslevel=1)
    return buffer.getvalue()


def pack(folder: Path, excludes: list, limit: int | None = None) -> Packed:
    """A zip of ``folder`` without the excluded names (a name, or a path relative to the folder) and without
    what git ignores there (.env files, keys, data listed in .gitignore stay home). Links inside the folder travel
    as links; links out of it stay home and are listed in ``outside``."""
    limit = max_bytes() if limit is None else limit
    entries, outside = _files(folder, excludes)
    files, total = [e for e in entries if e.link is None], 0
    for entry in files:
        total += entry.path.lstat().st_size
        if total > limit:
            raise JobError(f"{folder}: more than {format_size(limit)} to send with each job (the job's "
                           f"folder is copied to the machine that runs it). Put the data on storage every "
                           f"machine sees and pass --shared, list it in .gitignore, or move the job into a "
                           f"folder of its own.")
    return Packed(_zip(entries), len(files), total, links=len(entries) - len(files), outside=outside)


def pack_folder(folder: Path, excludes: list, max_bytes: int | None = None) -> bytes:
    """pack(...)'s zip alone."""
    return pack(folder, excludes, max_bytes).data


def snapshot(folder: Path) -> dict:
    """{relative path: (size, mtime_ns)} of every file and link under folder (a link's own, not its target's)."""
    out = {}
    for root, dirs, names in os.walk(folder):
        for name in [d for d in dirs if os.path.islink(os.path.join(root, d))] + names:
            path = Path(root) / name
            with contextlib.suppress(OSError):
                st = path.lstat()
                out[path.relative_to(folder).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def pack_changes(folder: Path, before: dict, limit: int) -> tuple:
    """(zip of the files under folder that are new or changed since ``before``, how many, their bytes, and the
    paths left out because they would pass ``limit``). Links come back as links when they stay inside the
    folder; one that leaves it is not followed and does not come back."""
    folder_real = os.path.realpath(folder)
    entries, left_out, total = [], [], 0
    for rel, (size, mtime) in sorted(snapshot(folder).items()):
        if before.get(rel) == (size, mtime) or _excluded(rel, ["__pycache__/", ".ipynb_checkpoints/"]):
            continue
        path = folder / rel
        if path.is_symlink():
            entry, _ = _classify_link(folder_real, rel, path)
            if entry is not None:
                entries.append(entry)
            continue
        if total + size > limit:
            left_out.append(rel)
            continue
        total += size
        entries.append(_Entry(rel, path))
    return (_zip(entries) if entries else None), len(entries), total, left_out


def unpack_folder(data: bytes, target: Path) -> None:
    """Unpack a pack_folder() zip into target, keeping file modes (an executable job stays executable) and links.
    An entry, or a link's target, that would land outside target is refused (ValueError)."""
    target.mkdir(parents=True, exist_ok=True)
    root = target.resolve()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            dest = (target / info.filename).resolve()
            if root not in dest.parents:
                raise ValueError(f"refusing to unpack {info.filename!r} outside {target}")
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                _unpack_link(info.filename, zf.read(info).decode("utf-8"), target, root)
                continue
            zf.extract(info, target)
            if mode:
                os.chmod(dest, mode & 0o777)


def _unpack_link(name: str, link_target: str, target: Path, root: Path) -> None:
    where = target / name
    points_to = Path(os.path.realpath(os.path.join(os.path.realpath(where.parent), link_target)))
    if os.path.isabs(link_target) or (points_to != root and root not in points_to.parents):
        raise ValueError(f"refusing to unpack the link {name!r} -> {link_target!r}: it points outside {target}")
    where.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(link_target, where)
