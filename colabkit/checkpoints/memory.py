"""New host memory for a checkpoint's bytes, its pages faulted in up front.

A restore reads the whole checkpoint into new memory before it is verified and handed to the framework, and a
run's first save copies the state into new snapshot buffers (buffers.py); the first touch of new memory costs
more than the read or the copy itself. NumPy asks for transparent huge pages for large arrays,
and faulting those in can stall (the kernel compacts memory to find them, or, in a VM, the host backs each one):
in a process that already holds a model of the same size, reading 2 GB into ``np.empty`` took 2.5-4.8 s,
into memory faulted in page by page 1.4 s, and into an anonymous mapping the kernel populated at ``mmap``
(MAP_POPULATE, ordinary pages) 0.8-0.9 s; 200 MB: 0.10-0.33 s, 0.15 s and 0.09-0.10 s
(``bench/fresh_memory.py``, bench/RESULTS.md). Elsewhere (no MAP_POPULATE: macOS, Windows) this is
``np.empty``.
"""
from __future__ import annotations

import mmap

import numpy as np

POPULATE_FROM = 4 << 20   # below this NumPy's own allocation is as cheap (and comes from its cache)


def new_bytes(nbytes: int) -> np.ndarray:
    """A writable uint8 array of ``nbytes`` whose pages are already faulted in (page-aligned) where the system
    can do that in one call; else ``np.empty``'s. Its memory goes back to the system when the last array viewing
    it is gone."""
    return new_array((nbytes,), np.uint8)


def _populated(nbytes: int) -> np.ndarray | None:
    """A uint8 array over a new anonymous mapping of ``nbytes`` populated by the kernel; None where the system
    has no MAP_POPULATE or the mapping failed (no address space for it: np.empty then meets the same failure)."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if not populate:
        return None
    try:
        mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    except (OSError, ValueError):
        return None
    return np.frombuffer(mapping, np.uint8)


def new_array(shape, dtype, *, fault_in: bool = False) -> np.ndarray:
    """``np.empty(shape, dtype)``, its pages faulted in as ``new_bytes``'s are. With ``fault_in``, an array the
    system does not populate (below POPULATE_FROM, or no MAP_POPULATE) is written once instead, so that every
    page of the result is faulted in whatever its size."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    populated = _populated(nbytes) if nbytes >= POPULATE_FROM and not dtype.hasobject else None
    if populated is not None:
        return populated.view(dtype).reshape(shape)
    array = np.empty(shape, dtype)
    if fault_in and not dtype.hasobject:
        array.fill(0)
    return array
