"""One worker of a two-worker MultiWorkerMirroredStrategy training with AutoResume (test_multiworker.py).

    python mw_worker.py INDEX PORT0,PORT1 CHECKPOINTS OUT.json [--sigterm-at STEP] [--hang-at STEP] [--deadline D]
        [--save-deadline] [--alone]

--deadline: AutoResume's deadline on this worker alone. --sigterm-at: this worker sends itself SIGTERM after that many steps (Ctrl-C or a scheduler's stop on one
machine). --hang-at: this worker writes OUT.json.ready and sleeps there (the test kills it).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

parser = argparse.ArgumentParser()
parser.add_argument("index", type=int)
parser.add_argument("ports")
parser.add_argument("checkpoints")
parser.add_argument("out")
parser.add_argument("--sigterm-at", type=int)
parser.add_argument("--hang-at", type=int)
parser.add_argument("--timeout", default="15s")
parser.add_argument("--deadline", default="auto", help="AutoResume's deadline on this worker")
parser.add_argument("--alone", action="store_true", help="train in this process alone, with the same global batch")
parser.add_argument("--save-deadline", action="store_true",
                    help="a save-and-keep-training deadline (as an idle cutoff) due at once on this worker")
args = parser.parse_args()

import colabkit
import colabkit.deadline


class SaveNow:
    """A clock whose deadline (save, keep training) is due at the first batch end."""

    at = time.time() + 30

    def next_deadline(self):
        return colabkit.deadline.Deadline(at=self.at, reason="a test's idle cutoff", stop_training=False,
                                          key="test-save")


if args.save_deadline:
    colabkit.deadline.register(SaveNow())

if args.alone:   # one process, no multi-worker strategy: what the two workers together must compute
    import tensorflow as tf
    strategy = tf.distribute.get_strategy()
else:
    strategy = colabkit.strategy(workers=[f"127.0.0.1:{p}" for p in args.ports.split(",")], index=args.index,
                                 timeout=args.timeout)

import keras
import numpy as np

keras.utils.set_random_seed(0)
with strategy.scope():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
rng = np.random.default_rng(1)
x = rng.normal(size=(384, 6)).astype("float32")
y = (x @ rng.normal(size=(6, 1))).astype("float32")


class Trigger(keras.callbacks.Callback):
    steps = 0

    def on_train_batch_end(self, batch, logs=None):
        Trigger.steps += 1
        if args.sigterm_at is not None and Trigger.steps == args.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)
        if args.hang_at is not None and Trigger.steps == args.hang_at:
            open(args.out + ".ready", "w").close()
            time.sleep(120)


auto = colabkit.keras.AutoResume(args.checkpoints, save_freq=5, verbose=1, deadline=args.deadline)
model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0, callbacks=[Trigger(), auto])
with open(args.out, "w") as fh:
    json.dump({"index": args.index, "weights": [w.tolist() for w in model.get_weights()],
               "restored": None if auto.restored is None else auto.restored.step, "stopped": auto._stopped_for,
               "steps_here": Trigger.steps}, fh)
