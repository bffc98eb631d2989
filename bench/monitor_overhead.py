"""What the training monitor costs per step, against the same training without it, measured in the same run.

1. Keras: ``model.fit`` of the same model on the same cached, prefetched tf.data input, without callbacks
   (baseline), with a do-nothing callback that overrides ``on_train_batch_end`` (what any per-batch callback
   costs: Keras then waits for every step), and with ``colabkit.keras.Monitor()`` (default options: sampling
   every 1 s, input split on every 20th call after the first measurements). Rounds alternate; best and
   medians. Three fits: the default model (~5 ms CPU steps), the same with ``steps_per_execution=8`` (every
   sampled call then runs its 8 batches through Keras' Python-iterator path), and a wider model (~30 ms
   steps: where the <= 1% target is meant to hold).
2. A custom loop: ``mon.step()`` + ``mon.wrap()`` per iteration against the bare loop (ns per step).
3. The live plots: CPU time of one redraw (``plots.render_png``) of a monitor holding 5000 steps of history,
   and what that costs at the default refresh of one redraw per 5 s.

    python bench/monitor_overhead.py [--width 512] [--batch 256] [--steps 300] [--rounds 5] [--spe 8]
                                     [--big-width 1024] [--big-steps 100]

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


def keras_case(width: int, batch: int, steps: int, rounds: int, spe: int = 1) -> dict:
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
    model.compile("adam", "mse", steps_per_execution=spe)

    class PerBatch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    def fit(callbacks):
        t, c = time.perf_counter(), time.process_time()
        model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=callbacks)
        cpu[-1].append(time.process_time() - c)
        return time.perf_counter() - t

    cpu = [[]]
    fit([])                                                  # compile
    fit([colabkit.keras.Monitor(verbose=0)])                 # the monitor's sampled-step path traced once
    cpu[-1] = []
    times = {"baseline": [], "per-batch callback": [], "Monitor": []}
    cpus = {k: [] for k in times}
    for _ in range(rounds):
        for name, runs in times.items():
            cpu[-1] = cpus[name]          # process CPU seconds: far steadier than wall time on a shared machine
            callbacks = []
            if name == "per-batch callback":
                callbacks = [PerBatch()]
            elif name == "Monitor":
                monitor = colabkit.keras.Monitor(verbose=0)
                callbacks = [monitor]
            runs.append(fit(callbacks))
    report = monitor.report()
    return {k: min(v) for k, v in times.items()} | {f"{k} median": statistics.median(v) for k, v in times.items()} | {
        f"{k} cpu": statistics.median(v) for k, v in cpus.items()} | {
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


def plot_case(redraws: int = 5) -> dict:
    import colabkit
    from colabkit.health import plots
    mon = colabkit.monitor(verbose=0, gpus=False, sample_every="10s")
    for i in range(5000):
        mon._last_step_end = time.perf_counter() - 0.01     # a steady 10 ms step, without sleeping
        mon.step(loss=1.0 / (i + 1))
    mon.log_epoch(0, {"loss": 0.5, "val_loss": 0.6})
    plots.render_png(mon)                                   # matplotlib's first use (font cache, imports)
    times = []
    for _ in range(redraws):
        t = time.process_time()
        plots.render_png(mon)
        times.append(time.process_time() - t)
    mon.stop()
    return {"best": min(times), "median": statistics.median(times)}


def print_keras(title: str, k: dict, steps: int, rounds: int) -> None:
    base = k["baseline"]
    print(f"\n{title} ({steps} steps; best and median of {rounds} alternating rounds; load only ever adds "
          f"time, so best-of is the cleaner figure):")
    print("| case | best fit s | ms/step | overhead ms/step | ratio (best) | median fit s | ratio (median) | "
          "CPU s per fit (median) | CPU ratio |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in ("baseline", "per-batch callback", "Monitor"):
        t = k[name]
        print(f"| {name} | {t:.3f} | {t / steps * 1000:.3f} | {(t - base) / steps * 1000:+.3f} | "
              f"{t / base:.4f} | {k[name + ' median']:.3f} | {k[name + ' median'] / k['baseline median']:.4f} | "
              f"{k[name + ' cpu']:.3f} | {k[name + ' cpu'] / k['baseline cpu']:.4f} |")
    print(f"Monitor vs per-batch callback: {k['Monitor'] / k['per-batch callback']:.4f} best, "
          f"{k['Monitor median'] / k['per-batch callback median']:.4f} median "
          f"({(k['Monitor'] - k['per-batch callback']) / steps * 1e6:+.1f} us/step best)")
    share = k["input_fraction"]
    print(f"monitor's own figures: step {k['step_time_s'] * 1000:.2f} ms, input share "
          f"{'n/a' if share is None else f'{share:.1%}'} over {k['samples']} measured calls")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--loop", type=int, default=200_000)
    parser.add_argument("--spe", type=int, default=8, help="steps_per_execution of the second fit")
    parser.add_argument("--big-width", type=int, default=1024, help="width of the third fit's model")
    parser.add_argument("--big-steps", type=int, default=100, help="steps per fit of the third fit")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPU(s), Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    k = keras_case(args.width, args.batch, args.steps, args.rounds)
    print_keras(f"Keras fit, width {args.width}, batch {args.batch}", k, args.steps, args.rounds)
    k = keras_case(args.width, args.batch, args.steps, args.rounds, spe=args.spe)
    print_keras(f"Keras fit, width {args.width}, batch {args.batch}, steps_per_execution={args.spe}", k,
                args.steps, args.rounds)
    k = keras_case(args.big_width, args.batch, args.big_steps, args.rounds)
    print_keras(f"Keras fit, width {args.big_width}, batch {args.batch}", k, args.big_steps, args.rounds)
    lo = loop_case(args.loop)
    print(f"\ncustom loop, {args.loop} iterations: bare {lo['bare_ns']:.0f} ns/step, with mon.wrap() + "
          f"mon.step() {lo['monitored_ns']:.0f} ns/step (+{lo['monitored_ns'] - lo['bare_ns']:.0f} ns)")
    p = plot_case()
    print(f"\nlive plots: one redraw {p['best']:.3f} s CPU best, {p['median']:.3f} s median (5000 steps of history); "
          f"at one redraw per 5 s: {p['median'] / 5:.1%} of one core, taken with the GIL held for most of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
