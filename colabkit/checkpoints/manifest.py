"""The manifest: the last file written into a checkpoint and the sole authority on whether it is complete.

It lists every file with size and hash (BLAKE3; sha256 in checkpoints written before: see digest.py), plus
step/epoch/batch, wall time and versions. It carries a checksum of its own body, so a manifest truncated or
half-synced by a Drive mount is rejected, not trusted.
"""
from __future__ import annotations

import hashlib
import json
import math
import platform
import time

from . import digest

FORMAT = "colabkit-checkpoint/1"
MANIFEST_NAME = "MANIFEST.json"
MAX_STEP = 2 ** 63 - 1        # what a framework's int64 step counter holds
MAX_GENERATION = 2 ** 31 - 1
MAX_FILE_SIZE = 2 ** 50       # 1 PiB: any size above it is a lie, and must not reach an allocation
MAX_MANIFEST_BYTES = 64 << 20  # ~400,000 files; a bigger manifest is not one colabkit wrote


class ManifestError(ValueError):
    """A manifest is missing, unparsable, of another format, or does not match its own checksum: the
    checkpoint was not completely written (or was damaged)."""


class InvalidManifest(ManifestError):
    """A manifest that is complete (it matches its own checksum) but that colabkit would never have written:
    a field missing, of the wrong type, out of range, or disagreeing with the folder's name. The checksum
    proves integrity, not authorship: anyone can edit a manifest and recompute it."""


def _body_checksum(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def build(*, step: int, epoch, batch, files: dict, info: dict | None = None, generation: int = 0,
          blake3_since: float | None = None, sha256_before=None) -> dict:
    """A manifest dict. ``files`` maps relative path -> {"size": int, digest.HASH: str}; ``generation`` counts
    the runs started over in the folder (see folder.names_to_keep); ``blake3_since``: when the folder's first
    BLAKE3 checkpoint was made, and ``sha256_before`` the names of the sha256 checkpoints the folder held then
    (see folder.written_alongside_by_older_version)."""
    from .._version import __version__
    body = {
        "format": FORMAT,
        "step": int(step),
        "epoch": None if epoch is None else int(epoch),
        "batch": None if batch is None else int(batch),
        "generation": int(generation),
        "created": time.time(),
        **({} if blake3_since is None else {"blake3_since": float(blake3_since)}),
        **({} if sha256_before is None else {"sha256_before": sorted(sha256_before)}),
        "files": {name: dict(meta) for name, meta in sorted(files.items())},
        "info": info or {},
        "versions": {"colabkit": __version__, "python": platform.python_version(), **_framework_versions()},
    }
    return {**body, "checksum": _body_checksum(body)}


def _framework_versions() -> dict:
    import sys
    versions = {}
    for name in ("numpy", "tensorflow", "keras"):
        module = sys.modules.get(name)  # report what is loaded; never import a framework for this
        if module is not None and hasattr(module, "__version__"):
            versions[name] = module.__version__
    return versions


def unsafe_path(rel) -> str | None:
    """Why a manifest's file path could not be written safely inside the checkpoint folder (None if it can): it
    must be relative, "/"-separated, without empty, "." or ".." parts, backslashes or NUL characters. A
    manifest read from Drive or a shared link is untrusted input; its paths are joined onto a local folder."""
    if not isinstance(rel, str) or not rel:
        return "which is not a file path"
    if rel.startswith("/") or "\\" in rel or "\0" in rel or (len(rel) > 1 and rel[1] == ":"):
        return "which is not a relative path"
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "which would point outside the checkpoint or at a folder"
    if rel == MANIFEST_NAME:
        return "which is the manifest's own name"
    return None


def dumps(manifest: dict) -> bytes:
    return (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()


def loads(data: bytes, where: str = "manifest") -> dict:
    """Parse, self-check and validate a manifest; raises ManifestError (incomplete or damaged) or
    InvalidManifest (complete, but with a field colabkit would never write), saying what is wrong."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{where} is not valid JSON ({exc}); the checkpoint was not completely written") from None
    except RecursionError:
        raise InvalidManifest(f"{where} is nested too deeply to be a manifest colabkit wrote") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ManifestError(f"{where} is not a {FORMAT} manifest")
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    try:
        intact = manifest.get("checksum") == _body_checksum(body)
    except (RecursionError, ValueError, TypeError):
        raise InvalidManifest(f"{where} is nested too deeply to be a manifest colabkit wrote") from None
    if not intact:
        raise ManifestError(f"{where} does not match its own checksum; it was damaged or partly written")
    problem = _field_problem(manifest)
    if problem:
        raise InvalidManifest(f"{where} {problem}; the checkpoint is not used")
    return manifest


def _whole(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _field_problem(manifest: dict) -> str | None:
    """What is wrong with a self-consistent manifest's fields (None when each has the type and range
    colabkit writes)."""
    if not _whole(manifest.get("step"), 0, MAX_STEP):
        return f"has step {manifest.get('step')!r}, not a whole number from 0 to {MAX_STEP}"
    for key in ("epoch", "batch"):
        if manifest.get(key) is not None and not _whole(manifest[key], 0, MAX_STEP):
            return f"has {key} {manifest[key]!r}, not a whole number from 0 to {MAX_STEP}"
    if not _whole(manifest.get("generation", 0), 0, MAX_GENERATION):
        return f"has generation {manifest.get('generation')!r}, not a whole number from 0 to {MAX_GENERATION}"
    for key in ("created", "blake3_since"):
        value = manifest.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            return f"has {key} {value!r}, not a time in seconds"
    before = manifest.get("sha256_before", [])
    if not isinstance(before, list) or not all(isinstance(name, str) for name in before):
        return f"has sha256_before {before!r}, not a list of checkpoint names"
    created = manifest.get("created")
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not math.isfinite(created) or created < 0:
        return f"has created {created!r}, not a time in seconds"
    for key in ("info", "versions"):
        if not isinstance(manifest.get(key, {}), dict):
            return f"has {key} of type {type(manifest[key]).__name__}, not an object"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return "lacks its file list"
    for rel, meta in files.items():
        why = unsafe_path(rel)
        if why:
            return f"lists the file {rel!r}, {why}"
        if not isinstance(meta, dict) or not _whole(meta.get("size"), 0, MAX_FILE_SIZE):
            return f"gives {rel!r} the size {meta.get('size') if isinstance(meta, dict) else meta!r}, not a byte count"
        why = digest.problem(meta)
        if why:
            return f"gives {rel!r} {why}"
    return None
