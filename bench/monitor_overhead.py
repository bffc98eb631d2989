"""What the training monitor costs per step, against the same training without it, measured in the same run.

1. Keras: ``model.fit`` of the same model on the same cached, prefetched tf.data input, without callbacks
   (baseline), with a do-nothing callback that overrides ``on_train_batch_end`` (what any per-batch callback
   costs: Keras then waits for every step), and with ``colabkit.keras.Monitor()`` (default options: sampling
   every 1 s, input split on every 20th call after the first measurements). Rounds alternate; medians.
2. A custom loop: ``mon.step()`` + ``mon.wrap()`` per iteration against the bare loop (ns per step).

    python bench/monitor_overhead.py [--width 512] [--batch 256] [--steps 300] [--rounds 5]

Needs TensorFlow (Keras 3). Without a GPU the step runs on the CPU (the overhead is a CPU cost either way).
Not a test: nothing fails on speed.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def keras_case(width: int, batch: int, steps: int, rounds: int) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    import colabkit

    rng = np.random.default_rng(0)
    x = rng.random((batch * 8, 256), dtype="float32")
    y = rng.random((batch * 8, 1), dtype="float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).cache().repeat().prefetch(tf.data.AUTOTUNE)
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(width, activation="relu"), keras.layers.Dense(1)])
    model.compile("adam", "mse")

    class PerBatch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    def fit(callbacks):
        t = time.perf_counter()
        model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
        return time.perf_counter() - t

    fit([])                                                  # compile
    fit([colabkit.keras.Monitor(verbose=0)])                 # the monitor's sampled-step path traced once
    times = {"baseline": [], "per-batch callback": [], "Monitor": []}
    for _ in range(rounds):
        times["baseline"].append(fit([]))
        times["per-batch callback"].append(fit([PerBatch()]))
        monitor = colabkit.keras.Monitor(verbose=0)
        times["Monitor"].append(fit([monitor]))
    report = monitor.report()
    return {k: min(v) for k, v in times.items()} | {f"{k} median": statistics.median(v) for k, v in times.items()} | {
        "samples": report["input_samples"], "input_fraction": report["input_fraction"],
        "step_time_s": report["step_time_s"]}


def loop_case(n: int) -> dict:
    import colabkit
    items = range(n)
    t = time.perf_counter()
    for _ in items:
        pass
    bare = time.perf_counter() - t
    mon = colabkit.monitor(verbose=0, gpus=False)
    t = time.perf_counter()
    for _ in mon.wrap(items):
        mon.step()
    monitored = time.perf_counter() - t
    mon.stop()
    return {"bare_ns": bare / n * 1e9, "monitored_ns": monitored / n * 1e9}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--loop", type=int, default=200_000)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPU(s), Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    k = keras_case(args.width, args.batch, args.steps, args.rounds)
    base = k["baseline"]
    print(f"\nKeras fit, {args.steps} steps, width {args.width}, batch {args.batch} (best and median of "
          f"{args.rounds} alternating rounds; load only ever adds time, so best-of is the cleaner figure):")
    print("| case | best fit s | ms/step | overhead ms/step | ratio (best) | median fit s |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in ("baseline", "per-batch callback", "Monitor"):
        t = k[name]
        print(f"| {name} | {t:.3f} | {t / args.steps * 1000:.3f} | {(t - base) / args.steps * 1000:+.3f} | "
              f"{t / base:.4f} | {k[name + ' median']:.3f} |")
    print(f"Monitor vs per-batch callback: {k['Monitor'] / k['per-batch callback']:.4f} "
          f"({(k['Monitor'] - k['per-batch callback']) / args.steps * 1e6:+.1f} us/step)")
    print(f"monitor's own figures: step {k['step_time_s'] * 1000:.2f} ms, input share {k['input_fraction']:.1%} "
          f"over {k['samples']} measured calls")
    lo = loop_case(args.loop)
    print(f"\ncustom loop, {args.loop} iterations: bare {lo['bare_ns']:.0f} ns/step, with mon.wrap() + "
          f"mon.step() {lo['monitored_ns']:.0f} ns/step (+{lo['monitored_ns'] - lo['bare_ns']:.0f} ns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
