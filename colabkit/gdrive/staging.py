"""`colabkit.stage(src, dst=None)`: copy a dataset from Drive to fast local disk once, then reuse it.

Sources: a folder or a .zip/.tar/.tar.gz/.tgz archive (extracted after the copy) given as a path, a
"drive:" location (the mount), "gdrive://" (the Drive API) or a Google Drive share link.

* Cached: a second call with an unchanged source returns at once. "Unchanged" means every file's size and
  modification time (Drive: modifiedDate) match the last completed staging; with ``checksum=True`` the
  content decides (sha256 of local sources, Drive's md5Checksum for gdrive://).
* Resumable: each file is written as ``<name>.colabkit-part`` and renamed when complete; completed files
  are journalled, so an interrupted staging (a dropped mount, a killed kernel) continues where it stopped.
* Checked first: the bytes still to copy must fit on the destination disk, else InsufficientSpace (an
  OSError, ENOSPC) names both sizes before anything is written.
* Parallel: several files at a time (threads): many for a network source (Drive's FUSE mount, rclone, NFS,
  gdrive://), where every file costs a round trip; few for a local disk, where the copy is bound by system
  calls. Zero-copy (sendfile) for mounted sources; one tqdm bar counts bytes, its postfix counts files.

The destination is a mirror: files the source no longer has are removed, so ``dst`` must be a folder
colabkit staged before, or new/empty. It holds the source's files and nothing else: the bookkeeping (what was
staged, the journal of an unfinished copy, downloads and extraction in progress) lives beside it, in
``<dst>.colabkit-stage/`` (see state_dir), so a folder-per-class loader that lists every entry sees only the
source's classes. A copy made by an older version, with ``.colabkit-stage/`` inside, has it moved out on the
next stage.

Safe in a folder other users can write (/tmp): the bookkeeping folder is made private (0700), and an existing
one, or an existing dst, must be this user's own (see _check_own_folder), else stage refuses before writing
anything. Every file stage writes (part files, temporary JSON, the journal) is created anew with
O_EXCL|O_NOFOLLOW, so a symbolic link planted at its name is replaced, never written through.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

from .. import config as _config
from ..mounts import on_network_fs
from .links import extract_archive, fetch, is_archive, is_link, new_file, unpacked_size

log = logging.getLogger("colabkit")

STATE_SUFFIX = ".colabkit-stage"    # <dst>.colabkit-stage/: the bookkeeping, beside the staged folder
STATE_DIR = ".colabkit-stage"       # where versions before it lived: inside the staged folder (moved out when met)
PART = ".colabkit-part"
_SENDFILE_CHUNK = 64 << 20
_NO_SENDFILE = {errno.EINVAL, errno.ENOSYS, errno.ENOTSOCK, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EINVAL)}
_BINARY = getattr(os, "O_BINARY", 0)   # Windows opens descriptors in text mode without it
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)   # a link at the name fails the open (ELOOP) instead of being followed
# a name the destination's file system cannot hold: too long (a name, or the whole path), or characters or an
# encoding it refuses (vfat, exFAT, NTFS: EINVAL; strict UTF-8 file systems: EILSEQ)
_UNUSABLE_NAME = {errno.ENAMETOOLONG, errno.EINVAL, errno.EILSEQ}
NETWORK_WORKERS = 16   # files in flight from a network source: enough to hide a round trip per file


class InsufficientSpace(OSError):
    """The destination disk cannot hold what staging would copy."""


@dataclass
class Entry:
    rel: str
    size: int
    stamp: str                  # size+mtime identity: mtime_ns (local) or modifiedDate (Drive)
    fetch: Callable             # fetch(out_fd, progress) -> None: writes the bytes into the open descriptor
    digest: Callable | None = None  # content identity for checksum mode


def _fmt(n: float) -> str:
    from ..units import format_size
    return format_size(n)


# -- sources -------------------------------------------------------------------------------------------
def _local_copy(src: str, size: int, mtime_ns: int):
    def fetch(fout: int, progress):
        # raw descriptors: for many small files the per-file cost is what counts
        fin = os.open(src, os.O_RDONLY | _BINARY)
        try:
            _copy_fd(fin, fout, size, progress)
            st = os.fstat(fin)
            if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):  # rewritten or replaced since it was listed
                raise OSError(errno.EIO, f"{src} changed during the copy ({size} -> {st.st_size} bytes); run stage "
                                         f"again to copy its new version.")
        finally:
            os.close(fin)
    return fetch


def _copy_fd(fin: int, fout: int, size: int, progress) -> None:
    """Copy up to ``size`` bytes (the listed size; the caller checks the source did not change meanwhile)."""
    offset = 0
    if hasattr(os, "sendfile"):
        try:
            while offset < size:
                sent = os.sendfile(fout, fin, offset, min(_SENDFILE_CHUNK, size - offset))
                if sent == 0:
                    return
                offset += sent
                progress(sent)
            return
        except OSError as exc:
            if exc.errno not in _NO_SENDFILE or offset:
                raise
    # no sendfile for this pair of files (macOS sends only to sockets, Windows has none)
    while offset < size and (chunk := os.read(fin, min(8 << 20, size - offset))):
        view = memoryview(chunk)
        while view:
            view = view[os.write(fout, view):]
        offset += len(chunk)
        progress(len(chunk))


def _sha256(path: Path):
    def digest():
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(8 << 20):
                h.update(chunk)
        return h.hexdigest()
    return digest


def _local_entries(src: Path) -> list[Entry]:
    if src.is_file():
        st = src.stat()
        return [Entry(src.name, st.st_size, str(st.st_mtime_ns), _local_copy(str(src), st.st_size, st.st_mtime_ns),
                      _sha256(src))]
    entries = []
    base = len(str(src).rstrip(os.sep)) + 1
    for root, dirs, files in os.walk(src):
        if root == str(src):                   # the bookkeeping of a copy staged by an older version is not data
            dirs[:] = [d for d in dirs if d != STATE_DIR]
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            st = os.stat(path)
            entries.append(Entry(path[base:].replace(os.sep, "/"), st.st_size, str(st.st_mtime_ns),
                                 _local_copy(path, st.st_size, st.st_mtime_ns), _sha256(path)))
    return entries


def _drive_entries(folder: str) -> tuple[list[Entry], bool]:
    """(entries, is_single_file) of a gdrive:// folder or file path."""
    from .auth import connect
    from .client import FOLDER_MIME
    client = connect()
    top, below, top_text = client.locate(folder)      # My Drive, a shared drive, or a folder by id
    parent_path, _, last = below.strip("/").rpartition("/")
    where = f"gdrive://{'/'.join(p for p in (top_text, parent_path) if p)}"
    if not below.strip("/"):                    # the location is the shared drive or the folder id itself
        item = client.get(top)
    else:
        parent = client.folder(parent_path, create=False, root=top) if parent_path else top
        item = client.pick(client.children(parent, title=last), where) if parent else None
    if item is not None:                        # a shortcut (a folder or file shared with you) stands for its target
        item = client.resolve(item, where)
    if item is None:
        raise FileNotFoundError(f"gdrive://{folder} does not exist on Google Drive (or is not visible to "
                                f"{client.whoami()}).")

    def entry(rel, meta):
        def fetch(out: int, progress, fid=meta["id"]):
            with os.fdopen(out, "wb", closefd=False) as fh:
                client.download(fid, fh, what=f"downloading gdrive://{folder}/{rel}", progress=progress)
        return Entry(rel, int(meta.get("fileSize", 0)), meta.get("modifiedDate", ""), fetch,
                     lambda m=meta: m.get("md5Checksum", ""))
    if item.get("mimeType") != FOLDER_MIME:
        return [entry(item["title"], item)], True
    found = client.walk(item["id"], where=f"gdrive://{folder}")
    return [entry(rel, meta) for rel, meta in sorted(found.items())], False


# -- the copy ------------------------------------------------------------------------------------------
def _default_dst(src: str) -> Path:
    name = Path(src.rstrip("/").split("?")[0]).name or "dataset"
    for suffix in (".tar.gz", ".tgz", ".zip", ".tar"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    digest = hashlib.sha1(src.encode()).hexdigest()[:8]
    return _config.load().resolved_cache_dir() / "datasets" / f"{name}-{digest}"


def state_dir(dst: Path) -> Path:
    """Where stage keeps its bookkeeping for the staged folder ``dst``: beside it, ``<dst>.colabkit-stage/``;
    where that folder's parent is not writable (dst is a mount point, say), in the cache dir under a name
    derived from dst's path. An existing one of the two is used."""
    dst = Path(dst)
    beside = dst.with_name(dst.name + STATE_SUFFIX) if dst.name else dst / STATE_SUFFIX
    keyed = (_config.load().resolved_cache_dir() / "stage-state" /
             f"{dst.name or 'root'}-{hashlib.sha1(str(dst).encode(errors='surrogateescape')).hexdigest()[:12]}")
    if beside.is_dir() or keyed.is_dir():
        return beside if beside.is_dir() else keyed
    parent = beside.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return beside if os.access(parent, os.W_OK) else keyed


def _user_name(uid: int) -> str:
    try:
        import pwd
        return f"{pwd.getpwuid(uid).pw_name}, uid {uid}"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _check_own_folder(path: Path, *, bookkeeping_for: Path | None = None) -> None:
    """Refuse (PermissionError) a folder at ``path`` that another user could have planted or can change: it
    must be this user's own and writable by no one else. For the bookkeeping folder (``bookkeeping_for``: the
    staged folder it belongs to) also a real folder, not a symbolic link, and not group-writable (colabkit
    makes it 0700). dst may be a link of this user's to a folder of theirs, and group-writable (a user's own
    folders are, under the common umask 002, and nothing in it is written through a link)."""
    what = f"the folder where stage keeps its bookkeeping for {bookkeeping_for}" if bookkeeping_for else \
        "the folder to stage into"
    elsewhere = "stage elsewhere: another dst, in a folder only you can write (under your home folder, say)"
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        if bookkeeping_for is not None:
            raise PermissionError(f"{path} ({what}) is a symbolic link (to {os.readlink(path)}), not a folder "
                                  f"colabkit made; it was not followed. Remove the link, or {elsewhere}.")
        if hasattr(os, "geteuid") and st.st_uid not in (os.geteuid(), 0):
            raise PermissionError(f"{path} ({what}) is a symbolic link owned by {_user_name(st.st_uid)}, not by "
                                  f"you: that user can point it elsewhere at any time. Remove it, or {elsewhere}.")
        st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        if bookkeeping_for is None:
            return                             # a file at dst: stage's own check names it
        raise PermissionError(f"{path} ({what}) is not a folder. Remove it, or {elsewhere}.")
    if not hasattr(os, "geteuid"):             # Windows: no POSIX owner and mode bits to check
        return
    if st.st_uid != os.geteuid():
        raise PermissionError(f"colabkit will not stage through {path} ({what}): it belongs to "
                              f"{_user_name(st.st_uid)}, not to you ({_user_name(os.geteuid())}), so that user could "
                              f"read or replace what is staged, or make stage overwrite files of yours through "
                              f"links. Have it removed (by its owner or root), or {elsewhere}.")
    others = 0o022 if bookkeeping_for is not None else 0o002
    if st.st_mode & others:
        raise PermissionError(f"colabkit will not stage through {path} ({what}): other users can write into it "
                              f"(mode {stat.S_IMODE(st.st_mode):04o}). If everything in it is yours, make it private "
                              f"(chmod {'700' if bookkeeping_for else 'o-w'} {path}); else remove it, or {elsewhere}.")


def _make_own_folder(path: Path, mode: int, *, bookkeeping_for: Path | None = None) -> None:
    """Make the folder ``path`` with ``mode`` (its parents as usual) unless it exists; then check it is ours
    (an existing one, or one another user made just before us, is refused)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    _check_own_folder(path, bookkeeping_for=bookkeeping_for)


def _claim(dst: Path, state: Path) -> None:
    """Make dst and its private bookkeeping folder, recording which folder the bookkeeping is for (its inode)."""
    _make_own_folder(dst, 0o755)
    _make_own_folder(state, 0o700, bookkeeping_for=dst)
    _write_json(state / "folder.json", {"folder": str(dst), "inode": dst.stat().st_ino})


def _owns(state: Path, dst: Path) -> bool:
    """The bookkeeping is dst's: dst is the folder it was written for (not one deleted, then made again)."""
    if not dst.is_dir():
        return False
    record = _read_json(state / "folder.json")
    return record is None or record.get("inode") == dst.stat().st_ino


def _adopt_state(dst: Path, state: Path) -> None:
    """Bookkeeping of an older version (inside dst) moves beside it; stale bookkeeping (dst gone) is dropped."""
    legacy = dst / STATE_DIR
    if legacy.is_dir() and not legacy.is_symlink():
        if state.is_dir():                     # both: the one beside is this version's own
            shutil.rmtree(legacy)
        else:
            state.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(legacy), str(state))
            os.chmod(state, 0o700)
            _claim(dst, state)
            log.info("colabkit: moved the staging bookkeeping out of %s, to %s", dst, state)
    if state.is_dir() and not _owns(state, dst):
        shutil.rmtree(state)


def _check_space(where: Path, need: int, what: str) -> None:
    probe = where
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if need > free:
        raise InsufficientSpace(errno.ENOSPC, f"Not enough disk space to stage {what}: it needs {_fmt(need)} at "
                                              f"{where}, and only {_fmt(free)} is free there. Free some space or "
                                              f"pass dst= on a larger disk.")


def _read_text(path: Path) -> str | None:
    """The text of the file at ``path``; None when there is none, or a symbolic link is there (not followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _BINARY)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read().decode("utf-8", errors="surrogateescape")


def _write_text(path: Path, text: str) -> None:
    """Replace the file at ``path`` atomically, through a temporary file created anew (never through a link)."""
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(new_file(tmp, 0o600), "wb") as fh:
        fh.write(text.encode("utf-8", errors="surrogateescape"))
    os.replace(tmp, path)                      # a rename replaces a link at ``path``, it does not follow it


def _read_json(path: Path):
    try:
        return json.loads(_read_text(path) or "")
    except ValueError:
        return None


def _write_json(path: Path, data) -> None:
    _write_text(path, json.dumps(data))


def _part_path(target: str, name_max: int) -> str:
    """Where ``target`` is written until complete: ``<name>.colabkit-part`` beside it, or, where that name would
    be longer than the file system allows, a short one derived from it."""
    folder, name = os.path.split(target)
    if len(os.fsencode(name)) + len(PART) <= name_max:
        return target + PART
    return os.path.join(folder, "." + hashlib.sha1(os.fsencode(name)).hexdigest()[:16] + PART)


def _name_max(folder: Path) -> int:
    """The longest file name (bytes) the file system of ``folder`` holds (255 on Linux's usual ones)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (AttributeError, ValueError, OSError):
        return 255


def _copy_all(entries: list[Entry], into: Path, journal: Path, *, workers: int, desc: str, quiet: bool,
              source: str) -> dict:
    """Copy entries into ``into``, skipping the ones the journal lists as done; journal each completed file.
    Returns {rel: why} of the entries whose name the destination cannot hold: each is skipped with a warning
    naming it (``source``/rel), and the rest is copied."""
    done = {}
    for line in (_read_text(journal) or "").splitlines():
        rel, _, stamp = line.partition("\t")
        done[rel] = stamp
    todo = []
    for e in entries:
        target = into / e.rel
        if done.get(e.rel) == f"{e.size}:{e.stamp}" and target.is_file() and target.stat().st_size == e.size:
            continue
        todo.append(e)
    total = sum(e.size for e in todo)
    _check_space(into, total, desc)
    from tqdm.auto import tqdm
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, disable=quiet, leave=not quiet)
    lock = threading.Lock()
    files_done = [0]
    shown = [0.0]
    made: set = set()
    skipped: dict = {}
    name_max = _name_max(into)
    # flushed in batches: a lost line only means one re-copy; names that are not UTF-8 are kept as they are
    if journal.is_symlink():                   # not ours: appending would write through it
        journal.unlink()
    jfh = open(os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o600), "a",
               buffering=1 << 16, encoding="utf-8", errors="surrogateescape")

    def one(e: Entry):
        target = os.path.join(into, e.rel)
        parent = os.path.dirname(target)
        part = _part_path(target, name_max)
        try:
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            out = new_file(part)
        except OSError as exc:
            if exc.errno not in _UNUSABLE_NAME:
                raise
            why = f"the destination's file system cannot hold its name or path ({exc.strerror})"
            log.warning("colabkit: skipped %s/%s: %s", source.rstrip("/"), e.rel, why)
            with lock:
                skipped[e.rel] = why
            return
        try:
            try:
                e.fetch(out, bar.update)
            finally:
                os.close(out)
            got = os.stat(part).st_size
            if got != e.size:
                raise OSError(errno.EIO, f"{e.rel}: copied {got} bytes, the source had {e.size}; it changed "
                                         f"during the copy or the mount dropped. Run stage again to continue.")
            os.replace(part, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
            raise
        with lock:
            jfh.write(f"{e.rel}\t{e.size}:{e.stamp}\n")
            files_done[0] += 1
            now = time.monotonic()
            if now - shown[0] > 0.2 or files_done[0] == len(todo):
                shown[0] = now
                jfh.flush()
                bar.set_postfix_str(f"{files_done[0]}/{len(todo)} files", refresh=False)

    try:
        if workers <= 1 or len(todo) <= 1:
            for e in todo:
                one(e)
        else:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="colabkit-stage") as pool:
                futures = [pool.submit(one, e) for e in todo]
                first_error = None
                for f in futures:
                    try:
                        f.result()
                    except BaseException as exc:  # noqa: BLE001 - let the others finish, raise the first
                        if first_error is None:
                            first_error = exc
                            for other in futures:
                                other.cancel()
                if first_error is not None:
                    raise first_error
    finally:
        jfh.close()
        bar.close()
    return skipped


def stage(src, dst=None, *, checksum: bool = False, workers: int | None = None, quiet: bool = False) -> Path:
    """Copy a dataset to fast local disk (cached, resumable); returns the local folder.

    src: a folder or .zip/.tar/.tar.gz/.tgz archive: a path, "drive:data/x", "gdrive://data/x", or a Google
    Drive share link. dst: the local folder (default: <cache_dir>/datasets/<name>-<hash>); it holds exactly
    the source's files (a mirror), and colabkit's bookkeeping (what was staged, the journal that lets an
    interrupted copy resume) is kept beside it in <dst>.colabkit-stage/ (in the cache dir where dst's parent is
    not writable; see state_dir). checksum: decide "unchanged" by content instead of size+mtime. workers: files
    copied at a time (default: 16 from a network source; from a local disk 4 for large files, 1 for small ones).
    """
    if not isinstance(src, (str, os.PathLike)) or not str(src).strip():
        raise ValueError(f"src={src!r} is empty; pass a dataset folder or archive (a path, \"drive:...\", "
                         f"\"gdrive://...\" or a share link).")
    src_text = os.fspath(src) if isinstance(src, os.PathLike) else src.strip()
    dst = Path(os.path.abspath(os.path.expanduser(str(dst)))) if dst is not None else _default_dst(src_text)
    state = state_dir(dst)
    for folder, of in ((dst, None), (state, dst)):   # before anything is read from or written to either
        if os.path.lexists(folder):
            _check_own_folder(folder, bookkeeping_for=of)
    _adopt_state(dst, state)
    marker = state / "complete.json"
    if dst.exists() and (not dst.is_dir() or (any(dst.iterdir()) and not state.is_dir())):
        raise FileExistsError(f"{dst} exists and was not made by colabkit.stage; staging mirrors the source and "
                              f"would delete what is there. Pass a new or empty folder as dst.")

    if is_link(src_text):
        return _stage_link(src_text, dst, state, quiet=quiet)
    if src_text.startswith("gdrive://"):
        entries, single = _drive_entries(src_text[len("gdrive://"):])
        network = True
        archive = single and is_archive(entries[0].rel)
        if single and not archive:
            raise ValueError(f"{src_text} is a single file that is not a .zip/.tar(.gz) archive; stage a folder "
                             f"or an archive.")
    else:
        from ..locations import resolve
        path = resolve(src_text)
        if not isinstance(path, Path):
            raise ValueError(f"{src_text} is not a folder or archive colabkit can stage.")
        if not path.exists():
            raise FileNotFoundError(f"The dataset {src_text} ({path}) does not exist.")
        if path.is_file() and not is_archive(path.name):
            raise ValueError(f"{path} is a file that is not a .zip/.tar(.gz) archive; stage a folder or an archive.")
        archive = path.is_file()
        entries = _local_entries(path)
        network = on_network_fs(path)

    identity = {"source": src_text, "files": {e.rel: f"{e.size}:{e.stamp}" for e in entries}}
    if checksum:
        identity["digests"] = {e.rel: e.digest() for e in entries}
    previous = _read_json(marker)
    if previous is not None and _unchanged(previous, identity, checksum) and _intact(dst, previous):
        log.info("colabkit: %s is staged at %s and unchanged; nothing to copy", src_text, dst)
        for rel, why in previous.get("skipped", {}).items():
            log.warning("colabkit: skipped %s/%s: %s", src_text.rstrip("/"), rel, why)
        return dst
    created = not dst.exists()
    try:
        return _stage_entries(src_text, dst, state, entries, identity, archive, workers, quiet, network, created)
    except InsufficientSpace:
        if created:                            # nothing is left behind by a copy that could not start
            shutil.rmtree(dst, ignore_errors=True)
            shutil.rmtree(state, ignore_errors=True)
        raise


def _stage_entries(src_text, dst, state, entries, identity, archive, workers, quiet, network, created) -> Path:
    marker = state / "complete.json"
    _claim(dst, state)
    journal = state / "journal.tsv"
    previous = _read_json(marker)
    if previous is not None and not archive and not journal.exists():  # files staged last time count as done
        same = previous.get("digests", {}) if "digests" in identity else None
        _write_text(journal, "".join(f"{rel}\t{stamp}\n" for rel, stamp in previous.get("files", {}).items()
                                     if same is None or same.get(rel) == identity["digests"].get(rel)))
    marker.unlink(missing_ok=True)
    total = sum(e.size for e in entries)
    big = total / max(len(entries), 1) >= (1 << 20)
    # a network source hides its round trips behind many threads; from a local disk, large files gain from a
    # few, small ones are bound by system calls and lose to the thread hand-offs
    n_workers = workers or min(NETWORK_WORKERS if network else 4 if big else 1, len(entries)) or 1
    desc = f"staging {Path(src_text.rstrip('/')).name or src_text}"
    log.info("colabkit: staging %s (%d files, %s) from %s, %d at a time", src_text, len(entries),
             _fmt(total), "the network" if network else "a local disk", n_workers)
    skipped = {}
    if archive:
        downloads = state / "archive"
        downloads.mkdir(exist_ok=True)
        if _copy_all(entries, downloads, journal, workers=1, desc=desc, quiet=quiet, source=src_text):
            raise OSError(errno.ENAMETOOLONG, f"{src_text}: its name cannot be a file name in {downloads}; stage a "
                                              f"copy of the archive with a shorter, plain name.")
        arch = downloads / entries[0].rel
        _extract_into(arch, dst, state, extract_archive)
        arch.unlink()
        outputs = {p.relative_to(dst).as_posix() for p in _files(dst)}
    else:
        skipped = _copy_all(entries, dst, journal, workers=n_workers, desc=desc, quiet=quiet, source=src_text)
        outputs = {e.rel for e in entries} - set(skipped)
        if not created or skipped:             # a mirror: drop what the source no longer has, and the folders
            _prune(dst, outputs)               # made for files that could not be written
    sizes = {e.rel: e.size for e in entries if e.rel in outputs} if not archive else \
        {rel: (dst / rel).stat().st_size for rel in outputs}
    _write_json(marker, {**identity, "outputs": sorted(outputs), "sizes": sizes,
                         **({"skipped": skipped} if skipped else {})})
    journal.unlink(missing_ok=True)
    return dst


def _files(root: Path):
    for base, _dirs, files in os.walk(root):
        for name in files:
            yield Path(base) / name


def _prune(dst: Path, keep: set) -> None:
    """Remove the files below dst not in ``keep`` (relative posix paths), then the folders left empty."""
    root = str(dst)
    for base, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            path = os.path.join(base, name)
            if os.path.relpath(path, root).replace(os.sep, "/") not in keep:
                os.unlink(path)
        if base != root and not os.listdir(base):
            os.rmdir(base)


def _clear(folder: Path) -> None:
    """Empty ``folder`` (a mirror about to receive a new extraction or download)."""
    for child in list(folder.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _move_in(child: Path, target: Path) -> None:
    try:
        os.replace(child, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:           # the bookkeeping on another disk than dst (see state_dir)
            raise
        shutil.move(str(child), str(target))


def _unchanged(previous: dict, identity: dict, checksum: bool) -> bool:
    if previous.get("source") != identity["source"]:
        return False
    if checksum:
        return previous.get("digests") == identity["digests"] and set(previous["files"]) == set(identity["files"])
    return previous.get("files") == identity["files"]


def _intact(dst: Path, previous: dict) -> bool:
    sizes = previous.get("sizes", {})
    root = str(dst)
    try:
        return all(os.stat(os.path.join(root, rel)).st_size == size for rel, size in sizes.items())
    except OSError:
        return False


def _extract_into(archive: Path, dst: Path, state: Path, extract) -> None:
    """Extract beside dst (in its bookkeeping folder), check the space first, then move the members into place."""
    _check_space(dst, unpacked_size(archive), f"the contents of {archive.name}")
    tmp = state / "extracting"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        extract(archive, tmp)
        _clear(dst)
        for child in tmp.iterdir():
            _move_in(child, dst / child.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _stage_link(url: str, dst: Path, state: Path, *, quiet: bool) -> Path:
    """Share links carry no size/mtime we can check without downloading: cached by URL once complete."""
    marker = state / "complete.json"
    previous = _read_json(marker)
    if previous is not None and previous.get("source") == url and _intact(dst, previous):
        return dst
    _claim(dst, state)
    marker.unlink(missing_ok=True)             # not complete until this download is in place
    download = state / "download"
    shutil.rmtree(download, ignore_errors=True)
    got = fetch(url, download, quiet=quiet)
    try:
        if got.is_file():
            if not is_archive(got.name):
                raise ValueError(f"{url} is a single file ({got.name}) that is not a .zip/.tar(.gz) archive.")
            _extract_into(got, dst, state, extract_archive)
        else:
            _clear(dst)
            for child in got.iterdir():
                _move_in(child, dst / child.name)
    finally:
        shutil.rmtree(download, ignore_errors=True)
    outputs = sorted(p.relative_to(dst).as_posix() for p in _files(dst))
    _write_json(marker, {"source": url, "outputs": outputs, "sizes": {r: (dst / r).stat().st_size for r in outputs}})
    return dst
