"""A save of a training state that does not fit twice in free memory is written variable by variable: a torch
AutoResume in a memory cgroup too small for a second copy of its state saves, twice, and a fresh process restores
it bit-exactly; the same save without the limit takes the buffered path. Free memory is read from MemAvailable
and the cgroup's limit (checked against fake cgroup trees).

Run as a script, this file is the worker: ``python test_streaming_save.py save|restore <dest> <MB>``.
"""
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

STREAMED = "does not fit twice in free memory"
CGROUP_V1 = Path("/sys/fs/cgroup/memory")


# -- the worker (runs in the subprocess) -----------------------------------------------------------------

def _model(total_mb: int, fill: bool):
    """Parameters of ``total_mb`` MB of float32: one above the staging buffer (200 MB), the rest in 64 MB and
    small pieces; random from a fixed seed when ``fill``, else zeros (the restore's fresh model)."""
    import torch
    sizes, left = [], total_mb << 20
    for size in [200 << 20] + [64 << 20] * 1000:
        if left <= 0:
            break
        sizes.append(min(size, left))
        left -= sizes[-1]
    sizes += [4 * 3, 4 * 1000]   # small ones besides
    params = torch.nn.ParameterList()
    g = torch.Generator().manual_seed(7)
    for nbytes in sizes:
        p = torch.empty(nbytes // 4)
        if fill:
            p.normal_(generator=g)
        else:
            p.zero_()
        params.append(torch.nn.Parameter(p, requires_grad=False))
    return params


def _digests(model) -> list:
    import hashlib
    return [hashlib.sha256(p.detach().numpy().tobytes()).hexdigest()[:16] for p in model]


def _worker(action: str, dest: str, total_mb: int) -> None:
    import resource

    import colabkit.torch
    model = _model(total_mb, fill=action == "save")
    if action == "restore":
        ar = colabkit.torch.AutoResume(dest, deadline=None, verbose=0, model=model)
        print(json.dumps({"step": ar.restored.step, "digests": _digests(model)}), flush=True)
        return
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    ar = colabkit.torch.AutoResume(dest, deadline=None, verbose=0, model=model)
    ar.save(wait=True)
    model[0].data.add_(1.0)   # the second save holds other values
    ar.save(wait=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
    print(json.dumps({"digests": _digests(model), "sets": ar.checkpoints.snapshot_buffer_sets,
                      "above_state": peak - before}), flush=True)
    ar.checkpoints.close()


# -- the tests -----------------------------------------------------------------------------------------------

def _run(args, env, cgroup: Path | None = None, timeout=300):
    command = [sys.executable, __file__, *map(str, args)]
    if cgroup is not None:   # the child enters the cgroup before Python starts
        command = ["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$@"', "sh", *command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"rc {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.fixture
def memory_cgroup():
    """A fresh cgroup v1 memory cgroup (skips where this machine has none that this user may create)."""
    if not (CGROUP_V1 / "memory.limit_in_bytes").exists():
        pytest.skip(f"no cgroup v1 memory controller at {CGROUP_V1}")
    path = CGROUP_V1 / f"colabkit-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup at {path}: {exc}")
    yield path
    for _ in range(50):   # its last process may take a moment to leave it
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.1)


@pytest.mark.slow
def test_a_state_larger_than_free_memory_is_streamed_and_restores_bit_exactly(ck_env, tmp_path, memory_cgroup):
    pytest.importorskip("torch")
    state_mb, limit_mb = 1536, 2600   # one copy fits; two do not
    (memory_cgroup / "memory.limit_in_bytes").write_text(str(limit_mb << 20))
    dest = tmp_path / "run"
    saved, said = _run(["save", dest, state_mb], ck_env, memory_cgroup)
    assert said.count(STREAMED) == 1, said   # once per run, not at every save
    assert saved["sets"] == 0                 # no snapshot buffers were allocated
    assert saved["above_state"] < 0.5 * (state_mb << 20), saved
    restored, _ = _run(["restore", dest, state_mb], ck_env)
    assert restored["digests"] == saved["digests"]
    assert restored["step"] == 0


@pytest.mark.slow
def test_the_same_state_with_memory_to_spare_takes_the_buffered_path(ck_env, tmp_path):
    pytest.importorskip("torch")
    dest = tmp_path / "run"
    saved, said = _run(["save", dest, 256], ck_env)
    assert STREAMED not in said
    assert saved["sets"] == 1
    restored, _ = _run(["restore", dest, 256], ck_env)
    assert restored["digests"] == saved["digests"]


def _fake_cgroup_v1(root: Path, limit: int, usage: int, inactive: int = 0, own: str = "") -> Path:
    folder = root / "memory" / own.strip("/")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (folder / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (folder / "memory.stat").write_text(f"cache 5\ninactive_file 1\ntotal_inactive_file {inactive}\n")
    return folder


def test_the_cgroup_v1_headroom_is_the_limit_less_usage_not_counting_inactive_file_cache(tmp_path):
    from colabkit.checkpoints.streaming import cgroup_headroom
    _fake_cgroup_v1(tmp_path, limit=8 << 30, usage=3 << 30, inactive=1 << 30)
    assert cgroup_headroom(tmp_path, "4:memory:/\n0::/\n") == 6 << 30


def test_the_tightest_limit_from_the_own_cgroup_up_counts(tmp_path):
    from colabkit.checkpoints.streaming import cgroup_headroom
    _fake_cgroup_v1(tmp_path, limit=9223372036854771712, usage=5 << 30)       # the root: no limit
    _fake_cgroup_v1(tmp_path, limit=4 << 30, usage=1 << 30, own="/job")        # a parent's limit
    _fake_cgroup_v1(tmp_path, limit=16 << 30, usage=2 << 30, own="/job/task")  # the process's own, looser
    assert cgroup_headroom(tmp_path, "4:memory:/job/task\n") == 3 << 30


def test_a_container_seeing_its_own_cgroup_at_the_root_reads_the_root(tmp_path):
    from colabkit.checkpoints.streaming import cgroup_headroom
    _fake_cgroup_v1(tmp_path, limit=2 << 30, usage=1 << 30)
    assert cgroup_headroom(tmp_path, "4:memory:/docker/0123abcd\n") == 1 << 30


def test_cgroup_v2_memory_max_and_current(tmp_path):
    from colabkit.checkpoints.streaming import cgroup_headroom
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    own = tmp_path / "user.slice"
    own.mkdir()
    (own / "memory.max").write_text("3221225472\n")
    (own / "memory.current").write_text(f"{2 << 30}\n")
    (own / "memory.stat").write_text(f"anon 5\ninactive_file {512 << 20}\n")
    assert cgroup_headroom(tmp_path, "0::/user.slice\n") == (3 << 30) - (1536 << 20)
    (own / "memory.max").write_text("max\n")
    assert cgroup_headroom(tmp_path, "0::/user.slice\n") is None


def test_no_cgroup_or_no_limit_leaves_meminfo_alone(tmp_path, monkeypatch):
    from colabkit.checkpoints import streaming
    assert streaming.cgroup_headroom(tmp_path / "absent", "4:memory:/\n") is None
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683584 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n")
    assert streaming.meminfo_available(meminfo) == 2 << 20
    monkeypatch.setenv("COLABKIT_TEST_CGROUP_ROOT", str(tmp_path))
    _fake_cgroup_v1(tmp_path, limit=1 << 30, usage=(1 << 30) - (100 << 20))
    assert streaming.available_bytes() <= 100 << 20


def _save_with_copy(ck, step, arrays):
    return ck.save_snapshot(step, arrays, lambda buffers: {"w": buffers[:-1], "tail": buffers[-1], "n": step},
                            copy=lambda index, buffer: np.copyto(buffer, arrays[index]), wait=True)


def test_a_streamed_checkpoint_reads_as_a_buffered_one_and_damage_falls_back(ck_env, tmp_path, monkeypatch,
                                                                             caplog):
    import colabkit
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(n).astype(np.float32) for n in (10, 1 << 20, 3)] + [np.arange(5, dtype=np.int16)]
    _fake_cgroup_v1(tmp_path / "cg", limit=1 << 30, usage=(1 << 30) - (64 << 20))   # 64 MB left: streams
    monkeypatch.setenv("COLABKIT_TEST_CGROUP_ROOT", str(tmp_path / "cg"))
    streamed = colabkit.Checkpoints(tmp_path / "streamed")
    with caplog.at_level("WARNING", logger="colabkit"):
        assert _save_with_copy(streamed, 1, arrays)
        first = arrays[0].copy()
        arrays[0] += 1
        assert _save_with_copy(streamed, 2, arrays)
    assert sum(STREAMED in r.getMessage() for r in caplog.records) == 1
    assert streamed.snapshot_buffer_sets == 0
    streamed.close()
    monkeypatch.delenv("COLABKIT_TEST_CGROUP_ROOT")
    buffered = colabkit.Checkpoints(tmp_path / "buffered")
    assert _save_with_copy(buffered, 2, arrays)
    assert buffered.snapshot_buffer_sets == 1
    buffered.close()
    # the files a fresh reader sees: the same names, the same arrays
    newest = {name: sorted((tmp_path / name).glob("ckpt-*"))[-1] for name in ("streamed", "buffered")}
    assert sorted(p.name for p in newest["streamed"].iterdir()) == sorted(p.name for p in newest["buffered"].iterdir())
    with np.load(newest["streamed"] / "arrays.npz") as a, np.load(newest["buffered"] / "arrays.npz") as b:
        assert a.files == b.files and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a.files)
    script = ("import sys, numpy as np, colabkit; r = colabkit.Checkpoints(sys.argv[1]).restore(); "
              "print(r.step, [np.asarray(x).tolist()[:2] for x in r.state['w']], r.state['tail'].tolist())")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "streamed")], env=ck_env,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[0] == "2", out.stderr
    assert out.stdout.strip().endswith("[0, 1, 2, 3, 4]")
    # the commit protocol is the same: a damaged newest checkpoint gives way to the previous one
    data = newest["streamed"] / "arrays.npz"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.warns(RuntimeWarning, match="damaged"):
        restored = colabkit.Checkpoints(tmp_path / "streamed").restore()
    assert restored.step == 1
    assert np.array_equal(restored.state["w"][0], first)


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))


_ADAM_RESTORE = """
import sys, hashlib, torch, colabkit.torch
torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5))
opt = torch.optim.Adam(model.parameters(), lr=0.1)
ar = colabkit.torch.AutoResume(sys.argv[1], deadline=None, verbose=0, model=model, opt=opt)
print(repr(sorted((k, v.tolist()) for k, v in model.state_dict().items())))
print(repr(opt.state_dict()["state"][0]["step"].tolist()), repr(opt.state_dict()["state"][0]["exp_avg"].tolist()))
"""


def test_a_streamed_torch_save_keeps_optimizer_scalars_and_buffers(ck_env, tmp_path, monkeypatch, caplog):
    torch = pytest.importorskip("torch")
    import colabkit.torch
    _fake_cgroup_v1(tmp_path / "cg", limit=1 << 30, usage=(1 << 30) - (64 << 20))   # 64 MB left: streams
    monkeypatch.setenv("COLABKIT_TEST_CGROUP_ROOT", str(tmp_path / "cg"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    for _ in range(3):   # Adam's 0-d step tensors, BatchNorm's running stats and its int64 batch count
        opt.zero_grad()
        model(torch.randn(8, 6)).square().mean().backward()
        opt.step()
    ar = colabkit.torch.AutoResume(tmp_path / "run", deadline=None, verbose=0, model=model, opt=opt)
    assert ar.save(wait=True)
    assert ar.checkpoints.snapshot_buffer_sets == 0
    ar.checkpoints.close()
    assert any(STREAMED in r.getMessage() for r in caplog.records)
    done = subprocess.run([sys.executable, "-c", _ADAM_RESTORE, str(tmp_path / "run")],
                          env={k: v for k, v in ck_env.items() if k != "COLABKIT_TEST_CGROUP_ROOT"},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    state, optimizer = done.stdout.strip().splitlines()[-2:]
    assert state == repr(sorted((k, v.tolist()) for k, v in model.state_dict().items()))
    assert optimizer == (f'{opt.state_dict()["state"][0]["step"].tolist()!r} '
                         f'{opt.state_dict()["state"][0]["exp_avg"].tolist()!r}')
