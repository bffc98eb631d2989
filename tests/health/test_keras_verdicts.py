"""The Keras monitor's input-share verdict on synthetic pipelines, within the first 50 steps (real TF/Keras).

Each pipeline's cost is set far from the 5% / 20% thresholds (a 10 ms sleep per batch against a ~1 ms step, or
a cached, prefetched input against a 1024-wide model), so the verdict does not depend on this machine's speed."""
from __future__ import annotations

import time

import numpy as np
import pytest

from tests.health.conftest import tiny_model

STEPS = 50


def _arrays(n=2048):
    rng = np.random.default_rng(0)
    return rng.random((n, 32), dtype="float32"), rng.random((n, 1), dtype="float32")


def _fit(keras, model, data, **fit_args):
    import colabkit
    monitor = colabkit.keras.Monitor(sample_every="0.2s", verbose=0)
    model.fit(data, epochs=1, steps_per_epoch=STEPS, verbose=0, callbacks=[monitor], **fit_args)
    return monitor.report()


def _slow_map(tf, x, y, sleep_s=0.01):
    def slow(a, b):
        time.sleep(sleep_s)   # a CPU-side preprocessing step that takes far longer than the train step
        return a, b

    def load(a, b):
        a, b = tf.numpy_function(slow, [a, b], [tf.float32, tf.float32])
        return tf.ensure_shape(a, [None, 32]), tf.ensure_shape(b, [None, 1])
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat().map(load)


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_input_bound_tf_data_gets_the_tf_data_advice(tf_keras, steps_per_execution):
    tf, keras = tf_keras
    x, y = _arrays()
    report = _fit(keras, tiny_model(keras, steps_per_execution=steps_per_execution), _slow_map(tf, x, y))
    assert report["steps"] == STEPS
    assert report["input_kind"] == "tf.data"
    assert report["input_samples"] >= 6
    assert report["input_fraction"] >= 0.5, report["text"]
    assert report["verdict"].startswith("highly input-bound"), report["verdict"]
    assert "prefetch(tf.data.AUTOTUNE)" in report["verdict"] and "num_parallel_calls" in report["verdict"]
    assert report["gpu_utilization"] is None          # no GPU here
    assert 0.005 < report["step_time_s"] < 1.0


def test_compute_bound_tf_data(tf_keras):
    tf, keras = tf_keras
    x, y = _arrays()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(256).cache().repeat().prefetch(tf.data.AUTOTUNE)
    report = _fit(keras, tiny_model(keras, width=1024), data)
    assert report["input_kind"] == "tf.data"
    assert report["input_fraction"] < 0.05, report["text"]
    assert report["verdict"].startswith("compute-bound"), report["verdict"]
    assert not any(v["kind"] == "input" for v in report["verdicts"])


def test_after_fit_the_monitor_keeps_nothing_of_it_alive(tf_keras):
    """The watchdog looks at fit()'s frame while fit() runs; once fit() returns, the data it was given is freed
    like it is without a Monitor. (Kept alive to interpreter exit, a tf.data pipeline with background threads
    deadlocked Python 3.10's shutdown under MirroredStrategy.)"""
    import gc
    import weakref

    import colabkit
    tf, keras = tf_keras
    x, y = _arrays()
    model = tiny_model(keras)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    freed = weakref.ref(data)
    monitor = colabkit.keras.Monitor(verbose=0)
    model.fit(data, epochs=1, verbose=0, callbacks=[monitor])
    del data
    gc.collect()
    assert freed() is None
    assert monitor.report()["steps"] > 0      # and the measurements stay


def test_python_generator_gets_the_generator_advice(tf_keras):
    keras = tf_keras[1]
    x, y = _arrays()

    def batches():
        while True:
            time.sleep(0.01)
            yield x[:32], y[:32]
    report = _fit(keras, tiny_model(keras), batches())
    assert report["input_kind"] == "generator"
    assert report["input_fraction"] >= 0.5, report["text"]
    assert report["verdict"].startswith("highly input-bound: waiting for input (a Python generator)")
    assert "PyDataset with workers=N" in report["verdict"]


def test_numpy_arrays_are_named_and_training_is_unchanged(tf_keras):
    """The sampled steps train on the same batches in the same order: the weights equal an unmonitored fit's."""
    keras = tf_keras[1]
    x, y = _arrays(640)
    import colabkit
    results = []
    for monitored in (False, True):
        keras.utils.set_random_seed(3)
        model = tiny_model(keras)
        callbacks = [colabkit.keras.Monitor(verbose=0)] if monitored else []
        model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        results.append((model.get_weights(), callbacks))
    for plain, watched in zip(results[0][0], results[1][0]):
        np.testing.assert_array_equal(plain, watched)
    report = results[1][1][0].report()
    assert report["input_kind"] == "numpy" and report["steps"] == 40
    assert [e["epoch"] for e in report["epochs"]] == [0, 1] and "loss" in report["epochs"][0]


MIRRORED = """
import os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import numpy as np, keras, colabkit
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x, y = rng.random((2048, 32), dtype="float32"), rng.random((2048, 1), dtype="float32")
def slow(a, b):
    time.sleep(0.01)
    return a, b
def load(a, b):
    a, b = tf.numpy_function(slow, [a, b], [tf.float32, tf.float32])
    return tf.ensure_shape(a, [None, 32]), tf.ensure_shape(b, [None, 1])
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).repeat().map(load)
with strategy.scope():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    model.compile("adam", "mse")
monitor = colabkit.keras.Monitor(verbose=0)
model.fit(ds, epochs=1, steps_per_epoch=50, verbose=0, callbacks=[monitor])
r = monitor.report()
print("REPORT", strategy.num_replicas_in_sync, r["input_samples"], round(r["input_fraction"], 3), r["verdict"])
"""


@pytest.mark.slow
def test_mirrored_strategy_on_two_cpu_devices(tf_keras):
    """A distributed iterator (two replicas): the sampled steps draw per-replica batches the same way."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", MIRRORED], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("REPORT"))
    _, replicas, samples, share, verdict = line.split(" ", 4)
    assert replicas == "2" and int(samples) >= 6 and float(share) >= 0.5, line
    assert verdict.startswith("highly input-bound"), line


TORCH_BACKEND = """
import os, time
os.environ["KERAS_BACKEND"] = "torch"
import numpy as np, keras, colabkit
rng = np.random.default_rng(0)
x, y = rng.random((256, 32), dtype="float32"), rng.random((256, 1), dtype="float32")
def batches():
    while True:
        time.sleep(0.05)    # far above a step of this model even on a loaded machine: the share stays far from 0.5
        yield x[:32], y[:32]
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(16), keras.layers.Dense(1)])
model.compile("adam", "mse")
monitor = colabkit.keras.Monitor(verbose=0)
model.fit(batches(), epochs=1, steps_per_epoch=50, verbose=0, callbacks=[monitor])
r = monitor.report()
print("REPORT", keras.backend.backend(), r["input_kind"], r["input_samples"], round(r["input_fraction"], 3))
"""


def test_torch_backend_times_the_fetch_between_batches():
    """With Keras' torch back end the batch is fetched in Python before on_train_batch_begin."""
    pytest.importorskip("torch")
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", TORCH_BACKEND], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("REPORT"))
    _, backend, kind, samples, share = line.split()
    assert (backend, kind) == ("torch", "generator") and int(samples) >= 20 and float(share) >= 0.5, line


def test_a_fit_left_by_an_exception_and_a_recompile_still_measure(tf_keras, tmp_path):
    tf, keras = tf_keras
    import colabkit
    x, y = _arrays(640)
    model = tiny_model(keras)
    monitor = colabkit.keras.Monitor(tmp_path / "first", verbose=0)

    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 5:
                raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[monitor, Boom()])
    model.compile("adam", "mse")     # a new train function
    first = monitor
    monitor = colabkit.keras.Monitor(tmp_path / "second", verbose=0)
    model.fit(_slow_map(tf, x, y), epochs=1, steps_per_epoch=30, verbose=0, callbacks=[monitor])
    report = monitor.report()
    assert report["input_samples"] >= 6 and report["input_fraction"] >= 0.5, report["text"]
    assert getattr(model.train_function, "_colabkit_monitor", None) is None   # put back after fit()
    assert first.health.hangs == [] and not (tmp_path / "first").exists()


def test_jax_backend_reports_the_input_share_as_not_measured(tf_keras, monkeypatch):
    """Keras' JAX back end fetches each batch inside its train function, after on_train_batch_begin: the gap
    between batches is not the input wait there, so the share is None and the report says why. JAX is not
    installed here: the callback is told the back end is JAX (the fit itself runs on TensorFlow)."""
    import types

    from colabkit.health import keras_monitor
    keras = tf_keras[1]
    monkeypatch.setattr(keras_monitor, "keras", types.SimpleNamespace(
        backend=types.SimpleNamespace(backend=lambda: "jax")))
    import colabkit
    x, y = _arrays(640)
    monitor = colabkit.keras.Monitor(verbose=0)
    tiny_model(keras).fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[monitor])
    report = monitor.report()
    assert report["steps"] == 20 and report["input_fraction"] is None
    assert "JAX back end" in report["input_note"] and "JAX back end" in report["text"]
    assert not report["verdict"].startswith(("highly", "moderately", "compute-bound"))
