"""The framework-neutral checkpoint store: commit protocol, verification, fallback, retention, faults."""
import json
import time
import warnings

import numpy as np
import pytest

import colabkit
from colabkit.checkpoints.folder import CheckpointFolder
from colabkit.checkpoints.manifest import MANIFEST_NAME
from tests.waiting import wait_for


def make(tmp_path, **kw):
    return colabkit.Checkpoints(str(tmp_path / "dest"), local_dir=tmp_path / "local", **kw)


def test_save_restore_roundtrip_with_json_arrays_and_nesting(tmp_path, ck_env):
    with make(tmp_path) as ckpt:
        assert ckpt.restore() is None
        w = np.arange(12, dtype=np.float32).reshape(3, 4)
        ckpt.save(7, {"w": w, "epoch": 2, "opt": {"lr": 0.1, "m": [np.ones(2), "adam"]}, "flag": None}, wait=True)
        w[:] = -1  # the snapshot must not alias the caller's array
    restored = make(tmp_path).restore()
    assert restored.step == 7
    np.testing.assert_array_equal(restored.state["w"], np.arange(12, dtype=np.float32).reshape(3, 4))
    assert restored.state["w"].dtype == np.float32
    assert restored.state["epoch"] == 2 and restored.state["flag"] is None
    assert restored.state["opt"]["lr"] == 0.1 and restored.state["opt"]["m"][1] == "adam"
    np.testing.assert_array_equal(restored.state["opt"]["m"][0], np.ones(2))


def test_manifest_lists_every_file_with_size_and_hash(tmp_path, ck_env):
    with make(tmp_path) as ckpt:
        ckpt.save(3, {"w": np.zeros(1000)}, epoch=1, batch=5, wait=True)
    [info] = CheckpointFolder(tmp_path / "dest").committed()
    manifest = json.loads((info.path / MANIFEST_NAME).read_text())
    assert manifest["step"] == 3 and manifest["epoch"] == 1 and manifest["batch"] == 5
    assert set(manifest["files"]) == {"arrays.npz", "state.json"}
    for name, meta in manifest["files"].items():
        assert (info.path / name).stat().st_size == meta["size"]
        assert len(meta["blake3"]) == 64
    assert manifest["versions"]["colabkit"] == colabkit.__version__


def test_folder_without_manifest_is_never_chosen_and_another_writers_is_cleaned_only_after_a_grace(
        tmp_path, ck_env, monkeypatch):
    from colabkit.checkpoints import uploader
    with make(tmp_path) as ckpt:
        ckpt.save(1, {"w": np.ones(3)}, wait=True)
    dest = tmp_path / "dest"
    partial = dest / "ckpt-000000000099-abcdef"
    partial.mkdir()
    (partial / "arrays.npz").write_bytes(b"partial")
    assert make(tmp_path).restore().step == 1
    with make(tmp_path) as ckpt:
        ckpt.restore()
        ckpt.save(2, {"w": np.ones(3)}, wait=True)
    assert partial.exists(), "another writer's folder without a manifest may still be uploading (Drive lags)"
    monkeypatch.setattr(uploader, "LEFTOVER_GRACE_S", 0.0)
    with make(tmp_path) as ckpt:
        ckpt.restore()
        ckpt.save(3, {"w": np.ones(3)}, wait=True)
    assert not partial.exists(), "a leftover older than the grace period should be removed after a newer commit"


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "manifest"])
def test_damaged_newest_falls_back_to_previous_with_warning(tmp_path, ck_env, damage):
    with make(tmp_path) as ckpt:
        ckpt.save(1, {"w": np.full(100, 1.0)}, wait=True)
        ckpt.save(2, {"w": np.full(100, 2.0)}, wait=True)
    newest = CheckpointFolder(tmp_path / "dest").committed()[-1].path
    target = newest / "arrays.npz"
    if damage == "flip":
        data = bytearray(target.read_bytes()); data[-50] ^= 0xFF; target.write_bytes(bytes(data))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:100])
    elif damage == "delete":
        target.unlink()
    else:
        (newest / MANIFEST_NAME).write_text((newest / MANIFEST_NAME).read_text()[:-40])
    import shutil
    shutil.rmtree(tmp_path / "local")  # a fresh VM: only the destination copy exists
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = make(tmp_path).restore()
    assert restored.step == 1 and restored.state["w"][0] == 1.0
    if damage != "manifest":  # a bad manifest means "never committed": skipped silently
        assert any("damaged" in str(w.message) and "step 2" in str(w.message) for w in caught)


def test_local_copy_is_used_when_destination_copy_is_bad(tmp_path, ck_env):
    with make(tmp_path) as ckpt:
        ckpt.save(5, {"w": np.full(10, 5.0)}, wait=True)
    [info] = CheckpointFolder(tmp_path / "dest").committed()
    (info.path / "arrays.npz").write_bytes(b"garbage")
    restored = make(tmp_path).restore()
    assert restored.step == 5 and restored.source == "local"


def test_retention_keeps_newest_and_never_deletes_before_commit(tmp_path, ck_env):
    with make(tmp_path, keep=2) as ckpt:
        for step in range(1, 6):
            ckpt.save(step, {"w": np.full(10, float(step))}, wait=True)
            steps = [c.step for c in CheckpointFolder(tmp_path / "dest").committed()]
            assert steps[-1] == step and len(steps) >= min(step, 2)  # the previous good one is still there
    assert [c.step for c in CheckpointFolder(tmp_path / "dest").committed()] == [4, 5]
    assert [c.step for c in CheckpointFolder(tmp_path / "local").committed()] == [4, 5]


def test_keep_every_keeps_one_per_interval(tmp_path, ck_env):
    created = []
    with make(tmp_path, keep=1, keep_every=0.3) as ckpt:
        for step in range(6):
            ckpt.save(step, {"w": np.zeros(2)}, wait=True)
            created.append(ckpt.status.last_uploaded.created)
            time.sleep(0.12)
    # which ones are first in their 0.3 s interval depends on how long the saves took: count from commit times
    expected, last = [], None
    for step, t in enumerate(created):
        if last is None or t - last >= 0.3:
            expected.append(step)
            last = t
    steps = [c.step for c in CheckpointFolder(tmp_path / "dest").committed()]
    assert steps == sorted({*expected, 5}) and steps[0] == 0 and len(steps) >= 3, (steps, created)


def test_saves_faster_than_uploads_are_coalesced(tmp_path, ck_env):
    with make(tmp_path, keep=50) as ckpt:
        for step in range(40):
            ckpt.save(step, {"w": np.full(1_000_000, float(step))})  # 8 MB: writing outlasts a snapshot
        assert ckpt.wait(30)
        dropped = ckpt.status.saves_dropped
    steps = [c.step for c in CheckpointFolder(tmp_path / "dest").committed()]
    assert steps[-1] == 39, "the newest state is always uploaded"
    assert dropped > 0 and len(steps) + dropped == 40


def test_destination_fault_keeps_training_warns_once_and_recovers(tmp_path, ck_env, caplog, monkeypatch):
    import colabkit.checkpoints.uploader as uploader
    monkeypatch.setattr(uploader, "BACKOFF_START", 0.05)
    dest = tmp_path / "dest"
    dest.parent.mkdir(exist_ok=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = make(tmp_path)
        dest.write_text("not a folder")  # any OSError on the destination: ENOTDIR here
        for step in range(1, 4):
            ckpt.save(step, {"w": np.full(10, float(step))})
            assert not ckpt.wait(0.3)
        # set by the uploader thread, which may still be writing step 3 locally
        status = ckpt.status
        assert wait_for(lambda: status.last_local is not None and status.last_local.step == 3
                          and status.state == "retrying" and "NotADirectoryError" in (status.last_error or "")
                          ), status
        assert [c.step for c in CheckpointFolder(tmp_path / "local").committed()][-1] == 3
        dest.unlink()                    # the destination comes back
        assert ckpt.wait(10)
        ckpt.close()
    fault_warnings = [w for w in caught if "could not upload" in str(w.message)]
    assert len(fault_warnings) == 1, "one warning per outage, not one per retry"
    assert "kept on local disk" in str(fault_warnings[0].message)
    assert [c.step for c in CheckpointFolder(dest).committed()] == [3]


def test_object_arrays_and_unknown_types_are_rejected(tmp_path, ck_env):
    with make(tmp_path) as ckpt:
        with pytest.raises(ValueError, match="object array"):
            ckpt.save(1, {"bad": np.array([{"a": 1}], dtype=object)})
        with pytest.raises(ValueError, match="set"):
            ckpt.save(1, {"bad": {1, 2}})
        with pytest.raises(ValueError, match="step=-1"):
            ckpt.save(-1, {})


def test_pickled_payload_is_never_loaded(tmp_path, ck_env):
    """A checkpoint whose arrays.npz holds a pickle (and matches its manifest) is refused, not unpickled."""
    with make(tmp_path) as ckpt:
        ckpt.save(1, {"w": np.zeros(2)}, wait=True)
    [info] = CheckpointFolder(tmp_path / "local").committed()
    marker = tmp_path / "pwned"
    np.savez(info.path / "arrays.npz", a0=np.array([_Evil(str(marker))], dtype=object))
    # re-commit so checksums match: an attacker controls the whole folder
    manifest = json.loads((info.path / MANIFEST_NAME).read_text())
    folder = CheckpointFolder(tmp_path / "local")
    (info.path / MANIFEST_NAME).unlink()
    folder.commit(info.path, step=manifest["step"])
    import shutil
    shutil.rmtree(tmp_path / "dest")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert make(tmp_path).restore() is None
    assert not marker.exists()


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("kwargs, message", [
    ({"keep": 0}, "keep=0"), ({"keep": "3"}, "keep='3'"), ({"keep_every": "soon"}, "keep_every='soon'")])
def test_invalid_arguments_name_the_value(tmp_path, ck_env, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(tmp_path, **kwargs)


@pytest.mark.parametrize("directory", ["", "   ", None, "drive:"])
def test_empty_directory_is_rejected(ck_env, directory):
    with pytest.raises(ValueError, match="drive:"):
        colabkit.Checkpoints(directory)


def test_drive_location_uses_configured_drive_root(tmp_path, ck_env):
    with colabkit.Checkpoints("drive:runs/gan") as ckpt:
        ckpt.save(1, {"x": 1}, wait=True)
    assert CheckpointFolder(tmp_path / "drive" / "runs" / "gan").committed()[0].step == 1


def test_trackables_restore_in_place(tmp_path, ck_env):
    tf = pytest.importorskip("tensorflow")
    v = tf.Variable([1.0, 2.0])
    module = tf.Module()
    module.w = tf.Variable(tf.ones((2, 3)))
    with make(tmp_path) as ckpt:
        ckpt.save(4, {"v": v, "gen": module, "epoch": 1}, wait=True)
    v.assign([0.0, 0.0]); module.w.assign(tf.zeros((2, 3)))
    restored = make(tmp_path).restore(into={"v": v, "gen": module})
    assert restored.state["epoch"] == 1
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(module.w.numpy(), np.ones((2, 3)))


def test_retention_never_deletes_a_save_still_being_written(tmp_path, ck_env):
    """A save with TensorFlow objects writes them into its folder on the calling thread, while the uploader
    thread commits the save before it and prunes the staging folder (keep=1), where a folder without a
    manifest is an interrupted write to delete: the folder of the save in progress is never taken for one."""
    tf = pytest.importorskip("tensorflow")
    big = tf.Variable(tf.zeros((32, 1024, 1024)))   # 128 MB: written long after the step before is committed
    leftover = tmp_path / "local" / "ckpt-000000000000-dead00"    # an interrupted write of an earlier session
    leftover.mkdir(parents=True)
    with make(tmp_path, keep=1) as ckpt:
        for step in range(1, 7, 2):
            big.assign_add(tf.ones_like(big))
            ckpt.save(step, {"w": np.full(3, float(step))})           # committed and pruned in the background
            ckpt.save(step + 1, {"big": big, "step": step + 1})       # meanwhile: written on this thread
        assert ckpt.wait(60)
    big.assign(tf.zeros_like(big))
    restored = make(tmp_path).restore(into={"big": big})
    assert restored.step == 6 and restored.state["step"] == 6 and float(big[0, 0, 0]) == 3.0
    assert not leftover.exists(), "a folder without a manifest that no save is writing is a leftover to delete"


def test_a_run_that_did_not_resume_cannot_save_below_the_folders_newest_step(tmp_path, ck_env):
    with make(tmp_path, keep=2) as ckpt:
        ckpt.save(10, {"w": np.zeros(3)}, wait=True)
        ckpt.save(11, {"w": np.zeros(3)}, wait=True)
    with make(tmp_path, keep=2) as ckpt, pytest.raises(colabkit.CheckpointError, match=r"holds step 11.*fresh=True"):
        ckpt.save(0, {"w": np.ones(3)}, wait=True)
    steps = sorted(c.step for c in CheckpointFolder(tmp_path / "dest").committed())
    assert steps == [10, 11]


def test_fresh_starts_a_new_run_whose_checkpoints_outrank_the_earlier_runs(tmp_path, ck_env):
    with make(tmp_path, keep=2) as ckpt:
        ckpt.save(10, {"w": np.zeros(3)}, wait=True)
        ckpt.save(11, {"w": np.zeros(3)}, wait=True)
    with make(tmp_path, keep=2, fresh=True) as ckpt:
        assert ckpt.save(0, {"w": np.ones(3)}, wait=True)
    assert sorted(c.step for c in CheckpointFolder(tmp_path / "dest").committed()) == [0, 11], \
        "the earlier run's newest stays until the new run has `keep` checkpoints"
    with make(tmp_path, keep=2) as ckpt:
        assert ckpt.restore().step == 0, "the new run's checkpoint is the newest"
        ckpt.save(1, {"w": np.ones(3)}, wait=True)
    assert sorted(c.step for c in CheckpointFolder(tmp_path / "dest").committed()) == [0, 1]
    restored = make(tmp_path).restore()
    assert restored.step == 1 and restored.state["w"][0] == 1.0


def test_fresh_must_be_a_bool(tmp_path, ck_env):
    with pytest.raises(ValueError, match="fresh='yes'"):
        make(tmp_path, fresh="yes")


def test_damaged_local_copy_falls_back_to_the_destination_copy_of_the_same_checkpoint(tmp_path, ck_env):
    with make(tmp_path, keep=1) as ckpt:
        ckpt.save(3, {"w": np.full(10, 3.0)}, wait=True)
    [local] = CheckpointFolder(tmp_path / "local").committed()
    (local.path / "arrays.npz").write_bytes(b"\0" * local.manifest["files"]["arrays.npz"]["size"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = make(tmp_path).restore()
    assert restored.step == 3 and restored.source == "destination" and restored.state["w"][0] == 3.0
    assert any("local copy" in str(w.message) for w in caught)


def test_uploader_survives_errors_that_are_not_oserror(tmp_path, ck_env, monkeypatch):
    import colabkit.checkpoints.uploader as uploader
    monkeypatch.setattr(uploader, "BACKOFF_START", 0.05)
    ckpt = make(tmp_path)
    real, calls = ckpt.dest.copy_in, []

    def flaky(info, **kw):
        calls.append(info.step)
        if len(calls) == 1:
            raise RuntimeError("a back end's own error type")
        return real(info, **kw)

    monkeypatch.setattr(ckpt.dest, "copy_in", flaky)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ckpt.save(1, {"w": np.zeros(3)})
        assert ckpt.wait(10), ckpt.status
        ckpt.save(2, {"w": np.zeros(3)}, wait=10)
    ckpt.close()
    assert [c.step for c in CheckpointFolder(tmp_path / "dest").committed()][-1] == 2 and len(calls) >= 3
