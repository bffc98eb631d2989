"""What a save and a resume cost, as behaviour (not time): one set of snapshot buffers, one copy per variable,
a local destination written once, a resume that reads each file once. The times are in bench/save_cost.py."""
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest

keras = pytest.importorskip("keras")
import colabkit  # noqa: E402
import colabkit.keras.state as ck_keras_state  # noqa: E402
from colabkit.checkpoints import folder, npz  # noqa: E402
from colabkit.checkpoints.buffers import SnapshotBuffers  # noqa: E402
from colabkit.checkpoints.folder import CheckpointFolder  # noqa: E402
from colabkit.checkpoints.manifest import MANIFEST_NAME  # noqa: E402
from tests.waiting import wait_for  # noqa: E402

HERE = Path(__file__).resolve().parent.parent / "checkpoints"   # workers.py, shared with test_kill.py
_spec = importlib.util.spec_from_file_location("ck_workers", HERE / "workers.py")
workers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workers)


def wide_model(width=256):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(width), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


@pytest.fixture
def skips_busy_saves(monkeypatch):
    """These models are tiny: make their periodic saves behave as a large state's do (never wait for a set)."""
    monkeypatch.setenv("COLABKIT_SMALL_STATE_MB", "0")


def state_nbytes(model):
    return sum(np.asarray(v.numpy()).nbytes for v in [*model.variables, *model.optimizer.variables])


def saves_taken(auto) -> int:
    """The saves AutoResume has taken so far: the save events of its timeline (what the status panel shows)."""
    return sum(1 for _, kind, _ in auto.events if kind.endswith("save"))


NUMPY_TRACE_DOMAIN = 389047   # NumPy reports the memory of array data to tracemalloc under this domain


def snapshot_sets(train, model) -> float:
    """Host memory the snapshots still hold after ``train()``, in training states (1.0: one set of buffers the
    size of the state): the NumPy data allocated while it ran and alive at its end, as tracemalloc sees it."""
    tracemalloc.start()
    try:
        train()
        held = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, NUMPY_TRACE_DOMAIN)])
    finally:
        tracemalloc.stop()
    return sum(trace.size for trace in held.traces) / state_nbytes(model)


class SlowWriter:
    """Holds every background write of arrays.npz until released, so that saves arrive while the previous
    snapshot is still being written."""

    def __init__(self, monkeypatch):
        self.gate, self.writes = threading.Event(), 0
        real = npz.write

        def write(*a, **kw):
            self.writes += 1
            self.gate.wait(30)
            return real(*a, **kw)
        monkeypatch.setattr(npz, "write", write)


def test_a_save_while_the_previous_is_written_takes_no_second_set_and_resume_is_exact(tmp_path, ck_env,
                                                                                     monkeypatch, skips_busy_saves):
    model = wide_model(512)
    x = np.random.RandomState(0).rand(8 * 12, 512).astype("float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=1, shuffle=False, verbose=0)   # traced before memory is counted
    slow = SlowWriter(monkeypatch)
    saves = []

    class Watch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            saves.append(saves_taken(auto))
            if batch == 1:   # the set asked for at batch 0 is touched (microseconds here) before this batch's save
                time.sleep(0.1)
            if batch == 2:   # that snapshot is being written (held), not waiting to be, before this batch's save
                assert wait_for(lambda: slow.writes == 1)
            if batch == 8:   # the first write ends; the save due since is taken at the next batch end
                slow.gate.set()
                assert wait_for(lambda: auto.checkpoints.status.last_uploaded is not None)

    auto = colabkit.keras.AutoResume(str(tmp_path / "run"), save_freq=1, deadline=None, verbose=0)
    tracemalloc.start()
    try:
        model.fit(x, x[:, :1], batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[auto, Watch()])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    nbytes = state_nbytes(model)
    assert peak < 1.5 * nbytes, f"snapshots took {peak} bytes of host memory for {nbytes} bytes of state: " \
                                "one set of snapshot buffers by default"
    assert saves[8] == 1 and set(saves[:9]) <= {0, 1}, f"saves due during the first write waited: {saves}"
    assert saves[9] == 2, f"and were taken once it was written: {saves}"
    # the final save (end of training) waited for the set and holds the last state
    resumed = wide_model(512)
    again = colabkit.keras.AutoResume(str(tmp_path / "run"), deadline=None, verbose=0)
    resumed.fit(x, x[:, :1], batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[again])  # nothing left
    assert again.restored.step == 12
    for a, b in zip([*model.variables, *model.optimizer.variables], [*resumed.variables, *resumed.optimizer.variables]):
        np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))


def test_spare_buffer_sets_trade_memory_for_taking_every_save_at_once(tmp_path, ck_env, monkeypatch,
                                                                      skips_busy_saves):
    monkeypatch.setenv("COLABKIT_SNAPSHOT_BUFFERS", "2")
    model = wide_model(512)   # a state far above the noise of what fit() allocates
    x = np.random.RandomState(0).rand(8 * 8, 512).astype("float32")
    slow = SlowWriter(monkeypatch)
    seqs = []

    class Watch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seqs.append(saves_taken(auto))   # AutoResume's save of this batch comes after this
            if batch < 4:   # a new set is touched in the background (microseconds here) before its first use
                time.sleep(0.1)
            if batch == 6:
                slow.gate.set()

    auto = colabkit.keras.AutoResume(str(tmp_path / "run"), save_freq=1, deadline=None, verbose=0)
    held = snapshot_sets(lambda: model.fit(x, x[:, :1], batch_size=8, epochs=1, shuffle=False, verbose=0,
                                           callbacks=[auto, Watch()]), model)
    assert 1.9 < held < 2.5, f"two sets of snapshot buffers, each the size of the state: {held:.2f}x the state"
    assert slow.writes >= 1 and seqs[4:8] == list(range(seqs[4], seqs[4] + 4)) and seqs[4] >= 2, \
        f"while the first snapshot is being written, every save is taken when it is due: {seqs}"
    assert auto.checkpoints.status.saves_dropped >= 3, "snapshots waiting behind the write were replaced"


def test_a_snapshot_waiting_behind_a_slow_upload_is_replaced_in_the_same_buffers(tmp_path, ck_env, monkeypatch,
                                                                                skips_busy_saves):
    model = wide_model(512)   # a state far above the noise of what fit() allocates
    x = np.random.RandomState(0).rand(8 * 8, 512).astype("float32")
    gate, real = threading.Event(), folder.CheckpointFolder.copy_in
    monkeypatch.setattr(folder.CheckpointFolder, "copy_in", lambda self, *a, **kw: gate.wait(30) and real(self, *a, **kw))
    seqs = []

    class Watch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seqs.append(saves_taken(auto))   # AutoResume's save of this batch comes after this
            if batch == 1:   # the set asked for at batch 0 is touched (microseconds here) before this save
                time.sleep(0.1)
            if batch == 2:   # the first snapshot is committed locally and its upload hangs
                assert wait_for(lambda: auto.checkpoints.status.state == "uploading")
            if batch == 7:   # until every save of the epoch was taken (each replacing the one waiting)
                gate.set()

    auto = colabkit.keras.AutoResume(str(tmp_path / "drive" / "run"), save_freq=1, deadline=None, verbose=0,
                                     local_dir=tmp_path / "local")
    held = snapshot_sets(lambda: model.fit(x, x[:, :1], batch_size=8, epochs=1, shuffle=False, verbose=0,
                                           callbacks=[auto, Watch()]), model)
    assert 0.9 < held < 1.5, f"one set of snapshot buffers: {held:.2f}x the state"
    assert seqs[3:] == list(range(seqs[3], seqs[3] + 5)), f"every later save was taken when due: {seqs}"
    assert auto.checkpoints.status.saves_dropped >= 4, "each replaced the one waiting behind the upload"
    assert CheckpointFolder(tmp_path / "drive" / "run").committed()[-1].step == 8


def test_a_small_state_is_saved_at_every_batch_a_save_is_due_even_when_writes_are_slower(tmp_path, ck_env,
                                                                                         monkeypatch):
    model = wide_model(512)   # a state far above the noise of what fit() allocates
    x = np.random.RandomState(0).rand(8 * 12, 512).astype("float32")
    real = npz.write
    monkeypatch.setattr(npz, "write", lambda *a, **kw: time.sleep(0.05) or real(*a, **kw))   # slower than a batch
    auto = colabkit.keras.AutoResume(str(tmp_path / "run"), save_freq=1, deadline=None, verbose=0)
    held = snapshot_sets(lambda: model.fit(x, x[:, :1], batch_size=8, epochs=1, shuffle=False, verbose=0,
                                           callbacks=[auto]), model)
    saved = [int(detail.split()[1]) for _, kind, detail in auto.events if kind == "save"]
    assert saved == list(range(1, 13)), f"each batch's save was taken at that batch: {saved}"
    assert 0.9 < held < 1.5, f"one set of snapshot buffers: {held:.2f}x the state"
    assert CheckpointFolder(tmp_path / "run").committed()[-1].step == 12


def test_a_snapshot_copies_each_variable_once_and_is_independent_of_later_updates():
    model = wide_model(32)
    variable = model.layers[0].kernel
    view = ck_keras_state.host_value(variable)
    live = np.asarray(variable.value.value())
    if type(variable.value).__module__.startswith("tensorflow") and "CPU" in variable.value.device.upper():
        assert np.shares_memory(view, live), "the read of a CPU variable is viewed, not copied (.numpy() would copy)"
    buffer = np.empty(view.shape, view.dtype)
    del view, live
    before = np.array(variable.numpy())
    ck_keras_state.copy_into(buffer, variable)
    variable.assign_add(np.ones(variable.shape, "float32"))
    np.testing.assert_array_equal(buffer, before)


def test_a_local_destination_is_written_once_and_committed_there(tmp_path, ck_env, monkeypatch):
    copies = []
    real_copy = folder.copy_file
    monkeypatch.setattr(folder, "copy_file", lambda *a, **kw: copies.append(a) or real_copy(*a, **kw))
    dest = tmp_path / "dest"
    with colabkit.Checkpoints(str(dest)) as ckpt:
        assert ckpt.save(5, {"w": np.arange(1000.0)}, wait=True)
        staging = ckpt.local.path
    assert not copies, "nothing was copied: the checkpoint was written where it is kept"
    assert not staging.exists() or not [p for p in staging.iterdir() if p.name.startswith("ckpt-")], \
        "nothing was staged"
    [info] = CheckpointFolder(dest).committed()
    CheckpointFolder(dest).verify(info, full=True)
    with np.load(info.path / "arrays.npz", allow_pickle=False) as arrays:   # an ordinary .npz
        np.testing.assert_array_equal(arrays["a0"], np.arange(1000.0))
    assert json.loads((info.path / MANIFEST_NAME).read_text())["step"] == 5


def test_a_local_destination_that_fails_is_staged_and_caught_up_then_written_directly_again(tmp_path, ck_env,
                                                                                          monkeypatch):
    import colabkit.checkpoints.uploader as uploader
    monkeypatch.setattr(uploader, "BACKOFF_START", 0.05)
    dest = tmp_path / "dest"
    dest.parent.mkdir(exist_ok=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = colabkit.Checkpoints(str(dest))   # a file there now is refused at once; one that appears later
        dest.write_text("not a folder")          # stands in for a destination that fails (ENOTDIR)
        ckpt.save(1, {"w": np.ones(10)})
        assert not ckpt.wait(0.5)
        staged = CheckpointFolder(ckpt.local.path).committed()
        assert [c.step for c in staged] == [1], "the checkpoint is kept on local disk meanwhile"
        dest.unlink()                        # the destination is back: the staged checkpoint is copied there
        assert ckpt.wait(10)
        ckpt.save(2, {"w": np.full(10, 2.0)}, wait=True)
        ckpt.close()
    assert len([w for w in caught if "could not write checkpoint step 1" in str(w.message)]) == 1
    assert [c.step for c in CheckpointFolder(dest).committed()] == [1, 2]
    assert [c.step for c in CheckpointFolder(ckpt.local.path).committed()] == [1], "step 2 went directly"
    assert colabkit.Checkpoints(str(dest)).restore().state["w"][0] == 2.0


def test_resume_reads_each_file_once_without_a_local_copy_and_rejects_a_damaged_one(tmp_path, ck_env,
                                                                                  monkeypatch):
    dest = tmp_path / "dest"
    with colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm1", keep=3) as ckpt:
        for step in (1, 2):
            ckpt.save(step, {"w": np.full(200_000, float(step)), "step": step}, wait=True)
    reads, copies = [], []
    real_read = npz.read_into_memory
    monkeypatch.setattr(npz, "read_into_memory", lambda source, **kw: reads.append(_name_of(source)) or
                        real_read(source, **kw))
    real_copy = folder.copy_file
    monkeypatch.setattr(folder, "copy_file", lambda *a, **kw: copies.append(a) or real_copy(*a, **kw))
    fresh = colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm2")
    restored = fresh.restore()
    assert restored.step == 2 and restored.state["w"][0] == 2.0 and restored.state["step"] == 2
    assert sorted(reads) == ["arrays.npz", "state.json"] and not copies
    assert restored.state["w"].ctypes.data % 64 == 0, "arrays are aligned views of what was read"
    fresh.close()
    newest = CheckpointFolder(dest).committed()[-1]
    data = bytearray((newest.path / "arrays.npz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (newest.path / "arrays.npz").write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = colabkit.Checkpoints(str(dest), local_dir=tmp_path / "vm3").restore()
    assert restored.step == 1 and restored.state["w"][0] == 1.0
    assert any("damaged" in str(w.message) and "blake3" in str(w.message) for w in caught)


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4), np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    np.array(2.5), np.zeros((0, 3)), np.array(["a", "bcd"]), np.array([True, False]),
    np.arange(6, dtype=np.int8)[::2], np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]),
], ids=["f32", "fortran", "0d", "empty", "str", "bool", "strided", "structured"])
def test_npz_round_trip_is_an_ordinary_npz_with_aligned_members(tmp_path, array):
    import zipfile

    import blake3
    path = tmp_path / "a.npz"
    digest, size = npz.write(path, {"a0": array, "a1": np.ones(200_000)})
    raw = path.read_bytes()
    assert (digest, size) == (blake3.blake3(raw).hexdigest(), len(raw))
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None   # CRCs right
    with np.load(path, allow_pickle=False) as loaded:
        np.testing.assert_array_equal(loaded["a0"], array)
    buffer, digest2 = npz.read_into_memory(path)
    assert digest2 == digest
    arrays = npz.load(buffer)
    np.testing.assert_array_equal(arrays["a0"], array)
    assert arrays["a0"].dtype == array.dtype and arrays["a1"].ctypes.data % 64 == 0   # a view, aligned
    assert arrays["a0"].base is None or arrays["a0"].nbytes >= npz.SMALL, "small arrays are copies"


def test_npz_members_bigger_than_a_chunk_get_the_crc_zip_readers_check(tmp_path):
    import zipfile
    path = tmp_path / "big.npz"
    big = np.arange(3 * npz.CHUNK // 4 + 5, dtype=np.float32)   # several chunks and a partial one
    npz.write(path, {"small": np.arange(3), "big": big, "after": np.ones(7)})
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None   # every member's CRC-32 matches its bytes
    with np.load(path, allow_pickle=False) as loaded:
        np.testing.assert_array_equal(loaded["big"], big)


def test_npz_reads_what_np_savez_wrote_and_refuses_compressed_members_and_object_arrays(tmp_path):
    old = tmp_path / "old.npz"
    np.savez(old, a0=np.arange(5), a1=np.eye(3))
    arrays = npz.load(npz.read_into_memory(old)[0])
    np.testing.assert_array_equal(arrays["a1"], np.eye(3))
    np.savez_compressed(tmp_path / "c.npz", a0=np.arange(5))   # colabkit never writes these: a zip bomb's shape
    with pytest.raises(ValueError, match="compressed or encrypted, which colabkit never writes"):
        npz.load(npz.read_into_memory(tmp_path / "c.npz")[0])
    with pytest.raises(ValueError, match="object"):
        npz.write(tmp_path / "o.npz", {"a0": np.array([{}], dtype=object)})
    np.save(tmp_path / "obj.npy", np.array([{}], dtype=object), allow_pickle=True)
    import zipfile
    with zipfile.ZipFile(tmp_path / "obj.npz", "w") as archive:
        archive.write(tmp_path / "obj.npy", "a0.npy")
    with pytest.raises(ValueError, match="pickle|object"):
        npz.load(npz.read_into_memory(tmp_path / "obj.npz")[0])


@pytest.mark.fuse
def test_a_local_disk_that_fills_up_under_destination_and_staging_alike_loses_nothing(tmp_path, ck_env,
                                                                                   drive_mount_factory, monkeypatch):
    """Destination and staging on one local disk (a FUSE filesystem over a local disk, as mergerfs shows in
    /proc/mounts) that fills up: the saves meanwhile fail with a warning, training goes on, and the first save
    after space comes back is committed there."""
    import colabkit.checkpoints.uploader as uploader
    monkeypatch.setattr(uploader, "BACKOFF_START", 0.05)
    disk = drive_mount_factory(rate=None, extra_args=["--subtype", "mergerfs"])
    monkeypatch.setenv("COLABKIT_CACHE_DIR", str(disk.my_drive / "cache"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = colabkit.Checkpoints(str(disk.my_drive / "run"))
        assert ckpt.save(1, {"w": np.ones(1000)}, wait=True)
        disk.set_fault("enospc")   # the disk is full: writes, creates and mkdirs fail with ENOSPC
        ckpt.save(2, {"w": np.full(1000, 2.0)})
        assert not ckpt.wait(1.0)
        ckpt.save(3, {"w": np.full(1000, 3.0)})   # no "closed" error: the writer lives
        disk.set_fault("ok")
        assert ckpt.save(4, {"w": np.full(1000, 4.0)}, wait=10)
        ckpt.close()
    assert any("No space left" in str(w.message) for w in caught), [str(w.message) for w in caught]
    with colabkit.Checkpoints(str(disk.my_drive / "run")) as fresh:
        restored = fresh.restore()
    assert restored.step == 4 and restored.state["w"][0] == 4.0


def test_a_save_that_fails_gives_its_snapshot_buffers_back(tmp_path, ck_env):
    """A callback whose get_state() fails once: that save raises, and the next fit() of the same callback
    still takes every periodic save (the one buffer set was not lost with the failed save)."""
    model = wide_model(512)   # a state far above the noise of what fit() allocates
    x = np.random.RandomState(0).rand(8 * 4, 512).astype("float32")

    class FailsOnce(keras.callbacks.Callback):
        failed = False

        def get_state(self):
            if not FailsOnce.failed:
                FailsOnce.failed = True
                raise RuntimeError("get_state failed")
            return {}

        def set_state(self, state):
            pass

    auto = colabkit.keras.AutoResume(str(tmp_path / "run"), save_freq=2, deadline=None, verbose=0)
    with pytest.raises(RuntimeError, match="get_state failed"):
        model.fit(x, x[:, :1], batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[auto, FailsOnce()])
    started = time.monotonic()
    held = snapshot_sets(lambda: model.fit(x, x[:, :1], batch_size=8, epochs=2, shuffle=False, verbose=0,
                                           callbacks=[auto, FailsOnce()]), model)
    assert time.monotonic() - started < SnapshotBuffers.WAIT_S / 2, "no save waited for a lost buffer set"
    saved = [detail for _, kind, detail in auto.events if kind == "save"]
    assert [d.split()[1] for d in saved] == ["2", "4", "6", "8"], saved
    assert held < 0.5, f"no second set was allocated for the lost one: {held:.2f}x the state"


def _name_of(source) -> str:
    """The file name of a path, or of a file opened by descriptor (as the store opens checkpoint files)."""
    if hasattr(source, "fileno"):
        return Path(os.readlink(f"/proc/self/fd/{source.fileno()}")).name
    return Path(source).name


_RESUME_IN_A_FRESH_PROCESS = """
import sys, warnings
import numpy as np
import keras
import colabkit
sys.path.insert(0, sys.argv[3])
from test_save_cost import wide_model
model = wide_model(64)
auto = colabkit.keras.AutoResume(sys.argv[1], deadline=None, verbose=0)
auto.set_model(model)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    auto.on_train_begin()
auto._restore_signal_handlers()   # no fit() runs here: put back what on_train_begin installed
np.savez(sys.argv[2], *[v.numpy() for v in [*model.variables, *model.optimizer.variables]])
print("RESTORED", auto.restored.step, any("damaged" in str(w.message) for w in caught))
"""


def test_a_keras_resume_in_a_fresh_process_is_bit_exact_and_falls_back_past_a_damaged_checkpoint(tmp_path, ck_env):
    dest = tmp_path / "dest"
    model = wide_model(64)
    auto = colabkit.keras.AutoResume(str(dest), save_freq=2, keep=3, deadline=None, verbose=0)
    saved = {}

    class KeepEverySave(keras.callbacks.Callback):   # after AutoResume's: what each periodic save holds
        def on_train_batch_end(self, batch, logs=None):
            if (batch + 1) % 2 == 0:
                saved[batch + 1] = [np.array(v.numpy()) for v in [*model.variables, *model.optimizer.variables]]

    x = np.random.RandomState(0).rand(32, 64).astype("float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[auto, KeepEverySave()])
    assert auto.checkpoints.wait(60)
    committed = CheckpointFolder(dest).committed()
    assert committed[-1].step == 4

    def resume_in_a_fresh_process(vm: str):
        out = tmp_path / f"{vm}.npz"
        done = subprocess.run([sys.executable, "-c", _RESUME_IN_A_FRESH_PROCESS, str(dest), str(out),
                               str(Path(__file__).resolve().parent)], capture_output=True, text=True, timeout=300,
                              env={**ck_env, "XDG_CACHE_HOME": str(tmp_path / vm)})
        line = [ln.split() for ln in done.stdout.splitlines() if ln.startswith("RESTORED")]
        assert done.returncode == 0 and line, done.stderr[-3000:]
        with np.load(out) as arrays:
            return int(line[0][1]), line[0][2] == "True", [arrays[f"arr_{i}"] for i in range(len(arrays.files))]

    step, warned, restored = resume_in_a_fresh_process("vm2")
    assert (step, warned) == (4, False)
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(restored, saved[4], strict=True))

    newest = committed[-1].path / "arrays.npz"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    step, warned, restored = resume_in_a_fresh_process("vm3")
    assert (step, warned) == (2, True), "the damaged newest checkpoint is skipped, with a warning"
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(restored, saved[2], strict=True))
