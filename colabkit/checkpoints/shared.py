"""Continuing from someone's shared checkpoint (``resume_from``): pull it from a share link into the store.

A downloaded checkpoint is untrusted input: its manifest must pass its self-check, it may hold only the
data formats colabkit writes (``arrays.npz`` read without pickle, ``state.json``, a TensorFlow variables
checkpoint under ``tf/``), archive members may not escape the folder, and every file must match the
manifest's hash before it becomes a local checkpoint. Nothing is left behind when any of that fails.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from ..gdrive.links import LinkError, download_shared, extract_archive, is_archive, parse_link
from . import manifest as _manifest
from .folder import _NAME, CheckpointFolder, CheckpointInfo, CorruptCheckpoint, new_name

log = logging.getLogger("colabkit")

_SAFE_CHECKPOINT_FILE = re.compile(r"^(arrays\.npz|state\.json|tf/ckpt\.index|tf/ckpt\.data-\d{5}-of-\d{5})$")


def _find_checkpoint(folder: Path, url: str) -> CheckpointInfo:
    candidates = [folder] + sorted(p for p in folder.rglob("*") if p.is_dir())
    found, problems = [], []
    for path in candidates:
        if not (path / _manifest.MANIFEST_NAME).is_file():
            continue
        try:
            manifest = _manifest.loads((path / _manifest.MANIFEST_NAME).read_bytes(), where=f"{url} ({path.name})")
        except _manifest.ManifestError as exc:
            problems.append(str(exc))
            continue
        found.append(CheckpointInfo(path, manifest))
    if not found:
        detail = f" ({problems[0]})" if problems else ""
        raise LinkError(f"{url} does not hold a colabkit checkpoint: no valid {_manifest.MANIFEST_NAME} in it{detail}. "
                        f"Share the checkpoint folder (or a .zip/.tar of it) that AutoResume/Checkpoints wrote.")
    return max(found, key=CheckpointInfo.order_key)


def pull_checkpoint(url: str, into: CheckpointFolder, *, quiet: bool = True) -> CheckpointInfo:
    """Download a shared checkpoint (folder, a folder of checkpoints, or a .zip/.tar of either), check it,
    and commit it into the local CheckpointFolder ``into``. Returns its CheckpointInfo there."""
    kind, file_id = parse_link(url)
    into.path.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".shared-", dir=into.path.parent))
    try:
        got = download_shared(kind, file_id, tmp, quiet=quiet)
        if kind == "file":
            if not is_archive(got.name):
                raise LinkError(f"{url} is a file named {got.name!r}, not a checkpoint; share the checkpoint folder "
                                f"or a .zip/.tar(.gz) of it.")
            extract_archive(got, tmp / "extracted")
            got = tmp / "extracted"
        info = _find_checkpoint(got, url)
        unsafe = sorted(rel for rel in info.manifest["files"] if not _SAFE_CHECKPOINT_FILE.match(rel))
        if unsafe:
            raise LinkError(f"The shared checkpoint at {url} lists files colabkit does not read "
                            f"({', '.join(unsafe[:3])}); only arrays.npz, state.json and tf/ckpt.* are accepted.")
        name = info.path.name if _NAME.match(info.path.name) else new_name(info.step)
        staged = info.path.with_name(name)
        if staged != info.path:
            os.replace(info.path, staged)
        try:
            committed = into.copy_in(CheckpointInfo(staged, info.manifest), check_hashes=True, durable=False)
        except FileNotFoundError as exc:
            raise LinkError(f"The shared checkpoint at {url} is incomplete: {exc.filename} is missing.") from None
        except CorruptCheckpoint as exc:
            raise LinkError(f"The shared checkpoint at {url} does not match its manifest ({exc}); not used.") from None
        log.info("colabkit: pulled checkpoint step %s from %s", committed.step, url)
        return committed
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
