"""What a checkpoint costs a Keras training run, each figure against a baseline measured in the same run:

1. stall per save (time the training loop spends in AutoResume on a batch that takes a snapshot)
   / one ``np.copyto`` of the whole state into warm (already touched) memory;
2. host memory used for snapshots while saves arrive faster than they are written (tracemalloc peak of a
   run with AutoResume minus the same run without it) / the state's size;
3. resume (``on_train_begin`` of a fresh AutoResume on a fresh model and an empty local folder) / reading
   the checkpoint's bytes from the same place (local disk, and the Drive stand-in FUSE mount when available);
4. commit latency at a local destination (save call -> committed there, durably) / writing the same
   number of bytes there once (write + fsync);

and the kill test: a training run (``save_freq=4``) SIGKILLed at random moments and restarted, how many batches
each restart trains again, against save_freq + the commit latency measured in that run.

    python bench/save_cost.py [--width 2112] [--kills 20] [--no-kill] [--no-mount]

Width 2112 gives 3 dense layers of 17.8M parameters: 214 MB of weights + Adam state. Needs TensorFlow
(Keras 3); the mount needs /dev/fuse + fusermount3 + mfusepy. Not a test: nothing fails on speed.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "standins"))

import numpy as np  # noqa: E402

BATCH = 8


def build(keras, width):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(2 * width), keras.layers.Dense(width),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def data(width, batches):
    x = np.random.RandomState(0).rand(batches * BATCH, width).astype("float32")
    return x, x[:, :1].copy()


def state_vars(model):
    return list(model.variables) + list(model.optimizer.variables) + list(getattr(model, "metrics_variables", []))


def state_bytes(model):
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in state_vars(model))


def median(xs):
    return statistics.median(xs) if xs else float("nan")


# -- 1. stall -----------------------------------------------------------------------------------------------
def copy_baseline(model):
    """A function timing one np.copyto of every variable's value (host arrays made beforehand) into touched
    buffers of the same shapes."""
    sources = [np.array(v.numpy()) for v in state_vars(model)]
    targets = [np.empty_like(s) for s in sources]
    for t in targets:
        t.fill(0)

    def copy():
        started = time.perf_counter()
        for t, s in zip(targets, sources):
            np.copyto(t, s)
        return time.perf_counter() - started
    return copy


class Recorder:
    """A callback around AutoResume: how long AutoResume's on_train_batch_end took, and whether it saved;
    and, right before each call, one np.copyto of the whole state into warm memory, so that the baseline of a
    batch that took a snapshot saw the same machine (load, background writes) as that snapshot."""

    def __init__(self, keras, auto, baseline=None):
        outer = self
        self.auto, self.records, self.baseline = auto, [], []

        class _Proxy(keras.callbacks.Callback):
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
                copied = baseline() if baseline is not None else None
                seq = auto.checkpoints._seq
                started = time.perf_counter()
                auto.on_train_batch_end(batch, logs)
                outer.records.append((time.perf_counter() - started, auto.checkpoints._seq != seq))
                if copied is not None and auto.checkpoints._seq != seq:
                    outer.baseline.append(copied)

            def on_epoch_end(self, epoch, logs=None):
                auto.on_epoch_end(epoch, logs)

            def on_train_end(self, logs=None):
                auto.on_train_end(logs)

        self.callback = _Proxy()


def train(keras, colabkit, model, dest, width, batches, save_freq, baseline=None, **kw):
    auto = colabkit.keras.AutoResume(str(dest), save_freq=save_freq, deadline=None, verbose=0, keep=2, **kw)
    rec = Recorder(keras, auto, baseline)
    x, y = data(width, batches)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[rec.callback])
    return auto, rec.records, rec.baseline


# -- 2. memory ----------------------------------------------------------------------------------------------
def traced_peak(fn):
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


# -- 3. resume ----------------------------------------------------------------------------------------------
def read_all(path: Path) -> float:
    started = time.perf_counter()
    for file in sorted(path.rglob("*")):
        if file.is_file():
            with open(file, "rb") as fh:
                while fh.read(8 << 20):
                    pass
    return time.perf_counter() - started


def state_digest(model) -> str:
    import hashlib
    digest = hashlib.sha256()
    for v in state_vars(model):
        digest.update(np.ascontiguousarray(v.numpy()).tobytes())
    return digest.hexdigest()


def sha256_time(path: Path) -> float:
    """Best of 3: sha256 of the checkpoint's files, already in memory (what verification costs at least)."""
    import hashlib
    data = [file.read_bytes() for file in sorted(path.rglob("*")) if file.is_file()]
    times = []
    for _ in range(3):
        started = time.perf_counter()
        for blob in data:
            hashlib.sha256(blob).digest()
        times.append(time.perf_counter() - started)
    return min(times)


def resume_worker(dest, local, width):
    """A fresh process (a fresh VM, but with the page cache warm): build the model, time on_train_begin of
    a new AutoResume, print the time, its parts and a digest of the resumed state."""
    import keras
    import colabkit
    model = build(keras, width)
    auto = colabkit.keras.AutoResume(str(dest), deadline=None, verbose=0, local_dir=local)
    auto.set_model(model)
    parts = {}
    for obj, name in ((auto.checkpoints, "restore"), (auto, "_apply")):
        real = getattr(obj, name)

        def timed(*a, _real=real, _name=name, **kw):
            t = time.perf_counter()
            try:
                return _real(*a, **kw)
            finally:
                parts[_name] = time.perf_counter() - t
        setattr(obj, name, timed)
    started = time.perf_counter()
    auto.on_train_begin()
    took = time.perf_counter() - started
    auto._restore_signal_handlers()
    assert auto.restored is not None
    print(f"RESUME {took:.4f} {parts.get('restore', 0):.4f} {parts.get('_apply', 0):.4f} {state_digest(model)}",
          flush=True)


def resume_once(width, dest, local):
    done = subprocess.run([sys.executable, __file__, "--resume-worker", str(dest), str(local), "--width", str(width)],
                          capture_output=True, text=True, timeout=600)
    line = [w for w in (ln.split() for ln in done.stdout.splitlines()) if w and w[0] == "RESUME"]
    if not line:
        raise RuntimeError(f"the resume worker failed: {done.stderr[-3000:]}")
    took, restore, apply, digest = line[0][1:]
    return float(took), float(restore), float(apply), digest


# -- 4. commit latency ---------------------------------------------------------------------------------------
def durable_write(path: Path, nbytes: int, source: np.ndarray) -> float:
    view = memoryview(source).cast("B")[:nbytes]
    started = time.perf_counter()
    with open(path, "wb") as fh:
        for offset in range(0, nbytes, 8 << 20):
            fh.write(view[offset:offset + (8 << 20)])
        fh.flush()
        os.fsync(fh.fileno())
    took = time.perf_counter() - started
    path.unlink()
    return took


def commit_latency(auto, position=(0, 0)):
    started = time.perf_counter()
    auto._save(position, reason="bench")
    assert auto.checkpoints.wait(120)
    return time.perf_counter() - started


# -- kill test ----------------------------------------------------------------------------------------------
def worker(dest, width, save_freq, batches):
    """A training process for the kill test: prints STEP <n> <t> after every trained batch, COMMITTED <step>
    <latency> when a save is committed at the destination, RESUMED <step> at the start."""
    import keras
    import colabkit
    model = build(keras, width)
    x, y = data(width, batches)
    auto = colabkit.keras.AutoResume(dest, save_freq=save_freq, deadline=None, verbose=0, keep=2)
    saved_at, lock, out = {}, threading.Lock(), threading.Lock()
    real_save = auto.checkpoints.save_snapshot

    def say(line):   # whole lines: the watcher thread prints too
        with out:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def save(step, specs, fill, **kw):
        def timed(buffers):   # the snapshot is taken once fill has copied the state: a commit's latency from there
            state = fill(buffers)
            with lock:
                saved_at[step] = time.monotonic()
            return state
        return real_save(step, specs, timed, **kw)

    auto.checkpoints.save_snapshot = save

    def watch():
        last = None
        while True:
            up = auto.checkpoints.status.last_uploaded
            if up is not None and up.step != last:
                last = up.step
                with lock:
                    started = saved_at.get(up.step)
                if started is not None:
                    say(f"COMMITTED {up.step} {time.monotonic() - started:.4f}")
            time.sleep(0.002)

    class Steps(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            restored = auto.restored
            say(f"RESUMED {restored.step if restored else 0}")
            threading.Thread(target=watch, daemon=True).start()

        def on_train_batch_end(self, batch, logs=None):
            if auto._step != getattr(self, "last", None):   # not a batch skipped to reach the resume position
                self.last = auto._step
                say(f"STEP {auto._step} {time.monotonic():.4f}")

    model.fit(x, y, batch_size=BATCH, epochs=1000, shuffle=False, verbose=0, callbacks=[auto, Steps()])


def kill_test(width, kills, save_freq, seed, env):
    rng = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="ck-kill-"))
    env = {**env, "XDG_CACHE_HOME": str(tmp / "cache"), "XDG_CONFIG_HOME": str(tmp / "config")}
    dest = tmp / "dest"
    lost, bounds, latencies, batch_times, writer_bounds = [], [], [], [], []
    last_step = None
    try:
        for i in range(kills + 1):
            proc = subprocess.Popen([sys.executable, __file__, "--worker", str(dest), "--width", str(width),
                                     "--save-freq", str(save_freq)], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            lines, first_step = [], threading.Event()

            def pump(p=proc, out=lines, ev=first_step):
                for line in p.stdout:
                    words = line.split()
                    if len(words) in (2, 3) and words[0] in ("STEP", "COMMITTED", "RESUMED"):
                        out.append(words)
                    if line.startswith("STEP"):
                        ev.set()

            reader = threading.Thread(target=pump, daemon=True)
            reader.start()
            if not first_step.wait(300):
                proc.kill()
                raise RuntimeError(f"the worker did not start training: {proc.stderr.read()[-2000:]}")
            resumed = next(int(w[1]) for w in lines if w[0] == "RESUMED")
            if last_step is not None:
                lost.append(last_step - resumed)
                bounds.append(run_bound)
                writer_bounds.append(run_writer_bound)
            if i == kills:
                proc.kill()
                proc.wait()
                break
            time.sleep(rng.uniform(1.0, 6.0))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            reader.join(5)
            steps = [(int(w[1]), float(w[2])) for w in lines if w[0] == "STEP"]
            run_latencies = [float(w[2]) for w in lines if w[0] == "COMMITTED"]
            last_step = steps[-1][0]
            gaps = [b[1] - a[1] for a, b in zip(steps, steps[1:])]
            batch_s = median(gaps) if gaps else float("nan")
            batch_times += gaps
            latencies += run_latencies
            worst = max(run_latencies) if run_latencies else float("nan")
            commit_batches = int(np.ceil(worst / batch_s)) if run_latencies and gaps else None
            run_bound = None if commit_batches is None else save_freq + commit_batches
            # when a commit outlasts save_freq batches the writer is the bottleneck: the next snapshot is taken
            # the batch after the previous commit ends, so the interval between snapshots is commit + 1 batch
            run_writer_bound = None if commit_batches is None else max(save_freq, commit_batches + 1) + commit_batches
            print(f"  kill {i + 1:2d}: trained to step {last_step} (resumed at {resumed}); commits in this run: "
                  f"{len(run_latencies)}, latency median {median(run_latencies):.3f} s, max {worst:.3f} s; "
                  f"batch {batch_s * 1e3:.0f} ms", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return lost, bounds, writer_bounds, latencies, batch_times


def distribution(xs):
    xs = sorted(xs)
    if not xs:
        return "n/a"
    q = lambda p: xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]  # noqa: E731
    return f"min {xs[0]}, median {q(0.5)}, p90 {q(0.9)}, max {xs[-1]} (n={len(xs)})"


def report_kill_test(args):
    """The kill test, and its distribution against the bounds."""
    print(f"\nkill test: save_freq={args.save_freq}, {args.kills} kills at random moments (1-6 s into each run)",
          flush=True)
    lost, bounds, writer_bounds, latencies, batch_times = kill_test(args.width, args.kills, args.save_freq,
                                                                    args.seed, dict(os.environ))
    over = [(lo, b) for lo, b in zip(lost, bounds) if b is not None and lo > b]
    print(f"batches trained again after a kill: {distribution(lost)}")
    known = [b for b in bounds if b is not None]
    print(f"bound save_freq + commit latency (worst of the killed run, in batches): {distribution(known)}; "
          f"kills over it: {len(over)} {over if over else ''}")
    over = [(lo, b) for lo, b in zip(lost, writer_bounds) if b is not None and lo > b]
    print(f"bound max(save_freq, commit + 1) + commit (the writer as bottleneck): kills over it: {len(over)} "
          f"{over if over else ''}")
    print(f"commit latency during training: median {median(latencies) * 1e3:.0f} ms, max "
          f"{max(latencies) * 1e3 if latencies else float('nan'):.0f} ms (n={len(latencies)}); batch median "
          f"{median(batch_times) * 1e3:.0f} ms")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2112)
    parser.add_argument("--batches", type=int, default=48, help="batches of the stall run")
    parser.add_argument("--save-freq", type=int, default=4)
    parser.add_argument("--commits", type=int, default=5)
    parser.add_argument("--resumes", type=int, default=3)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--no-kill", action="store_true")
    parser.add_argument("--kill-only", action="store_true", help="only the kill test")
    parser.add_argument("--no-mount", action="store_true")
    parser.add_argument("--drive-read-rate", type=float, default=50e6,
                        help="read throughput (bytes/s) of the Drive-like mount's resume row (Drive reads tens of "
                             "MB/s); 0: leave that row out")
    parser.add_argument("--worker")
    parser.add_argument("--resume-worker", nargs=2)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.width, args.save_freq, 4000)
    if args.resume_worker:
        return resume_worker(*args.resume_worker, args.width)

    if args.kill_only:
        return report_kill_test(args)
    import keras
    import colabkit
    tmp = Path(tempfile.mkdtemp(prefix="ck-cost-"))
    os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
    os.environ["XDG_CONFIG_HOME"] = str(tmp / "config")
    print(f"colabkit from {Path(colabkit.__file__).parent}; {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    ratios = {}

    # 1. stall per save vs one copy of the state into warm memory
    model = build(keras, args.width)
    nbytes = state_bytes(model)
    print(f"state: {nbytes / 1e6:.1f} MB ({len(state_vars(model))} variables), width {args.width}", flush=True)
    copy = copy_baseline(model)
    auto, records, copies = train(keras, colabkit, model, tmp / "stall", args.width, args.batches, args.save_freq,
                                  baseline=copy)
    save_stalls = [s for s, saved in records if saved]
    other = [s for s, saved in records if not saved]
    deferred = sum(1 for i, (s, saved) in enumerate(records) if not saved and (i + 1) % args.save_freq == 0)
    stall = median(save_stalls)
    ratios["stall"] = stall / median(copies)
    print(f"\n1. stall per save: median {stall * 1e3:.1f} ms, mean {np.mean(save_stalls) * 1e3:.1f} ms, max "
          f"{max(save_stalls) * 1e3:.1f} ms over {len(save_stalls)} snapshots ({deferred} save batches "
          f"without a snapshot); other batches {median(other) * 1e3:.2f} ms; one np.copyto of the state into "
          f"warm memory, right before each of those snapshots: median {median(copies) * 1e3:.1f} ms, best "
          f"{min(copies) * 1e3:.1f} ms -> {ratios['stall']:.2f}x median/median, "
          f"{min(save_stalls) / min(copies):.2f}x best/best (target <= 1.5x)", flush=True)

    # 4. commit latency at a local destination vs one durable write of the same bytes there
    time.sleep(1.0)
    auto.checkpoints.wait(60)
    newest = auto.checkpoints.list()[-1]
    ckpt_bytes = newest.size
    source = np.ones(ckpt_bytes // 8 + 1)
    commits, writes = [], []
    for i in range(args.commits):
        writes.append(durable_write(Path(auto.checkpoints.destination) / "baseline.bin", ckpt_bytes, source))
        time.sleep(0.3)
        commits.append(commit_latency(auto, (1, i)))
        time.sleep(0.3)
    del source
    ratios["commit"] = median(commits) / median(writes)
    print(f"\n4. commit latency at a local destination: median {median(commits) * 1e3:.0f} ms "
          f"(all: {', '.join(f'{c * 1e3:.0f}' for c in commits)}); write + fsync of {ckpt_bytes / 1e6:.1f} MB "
          f"there: median {median(writes) * 1e3:.0f} ms (all: {', '.join(f'{w * 1e3:.0f}' for w in writes)}) "
          f"-> {ratios['commit']:.2f}x median/median, {min(commits) / min(writes):.2f}x best/best "
          f"(target <= 1.5x)", flush=True)
    auto.checkpoints.close()
    auto.checkpoints.release()

    # 2. snapshot memory, saves faster than writes (save_freq=1), with and without AutoResume
    def fit_plain():
        m = build(keras, args.width)
        x, y = data(args.width, 16)
        m.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)

    holder = {}

    def fit_auto():
        m = build(keras, args.width)
        holder["auto"] = train(keras, colabkit, m, tmp / "memory", args.width, 16, 1)[0]
        holder["auto"].checkpoints.close()

    fit_plain()  # warm-up: first-call allocations of TF/Keras are not the checkpoint's
    plain = traced_peak(fit_plain)
    with_auto = traced_peak(fit_auto)
    snap_mem = with_auto - plain
    ratios["memory"] = snap_mem / nbytes
    status = holder["auto"].checkpoints.status
    sets = getattr(holder["auto"].checkpoints, "snapshot_buffer_sets", None)
    print(f"\n2. host memory for snapshots (16 batches, a save after every one): tracemalloc peak "
          f"{with_auto / 1e6:.0f} MB with AutoResume, {plain / 1e6:.0f} MB without -> {snap_mem / 1e6:.0f} MB "
          f"= {ratios['memory']:.2f}x the state (target <= 1x); snapshots written "
          f"{len(holder['auto'].checkpoints.list())} kept, dropped {status.saves_dropped}"
          + (f", buffer sets allocated {sets}" if sets is not None else ""), flush=True)

    # 3. resume vs reading the checkpoint's bytes, local disk and the FUSE mount
    from drive_mount import fuse_unavailable_reason, mounted_drive
    places = {"local disk": None}
    reason = "--no-mount" if args.no_mount else fuse_unavailable_reason()
    if reason is None:
        places["FUSE mount (20 MB/s writes)"] = "mount"
        if args.drive_read_rate:
            places[f"FUSE mount read at {args.drive_read_rate / 1e6:.0f} MB/s (Drive-like)"] = "slow-mount"
    else:
        print(f"\n(no FUSE mount: {reason})")
    with contextlib.ExitStack() as stack:
        for place, kind in places.items():
            if kind in ("mount", "slow-mount"):
                drive = stack.enter_context(mounted_drive(
                    tmp / kind, rate=None, read_rate=args.drive_read_rate if kind == "slow-mount" else None))
                dest = drive.my_drive / "resume"
            else:
                dest = tmp / "resume"
            m = build(keras, args.width)
            a = train(keras, colabkit, m, dest, args.width, 4, 4)[0]
            a.checkpoints.close()
            a.checkpoints.release()
            expected = state_digest(m)
            shutil.rmtree(a.checkpoints.local.path, ignore_errors=True)  # a fresh VM: only the destination
            ckpt_dir = a.checkpoints.list()[-1].path
            del m, a
            reads, resumes, restores, applies = [], [], [], []
            for i in range(args.resumes):
                reads.append(read_all(ckpt_dir))
                took, restore, apply, digest = resume_once(args.width, dest, tmp / f"fresh-{i}")
                assert digest == expected, "the resumed state differs from the saved one"
                resumes.append(took)
                restores.append(restore)
                applies.append(apply)
            key = {None: "resume", "mount": "resume_mount", "slow-mount": "resume_drive_like"}[kind]
            ratios[key] = median(resumes) / median(reads)
            sha = sha256_time(ckpt_dir)
            print(f"\n3. resume from {place} (a fresh process each time, state identical): median "
                  f"{median(resumes) * 1e3:.0f} ms (all: {', '.join(f'{r * 1e3:.0f}' for r in resumes)}; of which "
                  f"reading + checking + loading {median(restores) * 1e3:.0f} ms, assigning "
                  f"{median(applies) * 1e3:.0f} ms); reading the checkpoint's {ckpt_bytes / 1e6:.0f} MB there: "
                  f"median {median(reads) * 1e3:.0f} ms (all: {', '.join(f'{r * 1e3:.0f}' for r in reads)}) "
                  f"-> {ratios[key]:.2f}x (target <= 1.5x); the sha256 of those bytes alone, in memory: "
                  f"{sha * 1e3:.0f} ms ({sha / median(reads):.2f}x the read)", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)

    if not args.no_kill:
        report_kill_test(args)
    print("\nsummary: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
