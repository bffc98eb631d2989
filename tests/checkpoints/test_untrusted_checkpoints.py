"""The untrusted-checkpoint campaign, beside the fault campaign: a checkpoint folder someone else wrote.

A folder holds two committed checkpoints (steps 10 and 20). The newer one is then made hostile in turn: each
manifest field missing, of the wrong type, out of range or disagreeing with the folder's name, and hostile
files (links out of the folder, FIFOs, devices, compressed or oversized members), each re-signed (the
manifest's self-checksum recomputed, as anyone can). After each trial, a fresh ``restore()`` must give the
previous valid checkpoint (step 10) with a warning naming the bad one: it never hangs (a FIFO outside the
folder is the bait), never reads outside the folder, never allocates more than the declared sizes, and a
later save's retention deletes nothing outside the folder. ``colabkit checkpoints --verify`` lists the bad
entry without a traceback and exits non-zero.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import stat
import tracemalloc
import warnings
from pathlib import Path

import blake3
import numpy as np
import pytest

import colabkit
from colabkit.checkpoints import manifest as _manifest
from colabkit.checkpoints.folder import CheckpointFolder
from colabkit.cli import main as cli_main

pytestmark = pytest.mark.timeout(120)   # a trial that hangs on a FIFO fails here instead of stalling CI

W = 50_000   # floats per checkpoint: 400 kB


def _state(step):
    return {"w": np.full(W, float(step)), "step": step, "note": "x"}


@pytest.fixture
def two(tmp_path, ck_env):
    """A destination with committed steps 10 and 20; returns (dest, path of step 20's folder, outside dir)."""
    dest = tmp_path / "dest"
    with colabkit.Checkpoints(str(dest), keep=5) as ckpt:
        for step in (10, 20):
            ckpt.save(step, _state(step), wait=True)
    newest = CheckpointFolder(dest).committed()[-1]
    assert newest.step == 20
    outside = tmp_path / "outside"
    outside.mkdir()
    return dest, newest.path, outside


def resign(ckpt_dir: Path, change=lambda m: None, *, rehash=True) -> None:
    """Rewrite the manifest after ``change(manifest)``, with its file list re-hashed from what is in the
    folder (following links, as a careless writer's tool would) and its self-checksum recomputed."""
    path = ckpt_dir / _manifest.MANIFEST_NAME
    m = json.loads(path.read_text())
    if rehash:
        for rel in m["files"]:
            file = ckpt_dir / rel
            if file.is_file():
                data = file.read_bytes()
                m["files"][rel] = {"size": len(data), "blake3": blake3.blake3(data).hexdigest()}
    change(m)
    body = {k: v for k, v in m.items() if k != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    m["checksum"] = hashlib.sha256(_expand(canonical).encode()).hexdigest()
    path.write_text(_expand(json.dumps(m)))


DEEP = "@@deep@@"   # stands for a value nested 100,000 deep, which json.dumps cannot write


def _expand(text: str) -> str:
    return text.replace(f'"{DEEP}"', '{"a":' * 100_000 + "{}" + "}" * 100_000)


def _set(key, value):
    return lambda m: m.__setitem__(key, value)


def _delete(key):
    return lambda m: m.pop(key)


def _file_field(rel, key, value):
    return lambda m: m["files"][rel].__setitem__(key, value)


MANIFEST_TRIALS = {
    # step: missing, wrong type, out of range, disagreeing with the folder's name
    "step-missing": _delete("step"),
    "step-str": _set("step", "20"),
    "step-float": _set("step", 20.5),
    "step-bool": _set("step", True),
    "step-negative": _set("step", -1),
    "step-over-int64": _set("step", 2 ** 63),
    "step-10e18-other-name": _set("step", 10 ** 18),
    "step-21-other-name": _set("step", 21),
    "epoch-str": _set("epoch", "x"),
    "epoch-negative": _set("epoch", -5),
    "epoch-huge": _set("epoch", 10 ** 30),
    "batch-negative": _set("batch", -5),
    "batch-list": _set("batch", [1]),
    "generation-str": _set("generation", "1"),
    "generation-negative": _set("generation", -1),
    "generation-huge": _set("generation", 10 ** 12),
    "created-missing": _delete("created"),
    "created-str": _set("created", "abc"),
    "created-inf": _set("created", math.inf),
    "files-missing": _delete("files"),
    "files-list": _set("files", []),
    "size-str": _file_field("arrays.npz", "size", "12"),
    "size-10e15": _file_field("arrays.npz", "size", 10 ** 15),
    "size-negative": _file_field("state.json", "size", -1),
    "sha256-int": _file_field("state.json", "sha256", 123),
    "path-parent": lambda m: m["files"].__setitem__("../outside/secret", {"size": 1, "sha256": "0" * 64}),
    "path-absolute": lambda m: m["files"].__setitem__("/etc/hostname", {"size": 1, "sha256": "0" * 64}),
    "info-str": _set("info", "x"),
    "versions-list": _set("versions", []),
    "info-nested-100k": _set("info", DEEP),
}


@pytest.mark.parametrize("trial", list(MANIFEST_TRIALS))
def test_a_re_signed_manifest_with_a_bad_field_falls_back_to_the_previous_checkpoint(two, trial, capsys):
    dest, newest, outside = two
    resign(newest, MANIFEST_TRIALS[trial])
    _assert_falls_back(dest, newest, capsys)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


FILE_TRIALS = {
    # state.json replaced by a link to an identical copy outside: the hashes match; it must still not be read
    "state-link-same-bytes": lambda d, out: (_copy_then_link(d / "state.json", out / "state.json")),
    "state-fifo": lambda d, out: (d / "state.json").unlink() or _fifo(d / "state.json"),
    "state-link-to-fifo": lambda d, out: _fifo(out / "fifo") or _relink(d / "state.json", out / "fifo"),
    "arrays-link-to-device": lambda d, out: _relink(d / "arrays.npz", Path("/dev/zero")),
    "arrays-is-a-folder": lambda d, out: (d / "arrays.npz").unlink() or (d / "arrays.npz").mkdir(),
    "nested-folder-link": lambda d, out: _nested_link(d, out),
    "arrays-compressed": lambda d, out: _compressed(d / "arrays.npz"),
    "state-nested-100k": lambda d, out: (d / "state.json").write_text('{"tree": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    "state-tree-not-a-dict": lambda d, out: (d / "state.json").write_text('{"tree": [1, 2]}'),
    "state-missing-array": lambda d, out: (d / "state.json").write_text('{"tree": {"w": {"__colabkit_array__": "a9"}}}'),
}


def _copy_then_link(file: Path, copy: Path) -> None:
    copy.write_bytes(file.read_bytes())
    _relink(file, copy)


def _relink(file: Path, target: Path) -> None:
    file.unlink()
    file.symlink_to(target)


def _nested_link(ckpt: Path, outside: Path) -> None:
    """state.json moved into a sub-folder that is a link out of the checkpoint."""
    (outside / "sub").mkdir()
    (outside / "sub" / "state.json").write_bytes((ckpt / "state.json").read_bytes())
    (ckpt / "sub").symlink_to(outside / "sub")
    m = json.loads((ckpt / _manifest.MANIFEST_NAME).read_text())
    m["files"]["sub/state.json"] = m["files"].pop("state.json")
    (ckpt / _manifest.MANIFEST_NAME).write_text(json.dumps(m))
    (ckpt / "state.json").unlink()


def _compressed(arrays: Path) -> None:
    """A zip bomb: a deflated member that expands to 256 MiB from well under 1 MB."""
    arrays.unlink()
    with open(arrays, "wb") as fh:
        np.savez_compressed(fh, a0=np.zeros(32 << 20))
    assert arrays.stat().st_size < 1 << 20


@pytest.mark.parametrize("trial", list(FILE_TRIALS))
def test_a_hostile_file_in_a_re_signed_checkpoint_is_never_read_and_the_previous_one_is_used(two, trial, capsys):
    dest, newest, outside = two
    FILE_TRIALS[trial](newest, outside)
    resign(newest)
    before = _snapshot_outside(outside)
    _assert_falls_back(dest, newest, capsys)
    assert _snapshot_outside(outside) == before, "a file outside the checkpoint folder changed"


def test_a_checkpoint_named_entry_that_links_to_another_runs_checkpoint_is_neither_used_nor_deleted_through(
        tmp_path, ck_env):
    other = tmp_path / "other-run"
    with colabkit.Checkpoints(str(other), keep=5) as ckpt:
        ckpt.save(500, _state(500), wait=True)
    theirs = CheckpointFolder(other).committed()[0].path
    dest = tmp_path / "dest"
    with colabkit.Checkpoints(str(dest), keep=1) as ckpt:
        ckpt.save(1, _state(1), wait=True)
    (dest / "ckpt-000000000002-abcdef").symlink_to(theirs)
    fresh = colabkit.Checkpoints(str(dest), keep=1)
    with pytest.warns(RuntimeWarning, match="symbolic link"):
        restored = fresh.restore()
    assert restored.step == 1
    for step in (2, 3):   # retention runs after each save, keep=1
        fresh.save(step, _state(step), wait=True)
    fresh.close()
    assert (theirs / _manifest.MANIFEST_NAME).is_file(), "retention deleted through the link"
    assert CheckpointFolder(other).committed()[0].step == 500
    assert [c.step for c in CheckpointFolder(dest).committed()] == [3]


@pytest.mark.parametrize("step", [10 ** 12, 10 ** 15, 2 ** 63 - 2])
def test_steps_counted_in_tokens_stay_visible_and_are_pruned(tmp_path, ck_env, step, capsys):
    dest = tmp_path / "dest"
    with colabkit.Checkpoints(str(dest), keep=2) as ckpt:
        ckpt.save(5, _state(5), wait=True)
        for s in (step, step + 1):
            assert ckpt.save(s, _state(1), wait=True)
    fresh = colabkit.Checkpoints(str(dest))
    assert fresh.restore().step == step + 1
    fresh.close()
    assert [c.step for c in CheckpointFolder(dest).committed()] == [step, step + 1], "keep=2 pruned step 5"
    assert cli_main(["checkpoints", str(dest)]) == 0
    assert f"step {step + 1}" in capsys.readouterr().out


def test_a_step_beyond_int64_is_refused_when_saved(tmp_path, ck_env):
    with colabkit.Checkpoints(str(tmp_path / "dest")) as ckpt:
        with pytest.raises(ValueError, match=r"step=9223372036854775808 is invalid"):
            ckpt.save(2 ** 63, _state(1))
        with pytest.raises(ValueError, match=r"epoch=-1 is invalid"):
            ckpt.save(3, _state(1), epoch=-1)


def test_a_consistent_checkpoint_with_a_huge_step_is_restored_and_later_saves_stay_visible(tmp_path, ck_env):
    """A shared checkpoint that claims step 10**13 (consistently) is a real checkpoint: it is resumed, and the
    run's next saves are found after it, instead of capturing every later session."""
    dest = tmp_path / "dest"
    with colabkit.Checkpoints(str(dest)) as ckpt:
        ckpt.save(10 ** 13, _state(7), wait=True)
    with colabkit.Checkpoints(str(dest)) as ckpt:
        assert ckpt.restore().step == 10 ** 13
        ckpt.save(10 ** 13 + 50, _state(8), wait=True)
    with colabkit.Checkpoints(str(dest)) as ckpt:
        restored = ckpt.restore()
    assert restored.step == 10 ** 13 + 50 and restored.state["w"][0] == 8.0


def _snapshot_outside(outside: Path) -> dict:
    seen = {}
    for root, dirs, files in os.walk(outside):
        for name in files + dirs:
            p = Path(root, name)
            st = os.lstat(p)
            seen[str(p)] = (stat.S_IFMT(st.st_mode), p.read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return seen


def _assert_falls_back(dest: Path, bad: Path, capsys) -> None:
    fresh = colabkit.Checkpoints(str(dest), keep=1)
    tracemalloc.start()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            restored = fresh.restore()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # the two checkpoints declare 0.8 MB in all; a zip bomb or a lying size must not reach an allocation
    assert peak < 16 << 20, f"restore allocated {peak >> 20} MiB for checkpoints of 0.4 MB"
    assert restored is not None and restored.step == 10, f"restored {restored and restored.step}, not step 10"
    assert restored.state["w"][0] == 10.0 and restored.state["step"] == 10
    assert any(bad.name in str(w.message) for w in caught), [str(w.message) for w in caught]
    # the run goes on: its next save and retention work, and delete nothing outside the folder
    fresh.save(30, _state(30), wait=True)
    fresh.close()
    with contextlib.suppress(FileNotFoundError):
        assert colabkit.Checkpoints(str(dest)).restore().step == 30
    capsys.readouterr()
    code = cli_main(["checkpoints", str(dest), "--verify"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if bad.exists() or bad.is_symlink():
        assert code != 0 and bad.name in out, out
