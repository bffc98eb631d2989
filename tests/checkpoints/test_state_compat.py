"""The state codec changed no byte on disk: checkpoints written by the colabkit before it (commit BEFORE_CODEC, run
from git history in a subprocess) restore with this one, this one writes the same state.json for the same state,
and the earlier colabkit reads what this one writes as far as the state goes (its manifests now record BLAKE3,
which that colabkit does not know: it refuses them, never misreads them). A hand-written state.json in the tags' exact shape restores too, without git history."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import colabkit
from colabkit.checkpoints import codec
from colabkit.checkpoints import digest as digest_mod
from colabkit.checkpoints import manifest as manifest_mod
from colabkit.checkpoints.folder import CheckpointFolder

HERE = Path(__file__).parent
REPO = HERE.parent.parent
WORKER = HERE / "state_compat_worker.py"


def _worker_module():
    spec = importlib.util.spec_from_file_location("ck_state_compat_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start(root: Path, env: dict, cache: Path, **spec):
    """The worker under the colabkit in ``root`` (the working tree, or the one taken from history)."""
    env = {**env, "PYTHONPATH": str(root), "XDG_CACHE_HOME": str(cache), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(WORKER), json.dumps(spec)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.root = root
    return proc


def _finish(proc, expect_rc=0):
    stdout, stderr = proc.communicate(timeout=600)
    explain = f"rc={proc.returncode}\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-4000:]}"
    assert proc.returncode == expect_rc, explain
    assert f"COLABKIT {proc.root / 'colabkit'}\n" in stdout, explain   # it ran the colabkit it was meant to
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    return (json.loads(lines[0][len("RESULT "):]) if lines else None), explain


def _newest(dest: Path) -> Path:
    return CheckpointFolder(dest).committed()[-1].path


def _arrays(ckpt: Path) -> dict:
    with np.load(ckpt / "arrays.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _assert_same_files(old: Path, new: Path):
    assert (old / "state.json").read_bytes() == (new / "state.json").read_bytes()
    before, now = _arrays(old), _arrays(new)
    assert sorted(before) == sorted(now)
    for key in before:
        assert before[key].dtype == now[key].dtype and np.array_equal(before[key], now[key]), key


def _as_stored(value):
    """What Checkpoints.save keeps of a value: tuples as lists, NumPy scalars as Python numbers."""
    if isinstance(value, dict):
        return {k: _as_stored(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_stored(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


def test_a_store_checkpoint_written_before_the_codec_restores_and_is_written_the_same(tmp_path, ck_env,
                                                                                     old_colabkit):
    worker = _worker_module()
    old = _start(old_colabkit, ck_env, tmp_path / "cache-old", kind="store", dest=str(tmp_path / "old"))
    new = _start(REPO, ck_env, tmp_path / "cache-new", kind="store", dest=str(tmp_path / "new"))
    _finish(old)
    _finish(new)
    _assert_same_files(_newest(tmp_path / "old"), _newest(tmp_path / "new"))

    with colabkit.Checkpoints(tmp_path / "old") as ckpt:
        restored = ckpt.restore()
    assert (restored.step, restored.epoch, restored.batch) == (7, 1, 2)
    assert worker.describe(restored.state) == worker.describe(_as_stored(worker.store_state(np)))


def test_a_torch_run_checkpointed_before_the_codec_resumes_bit_exactly(tmp_path, ck_env, old_colabkit):
    """The earlier colabkit runs uninterrupted (the reference) and is cut off mid-epoch (after the periodic save
    at step 9); this one is cut off at the same batch. The two checkpoints hold the same data. This colabkit
    resumes the earlier one's checkpoint and ends as the reference did, having trained the same batches, with
    every ar.state value of its own type. The earlier colabkit refuses this one's checkpoint (a BLAKE3 manifest):
    it starts over with a warning rather than use files it cannot verify."""
    pytest.importorskip("torch")
    ref = _start(old_colabkit, ck_env, tmp_path / "cache-ref", kind="torch", dest=str(tmp_path / "ref"))
    old_cut = _start(old_colabkit, ck_env, tmp_path / "cache-old", kind="torch", dest=str(tmp_path / "old"),
                     crash_at=[1, 4])
    new_cut = _start(REPO, ck_env, tmp_path / "cache-new", kind="torch", dest=str(tmp_path / "new"),
                     crash_at=[1, 4])
    expected, _ = _finish(ref)
    _finish(old_cut, 3)
    _finish(new_cut, 3)
    _assert_same_files(_newest(tmp_path / "old"), _newest(tmp_path / "new"))

    new_resumes = _start(REPO, ck_env, tmp_path / "cache-old", kind="torch", dest=str(tmp_path / "old"))
    old_resumes = _start(old_colabkit, ck_env, tmp_path / "cache-new", kind="torch", dest=str(tmp_path / "new"))
    resumed, explain = _finish(old_resumes)
    assert resumed["restored"] is None and "not 64 hex digits; the checkpoint is not used" in explain, explain
    resumed, explain = _finish(new_resumes)
    assert resumed["restored"] == [9, 1, 3], explain
    assert resumed["objects"] == expected["objects"], explain
    assert resumed["user"] == expected["user"], explain
    assert resumed["step"] == expected["step"]
    assert resumed["seen"] == [s for s in expected["seen"] if (s[0], s[1]) >= (1, 3)], explain


# -- without git history: the tags' exact shape, written by hand -------------------------------------------------

GOLDEN_TREE = """{"tree": {
  "w": {"__colabkit_array__": "a0"},
  "n": 5, "nested": [1, [2, 3], {"a": {"__colabkit_array__": "a1"}}, {"x": null}],
  "user": {"__colabkit_torch__": "tuple", "items": [
      1, {"__colabkit_torch__": "dtype", "name": "torch.float16"}, {"__colabkit_torch__": "device", "name": "cpu"},
      {"__colabkit_torch__": "dict", "items": [[0, "zero"], [null, "none"], ["__colabkit_torch__", 2]]},
      {"__colabkit_torch__": "tensor", "dtype": "bfloat16", "data": {"__colabkit_array__": "a2"}},
      {"__colabkit_torch__": "tensor", "dtype": "float32", "data": {"__colabkit_array__": "a1"}}]},
  "rng": {"numpy": {"keys": {"__colabkit_array__": "a3"}, "pos": 624, "has_gauss": 0, "cached_gaussian": 0.0}}
}}"""


def _resign(ckpt: Path, state_json: str) -> None:
    """Replace a committed checkpoint's state.json and sign its manifest again (as an earlier colabkit would
    have written both)."""
    (ckpt / "state.json").write_text(state_json)
    body = {k: v for k, v in json.loads((ckpt / manifest_mod.MANIFEST_NAME).read_text()).items() if k != "checksum"}
    for rel in body["files"]:
        digest, size = digest_mod.hash_file(ckpt / rel, name="sha256")
        body["files"][rel] = {"sha256": digest, "size": size}
    signed = {**body, "checksum": manifest_mod._body_checksum(body)}
    (ckpt / manifest_mod.MANIFEST_NAME).write_bytes(manifest_mod.dumps(signed))


def test_a_hand_written_state_in_the_old_tags_exact_shape_restores(tmp_path, ck_env):
    keys = np.random.RandomState(7).get_state()[1]
    bf16_bits = np.array([16256, -16512], dtype=np.int16)   # 1.0 and -1.0 as bfloat16
    with colabkit.Checkpoints(tmp_path / "dest") as ckpt:
        ckpt.save(3, {"a0": np.arange(4.0), "a1": np.ones(2, np.float32), "a2": bf16_bits, "a3": keys}, wait=True)
    _resign(_newest(tmp_path / "dest"), GOLDEN_TREE)

    with colabkit.Checkpoints(tmp_path / "dest") as ckpt:
        state = ckpt.restore().state
    np.testing.assert_array_equal(state["w"], np.arange(4.0))
    assert state["n"] == 5 and state["nested"][:2] == [1, [2, 3]] and state["nested"][3] == {"x": None}
    np.testing.assert_array_equal(state["nested"][2]["a"], np.ones(2, np.float32))
    assert state["user"]["__colabkit_torch__"] == "tuple"   # the store leaves the adapters' kinds to them
    np.testing.assert_array_equal(state["rng"]["numpy"]["keys"], keys)
    assert state["rng"]["numpy"]["keys"].dtype == np.uint32

    torch = pytest.importorskip("torch")
    importlib.import_module("colabkit.torch")   # registers the torch kinds
    user = codec.decode(state["user"], tags=codec.VALUE_TAGS)
    assert isinstance(user, tuple) and len(user) == 6
    assert user[:3] == (1, torch.float16, torch.device("cpu"))
    assert user[3] == {0: "zero", None: "none", "__colabkit_torch__": 2}
    assert user[4].dtype == torch.bfloat16 and user[4].tolist() == [1.0, -1.0]
    assert user[5].dtype == torch.float32 and user[5].tolist() == [1.0, 1.0]
