"""What saving a tf.data input's position costs: colabkit's seed-state capture (colabkit/keras/tfdata.py) vs a
whole-iterator checkpoint (tf.train.Checkpoint(iterator=...), the one alternative that is exact too), for a
reshuffling shuffle() over 3 kB elements (784 float32), in one run.

    python bench/input_position_bench.py [--buffers 1000,10000,100000] [--runs 3]

Per buffer size: the whole iterator's checkpoint (bytes, seconds, at every save) after a few batches, and
colabkit's capture (bytes added to every checkpoint, seconds once an epoch) and restore (seconds, once per
resume); plus the epoch's own time to fill the buffer, for scale. Best of ``--runs``. Prints a table; copy
the figures into bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def best(fn, runs):
    times, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buffers", default="1000,10000,100000")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    import tensorflow as tf
    from colabkit.keras.tfdata import TFDataInput, _pipeline_state

    rows = []
    for buffer in (int(b) for b in args.buffers.split(",")):
        x = np.random.RandomState(0).rand(buffer + 2000, 784).astype("float32")
        dataset = tf.data.Dataset.from_tensor_slices(x).shuffle(buffer, seed=0).batch(32)
        fill_s, _ = best(lambda: next(iter(dataset)), 1)    # the first batch waits for the whole buffer
        running = iter(dataset)
        for _ in range(5):
            next(running)
        with tempfile.TemporaryDirectory() as tmp:
            whole_s, _ = best(lambda: tf.train.Checkpoint(iterator=running).write(f"{tmp}/ckpt"), args.runs)
            whole_bytes = folder_bytes(Path(tmp))
        parts, _, _ = _pipeline_state(dataset)
        probes = [iter(part) for part in parts]
        tracker = TFDataInput.__new__(TFDataInput)   # only the state capture, outside a fit()
        tracker._tf, tracker._probes, tracker._variables, tracker._broken, tracker._said_slow = tf, probes, [], None, False
        capture_s, states = best(tracker._seed_states, args.runs)
        capture_bytes = sum(s.nbytes for s in states["seeds"])
        restore_s, _ = best(lambda: [tracker._deserialize(p, s) for p, s in zip(probes, states["seeds"])], args.runs)
        rows.append((buffer, whole_bytes, whole_s, capture_bytes, capture_s, restore_s, fill_s))
        del x, dataset, running, probes

    print(f"{'buffer':>8} | {'whole iterator':>14} | {'its save s':>10} | {'colabkit':>9} | {'capture s':>9} | "
          f"{'restore s':>9} | {'buffer fill s':>13}")
    for buffer, whole_bytes, whole_s, capture_bytes, capture_s, restore_s, fill_s in rows:
        print(f"{buffer:>8} | {whole_bytes / 1e6:>11.1f} MB | {whole_s:>10.3f} | {capture_bytes / 1e3:>6.1f} kB | "
              f"{capture_s:>9.3f} | {restore_s:>9.3f} | {fill_s:>13.3f}")


if __name__ == "__main__":
    main()
