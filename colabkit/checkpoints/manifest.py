"""The manifest: the last file written into a checkpoint and the sole authority on whether it is complete.

It lists every file with size and sha256, plus step/epoch/batch, wall time and versions. It carries a
checksum of its own body, so a manifest truncated or half-synced by a Drive mount is rejected, not trusted.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time

FORMAT = "colabkit-checkpoint/1"
MANIFEST_NAME = "MANIFEST.json"
_CHUNK = 4 << 20


class ManifestError(ValueError):
    """A manifest is missing, unparsable, of another format, or does not match its own checksum."""


def sha256_file(path, *, fsync: bool = False) -> tuple[str, int]:
    """(hex digest, size) of a file; with ``fsync``, also flush it to stable storage."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
        if fsync:
            os.fsync(fh.fileno())
    return digest.hexdigest(), size


def _body_checksum(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def build(*, step: int, epoch, batch, files: dict, info: dict | None = None, generation: int = 0) -> dict:
    """A manifest dict. ``files`` maps relative path -> {"size": int, "sha256": str}; ``generation`` counts
    the runs started over in the folder (see folder.names_to_keep)."""
    from .._version import __version__
    body = {
        "format": FORMAT,
        "step": int(step),
        "epoch": None if epoch is None else int(epoch),
        "batch": None if batch is None else int(batch),
        "generation": int(generation),
        "created": time.time(),
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
    """Parse and self-check a manifest; raises ManifestError saying what is wrong."""
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{where} is not valid JSON ({exc}); the checkpoint was not completely written") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ManifestError(f"{where} is not a {FORMAT} manifest")
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    if manifest.get("checksum") != _body_checksum(body):
        raise ManifestError(f"{where} does not match its own checksum; it was damaged or partly written")
    if not isinstance(manifest.get("files"), dict) or not isinstance(manifest.get("step"), int):
        raise ManifestError(f"{where} lacks its file list or step")
    for rel in manifest["files"]:
        why = unsafe_path(rel)
        if why:
            raise ManifestError(f"{where} lists the file {rel!r}, {why}; the checkpoint is not used")
    if not isinstance(manifest.get("generation", 0), int):
        raise ManifestError(f"{where} has a generation that is not a whole number")
    return manifest
