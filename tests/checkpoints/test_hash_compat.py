"""Manifests record BLAKE3 now; checkpoints written before (sha256 manifests, by the colabkit of commit BEFORE_BLAKE3,
run from git history in a subprocess) still restore, and are still verified: a damaged one is skipped for the one
before it."""
from __future__ import annotations

import json
import subprocess
import sys
import warnings

import blake3
import numpy as np
import pytest

import colabkit
from colabkit.checkpoints.folder import CheckpointFolder
from colabkit.checkpoints.manifest import MANIFEST_NAME

torch = pytest.importorskip("torch")

# two saves of a small model and its Adam state, each after a step: prints the weights saved at each step
WRITER = """
import json, sys, torch, colabkit.torch
torch.manual_seed(0)
model = torch.nn.Linear(300, 200)
opt = torch.optim.Adam(model.parameters(), lr=0.1)
ar = colabkit.torch.AutoResume(sys.argv[1], model=model, opt=opt, deadline=None, verbose=0)
saved = {}
for step in (1, 2):
    opt.zero_grad(); model(torch.ones(1, 300)).sum().backward(); opt.step()
    ar.step = step; ar.save(); ar.checkpoints.wait()
    saved[step] = {"weight": model.weight.tolist(), "bias": model.bias.tolist(), "file": colabkit.__file__}
ar.close()
print("RESULT " + json.dumps(saved))
"""


@pytest.fixture
def sha256_run(sha256_colabkit, ck_env, tmp_path):
    """A folder holding steps 1 and 2 as the colabkit of BEFORE_BLAKE3 wrote them, and what each step saved."""
    dest = tmp_path / "run"
    env = {**ck_env, "PYTHONPATH": str(sha256_colabkit), "XDG_CACHE_HOME": str(tmp_path / "cache-old"),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", WRITER, str(dest)], env=env, capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert saved["1"]["file"].startswith(str(sha256_colabkit))   # it ran the colabkit from history
    return dest, saved


def _restore(dest):
    torch.manual_seed(1)
    model = torch.nn.Linear(300, 200)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ar = colabkit.torch.AutoResume(dest, model=model, opt=opt, deadline=None, verbose=0)
    ar.close()
    return ar, model, opt, [str(w.message) for w in caught]


def _assert_weights(model, saved):
    np.testing.assert_array_equal(model.weight.detach().numpy(), np.array(saved["weight"], np.float32))
    np.testing.assert_array_equal(model.bias.detach().numpy(), np.array(saved["bias"], np.float32))


def test_new_manifests_record_the_blake3_of_each_file(tmp_path, ck_env):
    with colabkit.Checkpoints(str(tmp_path / "dest"), local_dir=tmp_path / "local") as ckpt:
        ckpt.save(1, {"w": np.arange(300_000, dtype=np.float32)}, wait=True)
    [info] = CheckpointFolder(tmp_path / "dest").committed()
    files = json.loads((info.path / MANIFEST_NAME).read_text())["files"]
    assert set(files) == {"arrays.npz", "state.json"}
    for name, meta in files.items():
        assert set(meta) == {"size", "blake3"}
        assert meta["blake3"] == blake3.blake3((info.path / name).read_bytes()).hexdigest()


def test_a_checkpoint_with_a_sha256_manifest_restores_exactly(sha256_run, ck_env):
    dest, saved = sha256_run
    newest = CheckpointFolder(dest).committed()[-1]
    assert all(set(meta) == {"size", "sha256"} for meta in newest.manifest["files"].values())
    ar, model, opt, messages = _restore(dest)
    assert ar.restored.step == 2 and not messages
    _assert_weights(model, saved["2"])
    assert len(opt.state_dict()["state"]) == 2   # Adam's moments came back too


def test_a_damaged_sha256_checkpoint_is_detected_and_the_one_before_restores(sha256_run, ck_env):
    dest, saved = sha256_run
    newest = CheckpointFolder(dest).committed()[-1]
    arrays = newest.path / "arrays.npz"
    data = bytearray(arrays.read_bytes())
    data[len(data) // 2] ^= 0x01            # one bit, inside the weights: the size and the zip stay valid
    arrays.write_bytes(bytes(data))
    ar, model, _, messages = _restore(dest)
    assert ar.restored.step == 1
    assert any("damaged" in m and "sha256" in m for m in messages), messages
    _assert_weights(model, saved["1"])


# a training of ``steps`` saves from a seed: what a user's colabkit does when it finds nothing it can resume
TRAIN_FROM_SCRATCH = """
import json, sys, torch, colabkit.torch
torch.manual_seed(int(sys.argv[3]))
model = torch.nn.Linear(300, 200)
opt = torch.optim.Adam(model.parameters(), lr=0.1)
ar = colabkit.torch.AutoResume(sys.argv[1], model=model, opt=opt, deadline=None, verbose=0)
assert ar.restored is None or ar.restored.step == 0, ar.restored.step   # it found nothing it could use
for step in range(1, int(sys.argv[2]) + 1):
    opt.zero_grad(); model(torch.ones(1, 300)).sum().backward(); opt.step()
    ar.step = step; ar.save(); ar.checkpoints.wait()
print("RESULT " + json.dumps({"weight": model.weight.tolist(), "bias": model.bias.tolist(), "file": colabkit.__file__}))
ar.close()
"""


def _hash_of(info):
    """The hash a checkpoint's manifest records for its files."""
    [name] = {key for meta in info.manifest["files"].values() for key in meta if key != "size"}
    return name


def _train(dest, steps, seed, env, cwd):
    done = subprocess.run([sys.executable, "-c", TRAIN_FROM_SCRATCH, str(dest), str(steps), str(seed)], env=env,
                          capture_output=True, text=True, cwd=cwd, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT ", 1)[1]), done.stderr


def test_an_older_colabkits_restart_beside_this_versions_run_is_kept_and_never_outranks_it(
        sha256_colabkit, ck_env, tmp_path):
    """An older colabkit cannot read BLAKE3 manifests: in a folder holding this version's run (3 steps) it starts
    over and trains 5 steps of its own. An upgraded machine then resumes this version's step 3, says why, and its
    retention keeps both runs' checkpoints (the older run's are that machine's work)."""
    dest = tmp_path / "run"
    ours, _ = _train(dest, 3, 0, ck_env, tmp_path)
    old_env = {**ck_env, "PYTHONPATH": str(sha256_colabkit), "XDG_CACHE_HOME": str(tmp_path / "cache-old")}
    theirs, said = _train(dest, 5, 7, old_env, tmp_path)
    assert theirs["file"].startswith(str(sha256_colabkit))
    assert "sha256" in said            # the older colabkit said why it started over
    old = [c for c in CheckpointFolder(dest).committed() if _hash_of(c) == "sha256"]
    old_names = {c.name for c in old}
    assert sorted(c.step for c in old) == [3, 4, 5]   # its own retention (keep=3) kept its newest three

    ar, model, opt, messages = _restore(dest)
    assert ar.restored.step == 3
    _assert_weights(model, ours)
    assert len(messages) == 1 and "older colabkit" in messages[0] and "steps 3-5" in messages[0], messages

    # this run goes on with keep=2: its own older steps go, the older colabkit's run stays
    with pytest.warns(RuntimeWarning, match="older colabkit"):
        ar = colabkit.torch.AutoResume(dest, model=model, opt=opt, deadline=None, verbose=0, keep=2)
    for step in range(4, 7):
        ar.step = step
        ar.save()
        ar.checkpoints.wait()
    ar.close()
    committed = CheckpointFolder(dest).committed()
    assert sorted(c.step for c in committed if _hash_of(c) == "blake3") == [5, 6]
    assert {c.name for c in committed if _hash_of(c) == "sha256"} == old_names


def test_after_an_upgrade_the_runs_sha256_checkpoints_are_its_past_and_retention_replaces_them(sha256_run, ck_env):
    """The usual upgrade: the run's sha256 checkpoints were made before its first BLAKE3 one, so the resumed run
    ranks above them and its retention deletes them as its own are committed, with no warning."""
    dest, saved = sha256_run
    ar, model, opt, messages = _restore(dest)
    assert ar.restored.step == 2 and not messages
    ar = colabkit.torch.AutoResume(dest, model=model, opt=opt, deadline=None, verbose=0, keep=2)
    for step in (3, 4, 5):
        ar.step = step
        ar.save()
        ar.checkpoints.wait()
    ar.close()
    committed = CheckpointFolder(dest).committed()
    assert [(c.step, _hash_of(c)) for c in committed] == [(4, "blake3"), (5, "blake3")]
