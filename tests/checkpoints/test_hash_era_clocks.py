"""Which sha256 checkpoints a BLAKE3 run counts as its own past does not hang on machines' clocks: an older
colabkit's checkpoints written beside the run are kept even when the upgraded machine's clock ran ahead, and a
forged ``blake3_since`` neither deletes a real checkpoint nor stops a save."""
from __future__ import annotations

import hashlib
import json
import shutil
import time
import warnings

import numpy as np
import pytest

from colabkit.checkpoints import Checkpoints
from colabkit.checkpoints.folder import CheckpointFolder
from colabkit.checkpoints.manifest import MANIFEST_NAME, _body_checksum


def _rewrite(ckpt_dir, **fields):
    """Change a committed checkpoint's manifest fields, as another machine (or a hostile hand) would have written
    them, keeping it self-consistent."""
    path = ckpt_dir / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    manifest.pop("checksum")
    manifest.update(fields)
    manifest = {k: v for k, v in manifest.items() if v is not None}
    manifest["checksum"] = _body_checksum(manifest)
    path.write_text(json.dumps(manifest))


def _as_sha256(ckpt_dir, created):
    """Turn a committed checkpoint into one as a colabkit from before BLAKE3 writes it (sha256 manifest)."""
    manifest = json.loads((ckpt_dir / MANIFEST_NAME).read_text())
    files = {rel: {"size": meta["size"], "sha256": hashlib.sha256((ckpt_dir / rel).read_bytes()).hexdigest()}
             for rel, meta in manifest["files"].items()}
    _rewrite(ckpt_dir, files=files, created=created, blake3_since=None)


def _save(where, step, **kw):
    store = Checkpoints(where, **kw)
    store.save(step, {"w": np.full(4, step, np.float32)})
    assert store.wait(30)
    store.close()
    return max(CheckpointFolder(where).committed(), key=lambda c: c.order_key())


def _older_colabkits_checkpoint(tmp_path, dest, step, created):
    scratch = tmp_path / f"older-{step}"
    info = _save(scratch, step)
    _as_sha256(info.path, created)
    shutil.move(str(info.path), str(dest / info.name))
    return info.name


def _resume(dest, **kw):
    store = Checkpoints(dest, **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = store.restore()
    return store, restored, [str(w.message) for w in caught]


def test_an_older_colabkits_checkpoints_are_kept_when_the_upgraded_machines_clock_ran_ahead(ck_env, tmp_path):
    dest = tmp_path / "run"
    past = _save(dest, 1)
    _as_sha256(past.path, time.time() - 7200)            # the run's own past, from before the upgrade
    store, restored, _ = _resume(dest)
    assert restored.step == 1
    store.save(2, {"w": np.full(4, 2, np.float32)})
    assert store.wait(30)
    store.close()
    [first] = [c for c in CheckpointFolder(dest).committed() if c.step == 2]
    ahead = time.time() + 3600                           # that machine's clock was an hour ahead
    _rewrite(first.path, created=ahead, blake3_since=ahead)
    # a machine with an older colabkit (its clock right) cannot read step 2 and saves a run of its own
    theirs = _older_colabkits_checkpoint(tmp_path, dest, 1, time.time())

    store, restored, said = _resume(dest, keep=1)
    assert restored.step == 2
    assert any("older colabkit" in m for m in said), said
    for step in (3, 4):
        store.save(step, {"w": np.full(4, step, np.float32)})
        assert store.wait(30)
    store.close()
    names = {c.name for c in CheckpointFolder(dest).committed()}
    assert theirs in names                               # that machine's work is kept
    assert past.name not in names                        # the run's own past is replaced


def test_a_forged_blake3_since_never_deletes_a_checkpoint_nor_stops_a_save(ck_env, tmp_path):
    dest = tmp_path / "run"
    first = _save(dest, 1)
    _rewrite(first.path, blake3_since=1e18)              # far in the future
    theirs = _older_colabkits_checkpoint(tmp_path, dest, 1, time.time())
    store, restored, said = _resume(dest, keep=1)
    assert restored.step == 1
    store.save(2, {"w": np.full(4, 2, np.float32)})
    assert store.wait(30)
    store.close()
    names = {c.name for c in CheckpointFolder(dest).committed()}
    assert theirs in names


def test_colabkit_checkpoints_names_the_older_colabkits_checkpoints_to_delete(ck_env, tmp_path, capsys):
    from colabkit.cli import main
    dest = tmp_path / "run"
    _save(dest, 1)
    theirs = _older_colabkits_checkpoint(tmp_path, dest, 1, time.time())   # the same step as this run's
    main(["checkpoints", str(dest)])
    lines = capsys.readouterr().out.splitlines()
    marked = [line for line in lines if "older colabkit" in line]
    assert len(marked) == 1 and theirs in marked[0], lines
    main(["checkpoints", str(dest), "--json"])
    rows = json.loads(capsys.readouterr().out)["checkpoints"]
    assert {(r["name"], r["hash"], r["older_colabkit"]) for r in rows} == {
        (theirs, "sha256", True), (next(r["name"] for r in rows if r["name"] != theirs), "blake3", False)}


@pytest.mark.fuse
@pytest.mark.slow
def test_sha256_checkpoints_a_first_save_could_not_see_are_not_taken_for_an_older_colabkits(
        ck_env, tmp_path, monkeypatch, drive_mount):
    import colabkit.checkpoints.uploader as uploader
    monkeypatch.setattr(uploader, "BACKOFF_START", 0.05)
    dest = drive_mount.my_drive / "run"
    past = _save(dest, 1, local_dir=tmp_path / "before")
    _as_sha256(drive_mount.backing / "MyDrive" / "run" / past.name, time.time() - 600)   # the run's past
    drive_mount.set_fault("enotconn")              # the first save after the upgrade cannot read the folder
    store = Checkpoints(str(dest), local_dir=tmp_path / "local", keep=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store.save(2, {"w": np.full(4, 2, np.float32)})
        drive_mount.set_fault("ok")
        assert store.wait(60), store.status
        store.save(3, {"w": np.full(4, 3, np.float32)})
        assert store.wait(60), store.status
    store.close()
    store, restored, said = _resume(str(dest), local_dir=tmp_path / "local2")
    store.close()
    assert restored.step == 3 and not said, said
    names = {c.name for c in CheckpointFolder(drive_mount.backing / "MyDrive" / "run").committed()}
    assert past.name not in names                  # replaced by retention as the run's own past


def test_a_manifest_whose_sha256_before_is_not_a_list_of_names_is_invalid_and_kept(ck_env, tmp_path):
    dest = tmp_path / "run"
    first = _save(dest, 1)
    _rewrite(first.path, sha256_before=[7])
    listing = CheckpointFolder(dest).scan()
    assert first.name in listing.invalid and "sha256_before" in listing.invalid[first.name]
    store, restored, said = _resume(dest, keep=1)
    assert restored is None and any("sha256_before" in m for m in said), said
    store.save(1, {"w": np.zeros(4, np.float32)})
    assert store.wait(30)
    store.close()
    assert first.path.is_dir()                      # never deleted
