"""``stage()``: decide whether the source changed since the last staging, copy or download what is needed, and
leave the destination a mirror of the source (files the source no longer has are removed; an archive's members
replace what was there).

A second call with an unchanged source returns at once. "Unchanged" means every file's size and modification
time (Drive: modifiedDate) match the last completed staging; with ``checksum=True`` the content decides (sha256
of local sources, Drive's md5Checksum for gdrive://). Many files at a time from a network source (Drive's FUSE
mount, rclone, NFS, gdrive://), where every file costs a round trip; few from a local disk, where the copy is
bound by system calls.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
from pathlib import Path

from ... import config as _config
from ...mounts import on_network_fs
from ...units import format_size
from ..links import extract_archive, fetch, is_archive, is_link, unpacked_size
from .bookkeeping import adopt_state, check_own_folder, claim, read_json, state_dir, write_json, write_text
from .copying import InsufficientSpace, check_space, copy_all
from .sources import drive_entries, local_entries

log = logging.getLogger("colabkit")

NETWORK_WORKERS = 16   # files in flight from a network source: enough to hide a round trip per file


def _default_dst(src: str) -> Path:
    name = Path(src.rstrip("/").split("?")[0]).name or "dataset"
    for suffix in (".tar.gz", ".tgz", ".zip", ".tar"):
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    digest = hashlib.sha1(src.encode()).hexdigest()[:8]
    return _config.load().resolved_cache_dir() / "datasets" / f"{name}-{digest}"


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
            check_own_folder(folder, bookkeeping_for=of)
    adopt_state(dst, state)
    marker = state / "complete.json"
    if dst.exists() and (not dst.is_dir() or (any(dst.iterdir()) and not state.is_dir())):
        raise FileExistsError(f"{dst} exists and was not made by colabkit.stage; staging mirrors the source and "
                              f"would delete what is there. Pass a new or empty folder as dst.")

    if is_link(src_text):
        return _stage_link(src_text, dst, state, quiet=quiet)
    if src_text.startswith("gdrive://"):
        entries, single = drive_entries(src_text[len("gdrive://"):])
        network = True
        archive = single and is_archive(entries[0].rel)
        if single and not archive:
            raise ValueError(f"{src_text} is a single file that is not a .zip/.tar(.gz) archive; stage a folder "
                             f"or an archive.")
    else:
        from ...locations import resolve
        path = resolve(src_text)
        if not isinstance(path, Path):
            raise ValueError(f"{src_text} is not a folder or archive colabkit can stage.")
        if not path.exists():
            raise FileNotFoundError(f"The dataset {src_text} ({path}) does not exist.")
        if path.is_file() and not is_archive(path.name):
            raise ValueError(f"{path} is a file that is not a .zip/.tar(.gz) archive; stage a folder or an archive.")
        archive = path.is_file()
        entries = local_entries(path)
        network = on_network_fs(path)

    identity = {"source": src_text, "files": {e.rel: f"{e.size}:{e.stamp}" for e in entries}}
    if checksum:
        identity["digests"] = {e.rel: e.digest() for e in entries}
    previous = read_json(marker)
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
    claim(dst, state)
    journal = state / "journal.tsv"
    previous = read_json(marker)
    if previous is not None and not archive and not journal.exists():  # files staged last time count as done
        same = previous.get("digests", {}) if "digests" in identity else None
        write_text(journal, "".join(f"{rel}\t{stamp}\n" for rel, stamp in previous.get("files", {}).items()
                                     if same is None or same.get(rel) == identity["digests"].get(rel)))
    marker.unlink(missing_ok=True)
    total = sum(e.size for e in entries)
    big = total / max(len(entries), 1) >= (1 << 20)
    # a network source hides its round trips behind many threads; from a local disk, large files gain from a
    # few, small ones are bound by system calls and lose to the thread hand-offs
    n_workers = workers or min(NETWORK_WORKERS if network else 4 if big else 1, len(entries)) or 1
    desc = f"staging {Path(src_text.rstrip('/')).name or src_text}"
    log.info("colabkit: staging %s (%d files, %s) from %s, %d at a time", src_text, len(entries),
             format_size(total), "the network" if network else "a local disk", n_workers)
    skipped = {}
    if archive:
        downloads = state / "archive"
        downloads.mkdir(exist_ok=True)
        if copy_all(entries, downloads, journal, workers=1, desc=desc, quiet=quiet, source=src_text):
            raise OSError(errno.ENAMETOOLONG, f"{src_text}: its name cannot be a file name in {downloads}; stage a "
                                              f"copy of the archive with a shorter, plain name.")
        arch = downloads / entries[0].rel
        _extract_into(arch, dst, state, extract_archive)
        arch.unlink()
        outputs = {p.relative_to(dst).as_posix() for p in _files(dst)}
    else:
        skipped = copy_all(entries, dst, journal, workers=n_workers, desc=desc, quiet=quiet, source=src_text)
        outputs = {e.rel for e in entries} - set(skipped)
        if not created or skipped:             # a mirror: drop what the source no longer has, and the folders
            _prune(dst, outputs)               # made for files that could not be written
    sizes = {e.rel: e.size for e in entries if e.rel in outputs} if not archive else \
        {rel: (dst / rel).stat().st_size for rel in outputs}
    write_json(marker, {**identity, "outputs": sorted(outputs), "sizes": sizes,
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
    check_space(dst, unpacked_size(archive), f"the contents of {archive.name}")
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
    previous = read_json(marker)
    if previous is not None and previous.get("source") == url and _intact(dst, previous):
        return dst
    claim(dst, state)
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
    write_json(marker, {"source": url, "outputs": outputs, "sizes": {r: (dst / r).stat().st_size for r in outputs}})
    return dst
