"""Finding complete new checkpoints in the watched folder, by polling (a walk of the folder every few seconds;
nothing runs in the training process).

A checkpoint is complete when its contents (every file's size, mtime and inode) have not changed for the
settle time, a folder holds one of its pattern's markers (the file its writer puts last), a file looks whole in
its own format (patterns.looks_whole), and no process holds one of its files open for writing (Linux /proc).
A folder or file seen before the guard started (or restored by it) counts as new again only once it changes.
While the training runs the guard only reads the folder; a restore before launch moves a differing file or
folder aside (NAME.colabkit-replaced-N), never deletes one.
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from ..checkpoints.files import open_for_writing
from .patterns import NOT_LAST_MARKERS, Pattern, ignored, looks_whole, step_in_name, whole_state

__all__ = ["Candidate", "Watcher"]

MAX_DEPTH = 6     # runs/train/exp/weights/last.pt is 4 deep


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A complete checkpoint: its path, its path under the watched folder (posix), whether a folder, the
    step in its name (or None), and the fingerprint it was complete with."""
    path: Path
    rel: str
    is_dir: bool
    step: int | None
    fingerprint: tuple


def fingerprint(path: Path, is_dir: bool) -> tuple | None:
    """What changes when anything in it is written: (relative name, size, mtime, inode) of every file; None
    when it vanished while being read."""
    try:
        if not is_dir:
            st = os.stat(path)
            return (("", st.st_size, st.st_mtime_ns, st.st_ino),)
        rows = []
        for folder, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                st = os.stat(os.path.join(folder, name))
                rows.append((os.path.relpath(os.path.join(folder, name), path), st.st_size, st.st_mtime_ns,
                             st.st_ino))
        return tuple(rows)
    except FileNotFoundError:
        return None


class Watcher:
    """Polls ``root`` for entries matching ``patterns``; ``complete(now)`` returns the new complete ones."""

    def __init__(self, root: Path, patterns, *, settle: float):
        self.root, self.patterns, self.settle = Path(root), tuple(patterns), settle
        self._seen: dict[str, tuple] = {}        # rel -> (fingerprint, monotonic time it was first seen)
        self._done: dict[str, tuple] = {}        # rel -> fingerprint already committed (or there at the start)

    def entries(self):
        """(rel, path, is_dir, pattern) of every entry matching a pattern; matched folders are not entered."""
        found = []

        def walk(folder: Path, prefix: str, depth: int):
            try:
                with os.scandir(folder) as it:
                    items = sorted(it, key=lambda e: e.name)
            except OSError:
                return
            for entry in items:
                if ignored(entry.name):
                    continue
                rel = f"{prefix}{entry.name}"
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                    if not is_dir and not entry.is_file(follow_symlinks=False):
                        continue
                except OSError:
                    continue
                pattern = next((p for p in self.patterns if p.matches(rel, entry.name, is_dir)), None)
                if pattern is not None:
                    found.append((rel, Path(entry.path), is_dir, pattern))
                elif is_dir and depth < MAX_DEPTH:
                    walk(Path(entry.path), rel + "/", depth + 1)
        walk(self.root, "", 1)
        return found

    def baseline(self) -> None:
        """What is there now counts as done: only what changes or appears from now on is committed."""
        for rel, path, is_dir, _ in self.entries():
            fp = fingerprint(path, is_dir)
            if fp is not None:
                self._done[rel] = fp

    def mark_done(self, rel: str, fp: tuple) -> None:
        self._done[rel] = fp

    def complete(self, now: float | None = None, *, writers_gone: bool = False, alive_until: float | None = None,
                 clean: bool = False) -> list[Candidate]:
        """New complete checkpoints, lowest step first. ``writers_gone``: the training has exited (it was last
        seen running at ``alive_until``, monotonic), so nothing is being written any more: a checkpoint counts
        when its contents prove it whole (a marker written last, such as trainer_state.json; a file's end
        record), when it was unchanged for the settle time while the writer still ran, or when the training
        exited by itself with status 0 (``clean``). A folder the writer died in the middle of (accelerate writes
        random_states_0.pkl before custom_checkpoint_0.pkl) is never taken."""
        now = time.monotonic() if now is None else now
        ready = []
        for rel, path, is_dir, pattern in self.entries():
            fp = fingerprint(path, is_dir)
            if not fp or self._done.get(rel) == fp:
                continue
            seen = self._seen.get(rel)
            if seen is None or seen[0] != fp:
                seen = self._seen[rel] = (fp, now)
                if not writers_gone:
                    continue
            elif now - seen[1] < self.settle and not writers_gone:
                continue
            if is_dir and not _has_marker(path, pattern) or not is_dir and not looks_whole(path):
                continue
            if writers_gone and not clean:
                stable = alive_until is not None and alive_until - seen[1] >= self.settle
                if not stable and not _proves_whole(path, is_dir, pattern):
                    continue
            ready.append(Candidate(path, rel, is_dir, step_in_name(path.name), fp))
        if ready and not writers_gone:
            busy = open_for_writing() or set()
            ready = [c for c in ready if not _open_in(c, busy)]
        return sorted(ready, key=lambda c: (c.step is None, c.step or 0, c.rel))


def _has_marker(path: Path, pattern: Pattern) -> bool:
    return not pattern.markers or any((path / m).is_file() for m in pattern.markers)


def _proves_whole(path: Path, is_dir: bool, pattern: Pattern) -> bool:
    """Whether its contents alone show that its writer finished it: a folder with a marker that is written last
    (not accelerate's random_states_0.pkl, which comes before custom_checkpoint_<i>.pkl and other ranks' files),
    a file whose format has an end to check (zip, pickle, safetensors)."""
    if is_dir:
        return any(m not in NOT_LAST_MARKERS and (path / m).is_file() for m in pattern.markers)
    return whole_state(path) == "whole"


def _open_in(candidate: Candidate, busy: set) -> bool:
    """Whether a process holds one of the candidate's files open for writing."""
    if not busy:
        return False
    paths = [candidate.path] if not candidate.is_dir else [candidate.path / row[0] for row in candidate.fingerprint]
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in busy:
            return True
    return False
