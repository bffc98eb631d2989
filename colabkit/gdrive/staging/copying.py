"""The copy: entries into a folder, several at a time, each file complete or absent, resumable.

Each file is written as ``<name>.colabkit-part`` and renamed when complete; completed files are journalled, so an
interrupted staging (a dropped mount, a killed kernel) continues where it stopped. The bytes still to copy must fit
on the destination disk, else InsufficientSpace (an OSError, ENOSPC) names both sizes before anything is written.
A name the destination's file system cannot hold is skipped with a warning naming it; the rest is copied. One tqdm
bar counts bytes, its postfix counts files.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...units import format_size
from ..links import new_file
from .bookkeeping import O_NOFOLLOW, read_text
from .sources import Entry

log = logging.getLogger("colabkit")

PART = ".colabkit-part"
# a name the destination's file system cannot hold: too long (a name, or the whole path), or characters or an
# encoding it refuses (vfat, exFAT, NTFS: EINVAL; strict UTF-8 file systems: EILSEQ)
_UNUSABLE_NAME = {errno.ENAMETOOLONG, errno.EINVAL, errno.EILSEQ}


class InsufficientSpace(OSError):
    """The destination disk cannot hold what staging would copy."""


def check_space(where: Path, need: int, what: str) -> None:
    probe = where
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if need > free:
        raise InsufficientSpace(errno.ENOSPC, f"Not enough disk space to stage {what}: it needs {format_size(need)} "
                                              f"at {where}, and only {format_size(free)} is free there. Free some "
                                              f"space or pass dst= on a larger disk.")


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


def copy_all(entries: list[Entry], into: Path, journal: Path, *, workers: int, desc: str, quiet: bool,
              source: str) -> dict:
    """Copy entries into ``into``, skipping the ones the journal lists as done; journal each completed file.
    Returns {rel: why} of the entries whose name the destination cannot hold: each is skipped with a warning
    naming it (``source``/rel), and the rest is copied."""
    done = {}
    for line in (read_text(journal) or "").splitlines():
        rel, _, stamp = line.partition("\t")
        done[rel] = stamp
    todo = []
    for e in entries:
        target = into / e.rel
        if done.get(e.rel) == f"{e.size}:{e.stamp}" and target.is_file() and target.stat().st_size == e.size:
            continue
        todo.append(e)
    total = sum(e.size for e in todo)
    check_space(into, total, desc)
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
    jfh = open(os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT | O_NOFOLLOW, 0o600), "a",
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
