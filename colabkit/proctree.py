"""The processes below a process (Linux /proc), for signalling a whole tree: a job's (jobs/) or a guarded
training's (guard/). Ground: imports nothing of colabkit."""
from __future__ import annotations

import os

__all__ = ["descendants"]


def descendants(pid: int) -> set:
    """PIDs of every process below `pid` (Linux /proc; elsewhere none, and the process group is signalled)."""
    children: dict = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
