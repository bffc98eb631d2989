"""Checkpoints.save_snapshot from plain Python: a training loop's save, its arrays copied once into host buffers
the store reuses. What is asserted is what a new Checkpoints object (or a fresh process) restores afterwards, and
what the loop sees: the buffers it is handed, whether a save was taken, how long it waited, host memory."""
import json
import subprocess
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

import colabkit
from colabkit.checkpoints import npz
from colabkit.checkpoints.buffers import SnapshotBuffers
from tests.waiting import wait_for


class Weights:
    """A training loop's state: two arrays it updates in place, and a counter."""

    def __init__(self, n=1000):
        self.w = np.arange(n, dtype=np.float32)
        self.b = np.zeros(7, dtype=np.int64)
        self.steps = 0
        self.handed = []   # the buffers each fill() was given

    def train(self):
        self.w += 1.0
        self.b += 2
        self.steps += 1

    def specs(self):
        return [self.w, self.b]

    def fill(self, buffers):
        self.handed.append(buffers)
        w, b = buffers
        np.copyto(w, self.w)
        np.copyto(b, self.b)
        return {"w": w, "b": b, "steps": self.steps, "note": "plain"}


class SlowWriter:
    """Holds every background write of arrays.npz until released."""

    def __init__(self, monkeypatch):
        self.gate, self.writes = threading.Event(), 0
        real = npz.write

        def write(*a, **kw):
            self.writes += 1
            self.gate.wait(30)
            return real(*a, **kw)
        monkeypatch.setattr(npz, "write", write)


def restore_in_a_fresh_process(directory, env) -> dict:
    code = ("import json, sys, colabkit\n"
            "r = colabkit.Checkpoints(sys.argv[1]).restore()\n"
            "print(json.dumps(None if r is None else {'step': r.step, 'epoch': r.epoch, 'batch': r.batch,\n"
            "    'w': r.state['w'].tolist(), 'b': r.state['b'].tolist(), 'steps': r.state['steps'],\n"
            "    'note': r.state['note'], 'reason': r.manifest.get('info', {}).get('reason')}))\n")
    done = subprocess.run([sys.executable, "-c", code, str(directory)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_what_fill_returns_is_what_a_fresh_process_restores(tmp_path, ck_env):
    loop, dest = Weights(), tmp_path / "run"
    with colabkit.Checkpoints(str(dest)) as ckpt:
        for _ in range(3):
            loop.train()
            assert ckpt.save_snapshot(loop.steps, loop.specs(), loop.fill, epoch=0, batch=loop.steps,
                                      info={"reason": "test"}, wait=True) is True
        loop.train()   # after the last save: not in any checkpoint
    w, b = loop.handed[-1]
    assert (w.shape, w.dtype, b.shape, b.dtype) == ((1000,), np.float32, (7,), np.int64), \
        "fill is handed one buffer per spec, of its shape and dtype"
    restored = restore_in_a_fresh_process(dest, ck_env)
    assert restored["step"] == 3 and (restored["epoch"], restored["batch"]) == (0, 3)
    assert restored["w"] == (np.arange(1000, dtype=np.float32) + 3).tolist()
    assert restored["b"] == [6] * 7 and restored["steps"] == 3 and restored["note"] == "plain"


def test_an_exception_in_fill_saves_nothing_and_the_previous_checkpoint_stays_the_one_restored(tmp_path, ck_env):
    loop, dest = Weights(), tmp_path / "run"
    ckpt = colabkit.Checkpoints(str(dest))
    loop.train()
    assert ckpt.save_snapshot(1, loop.specs(), loop.fill, wait=True)

    def fails(buffers):
        loop.fill(buffers)   # half the work done: the buffers hold step 2's arrays
        raise RuntimeError("a callback's state could not be read")

    loop.train()
    with pytest.raises(RuntimeError, match="could not be read"):
        ckpt.save_snapshot(2, loop.specs(), fails, wait=True)
    assert ckpt.wait(10)
    restored = colabkit.Checkpoints(str(dest)).restore()
    assert restored.step == 1 and restored.state["w"][0] == 1.0 and restored.state["steps"] == 1
    # the buffers were given back: the next save takes them at once (a lost set would be waited for)
    started = time.monotonic()
    assert ckpt.save_snapshot(3, loop.specs(), loop.fill, wait=True)
    assert time.monotonic() - started < SnapshotBuffers.WAIT_S / 2
    assert ckpt.snapshot_buffer_sets == 1
    ckpt.close()
    restored = colabkit.Checkpoints(str(dest)).restore()
    assert restored.step == 3 and restored.state["w"][0] == 2.0


def test_a_save_the_store_refuses_gives_its_buffers_back_and_saves_nothing(tmp_path, ck_env):
    loop, dest = Weights(), tmp_path / "run"
    with colabkit.Checkpoints(str(dest)) as ckpt:
        assert ckpt.save_snapshot(5, loop.specs(), loop.fill, wait=True)
        with pytest.raises(ValueError, match="step=-1 is invalid"):
            ckpt.save_snapshot(-1, loop.specs(), loop.fill)
        started = time.monotonic()
        assert ckpt.save_snapshot(6, loop.specs(), loop.fill, wait=True)
        assert time.monotonic() - started < SnapshotBuffers.WAIT_S / 2, "the refused save gave its set back"
    with colabkit.Checkpoints(str(dest)) as again:   # another run, which did not restore: a lower step is refused
        with pytest.raises(colabkit.CheckpointError, match="holds step 6"):
            again.save_snapshot(2, loop.specs(), loop.fill)
        assert colabkit.Checkpoints(str(dest)).restore().step == 6, "nothing was saved"
        started = time.monotonic()
        assert again.save_snapshot(7, loop.specs(), loop.fill, wait=True)
        assert time.monotonic() - started < SnapshotBuffers.WAIT_S / 2, "the refused save gave its set back"
        assert again.snapshot_buffer_sets == 1
    assert colabkit.Checkpoints(str(dest)).restore().step == 7


def test_snapshots_reuse_one_set_of_buffers_so_host_memory_stays_at_one_state(tmp_path, ck_env):
    loop, dest = Weights(n=2_000_000), tmp_path / "run"   # 8 MB of state
    nbytes = loop.w.nbytes + loop.b.nbytes
    ckpt = colabkit.Checkpoints(str(dest), keep=2)
    loop.train()
    ckpt.save_snapshot(loop.steps, loop.specs(), loop.fill, wait=True)   # the first allocates the set
    tracemalloc.start()
    try:
        for _ in range(10):
            loop.train()
            ckpt.save_snapshot(loop.steps, loop.specs(), loop.fill)   # not waited for: the next save may find
        assert ckpt.wait(30)                                          # the set busy, and waits for it
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    ckpt.close()
    assert peak < 0.5 * nbytes, f"ten snapshots took {peak} bytes of host memory beyond the one set ({nbytes})"
    first = loop.handed[0][0]
    assert all(np.shares_memory(w, first) for w, _ in loop.handed), "every snapshot was copied into the same set"
    assert ckpt.snapshot_buffer_sets == 1
    restored = colabkit.Checkpoints(str(dest)).restore()
    assert restored.step == 11 and restored.state["steps"] == 11
    np.testing.assert_array_equal(restored.state["w"], np.arange(2_000_000, dtype=np.float32) + 11)


def test_a_periodic_save_of_a_large_state_takes_nothing_while_its_set_is_written(tmp_path, ck_env, monkeypatch):
    monkeypatch.setenv("COLABKIT_SMALL_STATE_MB", "0")   # every state counts as large
    loop, dest = Weights(), tmp_path / "run"
    ckpt = colabkit.Checkpoints(str(dest))
    assert ckpt.prepare_snapshot(loop.specs()) == loop.w.nbytes + loop.b.nbytes
    loop.train()
    # the prepared set was never written to: the first periodic save has it touched in the background
    assert ckpt.save_snapshot(1, loop.specs(), loop.fill, periodic=True) is None
    assert not loop.handed
    taken = wait_for(lambda: ckpt.save_snapshot(1, loop.specs(), loop.fill, periodic=True), timeout=10)
    assert taken is True and len(loop.handed) == 1
    assert ckpt.wait(10)
    slow = SlowWriter(monkeypatch)
    loop.train()
    assert ckpt.save_snapshot(2, loop.specs(), loop.fill, periodic=True) is True
    assert wait_for(lambda: slow.writes == 1)   # step 2 is being written, in the one set
    loop.train()
    started = time.monotonic()
    assert ckpt.save_snapshot(3, loop.specs(), loop.fill, periodic=True) is None, "nothing taken, nothing waited"
    assert time.monotonic() - started < 1.0 and len(loop.handed) == 2
    threading.Timer(0.3, slow.gate.set).start()
    # a save that is not periodic (an epoch's end, a deadline) waits for the set
    assert ckpt.save_snapshot(3, loop.specs(), loop.fill, wait=10) is True
    assert len(loop.handed) == 3 and ckpt.snapshot_buffer_sets == 1
    ckpt.close()
    restored = colabkit.Checkpoints(str(dest)).restore()
    assert restored.step == 3 and restored.state["w"][0] == 3.0


def test_write_false_runs_fill_and_writes_nothing(tmp_path, ck_env):
    loop, dest = Weights(), tmp_path / "run"
    with colabkit.Checkpoints(str(dest)) as ckpt:
        loop.train()
        assert ckpt.save_snapshot(1, loop.specs(), loop.fill, write=False) is True
        assert len(loop.handed) == 1 and loop.handed[0][0][0] == 1.0
        assert ckpt.wait(5)
    assert colabkit.Checkpoints(str(dest)).restore() is None
    with colabkit.Checkpoints(str(dest)) as other:   # nor was the folder claimed
        assert other.save_snapshot(1, loop.specs(), loop.fill, wait=True)
    assert colabkit.Checkpoints(str(dest)).restore().step == 1


_RESIDENT_IN_FILL = r"""
import ctypes, json, mmap, sys, time
import numpy as np
if sys.argv[2] == "without":
    del mmap.MAP_POPULATE   # as on macOS and Windows
import colabkit

def resident(array):
    '''The share of the array's pages that are in memory (mincore), read without touching them.'''
    page = mmap.PAGESIZE
    start = array.ctypes.data - array.ctypes.data % page
    length = array.ctypes.data + array.nbytes - start
    vec = (ctypes.c_ubyte * ((length + page - 1) // page))()
    if ctypes.CDLL(None, use_errno=True).mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec):
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vec) / len(vec)

state = [np.ones((48 << 20) // 4, np.float32), np.ones((2 << 20) // 4, np.float32)]   # 48 MB and 2 MB
seen = {}

def fill(name):
    def fill(buffers):
        seen[name] = [resident(b) for b in buffers]
        for buffer, array in zip(buffers, state):
            np.copyto(buffer, array)
        return {"big": buffers[0], "small": buffers[1]}
    return fill

for kind in ("waiting", "periodic"):
    ckpt = colabkit.Checkpoints(f"{sys.argv[1]}/{kind}")
    ckpt.prepare_snapshot(state)
    if kind == "waiting":   # an epoch's end, a signal: the first save of the run waits for the prepared set
        ckpt.save_snapshot(1, state, fill(kind), wait=True)
    else:                   # the first asks for the prepared set to be touched; a later one takes it
        deadline = time.monotonic() + 60
        while ckpt.save_snapshot(1, state, fill(kind), periodic=True) is None and time.monotonic() < deadline:
            time.sleep(0.05)
    ckpt.close()
print(json.dumps(seen))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore and glibc's malloc settings")
@pytest.mark.parametrize("populate", ["with", "without"], ids=["MAP_POPULATE", "without"])
def test_the_first_save_into_a_prepared_set_is_handed_memory_already_faulted_in(tmp_path, ck_env, populate):
    """What save_snapshot promises the loop: its copy goes into memory already touched (no page faults), for
    the first save into the set prepare_snapshot made too, whether that save waits for the set or a periodic
    save had it touched in the background, for arrays of every size, with or without MAP_POPULATE."""
    env = {**ck_env, "COLABKIT_SMALL_STATE_MB": "0",
           # every array of 128 kB and more is a mapping of its own, never touched before (not a reused heap block)
           "MALLOC_MMAP_THRESHOLD_": str(128 << 10)}
    done = subprocess.run([sys.executable, "-c", _RESIDENT_IN_FILL, str(tmp_path / "run"), populate], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(seen) == {"waiting", "periodic"}
    for kind, shares in seen.items():
        assert min(shares) > 0.9, f"a {kind} save was handed buffers with pages never faulted in: {shares}"
