"""Checkpoints that another program wrote: a Trainer's ``checkpoint-1500`` folder, an accelerate ``save_state``
folder, a script's ``last.pt``. They are taken into a checkpoint as they are, under ``files/<name>``, beside a
state.json that names them; the manifest then covers every byte like any other checkpoint.

Taking them must never commit a mix of two writes. On the calling thread each file is either hard-linked into
the staging folder (instant; the background thread then copies it to a file of the checkpoint's own while
hashing it, so a committed checkpoint never shares a file with the program; if the program rewrites it in
place before that copy is done, the save is refused, not committed) or copied, with the file's identity
(inode, size, mtime) read before and after the copy: a file rewritten during the copy is copied again.

An identity only tells two writes apart when their timestamps differ, and the kernel stamps files from a clock
that moves in ticks (milliseconds): a program that rewrites a small file in place many times a second leaves
the same size and mtime after each write. So a file is taken only once its last change is older than QUIET_S
(any later write then gets a newer mtime), and a copy must have the size the file had before and after it.
A program stalled half way through a write (descheduled, waiting for its disk) leaves a file that looks quiet:
where /proc lists open files (Linux), a file some process holds open for writing is not taken at all.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import stat
import time
from pathlib import Path

from .digest import hash_file
from .storage import copy_file

FILES = "files"                 # the program's files, under files/<name> in the checkpoint folder
STATE_KEY = "colabkit.files"    # the state tree's record of them: {"name": ..., "kind": "folder" | "file"}
COPY_ATTEMPTS = 5
QUIET_S = 0.05       # far above the kernel's timestamp tick (1-10 ms): a later write gets a newer mtime


class SourceChanged(OSError):
    """A file was rewritten while it was being taken: this snapshot is not consistent and is not committed."""


def _identity(st: os.stat_result) -> tuple:
    return st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _contents_identity(st: os.stat_result) -> tuple:
    """What changes when a hard-linked file's contents are rewritten in place. Not its ctime: that also changes
    when the program removes its own name for the file (a Trainer pruning old checkpoint-N folders, a save_state
    folder deleted once it was taken), which leaves the contents the store linked as they were."""
    return st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns


@dataclasses.dataclass
class FilesSnapshot:
    """What ``take`` put in a checkpoint's staging folder, and what the linked files looked like then."""
    name: str
    kind: str                                   # "folder" or "file"
    linked: dict = dataclasses.field(default_factory=dict)   # name in the checkpoint -> identity when linked
    copied_instead: int = 0   # files copied on the calling thread because the filesystem refused a link

    def state(self) -> dict:
        return {STATE_KEY: {"name": self.name, "kind": self.kind}}


def check_source(source) -> Path:
    """``source`` as a Path to an existing regular file or folder, or ValueError naming it and the fix."""
    path = Path(source)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ValueError(f"{str(source)!r} does not exist: pass the checkpoint folder or file the training "
                         f"wrote (for example \"outputs/checkpoint-500\" or \"last.pt\").") from None
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise ValueError(f"{str(source)!r} is neither a folder nor a regular file; pass the checkpoint folder or "
                         f"file the training wrote.")
    if not path.name or path.name in (".", ".."):
        path = path.resolve()
    return path


def take(source: Path, into: Path, *, link: bool, closed: bool = False) -> FilesSnapshot:
    """Put ``source`` (a folder or a file) into ``into / FILES / source.name``: hard links when ``link`` and the
    filesystem allows them, copies otherwise. Symbolic links inside a folder are copied as the files they point
    to (a checkpoint holds no links); anything that is not a regular file or folder is left out.
    ``closed``: the caller knows every file is written whole and closed (it wrote them itself and returned),
    so the checks for a writer still at work (a quiet time, open files in /proc) are skipped."""
    target = into / FILES / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    snap = FilesSnapshot(name=source.name, kind="folder" if source.is_dir() else "file")
    if snap.kind == "file":
        _take_file(source, target, f"{FILES}/{snap.name}", snap, link, closed)
        if not closed:
            _refuse_linked_if_open(snap, into)
        return snap
    for folder, dirs, files in os.walk(source, followlinks=False):
        rel_folder = Path(folder).relative_to(source)
        (target / rel_folder).mkdir(parents=True, exist_ok=True)
        for name in sorted(files):
            rel = Path(FILES, snap.name, rel_folder, name).as_posix()
            _take_file(Path(folder, name), target / rel_folder / name, rel, snap, link, closed)
        dirs.sort()
    if not closed:
        _refuse_linked_if_open(snap, into)
    return snap


def open_for_writing() -> set | None:
    """(st_dev, st_ino) of every file that a process this user can see holds open for writing, read from
    /proc (Linux); None where there is no /proc to read. One stat per open descriptor."""
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    found = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
                if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in found:
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii") as fh:
                    flags = next((int(line.split()[1], 8) for line in fh if line.startswith("flags:")), 0)
            except (OSError, ValueError, IndexError):
                continue
            if flags & (os.O_WRONLY | os.O_RDWR):
                found.add((st.st_dev, st.st_ino))
    return found


def _refuse_if_open(src: Path, identity: tuple, busy: set | None) -> None:
    if busy is not None and (identity[1], identity[0]) in busy:
        raise SourceChanged(errno.EBUSY, f"{src} is open for writing (a program is still writing it); this "
                                         f"checkpoint is not taken")


def _refuse_linked_if_open(snap: FilesSnapshot, into: Path) -> None:
    """After linking (each file quiet first): none may be held open for writing now, such as by a writer stalled
    half way; a write that starts later changes the file's identity, which hash_linked checks."""
    if snap.linked:
        busy = open_for_writing()
        for rel, identity in snap.linked.items():
            _refuse_if_open(into / rel, identity, busy)


def _take_file(src: Path, dst: Path, rel: str, snap: FilesSnapshot, link: bool, closed: bool) -> None:
    try:
        st = os.stat(src)
    except FileNotFoundError:
        raise SourceChanged(errno.ENOENT, f"{src} disappeared while the checkpoint was being taken") from None
    if not stat.S_ISREG(st.st_mode):
        return
    if link and not stat.S_ISLNK(os.lstat(src).st_mode):
        before = _identity(os.stat(src)) if closed else _quiet_identity(src)
        try:
            os.link(src, dst)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES):
                raise
            snap.copied_instead += 1
        else:
            linked = _identity(os.stat(dst))   # the link itself changes ctime, nothing else
            if linked[:4] != before[:4]:
                raise SourceChanged(errno.EBUSY, f"{src} changed while it was being taken; this checkpoint is not "
                                                 f"taken")
            # its mtime is older than QUIET_S: a write from now on changes it (see QUIET_S)
            snap.linked[rel] = _contents_identity(os.stat(dst))
            return
    if closed:
        _copy_closed(src, dst)
    else:
        _copy_consistently(src, dst)


def _copy_closed(src: Path, dst: Path) -> None:
    """Copy a file its writer has closed; SourceChanged if it changed during the copy all the same."""
    before = _identity(os.stat(src))
    shutil.copyfile(src, dst)
    if _identity(os.stat(src)) != before or os.stat(dst).st_size != before[2]:
        raise SourceChanged(errno.EBUSY, f"{src} changed while it was copied; this checkpoint is not taken")


def _quiet_identity(src: Path, attempt: int = 0) -> tuple:
    """``src``'s identity once its last change is older than QUIET_S (waiting for that, a few times), so that
    any later write gives it another identity. SourceChanged when it keeps changing."""
    for tries in range(attempt, COPY_ATTEMPTS):
        st = os.stat(src)
        age = time.time() - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9
        if age > QUIET_S:
            return _identity(st)
        time.sleep(max(QUIET_S - age, 0.0) + 0.01 * (tries + 1))
    raise SourceChanged(errno.EBUSY, f"{src} kept changing while it was being taken ({COPY_ATTEMPTS} attempts); "
                                     f"this checkpoint is not taken")


def copy_consistently(src, dst) -> None:
    """Copy the file ``src`` to ``dst`` as one version of it, as ``save_folder(link=False)`` takes a file:
    SourceChanged when it kept changing or is held open for writing."""
    _copy_consistently(Path(src), Path(dst))


def _copy_consistently(src: Path, dst: Path) -> None:
    """Copy ``src`` so that the copy is one version of it: taken while quiet (see QUIET_S) and not open for
    writing, and copied again when it changed during the copy or the copy's size is not the file's."""
    for attempt in range(COPY_ATTEMPTS):
        before = _quiet_identity(src, attempt)
        # quiet, and nobody holds it open for writing (a writer stalled half way would): a write from now on
        # gives it a newer mtime
        _refuse_if_open(src, before, open_for_writing())
        shutil.copyfile(src, dst)
        if _identity(os.stat(src)) == before and os.stat(dst).st_size == before[2]:
            return
        time.sleep(0.05 * (attempt + 1))
    raise SourceChanged(errno.EBUSY, f"{src} kept changing while it was copied ({COPY_ATTEMPTS} attempts); this "
                                     f"checkpoint is not taken")


def hash_linked(snap: FilesSnapshot, ckpt_dir: Path) -> dict:
    """Give each hard-linked file a copy of its own, hashed (and fsynced) on the way, in place of the link, then
    check that the program did not rewrite it in place meanwhile: {relative name: (digest.HASH hex, size)} for the
    manifest. Raises SourceChanged when one was rewritten. Runs on the background thread: once committed, the
    checkpoint shares no file with the program, whose later writes can then never damage it."""
    written = {}
    for rel, identity in snap.linked.items():
        path = ckpt_dir / rel
        private = path.with_name(f".{path.name}.colabkit-copy")
        digest, size = copy_file(path, private, durable=True, digest=True)
        if _contents_identity(os.stat(path)) != identity or size != identity[2]:
            private.unlink()
            raise SourceChanged(errno.EBUSY, f"{path.name} was rewritten in place while it was being committed; "
                                             f"this checkpoint is skipped and the previous one stays the newest")
        os.replace(private, path)
        written[rel] = (digest, size)
    return written


def recorded(state: dict) -> dict | None:
    """The files record of a restored state, or None for a checkpoint that holds no program's files."""
    entry = state.get(STATE_KEY) if isinstance(state, dict) else None
    if not isinstance(entry, dict) or entry.get("kind") not in ("folder", "file"):
        return None
    name = entry.get("name")
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        return None
    return entry


def place(ckpt_path: Path, entry: dict, into: Path) -> Path:
    """Copy a verified checkpoint's files to ``into / name``. Whatever is there already and differs is moved
    aside to ``name.colabkit-replaced-N`` (never deleted), and the copy is renamed into place whole."""
    source = ckpt_path / FILES / entry["name"]
    into.mkdir(parents=True, exist_ok=True)
    target = into / entry["name"]
    staging = into / f".{entry['name']}.colabkit-restoring"
    _remove(staging)
    if entry["kind"] == "folder":
        shutil.copytree(source, staging, symlinks=False)
    else:
        shutil.copyfile(source, staging)
    if os.path.lexists(target):
        if _same_tree(target, staging):
            _remove(staging)
            return target
        n = 1
        while os.path.lexists(into / f"{entry['name']}.colabkit-replaced-{n}"):
            n += 1
        os.replace(target, into / f"{entry['name']}.colabkit-replaced-{n}")
    os.replace(staging, target)
    return target


def _same_tree(a: Path, b: Path) -> bool:
    def listing(root: Path) -> dict:
        if root.is_file():
            return {"": hash_file(root)}
        return {p.relative_to(root).as_posix(): hash_file(p) for p in sorted(root.rglob("*")) if p.is_file()}
    try:
        return listing(a) == listing(b)
    except OSError:
        return False


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink()
