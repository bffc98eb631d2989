"""Training-loop stall per checkpoint: colabkit.keras.AutoResume vs keras.callbacks.BackupAndRestore,
each writing to local disk and to a Drive-like FUSE mount throttled to 20 MB/s, in one run.

Also: resume time vs the time to read the checkpoint's bytes, and checkpoint size vs raw tensor bytes.

    python bench/checkpoint_bench.py [--params 16.8e6] [--saves 5] [--every 5]

Needs TensorFlow (Keras 3), /dev/fuse + fusermount3 + mfusepy for the mount (the local-disk half runs
without them). Prints a table; copy the figures into bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "standins"))

import numpy as np  # noqa: E402


class Timed:
    """Wraps a Keras callback and records how long each on_train_batch_end call blocked the loop."""

    def __init__(self, keras, inner):
        outer = self

        class _Proxy(keras.callbacks.Callback):
            def set_model(self, model):
                super().set_model(model)
                inner.set_model(model)

            def set_params(self, params):
                super().set_params(params)
                inner.set_params(params)

            def on_train_begin(self, logs=None):
                inner.on_train_begin(logs)

            def on_epoch_begin(self, epoch, logs=None):
                inner.on_epoch_begin(epoch, logs)

            def on_train_batch_end(self, batch, logs=None):
                checkpoints = getattr(inner, "checkpoints", None)   # AutoResume: did this batch take a snapshot?
                seq = checkpoints._seq if checkpoints is not None else None
                t = time.perf_counter()
                inner.on_train_batch_end(batch, logs)
                outer.stalls.append(time.perf_counter() - t)
                outer.saved.append(None if seq is None else checkpoints._seq != seq)

            def on_epoch_end(self, epoch, logs=None):
                inner.on_epoch_end(epoch, logs)

            def on_train_end(self, logs=None):
                t = time.perf_counter()
                inner.on_train_end(logs)
                outer.final = time.perf_counter() - t

        self.stalls, self.saved, self.final, self.callback = [], [], 0.0, _Proxy()


def build(keras, width):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((width,)), keras.layers.Dense(2 * width), keras.layers.Dense(width),
                              keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def run(keras, tool, dest, width, saves, every):
    model = build(keras, width)
    batches = saves * every
    x = np.random.RandomState(0).rand(batches * 8, width).astype("float32")
    y = x[:, :1]
    if tool == "BackupAndRestore":
        inner = keras.callbacks.BackupAndRestore(str(dest), save_freq=every, delete_checkpoint=False)
    else:
        import colabkit
        inner = colabkit.keras.AutoResume(str(dest), save_freq=every, deadline=None, verbose=0, keep=2)
    timed = Timed(keras, inner)
    started = time.perf_counter()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[timed.callback])
    wall = time.perf_counter() - started
    # a save batch: where a snapshot was taken (AutoResume takes one due while the previous is still being
    # written at a later batch), else every `every`-th batch (BackupAndRestore)
    saved = [(i + 1) % every == 0 if taken is None else taken for i, taken in enumerate(timed.saved)]
    save_stalls = [s for s, is_save in zip(timed.stalls, saved) if is_save]
    other = [s for s, is_save in zip(timed.stalls, saved) if not is_save]
    return {"stall": float(np.mean(save_stalls)), "stall_max": float(np.max(save_stalls)), "saves": len(save_stalls),
            "other": float(np.mean(other)) if other else 0.0, "final": timed.final, "wall": wall,
            "model": model, "callback": inner}


def raw_bytes(model):
    return sum(np.asarray(v.numpy()).nbytes for v in list(model.variables) + list(model.optimizer.variables))


def read_all(path: Path) -> float:
    started = time.perf_counter()
    for file in sorted(path.rglob("*")):
        if file.is_file():
            with open(file, "rb") as fh:
                while fh.read(8 << 20):
                    pass
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048, help="model width; 2048 gives ~16.8M params (~200 MB "
                                                                  "with Adam state)")
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--every", type=int, default=5, help="batches between saves")
    parser.add_argument("--rate", type=float, default=20e6, help="mount write throttle, bytes/s")
    args = parser.parse_args()
    import keras
    from drive_mount import fuse_unavailable_reason, mounted_drive

    tmp = Path(tempfile.mkdtemp(prefix="ck-bench-"))
    os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
    results = {}
    reason = fuse_unavailable_reason()
    import contextlib
    with contextlib.ExitStack() as stack:
        places = {"local disk": tmp / "local"}
        if reason:
            print(f"(no FUSE mount: {reason}; local disk only)")
        else:
            drive = stack.enter_context(mounted_drive(tmp / "fuse", rate=args.rate))
            places[f"{args.rate / 1e6:.0f} MB/s mount"] = drive.my_drive
        for place, root in places.items():
            for tool in ("BackupAndRestore", "AutoResume"):
                results[(tool, place)] = run(keras, tool, root / tool, args.width, args.saves, args.every)
                r = results[(tool, place)]
                print(f"{tool:<17} {place:<16} stall/save {r['stall']:7.3f} s (max {r['stall_max']:.3f}, "
                      f"{r['saves']} saves), final save {r['final']:.2f} s, wall {r['wall']:.1f} s", flush=True)

        model = results[("AutoResume", "local disk")]["model"]
        raw = raw_bytes(model)
        print(f"\nstate: {raw / 1e6:.1f} MB raw (weights + optimizer), width {args.width}")
        print("\n| tool | destination | saves taken | stall per save (mean) | max | final save (waits for upload) |")
        print("|---|---|---|---|---|---|")
        for (tool, place), r in results.items():
            print(f"| {tool} | {place} | {r['saves']} | {r['stall']:.3f} s | {r['stall_max']:.3f} s | "
                  f"{r['final']:.2f} s |")
        slow = [p for p in places if p != "local disk"]
        if slow:
            ours_slow = results[("AutoResume", slow[0])]["stall"]
            ours_local = results[("AutoResume", "local disk")]["stall"]
            theirs_slow = results[("BackupAndRestore", slow[0])]["stall"]
            theirs_local = results[("BackupAndRestore", "local disk")]["stall"]
            print(f"\nAutoResume stall on the slow mount / on local disk: {ours_slow / ours_local:.2f}x (target <= 1.2x)")
            print(f"AutoResume stall / BackupAndRestore stall, slow mount: {ours_slow / theirs_slow:.3f} "
                  f"(target <= 0.1)")
            print(f"AutoResume stall on the slow mount / BackupAndRestore stall on local disk: "
                  f"{ours_slow / theirs_local:.2f} (stretch: < 1)")

        # size and resume, from the slowest destination available
        place = slow[0] if slow else "local disk"
        auto = results[("AutoResume", place)]["callback"]
        newest = auto.checkpoints.list()[-1]
        size = newest.size
        print(f"\ncheckpoint size {size / 1e6:.1f} MB vs raw tensors {raw / 1e6:.1f} MB: {size / raw:.3f}x "
              f"(target <= 1.05x)")
        dest_ckpt = auto.checkpoints.destination / newest.name
        shutil.rmtree(auto.checkpoints.local.path)          # a fresh VM: restore from the destination
        read_s = read_all(dest_ckpt)
        import colabkit
        model2 = build(keras, args.width)
        resume = colabkit.keras.AutoResume(str(auto.checkpoints.destination), deadline=None, verbose=0,
                                           local_dir=tmp / "fresh-local")
        resume.set_model(model2)
        started = time.perf_counter()
        resume.on_train_begin()
        resume_s = time.perf_counter() - started
        print(f"resume from {place}: {resume_s:.2f} s; reading the checkpoint's bytes: {read_s:.2f} s "
              f"({resume_s / read_s:.2f}x)")
        resume._restore_signal_handlers()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
