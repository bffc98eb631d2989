"""colabkit's checkpoints against their peers, on the same state and the same disk: what a resume costs, how long
the training loop waits per save, and how long a save takes to be durable.

For each state size, the same model (3 linear layers of width W + Adam's two moments: 48 W^2 bytes) is saved once
by every tool into one folder on the same disk; then every measure runs in a fresh process of its own, the
measures taking turns in each round (the machine's load falls on all of them alike), and the best and median
over the rounds are reported (load only ever adds time, so the best is the fairest figure on a shared machine):

resume (files in the page cache):
  torch_ar_resume   colabkit.torch.AutoResume(...) on fresh objects, local staging wiped (a new VM), verified
  torch_load        torch.load(weights_only=True) of a torch.save file, then load_state_dict into fresh objects
  dcp_load          torch.distributed.checkpoint.load into fresh objects' state dicts (+ load_state_dict)
  keras_ar_resume   a fresh colabkit.keras.AutoResume's on_train_begin (finds, verifies, assigns)
  keras_bnr_resume  keras.callbacks.BackupAndRestore's on_train_begin (model.load_weights of its backup)
  read_torch/keras  reading the colabkit checkpoint's bytes: 8 MB reads into one reused buffer, and into one
                    fresh buffer of the file's size (what any restore has to do: the bytes land in new memory)
stall per save (what the loop waits; the previous save already finished) and commit (save called -> on disk):
  torch_ar_save     colabkit.torch.AutoResume.save(); commit: until checkpoints.wait() returns (fsynced)
  dcp_async_save    torch.distributed.checkpoint.async_save (one process, no process group); commit: its future
  lightning_async   Trainer.save_checkpoint with lightning's AsyncCheckpointIO(TorchCheckpointIO); commit: until
                    its thread is done (torch.save; no fsync)
  keras_ar_save     colabkit.keras.AutoResume's on_train_batch_end on a saving batch in model.fit;
                    commit: until checkpoints.wait() returns (fsynced)
  keras_bnr_save    BackupAndRestore's save (model.save_weights + its JSON; synchronous, no fsync)
  write_fsync       one write of the state's bytes to a file on the same disk + fsync (the commit's baseline)

    python bench/peer_bench.py [--sizes-mb 200 2000] [--rounds 5] [--big-rounds 2] [--dir DIR] [--json OUT]

Needs torch, lightning, TensorFlow + Keras 3. Not a test: nothing fails on speed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

SAVES = 3          # timed saves per save measure (after an untimed first one: fresh buffers, first writes)
BATCH = 8
TORCH_MEASURES = ("read_torch", "torch_ar_resume", "torch_load", "dcp_load",
                  "torch_ar_save", "dcp_async_save", "lightning_async", "write_fsync")
KERAS_MEASURES = ("read_keras", "keras_ar_resume", "keras_bnr_resume", "keras_ar_save", "keras_bnr_save")


def width_for(size_mb: float) -> int:
    return int(round(math.sqrt(size_mb * 1e6 / 48)))


def say(result: dict) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def timed(fn):
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


# -- torch ---------------------------------------------------------------------------------------------------
def torch_build(width):
    import torch
    from torch_save_cost import build
    return build(torch, width)


def torch_digest(model, opt) -> str:
    import torch
    digest = hashlib.sha256()
    from torch_save_cost import tensors_of
    for t in tensors_of(torch, model, opt):
        digest.update(t.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def torch_ar(d: Path, model, opt, run="run"):
    import colabkit.torch   # imported before any timing: a training script has imported it already
    return colabkit.torch.AutoResume(d / run, model=model, opt=opt, deadline=None, verbose=0)


def prepare_torch(d: Path, width: int) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp
    model, opt = torch_build(width)
    ar = torch_ar(d, model, opt)
    ar.step = 1
    ar.save()
    assert ar.checkpoints.wait(600)
    ar.close()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, d / "torch_save.pt")
    dcp.save({"model": model.state_dict(), "opt": opt.state_dict()}, checkpoint_id=d / "dcp")
    from torch_save_cost import tensors_of
    raw = sum(t.numel() * t.element_size() for t in tensors_of(torch, model, opt))
    return {"torch_digest": torch_digest(model, opt), "raw_bytes": raw}


def newest_checkpoint(folder: Path) -> Path:
    from colabkit.checkpoints.folder import CheckpointFolder
    return Path(CheckpointFolder(folder).committed()[-1].path)


def read_bytes(folder: Path) -> dict:
    """Reading every file of the checkpoint: into one reused 8 MB buffer, and into one fresh buffer each."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    started = time.perf_counter()
    chunk = bytearray(8 << 20)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(chunk):
                pass
    reused = time.perf_counter() - started
    started = time.perf_counter()
    for f in files:
        buffer = np.empty(f.stat().st_size, np.uint8)
        with open(f, "rb", buffering=0) as fh:
            fh.readinto(memoryview(buffer))
    fresh = time.perf_counter() - started
    return {"read_reused_s": reused, "read_fresh_s": fresh, "bytes": sum(f.stat().st_size for f in files)}


def torch_measure(name: str, d: Path, width: int, expect: dict) -> dict:
    import torch
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")   # one process, as intended
    if name == "read_torch":
        return read_bytes(newest_checkpoint(d / "run"))
    if name == "torch_ar_resume":
        import colabkit.torch  # noqa: F401 - imported before the timing, as a training script has
        shutil.rmtree(d / "cache", ignore_errors=True)   # a new VM: no local staging
        model, opt = torch_build(width)
        took, ar = timed(lambda: torch_ar(d, model, opt))
        assert ar.restored is not None and ar.restored.source == "destination", ar.restored
        ar.close()
        return {"resume_s": took, "exact": torch_digest(model, opt) == expect["torch_digest"]}
    if name == "torch_load":
        model, opt = torch_build(width)
        took, loaded = timed(lambda: torch.load(d / "torch_save.pt", weights_only=True))

        def into():
            model.load_state_dict(loaded["model"])
            opt.load_state_dict(loaded["opt"])
        took_into, _ = timed(into)
        return {"load_s": took, "load_into_s": took + took_into,
                "exact": torch_digest(model, opt) == expect["torch_digest"]}
    if name == "dcp_load":
        import torch.distributed.checkpoint as dcp
        model, opt = torch_build(width)

        def load():
            state = {"model": model.state_dict(), "opt": opt.state_dict()}
            dcp.load(state, checkpoint_id=d / "dcp")
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
        took, _ = timed(load)
        return {"load_s": took, "exact": torch_digest(model, opt) == expect["torch_digest"]}
    if name == "torch_ar_save":
        model, opt = torch_build(width)
        shutil.rmtree(d / "run_save", ignore_errors=True)
        ar = torch_ar(d, model, opt, run="run_save")
        stalls, commits = [], []
        for step in range(SAVES + 1):
            ar.step = step + 1
            stall, _ = timed(ar.save)
            wait, done = timed(lambda: ar.checkpoints.wait(600))
            assert done
            stalls.append(stall)
            commits.append(stall + wait)
        ar.close()
        shutil.rmtree(d / "run_save", ignore_errors=True)
        return {"stall_s": stalls[1:], "commit_s": commits[1:], "first_stall_s": stalls[0]}
    if name == "dcp_async_save":
        import torch.distributed.checkpoint as dcp
        model, opt = torch_build(width)
        stalls, commits = [], []
        for i in range(SAVES + 1):
            target = d / f"dcp_async_{i % 2}"
            shutil.rmtree(target, ignore_errors=True)
            stall, future = timed(lambda t=target: dcp.async_save(
                {"model": model.state_dict(), "opt": opt.state_dict()}, checkpoint_id=t))
            wait, _ = timed(future.result)
            stalls.append(stall)
            commits.append(stall + wait)
        for i in range(2):
            shutil.rmtree(d / f"dcp_async_{i}", ignore_errors=True)
        return {"stall_s": stalls[1:], "commit_s": commits[1:], "first_stall_s": stalls[0]}
    if name == "lightning_async":
        return lightning_async(d, width)
    if name == "write_fsync":
        data = np.ones(expect["raw_bytes"], np.uint8)   # touched, as a state in memory is
        path = d / "write_fsync.bin"

        def write():
            view = memoryview(data)
            with open(path, "wb") as fh:
                for at in range(0, data.nbytes, 8 << 20):
                    fh.write(view[at:at + (8 << 20)])
                fh.flush()
                os.fsync(fh.fileno())
        took, _ = timed(write)
        path.unlink()
        return {"write_s": took}
    raise ValueError(name)


def lightning_async(d: Path, width: int) -> dict:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net, _ = torch_build(width)

        def training_step(self, batch, _):
            return self.net(batch).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-4)

    io = AsyncCheckpointIO(TorchCheckpointIO())
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, plugins=[io],
                         default_root_dir=str(d / "lightning"))
    data = torch.utils.data.DataLoader(torch.randn(4 * BATCH, width), batch_size=BATCH)
    trainer.fit(Module(), data)
    stalls, commits = [], []
    for i in range(SAVES + 1):
        stall, _ = timed(lambda p=d / f"lightning_{i % 2}.ckpt": trainer.save_checkpoint(p))
        wait, _ = timed(io.teardown)   # its one thread finishes the queued save
        stalls.append(stall)
        commits.append(stall + wait)
    for i in range(2):
        (d / f"lightning_{i}.ckpt").unlink(missing_ok=True)
    return {"stall_s": stalls[1:], "commit_s": commits[1:], "first_stall_s": stalls[0]}


# -- keras ---------------------------------------------------------------------------------------------------
def keras_build(width):
    import keras
    from save_cost import build
    return build(keras, width)


def keras_data(width, batches):
    x = np.random.RandomState(0).rand(batches * BATCH, width).astype("float32")
    return x, x[:, :1].copy()


def keras_digests(model) -> tuple[str, str]:
    """sha256 of the model's variables, and of the optimizer's."""
    out = []
    for variables in (model.variables, model.optimizer.variables):
        digest = hashlib.sha256()
        for v in variables:
            digest.update(np.ascontiguousarray(v.numpy()).tobytes())
        out.append(digest.hexdigest())
    return tuple(out)


def keras_ar(d: Path, folder="keras_run", **kw):
    import colabkit.keras
    return colabkit.keras.AutoResume(str(d / folder), deadline=None, verbose=0, **kw)


def prepare_keras(d: Path, width: int) -> dict:
    import keras
    model = keras_build(width)
    x, y = keras_data(width, 2)
    auto = keras_ar(d, save_freq=2)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[auto])
    assert auto.checkpoints.wait(600)
    bnr = keras.callbacks.BackupAndRestore(str(d / "keras_bnr"), delete_checkpoint=False)
    bnr.set_model(model)
    bnr.on_epoch_end(0)
    weights, optimizer = keras_digests(model)
    size = sum(p.stat().st_size for p in (d / "keras_bnr").rglob("*") if p.is_file())
    return {"keras_weights_digest": weights, "keras_optimizer_digest": optimizer, "keras_bnr_bytes": size}


class _Timed:
    """A callback around AutoResume that times its on_train_batch_end on the batches that save, each after the
    previous save was committed (outside the timing), and the commit of each."""

    def __init__(self, keras, auto):
        outer = self
        self.stalls, self.commits = [], []

        class Proxy(keras.callbacks.Callback):
            def set_model(self, model):
                super().set_model(model)
                auto.set_model(model)

            def set_params(self, params):
                super().set_params(params)
                auto.set_params(params)

            def on_train_begin(self, logs=None):
                auto.on_train_begin(logs)

            def on_epoch_begin(self, epoch, logs=None):
                auto.on_epoch_begin(epoch, logs)

            def on_train_batch_end(self, batch, logs=None):
                assert auto.checkpoints.wait(600)
                seq = auto.checkpoints._seq
                stall, _ = timed(lambda: auto.on_train_batch_end(batch, logs))
                if auto.checkpoints._seq != seq:
                    wait, done = timed(lambda: auto.checkpoints.wait(600))
                    assert done
                    outer.stalls.append(stall)
                    outer.commits.append(stall + wait)

            def on_epoch_end(self, epoch, logs=None):
                auto.on_epoch_end(epoch, logs)

            def on_train_end(self, logs=None):
                auto.on_train_end(logs)

        self.callback = Proxy()


def keras_measure(name: str, d: Path, width: int, expect: dict) -> dict:
    import keras
    if name == "read_keras":
        return read_bytes(newest_checkpoint(d / "keras_run"))
    if name == "keras_ar_resume":
        shutil.rmtree(d / "cache", ignore_errors=True)
        model = keras_build(width)
        auto = keras_ar(d)
        auto.set_model(model)
        took, _ = timed(auto.on_train_begin)
        auto._restore_signal_handlers()   # fit() is not run: put back what on_train_begin installed
        assert auto.restored is not None
        weights, optimizer = keras_digests(model)
        return {"resume_s": took, "exact": (weights, optimizer) == (expect["keras_weights_digest"],
                                                                     expect["keras_optimizer_digest"])}
    if name == "keras_bnr_resume":
        model = keras_build(width)
        bnr = keras.callbacks.BackupAndRestore(str(d / "keras_bnr"), delete_checkpoint=False)
        bnr.set_model(model)
        took, _ = timed(bnr.on_train_begin)
        weights, optimizer = keras_digests(model)
        return {"resume_s": took, "exact": weights == expect["keras_weights_digest"],
                "optimizer_restored": optimizer == expect["keras_optimizer_digest"]}
    if name == "keras_ar_save":
        model = keras_build(width)
        shutil.rmtree(d / "keras_run_save", ignore_errors=True)
        auto = keras_ar(d, folder="keras_run_save", save_freq=2)
        probe = _Timed(keras, auto)
        # the first periodic save of a large state only readies its buffers: a later batch takes it
        x, y = keras_data(width, 24 if width < 4000 else 16)
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[probe.callback])
        shutil.rmtree(d / "keras_run_save", ignore_errors=True)
        return {"stall_s": probe.stalls[1:], "commit_s": probe.commits[1:], "first_stall_s": probe.stalls[:1]}
    if name == "keras_bnr_save":
        model = keras_build(width)
        x, y = keras_data(width, 1)
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        shutil.rmtree(d / "keras_bnr_save", ignore_errors=True)
        bnr = keras.callbacks.BackupAndRestore(str(d / "keras_bnr_save"), delete_checkpoint=False)
        bnr.set_model(model)
        stalls = [timed(lambda e=epoch: bnr.on_epoch_end(e))[0] for epoch in range(SAVES + 1)]
        shutil.rmtree(d / "keras_bnr_save", ignore_errors=True)
        return {"stall_s": stalls[1:], "commit_s": stalls[1:], "first_stall_s": stalls[0]}
    raise ValueError(name)


# -- the driver ----------------------------------------------------------------------------------------------
def run_worker(kind: str, d: Path, width: int, timeout: float) -> dict:
    env = dict(os.environ, XDG_CACHE_HOME=str(d / "cache"))
    done = subprocess.run([sys.executable, __file__, "--worker", kind, "--dir", str(d), "--width", str(width)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    lines = [ln[7:] for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{kind} failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(lines[-1])


def worker(kind: str, d: Path, width: int) -> None:
    expect = json.loads((d / "expect.json").read_text()) if (d / "expect.json").exists() else {}
    if kind == "prepare_torch":
        say(prepare_torch(d, width))
    elif kind == "prepare_keras":
        say(prepare_keras(d, width))
    elif kind in TORCH_MEASURES:
        say(torch_measure(kind, d, width, expect))
    else:
        say(keras_measure(kind, d, width, expect))


def values(results: list, key: str) -> list:
    """Every value of ``key`` over the rounds (a save measure gives several per round)."""
    out = []
    for r in results:
        v = r.get(key)
        out += v if isinstance(v, list) else [] if v is None else [v]
    return out


def bench_size(size_mb: float, rounds: int, base: Path, measures: list, timeout: float) -> dict:
    width = width_for(size_mb)
    d = base / f"state_{int(size_mb)}mb"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    load_before = os.getloadavg()
    expect = {}
    if any(m in TORCH_MEASURES for m in measures):
        expect.update(run_worker("prepare_torch", d, width, timeout))
    if any(m in KERAS_MEASURES for m in measures):
        expect.update(run_worker("prepare_keras", d, width, timeout))
    expect.setdefault("raw_bytes", 48 * width * width)
    (d / "expect.json").write_text(json.dumps(expect))
    results = {m: [] for m in measures}
    started = time.time()
    for r in range(rounds):
        for m in (measures if r % 2 == 0 else list(reversed(measures))):   # alternate the order too
            try:
                results[m].append(run_worker(m, d, width, timeout))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:   # the other measures still count
                results[m].append({"error": str(exc)[-2000:]})
            print(f"  {size_mb:g} MB round {r + 1}/{rounds}: {m} {results[m][-1]}", file=sys.stderr, flush=True)
    out = {"size_mb": size_mb, "width": width, "raw_bytes": expect["raw_bytes"], "rounds": rounds,
           "load_before": load_before, "load_after": os.getloadavg(), "seconds": time.time() - started,
           "keras_bnr_bytes": expect.get("keras_bnr_bytes"), "results": results}
    shutil.rmtree(d, ignore_errors=True)
    return out


def summary(run: dict) -> dict:
    """name -> (best, median) seconds of every figure."""
    res, fig = run["results"], {}

    def put(label, measure, key):
        vs = values(res.get(measure, []), key)
        if vs:
            fig[label] = (min(vs), statistics.median(vs))
    put("read, reused 8 MB buffer (torch ckpt)", "read_torch", "read_reused_s")
    put("read, fresh buffer (torch ckpt)", "read_torch", "read_fresh_s")
    put("colabkit torch AutoResume resume", "torch_ar_resume", "resume_s")
    put("torch.load(weights_only=True)", "torch_load", "load_s")
    put("torch.load + load_state_dict", "torch_load", "load_into_s")
    put("dcp.load (+ load_state_dict)", "dcp_load", "load_s")
    put("read, reused 8 MB buffer (keras ckpt)", "read_keras", "read_reused_s")
    put("read, fresh buffer (keras ckpt)", "read_keras", "read_fresh_s")
    put("colabkit keras AutoResume resume", "keras_ar_resume", "resume_s")
    put("keras BackupAndRestore resume", "keras_bnr_resume", "resume_s")
    for measure, label in (("torch_ar_save", "colabkit torch AutoResume"), ("dcp_async_save", "dcp.async_save"),
                           ("lightning_async", "Lightning AsyncCheckpointIO"),
                           ("keras_ar_save", "colabkit keras AutoResume"),
                           ("keras_bnr_save", "keras BackupAndRestore")):
        put(f"stall: {label}", measure, "stall_s")
        put(f"commit: {label}", measure, "commit_s")
    put("one write + fsync", "write_fsync", "write_s")
    return fig


def report(run: dict) -> str:
    fig = summary(run)
    lines = [f"### {run['raw_bytes'] / 1e6:.0f} MB of state (width {run['width']}), {run['rounds']} rounds, "
             f"load average {run['load_before'][0]:.1f} before, {run['load_after'][0]:.1f} after, "
             f"{run['seconds'] / 60:.1f} min", "", "| measure | best s | median s |", "| --- | ---: | ---: |"]
    for label, (best, med) in fig.items():
        lines.append(f"| {label} | {best:.4f} | {med:.4f} |")
    lines.append("")

    def ratio(a, b, what):
        if a in fig and b in fig:
            lines.append(f"- {what}: best {fig[a][0] / fig[b][0]:.2f}x, median {fig[a][1] / fig[b][1]:.2f}x")
    ratio("colabkit torch AutoResume resume", "torch.load(weights_only=True)", "torch resume / torch.load")
    ratio("colabkit torch AutoResume resume", "torch.load + load_state_dict",
          "torch resume / (torch.load + load_state_dict)")
    ratio("colabkit torch AutoResume resume", "dcp.load (+ load_state_dict)", "torch resume / dcp.load")
    ratio("colabkit keras AutoResume resume", "read, reused 8 MB buffer (keras ckpt)",
          "keras resume / reading the bytes (reused buffer)")
    ratio("colabkit keras AutoResume resume", "read, fresh buffer (keras ckpt)",
          "keras resume / reading the bytes (fresh buffer)")
    ratio("colabkit keras AutoResume resume", "keras BackupAndRestore resume", "keras resume / BackupAndRestore")
    ratio("commit: colabkit torch AutoResume", "one write + fsync", "torch commit / one write + fsync")
    ratio("commit: colabkit keras AutoResume", "one write + fsync", "keras commit / one write + fsync")
    exact = {m: all(r.get("exact", True) for r in rs) for m, rs in run["results"].items() if rs}
    lines.append("- restored bit-exactly: " + ", ".join(f"{m} {v}" for m, v in exact.items()
                                                      if "resume" in m or "load" in m))
    bnr = run["results"].get("keras_bnr_resume")
    if bnr:
        lines.append(f"- BackupAndRestore restores the optimizer's state: {bnr[0].get('optimizer_restored')}; its "
                     f"backup: {run['keras_bnr_bytes'] / 1e6:.1f} MB")
    return "\n".join(lines)


def versions() -> str:
    import importlib.metadata as md
    names = ("torch", "lightning", "tensorflow", "keras", "numpy", "blake3")
    found = []
    for n in names:
        try:
            found.append(f"{n} {md.version(n)}")
        except md.PackageNotFoundError:
            pass
    return f"Python {platform.python_version()}, " + ", ".join(found)


def main():
    parser = argparse.ArgumentParser(prog="python bench/peer_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[200, 2000], help="state sizes (MB)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds for states under 1 GB (default 5)")
    parser.add_argument("--big-rounds", type=int, default=2, help="rounds for states of 1 GB and more (default 2)")
    parser.add_argument("--only", nargs="+", choices=TORCH_MEASURES + KERAS_MEASURES, help="only these measures")
    parser.add_argument("--dir", help="where the checkpoints go (default: a temporary folder on the system disk)")
    parser.add_argument("--json", help="also write every figure to this file")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for one measure's process")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, Path(args.dir), args.width)
        return
    measures = list(args.only or TORCH_MEASURES + KERAS_MEASURES)
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="colabkit-peer-bench-"))
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores, {platform.machine()}, "
          f"Linux {platform.release()}; {versions()}; load average {os.getloadavg()[0]:.1f}\n", flush=True)
    runs = []
    try:
        for size in args.sizes_mb:
            runs.append(bench_size(size, args.rounds if size < 1000 else args.big_rounds, base, measures,
                                   args.timeout))
            print(report(runs[-1]) + "\n", flush=True)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
