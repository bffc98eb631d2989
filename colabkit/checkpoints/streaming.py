"""Saves of a training state that does not fit twice in free memory: written variable by variable.

A buffered save (buffers.py) copies the whole state into host buffers and writes it while training goes on,
which takes one more copy of the state in host memory. Before such buffers are allocated, the store asks
``fits``: free memory is the smaller of the kernel's MemAvailable and the room left under the memory limit of
this process's cgroup (a container, a Docker box, a job scheduler's slice), less a safety margin. When the
state does not fit, the save streams instead: each variable in turn is copied (device-to-host for GPU tensors)
into one small staging buffer, written into ``arrays.npz`` and hashed, then the next; training waits for the
whole write. The files, the manifest and the commit are those of a buffered save: a reader cannot tell them
apart.

``COLABKIT_TEST_CGROUP_ROOT`` names another cgroup filesystem root than /sys/fs/cgroup (tests point it at a
fake tree).
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from . import npz as _npz
from .state import Snapshot

STAGING_BYTES = 128 << 20      # the staging buffer: variables up to this size are copied through it
MARGIN_BYTES = 512 << 20       # kept free beyond the buffers: the interpreter, the framework, the writer's own
_ALIGN = 64                    # each variable's place in the staging buffer starts on a 64-byte boundary
_NO_LIMIT = 1 << 60            # cgroup v1 writes "no limit" as a huge number (9223372036854771712)


# -- how much memory this process may still take ------------------------------------------------------------
def meminfo_available(path="/proc/meminfo") -> int | None:
    """The kernel's estimate of memory available without swapping (MemAvailable), in bytes; None where there
    is no /proc/meminfo (macOS, Windows) or it lacks the field (kernels before 3.14)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def cgroup_headroom(root=None, self_cgroup: str | None = None) -> int | None:
    """Bytes this process may still take before its cgroup's memory limit (the tightest of its cgroup and
    every parent's): the limit less what is charged, not counting inactive file cache (the kernel reclaims it
    before it fails an allocation). None where no limit applies or cgroups cannot be read.

    root: the cgroup filesystem (default /sys/fs/cgroup, or COLABKIT_TEST_CGROUP_ROOT); self_cgroup: the text of
    /proc/self/cgroup (read when not given)."""
    root = Path(root or os.environ.get("COLABKIT_TEST_CGROUP_ROOT") or "/sys/fs/cgroup")
    if self_cgroup is None:
        try:
            self_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    v1_path = v2_path = None
    for line in self_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if "memory" in parts[1].split(","):
            v1_path = parts[2]
        elif parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
    if v1_path is not None and (root / "memory").is_dir():
        return _tightest(root / "memory", v1_path, "memory.limit_in_bytes", "memory.usage_in_bytes",
                         "total_inactive_file")
    if v2_path is not None and (root / "cgroup.controllers").exists():
        return _tightest(root, v2_path, "memory.max", "memory.current", "inactive_file")
    return None


def _tightest(base: Path, own: str, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    """The least headroom from the process's cgroup up to ``base``. In a container the cgroup path that
    /proc/self/cgroup names is often the host's, and the container sees its own cgroup at ``base``: then only
    ``base`` is read."""
    here = base / own.strip("/") if own.strip("/") else base
    if not here.is_dir():
        here = base
    least = None
    while True:
        room = _headroom_of(here, limit_file, usage_file, inactive_key)
        if room is not None:
            least = room if least is None else min(least, room)
        if here == base or base not in here.parents:
            return least
        here = here.parent


def _headroom_of(folder: Path, limit_file: str, usage_file: str, inactive_key: str) -> int | None:
    try:
        limit = (folder / limit_file).read_text().strip()
        if limit == "max" or int(limit) >= _NO_LIMIT:
            return None
        usage = int((folder / usage_file).read_text())
    except (OSError, ValueError):
        return None
    inactive = 0
    try:
        for line in (folder / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == inactive_key:
                inactive = int(value)
    except (OSError, ValueError):
        pass
    return max(0, int(limit) - max(0, usage - inactive))


def available_bytes() -> int | None:
    """What this process may still allocate: the smaller of MemAvailable and its cgroup's headroom (None when
    neither can be read)."""
    known = [n for n in (meminfo_available(), cgroup_headroom()) if n is not None]
    return min(known) if known else None


def fits(nbytes: int, available: int | None) -> bool:
    """Whether host buffers of ``nbytes`` fit in ``available`` bytes with the safety margin (True when the
    available memory is unknown: the buffered save is what colabkit did before it could tell)."""
    return available is None or nbytes + MARGIN_BYTES <= available


# -- one streamed save ---------------------------------------------------------------------------------------
class StreamedSave:
    """One save written variable by variable. ``placeholders`` stand for the host buffers in ``fill`` (arrays of
    the right shape and dtype that hold no memory); the state ``fill`` returns holds them where the copies go.
    ``snapshot(snap)`` turns each placeholder in the encoded state into an array that npz.write asks for just
    before writing it: ``copy(index, buffer)`` copies the variable into the staging buffer then."""

    def __init__(self, specs, copy):
        from .buffers import layout_of
        self.layout = layout_of(specs)
        self.nbytes = sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in self.layout)
        self._copy = copy
        self._staging, self._free = None, 0   # the staging buffer, and where its unused part begins
        self.placeholders, self._index, self._data = [], {}, {}
        for i, (shape, dtype) in enumerate(self.layout):
            backing = np.zeros(1, dtype)
            holder = np.lib.stride_tricks.as_strided(backing, shape, (0,) * len(shape), writeable=False)
            self.placeholders.append(holder)
            self._index[id(holder)] = i
            self._data[holder.__array_interface__["data"][0]] = i

    def host(self, index: int, caught_up=lambda: None) -> np.ndarray:
        """Variable ``index`` copied to host memory: into the next free part of the staging buffer, or (bigger
        than it) into an array of its own, let go once written. ``caught_up()`` returns once the writer is done
        with the memory handed out before: called before that memory is reused (the staging buffer wraps
        around) or another big array is allocated, so host memory stays within the staging buffer and one big
        variable, and many small variables cost no wait each."""
        shape, dtype = self.layout[index]
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if nbytes > STAGING_BYTES:
            caught_up()
            buffer = np.empty(shape, dtype)
        else:
            if self._staging is None:
                total = sum(int(np.prod(s)) * d.itemsize + _ALIGN for s, d in self.layout)
                self._staging = np.empty(max(1, min(STAGING_BYTES, total)), np.uint8)
            if self._free + nbytes > len(self._staging):
                caught_up()
                self._free = 0
            buffer = self._staging[self._free:self._free + nbytes].view(dtype).reshape(shape)
            self._free += -(-nbytes // _ALIGN) * _ALIGN
        self._copy(index, buffer)
        return buffer

    def read_all(self) -> None:
        """Copy every variable through the staging buffer, writing nothing (a worker that reads its variables as
        the one that writes does)."""
        for index in range(len(self.layout)):
            self.host(index)

    def snapshot(self, snap: Snapshot) -> Snapshot:
        """``snap`` with each placeholder replaced by a deferred array for npz.write."""
        arrays = {}
        for key, value in snap.arrays.items():
            index = self._index.get(id(value))
            if index is None:
                viewed = self._data.get(value.__array_interface__["data"][0])
                if viewed is not None:
                    raise RuntimeError(f"the state holds a view of snapshot buffer {viewed} "
                                       f"rather than the buffer itself, which a save written variable by variable "
                                       f"cannot fill; fill() must place the buffers it is given as they are.")
                arrays[key] = value
                continue
            shape, dtype = self.layout[index]
            arrays[key] = _npz.Deferred(shape, dtype, lambda caught_up, i=index: self.host(i, caught_up))
        return dataclasses.replace(snap, arrays=arrays)

    def close(self) -> None:
        """The save is written: let the staging buffer go."""
        self._staging, self._free = None, 0
