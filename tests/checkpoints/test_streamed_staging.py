"""A streamed save (streaming.py) packs small variables one after another in its staging buffer and reuses it only
once the hash has caught up: the checkpoint verifies and restores bit-exactly when the buffer wraps around many
times, and a streamed save killed midway leaves the previous checkpoint the one a fresh process restores."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import colabkit
from colabkit.checkpoints import streaming


def _squeezed_cgroup(root):
    """A fake cgroup v1 tree with 64 MB left under its limit: every save streams."""
    folder = root / "memory"
    folder.mkdir(parents=True)
    (folder / "memory.limit_in_bytes").write_text(f"{1 << 30}\n")
    (folder / "memory.usage_in_bytes").write_text(f"{(1 << 30) - (64 << 20)}\n")
    (folder / "memory.stat").write_text("total_inactive_file 0\n")
    return root


def test_small_variables_wrapping_the_staging_buffer_many_times_restore_bit_exactly(ck_env, tmp_path, monkeypatch):
    monkeypatch.setattr(streaming, "STAGING_BYTES", 4096)   # a few variables per fill of the staging buffer
    monkeypatch.setenv("COLABKIT_TEST_CGROUP_ROOT", str(_squeezed_cgroup(tmp_path / "cg")))
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(n).astype(dtype) for n, dtype in
              [(300, np.float32), (7, np.int8), (1000, np.float64), (5000, np.float32), (1, np.int64)] * 40]
    store = colabkit.Checkpoints(tmp_path / "run")
    assert store.save_snapshot(3, arrays, lambda buffers: {"w": buffers},
                               copy=lambda i, buffer: np.copyto(buffer, arrays[i]), wait=True)
    assert store.snapshot_buffer_sets == 0        # it streamed
    store.close()
    restored = colabkit.Checkpoints(tmp_path / "run").restore()   # verified against the manifest's hashes
    assert restored.step == 3
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(arrays, restored.state["w"]))


KILLED_MIDWAY = """
import sys, time, numpy as np, colabkit
arrays = [np.full(1 << 16, i, np.float32) for i in range(8)]
store = colabkit.Checkpoints(sys.argv[1])
def copy(step):
    def into(index, buffer):
        if step == 2 and index == 5:   # midway through the second save's file
            open(sys.argv[2], "w").close()
            time.sleep(300)
        np.copyto(buffer, arrays[index] + step)
    return into
for step in (1, 2):
    store.save_snapshot(step, arrays, lambda b: {"w": b}, copy=copy(step), wait=True)
"""


@pytest.mark.subprocess_kill
def test_a_streamed_save_killed_midway_leaves_the_previous_checkpoint_to_restore(ck_env, tmp_path):
    env = {**ck_env, "COLABKIT_TEST_CGROUP_ROOT": str(_squeezed_cgroup(tmp_path / "cg"))}
    marker = tmp_path / "midway"
    writer = subprocess.Popen([sys.executable, "-c", KILLED_MIDWAY, str(tmp_path / "run"), str(marker)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert writer.poll() is None, writer.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the writer never reached the second save"
            time.sleep(0.05)
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    assert len(list((tmp_path / "run").glob("ckpt-*"))) == 2     # the second one half written
    script = ("import sys, colabkit; r = colabkit.Checkpoints(sys.argv[1]).restore(); "
              "print(r.step, [float(a[0]) for a in r.state['w']])")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run")], env=ck_env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split(" ", 1) == ["1", f"{[float(i + 1) for i in range(8)]}\n"]


@pytest.mark.fuse
@pytest.mark.slow
def test_a_streamed_save_to_the_drive_mount_is_staged_and_survives_a_drop(ck_env, tmp_path, monkeypatch, drive_mount):
    import colabkit.checkpoints.uploader as uploader
    monkeypatch.setattr(uploader, "BACKOFF_START", 0.05)
    monkeypatch.setenv("COLABKIT_TEST_CGROUP_ROOT", str(_squeezed_cgroup(tmp_path / "cg")))
    arrays = [np.full(1 << 18, i, np.float32) for i in range(6)]
    dest = drive_mount.my_drive / "run"
    store = colabkit.Checkpoints(str(dest), local_dir=tmp_path / "local")
    save = lambda step: store.save_snapshot(step, arrays, lambda b: {"w": b},  # noqa: E731
                                            copy=lambda i, buffer: np.copyto(buffer, arrays[i] + step))
    assert save(1) and store.wait(60)
    drive_mount.set_fault("enotconn")
    with pytest.warns(RuntimeWarning, match="could not upload checkpoint step 2"):
        assert save(2)                             # written to local disk while the mount is gone
        assert not store.wait(1.0)
    drive_mount.set_fault("ok")
    assert store.wait(60), store.status
    store.close()
    assert store.snapshot_buffer_sets == 0         # it streamed
    script = ("import sys, colabkit; r = colabkit.Checkpoints(sys.argv[1], local_dir=sys.argv[2]).restore(); "
              "print(r.step, r.source, [float(a[0]) for a in r.state['w']])")
    out = subprocess.run([sys.executable, "-c", script, str(dest), str(tmp_path / "fresh-vm")], env=ck_env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[:2] == ["2", "destination"], out.stdout
