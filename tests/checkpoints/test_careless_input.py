"""Careless input to the store: a location that names the Drive root or leaves it, a location that is a file or
not a path at all, and lease records that are damaged, hand-edited or dated far ahead. Each gets one clear
answer, and none lets a run delete or prune what is not its own."""
import json
import os
import threading
import time
import warnings

import numpy as np
import pytest

import colabkit
from colabkit.checkpoints import FolderInUse
from colabkit.checkpoints.folder import LEASE_NAME, CheckpointFolder


def steps(folder):
    return sorted(c.step for c in CheckpointFolder(folder).committed())


# -- locations -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("location", ["drive:.", "drive:./", "drive:runs/..", "drive:../x", "drive:a/../../b",
                                      "drive:runs/./mnist", "drive:..\\x", "drive:runs\\..\\..\\x",
                                      "gdrive://.", "gdrive://runs/..", "gdrive://../x"])
def test_a_location_that_names_the_drive_root_or_leaves_it_is_refused(ck_env, tmp_path, location):
    with pytest.raises(ValueError) as info:
        colabkit.Checkpoints(location)
    message = str(info.value)
    assert location in message and "runs/mnist" in message, message
    assert not (tmp_path / "drive").exists() and not (tmp_path / "x").exists()


def test_a_local_path_that_is_the_drive_root_is_refused(ck_env, tmp_path, monkeypatch):
    root = tmp_path / "drive"
    root.mkdir()
    with pytest.raises(ValueError, match="Drive root"):
        colabkit.Checkpoints(str(root))
    monkeypatch.chdir(root)
    with pytest.raises(ValueError, match="Drive root"):
        colabkit.Checkpoints(".")
    with colabkit.Checkpoints("runs/mnist") as ckpt:   # a folder below it is fine
        assert ckpt.save(1, {"w": np.ones(2)}, wait=True)
    assert steps(root / "runs" / "mnist") == [1]


def test_delete_checkpoint_removes_only_the_runs_checkpoints_and_keeps_the_users_other_files(ck_env, tmp_path):
    keras = pytest.importorskip("keras")
    from tests.checkpoints import workers
    folder, staging = tmp_path / "drive" / "project", tmp_path / "staging"
    for mine in (folder, staging):
        (mine / "data").mkdir(parents=True)
        (mine / "notes.txt").write_text("my notes")
        (mine / "data" / "train.csv").write_text("1,2,3")
    model, _ = workers.build_model(keras)
    x, y = workers.data(np)
    auto = colabkit.keras.AutoResume("drive:project", deadline=None, delete_checkpoint=True, local_dir=str(staging))
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[auto])
    for mine in (folder, staging):
        assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*")) == [
            "data", "data/train.csv", "notes.txt"], "only the run's checkpoints go"
        assert (mine / "notes.txt").read_text() == "my notes"


@pytest.mark.parametrize("what", ["directory", "local_dir"])
def test_a_location_that_is_a_file_is_refused_at_once(ck_env, tmp_path, what):
    file = tmp_path / "results.txt"
    file.write_text("precious")
    where = {"directory": str(file)} if what == "directory" else {"directory": str(tmp_path / "run"),
                                                                   "local_dir": str(file)}
    with pytest.raises(ValueError, match=r"results\.txt.* is a file, not a folder") as info:
        colabkit.Checkpoints(**where)
    assert what in str(info.value)
    assert file.read_text() == "precious"


def test_a_drive_location_that_is_a_file_is_refused_at_once(ck_env, tmp_path):
    (tmp_path / "drive" / "runs").mkdir(parents=True)
    (tmp_path / "drive" / "runs" / "mnist").write_text("not a folder")
    with pytest.raises(ValueError, match=r"drive:runs/mnist.*is a file, not a folder"):
        colabkit.Checkpoints("drive:runs/mnist")


@pytest.mark.parametrize("location", [42, 3.5, b"runs/mnist", ["runs"], True])
def test_a_location_that_is_not_a_string_or_path_names_its_type(ck_env, location):
    with pytest.raises(TypeError) as info:
        colabkit.Checkpoints(location)
    message = str(info.value)
    assert repr(location) in message and type(location).__name__ in message and "str or" in message, message
    assert "empty" not in message


def test_autoresume_with_a_location_that_is_not_a_string_names_its_type(ck_env):
    pytest.importorskip("keras")
    with pytest.raises(TypeError, match="42 .*int"):
        colabkit.keras.AutoResume(42)


# -- leases ----------------------------------------------------------------------------------------------
def _lease(dest, **fields):
    dest.mkdir(parents=True, exist_ok=True)
    now = time.time()
    record = {"token": "0" * 16, "host": "colab-vm-1", "machine": "colab-vm-1/boot", "pid": 4242,
              "started": now - 3600, "renewed": now, "beat": 7, "location": str(dest), **fields}
    (dest / LEASE_NAME).write_text(json.dumps(record))
    return record


BAD_LEASES = {
    "renewed is text": lambda dest: _lease(dest, renewed="abc"),
    "renewed is null": lambda dest: _lease(dest, renewed=None),
    "renewed is NaN": lambda dest: _lease(dest, renewed=float("nan")),
    "pid is -1": lambda dest: _lease(dest, pid=-1),
    "pid is huge": lambda dest: _lease(dest, pid=10 ** 30),
    "no token": lambda dest: (dest / LEASE_NAME).write_text(json.dumps({"renewed": time.time()})),
    "a list": lambda dest: (dest / LEASE_NAME).write_text("[1, 2]"),
    "torn": lambda dest: (dest / LEASE_NAME).write_text(json.dumps(_lease(dest))[:40]),
    "dated ten years ahead": lambda dest: _lease(dest, renewed=time.time() + 10 * 365 * 86400),
}


@pytest.fixture
def quick_lease(monkeypatch):
    from colabkit.checkpoints import lease
    monkeypatch.setattr(lease, "RENEW_S", 0.5)   # a record is judged by one second of watching it
    return lease


@pytest.mark.parametrize("damage", BAD_LEASES.values(), ids=BAD_LEASES.keys())
def test_a_lease_that_cannot_be_trusted_is_taken_over_once_nobody_renews_it(tmp_path, ck_env, quick_lease, damage):
    dest = tmp_path / "dest"
    dest.mkdir()
    damage(dest)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm") as ckpt:
            assert ckpt.save(1, {"w": np.ones(3)}, wait=True)
    messages = [str(w.message) for w in caught]
    assert any("taking over" in m and LEASE_NAME in m and "did not change" in m for m in messages), messages
    assert steps(dest) == [1]


@pytest.mark.parametrize("damage", [BAD_LEASES["renewed is text"], BAD_LEASES["dated ten years ahead"]],
                         ids=["renewed is text", "dated ten years ahead"])
def test_a_lease_that_cannot_be_trusted_but_is_still_renewed_refuses_a_second_writer(tmp_path, ck_env, quick_lease,
                                                                                     damage):
    dest = tmp_path / "dest"
    dest.mkdir()
    damage(dest)
    stop = threading.Event()

    def renew():   # a writer that still runs rewrites its record: its beat changes
        beat = 7
        while not stop.wait(0.1):
            beat += 1
            record = json.loads((dest / LEASE_NAME).read_text())
            (dest / "lease.tmp").write_text(json.dumps(dict(record, beat=beat)))
            os.replace(dest / "lease.tmp", dest / LEASE_NAME)
    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    try:
        with colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm") as ckpt:
            with pytest.raises(FolderInUse, match=f"{LEASE_NAME}.*still changes"):
                ckpt.save(1, {"w": np.ones(3)})
    finally:
        stop.set()
        renewer.join()
    assert steps(dest) == []
    assert json.loads((dest / LEASE_NAME).read_text())["host"] == "colab-vm-1", "their lease is left alone"


def test_a_lease_dated_slightly_ahead_is_a_live_lease_of_a_machine_whose_clock_is_ahead(tmp_path, ck_env):
    dest = tmp_path / "dest"
    _lease(dest, renewed=time.time() + 60)
    with colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm") as ckpt:
        with pytest.raises(FolderInUse, match="process 4242 on host colab-vm-1"):
            ckpt.save(1, {"w": np.ones(3)})
    assert steps(dest) == []
