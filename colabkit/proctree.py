"""The process tree (Linux /proc): the processes below a process, for signalling a whole tree (a job's in
jobs/, a guarded training's in guard/), and every process's parent (the GPU claims' accounted-for processes in
devices/claims.py). Ground: imports nothing of colabkit."""
from __future__ import annotations

import os

__all__ = ["descendants", "parents"]


def parents() -> dict:
    """{pid: its parent's pid} for every process (Linux /proc; elsewhere, or unreadable, empty)."""
    found = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            found[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return found


def descendants(pid: int) -> set:
    """PIDs of every process below `pid` (Linux /proc; elsewhere none, and the process group is signalled)."""
    children: dict = {}
    for child, parent in parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
