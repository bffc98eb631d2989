"""A checkpoint's contents are untrusted: anyone can edit its state and re-sign its manifest (the checksum proves
integrity, not authorship). Each adapter checks everything a restored checkpoint holds before it changes anything
live; one that cannot be valid is skipped with a warning naming it, and the previous valid checkpoint is resumed.

Every case: a real run of the real adapter on a tiny model saves two checkpoints; the newer one is edited and
re-signed; a fresh run resumes, from the user's view, the older one.
"""
import importlib.util
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from colabkit.checkpoints import digest as digest_mod
from colabkit.checkpoints import manifest as manifest_mod

ARRAY = "__colabkit_array__"


def resign(ckpt_dir, mutate=None, *, files=None):
    """Edit a committed checkpoint and re-sign it: ``mutate(tree, arrays, manifest)`` changes state.json's tree,
    the arrays (name -> ndarray) and the manifest's body in place; ``files`` ({relative name: bytes}) replaces
    files outright. Every file's size and hash and the manifest's own checksum are then recomputed."""
    path = Path(ckpt_dir)
    body = {k: v for k, v in json.loads((path / manifest_mod.MANIFEST_NAME).read_text()).items() if k != "checksum"}
    if mutate is not None:
        doc = json.loads((path / "state.json").read_text())
        arrays = {}
        if (path / "arrays.npz").exists():
            with np.load(path / "arrays.npz", allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        mutate(doc["tree"], arrays, body)
        (path / "state.json").write_text(json.dumps(doc))
        if arrays:
            np.savez(path / "arrays.npz", **arrays)
    for rel, data in (files or {}).items():
        (path / rel).write_bytes(data)
    for rel in body["files"]:
        digest, size = digest_mod.hash_file(path / rel)   # the hash colabkit records now
        body["files"][rel] = {digest_mod.HASH: digest, "size": size}
    signed = {**body, "checksum": manifest_mod._body_checksum(body)}
    (path / manifest_mod.MANIFEST_NAME).write_bytes(manifest_mod.dumps(signed))
    try:   # intact: its checksum matches; a field the store itself refuses makes it skip the checkpoint there
        manifest_mod.loads((path / manifest_mod.MANIFEST_NAME).read_bytes())
    except manifest_mod.InvalidManifest:
        pass
    return path.name


def _sibling(name, folder="checkpoints"):
    """A test module of tests/FOLDER (tests/ is no package), for its model builders."""
    path = Path(__file__).resolve().parent.parent / folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"ck_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _array(tree_ref, arrays):
    return arrays[tree_ref[ARRAY]]


def _set_array(tree_ref, arrays, value):
    arrays[tree_ref[ARRAY]] = value


def _newest(dest):
    import colabkit
    return colabkit.Checkpoints(dest).list()[-1]


def resign_newest(dest, mutate=None, *, damage=None):
    """Edit and re-sign every copy of ``dest``'s newest checkpoint (the destination's and the local staging
    folder's, under the test's XDG_CACHE_HOME), as a damaged or tampered upload would have them all."""
    name = _newest(dest).name
    copies = [Path(dest) / name, *(Path(dest).parent / "cache").rglob(name)]
    for path in copies:
        if path.is_dir():
            resign(path, mutate, files=damage(path) if damage else None)
    return name


# -- Keras -----------------------------------------------------------------------------------------------------

def _keras_short_python_rng(tree, arrays, manifest):
    tree["rng"]["python"]["internal"] = tree["rng"]["python"]["internal"][:100]


def _keras_short_numpy_rng(tree, arrays, manifest):
    ref = tree["rng"]["numpy"]["keys"]
    _set_array(ref, arrays, _array(ref, arrays)[:10])


def _keras_short_tf_generator(tree, arrays, manifest):
    ref = tree["rng"]["tf_global_generator"]
    _set_array(ref, arrays, _array(ref, arrays)[:1])


def _keras_text_weight(tree, arrays, manifest):
    ref = tree["model"][-1]   # the last weight: the others would be assigned before it failed
    value = _array(ref, arrays)
    _set_array(ref, arrays, np.full(value.shape, "x"))


def _keras_paths_not_a_list(tree, arrays, manifest):
    tree["model_paths"] = 7


def _keras_callbacks_not_a_dict(tree, arrays, manifest):
    tree["callbacks"] = ["EarlyStopping"]


def _epoch_x(tree, arrays, manifest):
    manifest["epoch"] = "x"


def _batch_negative(tree, arrays, manifest):
    manifest["batch"] = -5


KERAS_CASES = {
    "short python RNG state": _keras_short_python_rng,
    "short numpy RNG state": _keras_short_numpy_rng,
    "short tf generator state": _keras_short_tf_generator,
    "a weight of text": _keras_text_weight,
    "variable paths not a list": _keras_paths_not_a_list,
    "callbacks not a dict": _keras_callbacks_not_a_dict,
    "epoch 'x'": _epoch_x,
    "batch -5": _batch_negative,
}


@pytest.mark.parametrize("mutate", KERAS_CASES.values(), ids=KERAS_CASES.keys())
def test_keras_skips_an_invalid_checkpoint_and_resumes_the_previous_one(tmp_path, ck_env, mutate):
    keras = pytest.importorskip("keras")
    import colabkit
    workers = _sibling("workers")
    x, y = workers.data(np)
    dest = tmp_path / "run"

    def fit(model, epochs):
        auto = colabkit.keras.AutoResume(str(dest), deadline=None, verbose=0)
        model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, callbacks=[auto])
        return auto

    model, _ = workers.build_model(keras)
    fit(model, 1)                                  # step 12 (epoch 1)
    at_step_12 = [w.copy() for w in model.get_weights()]
    fit(model, 2)                                  # step 24 (epoch 2), then edited
    bad = resign_newest(dest, mutate)

    fresh, _ = workers.build_model(keras, seed=99)
    with pytest.warns(RuntimeWarning, match=bad):
        auto = fit(fresh, 1)                       # resumed at epoch 1 of 1: nothing more is trained
    assert auto.restored.step == 12
    for got, want in zip(fresh.get_weights(), at_step_12):
        np.testing.assert_array_equal(got, want)


# -- PyTorch ---------------------------------------------------------------------------------------------------

def _torch_tiny(seed):
    torch = pytest.importorskip("torch")
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    return model, opt, sched


def _torch_train(ar, model, opt, sched, epochs):
    import torch
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(12, 3)), batch_size=4,
                                         shuffle=True)
    for _ in ar.epochs(epochs):
        for (xb,) in ar.batches(loader):
            opt.zero_grad()
            model(xb).sum().backward()
            opt.step()
        sched.step()


def _torch_scheduler_field_names_a_function(tree, arrays, manifest):
    tree["objects"]["sched"]["gamma"] = {"__colabkit_torch__": "dtype", "name": "seed"}


def _torch_short_rng(tree, arrays, manifest):
    ref = tree["rng"]["torch"]
    _set_array(ref, arrays, _array(ref, arrays)[:16])


def _torch_short_python_rng(tree, arrays, manifest):
    tree["rng"]["python"]["internal"] = tree["rng"]["python"]["internal"][:3]


def _torch_dtype_tag_disagrees_with_data(tree, arrays, manifest):
    tree["objects"]["model"]["weight"]["dtype"] = "bfloat16"


def _torch_optimizer_group_of_other_ids(tree, arrays, manifest):
    tree["objects"]["opt"]["param_groups"][0]["params"] = [5, 7]


def _torch_unknown_tag(tree, arrays, manifest):
    tree["objects"]["sched"]["base_lrs"] = {"__colabkit_torch__": "module", "name": "os"}


def _torch_weight_of_a_number(tree, arrays, manifest):
    tree["objects"]["model"]["bias"] = 0.5   # after the weight: torch's load would have copied that one


def _torch_lr_of_text(tree, arrays, manifest):
    tree["objects"]["opt"]["param_groups"][0]["lr"] = "fast"


TORCH_CASES = {
    "epoch 'x'": _epoch_x,
    "batch -5": _batch_negative,
    "scheduler field tagged as torch.seed": _torch_scheduler_field_names_a_function,
    "unknown tag": _torch_unknown_tag,
    "short torch RNG state": _torch_short_rng,
    "short python RNG state": _torch_short_python_rng,
    "dtype tag disagrees with the data": _torch_dtype_tag_disagrees_with_data,
    "optimizer group of other parameter ids": _torch_optimizer_group_of_other_ids,
    "learning rate of text": _torch_lr_of_text,
    "module weight of a number": _torch_weight_of_a_number,
}


@pytest.mark.parametrize("mutate", TORCH_CASES.values(), ids=TORCH_CASES.keys())
def test_torch_skips_an_invalid_checkpoint_and_resumes_the_previous_one(tmp_path, ck_env, mutate):
    torch = pytest.importorskip("torch")
    import colabkit
    dest = tmp_path / "run"
    model, opt, sched = _torch_tiny(0)
    ar = colabkit.torch.AutoResume(dest, model=model, opt=opt, sched=sched, deadline=None, verbose=0)
    _torch_train(ar, model, opt, sched, 1)          # step 3 (epoch 1)
    at_step_3 = {k: v.clone() for k, v in model.state_dict().items()}
    _torch_train(ar, model, opt, sched, 2)          # step 6 (epoch 2), then edited
    ar.close()
    bad = resign_newest(dest, mutate)

    fresh, fresh_opt, fresh_sched = _torch_tiny(5)
    with pytest.warns(RuntimeWarning, match=bad):
        ar = colabkit.torch.AutoResume(dest, model=fresh, opt=fresh_opt, sched=fresh_sched, deadline=None,
                                       verbose=0)
    assert (ar.step, ar.epoch, ar.batch) == (3, 1, 0)
    assert all(torch.equal(v, at_step_3[k]) for k, v in fresh.state_dict().items())
    assert fresh_sched.gamma == 0.5 and fresh_opt.param_groups[0]["lr"] == pytest.approx(0.005)
    _torch_train(ar, fresh, fresh_opt, fresh_sched, 2)   # and it trains on from there
    ar.close()


def test_torch_with_only_an_invalid_checkpoint_changes_nothing_and_starts_over(tmp_path, ck_env):
    torch = pytest.importorskip("torch")
    import random
    import colabkit
    dest = tmp_path / "run"
    model, opt, sched = _torch_tiny(0)
    ar = colabkit.torch.AutoResume(dest, model=model, opt=opt, sched=sched, deadline=None, verbose=0)
    _torch_train(ar, model, opt, sched, 1)
    ar.close()
    bad = resign_newest(dest, _torch_short_rng)

    fresh, fresh_opt, fresh_sched = _torch_tiny(5)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    rng_before = (torch.get_rng_state(), random.getstate())
    with pytest.warns(RuntimeWarning, match=bad):
        ar = colabkit.torch.AutoResume(dest, model=fresh, opt=fresh_opt, sched=fresh_sched, deadline=None,
                                       verbose=0)
    assert ar.restored is None and (ar.step, ar.epoch, ar.batch) == (0, 0, 0)
    assert all(torch.equal(v, before[k]) for k, v in fresh.state_dict().items())
    assert fresh_opt.state_dict()["state"] == {} and fresh_sched.last_epoch == 0
    assert torch.equal(torch.get_rng_state(), rng_before[0]) and random.getstate() == rng_before[1]
    ar.close()


def test_torch_refuses_a_module_tensor_torch_cannot_copy_and_changes_nothing(tmp_path, ck_env):
    """torch's load of a module copies every tensor it can and reports the others at the end: a checkpoint
    whose last tensor has a dtype torch cannot copy into the parameter's is refused before anything loads."""
    torch = pytest.importorskip("torch")
    import colabkit
    dest = tmp_path / "run"
    model, opt, sched = _torch_tiny(0)
    ar = colabkit.torch.AutoResume(dest, model=model, opt=opt, sched=sched, deadline=None, verbose=0)
    _torch_train(ar, model, opt, sched, 1)
    ar.close()

    def float4_bias(tree, arrays, manifest):
        ref = tree["objects"]["model"]["bias"]
        ref["dtype"] = "float4_e2m1fn_x2"   # stored as uint8, one byte per element
        _set_array(ref["data"], arrays, np.zeros(_array(ref["data"], arrays).shape, np.uint8))
    resign_newest(dest, float4_bias)

    fresh, fresh_opt, fresh_sched = _torch_tiny(5)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(colabkit.CheckpointError, match="bias is torch.float4_e2m1fn_x2 .*Nothing was restored"):
        colabkit.torch.AutoResume(dest, model=fresh, opt=fresh_opt, sched=fresh_sched, deadline=None, verbose=0)
    assert all(torch.equal(v, before[k]) for k, v in fresh.state_dict().items())
    assert fresh_opt.state_dict()["state"] == {} and fresh_sched.last_epoch == 0


# -- Lightning -------------------------------------------------------------------------------------------------

def _lightning_state_dict_not_a_dict(tree, arrays, manifest):
    tree["checkpoint"]["state_dict"] = [1, 2]


def _lightning_wrong_optimizer_group(tree, arrays, manifest):
    tree["checkpoint"]["optimizer_states"][0]["param_groups"][0]["params"] = [0]


def _lightning_epoch_x(tree, arrays, manifest):
    tree["checkpoint"]["epoch"] = "x"


def _lightning_global_step_disagrees(tree, arrays, manifest):
    tree["checkpoint"]["global_step"] = 999


def _lightning_short_rng(tree, arrays, manifest):
    ref = tree["checkpoint"]["callbacks"]["colabkit.AutoResume"]["rng"]["torch"]
    _set_array(ref, arrays, _array(ref, arrays)[:16])


def _lightning_weight_of_another_shape(tree, arrays, manifest):
    ref = tree["checkpoint"]["state_dict"]["net.0.weight"]["data"]
    _set_array(ref, arrays, _array(ref, arrays)[:2])


LIGHTNING_CASES = {
    "state_dict not a dict": _lightning_state_dict_not_a_dict,
    "wrong optimizer group": _lightning_wrong_optimizer_group,
    "epoch 'x'": _lightning_epoch_x,
    "manifest epoch 'x'": _epoch_x,
    "global_step disagrees with the manifest": _lightning_global_step_disagrees,
    "short RNG state": _lightning_short_rng,
}


@pytest.mark.parametrize("mutate", LIGHTNING_CASES.values(), ids=LIGHTNING_CASES.keys())
def test_lightning_skips_an_invalid_checkpoint_and_resumes_the_previous_one(tmp_path, ck_env, mutate):
    torch = pytest.importorskip("torch")
    L = pytest.importorskip("lightning")
    import colabkit
    lit = _sibling("test_lightning_resume", "torch")
    _build, _trainer = lit._build, lit._trainer

    dest = tmp_path / "run"
    model, loader = _build({"loader": "plain"})
    ar = colabkit.torch_lightning.AutoResume(dest, deadline=None, verbose=0)
    _trainer(tmp_path, ar, max_epochs=1).fit(model, loader, ckpt_path="last")    # step 6 (epoch 1)
    at_step_6 = {k: v.clone() for k, v in model.state_dict().items()}
    ar = colabkit.torch_lightning.AutoResume(dest, deadline=None, verbose=0)
    _trainer(tmp_path, ar, max_epochs=2).fit(model, loader, ckpt_path="last")    # step 12 (epoch 2), then edited
    bad = resign_newest(dest, mutate)

    class AtStart(L.Callback):
        def on_train_start(self, trainer, pl_module):
            self.weights = {k: v.clone() for k, v in pl_module.state_dict().items()}
            self.step = trainer.global_step

    fresh, loader = _build({"loader": "plain"})
    seen, ar = AtStart(), colabkit.torch_lightning.AutoResume(dest, deadline=None, verbose=0)
    trainer = _trainer(tmp_path, ar, max_epochs=2)
    trainer.callbacks.append(seen)
    with pytest.warns(RuntimeWarning, match=bad):
        trainer.fit(fresh, loader, ckpt_path="last")
    assert seen.step == 6
    assert all(torch.equal(v, at_step_6[k]) for k, v in seen.weights.items())
    assert trainer.global_step == 12   # and it trained on from there


def test_lightning_checkpoint_of_another_model_is_refused_and_changes_nothing(tmp_path, ck_env):
    torch = pytest.importorskip("torch")
    pytest.importorskip("lightning")
    import colabkit
    lit = _sibling("test_lightning_resume", "torch")
    _build, _trainer = lit._build, lit._trainer

    dest = tmp_path / "run"
    model, loader = _build({"loader": "plain"})
    ar = colabkit.torch_lightning.AutoResume(dest, deadline=None, verbose=0)
    _trainer(tmp_path, ar, max_epochs=1).fit(model, loader, ckpt_path="last")
    fresh, loader = _build({"loader": "plain"})
    fresh.net[4] = torch.nn.Linear(8, 3)   # another head: valid checkpoint, another model
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    ar = colabkit.torch_lightning.AutoResume(dest, deadline=None, verbose=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)   # not skipped as invalid: refused
        with pytest.raises(colabkit.CheckpointError, match=r"net\.4\.weight.*\(1, 8\).*\(3, 8\)"):
            _trainer(tmp_path, ar, max_epochs=2).fit(fresh, loader, ckpt_path="last")
    assert all(torch.equal(v, before[k]) for k, v in fresh.state_dict().items())


# -- TensorFlow checkpoint files (trackables) ------------------------------------------------------------------

def _tf_module(tf, value):
    module = tf.Module()
    module.a = tf.Variable(np.full(4, value, np.float32))
    module.b = tf.Variable(np.full(3, value, np.float32))
    return module


def _garbage_index(path):
    return {"tf/ckpt.index": b"not an sstable" * 8}


def _truncated_data(path):
    data = next(p for p in (path / "tf").iterdir() if p.name.startswith("ckpt.data"))
    return {f"tf/{data.name}": data.read_bytes()[:-40]}


def _flipped_data(path):
    data = next(p for p in (path / "tf").iterdir() if p.name.startswith("ckpt.data"))
    raw = bytearray(data.read_bytes())
    raw[4] ^= 0xFF
    return {f"tf/{data.name}": bytes(raw)}


TF_CASES = {"garbage index": _garbage_index, "truncated data": _truncated_data, "flipped data": _flipped_data}


@pytest.mark.parametrize("damage", TF_CASES.values(), ids=TF_CASES.keys())
def test_tensorflow_files_that_cannot_be_read_fall_back_to_the_previous_checkpoint(tmp_path, ck_env, damage):
    tf = pytest.importorskip("tensorflow")
    import colabkit
    dest = tmp_path / "run"
    with colabkit.Checkpoints(dest) as ckpt:
        ckpt.save(1, {"m": _tf_module(tf, 1.0)}, wait=True)
        ckpt.save(2, {"m": _tf_module(tf, 2.0)}, wait=True)
    bad = resign_newest(dest, damage=damage)

    live = _tf_module(tf, 7.0)
    with pytest.warns(RuntimeWarning, match=bad):
        restored = colabkit.Checkpoints(dest).restore(into={"m": live})
    assert restored.step == 1
    assert np.all(live.a.numpy() == 1.0) and np.all(live.b.numpy() == 1.0)


def test_tensorflow_checkpoint_of_another_shape_is_refused_without_half_assigning(tmp_path, ck_env):
    tf = pytest.importorskip("tensorflow")
    import colabkit
    dest = tmp_path / "run"
    with colabkit.Checkpoints(dest) as ckpt:
        ckpt.save(1, {"m": _tf_module(tf, 1.0)}, wait=True)
    live = tf.Module()
    live.a = tf.Variable(np.full(4, 7.0, np.float32))   # fits, and is restored first
    live.b = tf.Variable(np.full(5, 7.0, np.float32))   # does not fit
    with pytest.raises(colabkit.CheckpointError, match="does not fit"):
        colabkit.Checkpoints(dest).restore(into={"m": live})
    assert np.all(live.a.numpy() == 7.0) and np.all(live.b.numpy() == 7.0)
