"""The hash that a manifest records for each file: BLAKE3 for checkpoints written now, sha256 for those written
before (which must still load and still be verified).

BLAKE3 because a verified restore reads every byte once and must not then wait for the hash: sha256 runs at
about 0.5-1 GB/s on one core, slower than reading from a local disk, while BLAKE3 (SIMD) runs at about 3 GB/s
on one core, in a thread beside the reads and writes. The ``blake3`` package is imported on first use, never
by ``import colabkit``.
"""
from __future__ import annotations

import hashlib
import os
import re

HASH = "blake3"                       # what new checkpoints record
KNOWN = ("blake3", "sha256")          # what a manifest may record, newest first
# A colabkit from before BLAKE3 cannot read BLAKE3 manifests: it takes them for damaged ones and starts over in
# the same folder, numbering its steps from 0 again. Its checkpoints must never outrank this version's, or an
# upgraded machine would resume that restart once its step passed the real run's (and retention would then
# delete the real run). So checkpoints rank first by the era of their hash: every BLAKE3 one above every sha256 one.
ERA = {"sha256": 0, "blake3": 1}
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 8 << 20


def hasher(name: str = HASH):
    """A new hash object (``update``, ``hexdigest``) of the kind ``name``; both release the GIL on large
    buffers, so hashing in a thread overlaps reading and writing."""
    if name == "sha256":
        return hashlib.sha256()
    if name != "blake3":
        raise ValueError(f"unknown checkpoint hash {name!r}; colabkit knows {', '.join(KNOWN)}")
    import blake3
    # one thread: blake3's multi-threaded mode uses a thread pool that a forked child (a DataLoader worker, a
    # multiprocessing fork) inherits without its threads; one core of BLAKE3 already outruns sha256 fourfold
    return blake3.blake3()


def recorded(meta: dict) -> tuple[str, str]:
    """(hash name, hex digest) that a manifest's file entry records: its blake3, else its sha256."""
    for name in KNOWN:
        if name in meta:
            return name, meta[name]
    raise KeyError("no file hash")


def era(files: dict) -> int:
    """The hash era of a manifest's ``files`` (see ERA): 1 when any file records BLAKE3, else 0."""
    return max((ERA[name] for meta in files.values() for name in KNOWN if name in meta), default=0)


def problem(meta: dict) -> str | None:
    """What is wrong with a manifest file entry's hash (None when it records exactly one known hash, as 64
    hex digits)."""
    names = [name for name in KNOWN if name in meta]
    if len(names) != 1:
        return f"records {' and '.join(names) or 'no hash'}, not one of {' or '.join(KNOWN)}"
    value = meta[names[0]]
    if not isinstance(value, str) or not _HEX64.match(value):
        return f"the {names[0]} {value!r}, not 64 hex digits"
    return None


def hash_file(path, *, fsync: bool = False, name: str = HASH) -> tuple[str, int]:
    """(hex digest, size) of a file (a path, or a binary file open for reading); with ``fsync``, also flush
    it to stable storage."""
    if hasattr(path, "read"):
        return _hash_stream(path, fsync, name)
    with open(path, "rb") as fh:
        return _hash_stream(fh, fsync, name)


def _hash_stream(fh, fsync: bool, name: str) -> tuple[str, int]:
    digest, size = hasher(name), 0
    while chunk := fh.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    if fsync:
        os.fsync(fh.fileno())
    return digest.hexdigest(), size
