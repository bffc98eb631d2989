"""`colabkit checkpoints DIR`: what a checkpoint folder holds, for people and scripts."""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..units import format_duration, format_size
from .destinations import resolve_destination
from .folder import CheckpointFolder, CorruptCheckpoint, written_alongside_by_older_version


def checkpoints_report(location, *, verify: bool = False, as_json: bool = False) -> tuple[str, bool]:
    """(text, all_ok): the committed checkpoints in ``location``, oldest first; with ``verify``, each one's
    files are checked against its manifest. Folders without a valid manifest are counted as leftovers; folders
whose manifest cannot be read are listed as unreadable, and entries colabkit would never have written (a link,
a manifest with a field out of range) as invalid; both make ``all_ok`` False."""
    path = resolve_destination(location)
    if not isinstance(path, Path):
        folder = path                     # a back end that is not a filesystem (gdrive://)
    elif not path.is_dir():
        raise FileNotFoundError(f"{location!r} ({path}) is not a folder; pass the directory given to "
                                f"AutoResume or Checkpoints.")
    else:
        folder = CheckpointFolder(path)
    rows, ok = [], True
    listing = folder.scan()
    unreadable = {name: str(exc) for name, exc in listing.unreadable.items()}
    ok = not unreadable
    # an older colabkit's restart beside a BLAKE3 run: the resume's warning points here to find them by name
    older = {c.name for c in written_alongside_by_older_version(listing.committed)}
    for info in listing.committed:
        problem = None
        if verify:
            try:
                folder.verify(info, full=True)
            except CorruptCheckpoint as exc:
                problem, ok = str(exc), False
        rows.append({"name": info.name, "step": info.step, "epoch": info.epoch, "batch": info.batch,
                     "created": info.created, "size": info.size, "reason": info.manifest.get("info", {}).get("reason"),
                     "valid": None if not verify else problem is None, "problem": problem,
                     "hash": "blake3" if info.hash_era else "sha256",
                     "older_colabkit": info.name in older})
    leftovers, invalid = listing.incomplete, listing.invalid
    ok = ok and not invalid
    if as_json:
        return json.dumps({"location": str(location), "path": str(path), "checkpoints": rows,
                           "leftovers": leftovers, "unreadable": unreadable, "invalid": invalid}, indent=2), ok
    lines = [f"{path}: {len(rows)} committed checkpoint(s)" + (f", {len(leftovers)} leftover(s)" if leftovers else "")
             + (f", {len(unreadable)} UNREADABLE" if unreadable else "")
             + (f", {len(invalid)} INVALID" if invalid else "")]
    now = time.time()
    for r in rows:
        where = f"epoch {r['epoch']}, batch {r['batch']}" if r["epoch"] is not None else "-"
        status = "" if r["valid"] is None else ("  OK" if r["valid"] else f"  DAMAGED: {r['problem']}")
        lines.append(f"  step {r['step']:>8}  {where:<22} {format_size(r['size']):>10}  "
                     f"{format_duration(now - r['created'])} ago{status}")
        if r["older_colabkit"]:
            lines[-1] += (f"  {r['name']}: an older colabkit's restart beside this run (sha256), kept; delete it "
                          f"once every machine runs this version")
    lines += [f"  {name}  UNREADABLE: {error} (nothing is deleted while it cannot be read)"
              for name, error in sorted(unreadable.items())]
    lines += [f"  {name}  INVALID, not used: {why}" for name, why in sorted(invalid.items())]
    return "\n".join(lines), ok
