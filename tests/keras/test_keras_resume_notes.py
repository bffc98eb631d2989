"""Patterns of public Keras examples, resumed in a fresh process: each resumes exactly, or the resume says in
one line what cannot. A regression model reads a reshuffling shuffle() below cache() and keeps its best model
with ModelCheckpoint(save_best_only=True) on the VM's disk; a GAN has no call() (so fit() never builds it),
built sub-models, ``tf.random.normal`` in its own train_step and a random layer in a parallel map().

Two processes (this file is also the worker: ``python test_keras_resume_notes.py SPEC``): one whose fits are
interrupted by SIGINT (the stop button) mid-epoch; then a fresh one that runs an uninterrupted reference first
(its own dataset object, so its own cache) and resumes each interrupted fit from its folder.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

keras = pytest.importorskip("keras")
pytest.importorskip("tensorflow")


# -- the worker (runs in the subprocess) -----------------------------------------------------------------

class _NoCallGan(keras.Model):
    """Built sub-models, two optimizers, no call(): fit() never builds the model itself."""

    def __init__(self):
        super().__init__()
        self.generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)])
        self.discriminator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        self.d_opt, self.g_opt = keras.optimizers.SGD(0.05), keras.optimizers.SGD(0.05)

    def train_step(self, real):
        import tensorflow as tf
        z = tf.random.normal((tf.shape(real)[0], 2))    # a stateful TensorFlow op: starts over in a new process
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(self.discriminator(self.generator(z))) - tf.reduce_mean(self.discriminator(real))
        grads = tape.gradient(loss, self.discriminator.trainable_weights)
        self.d_opt.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            loss = -tf.reduce_mean(self.discriminator(self.generator(z)))
        grads = tape.gradient(loss, self.generator.trainable_weights)
        self.g_opt.apply_gradients(zip(grads, self.generator.trainable_weights))
        return {"g_loss": loss}


SAMPLES, BATCH = 64, 8        # 8 batches an epoch


def _cached_fit_input():
    """A public pattern: a reshuffling shuffle() below cache() (text_dataset_from_directory shuffles, the
    example caches): every epoch after the first replays the first epoch's order from the cache."""
    import tensorflow as tf
    rng = np.random.RandomState(0)
    x = rng.rand(SAMPLES, 4).astype("float32")
    y = (x @ rng.rand(4, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(SAMPLES, seed=0).batch(BATCH).cache()


def _regression():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def _fit(model, data, dest, interrupt=None, callbacks=()):
    import colabkit
    from tests.keras.test_keras_input import _InterruptAt
    print(f"FIT {Path(dest).name}", flush=True)
    auto = colabkit.keras.AutoResume(dest, save_freq=2, deadline=None)
    try:
        model.fit(data, epochs=3, verbose=0, callbacks=[*([_InterruptAt(*interrupt)] if interrupt else []),
                                                        *callbacks, auto])
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
        return None
    print("RESTORED " + json.dumps(None if auto.restored is None else
                                   [auto.restored.step, auto.restored.epoch, auto.restored.batch]), flush=True)
    return auto


def _best_model_checkpoint(folder):
    # monitors a value that no later epoch beats (as val_loss once a model overfits): the file is written once
    return keras.callbacks.ModelCheckpoint(str(Path(folder) / "best.weights.h5"), monitor="loss", mode="max",
                                           save_best_only=True, save_weights_only=True)


def _gan_fit_input():
    import tensorflow as tf
    augment = keras.layers.GaussianNoise(0.1, seed=4)   # a random layer in a parallel map(), as image examples do
    real = np.random.RandomState(0).rand(32, 4).astype("float32")
    return tf.data.Dataset.from_tensor_slices(real).map(lambda x: augment(x, training=True),
                                                        num_parallel_calls=tf.data.AUTOTUNE).batch(4)


def worker(spec):
    root = Path(spec["root"])
    if spec["phase"] == "interrupt":
        _fit(_regression(), _cached_fit_input(), str(root / "cached"), interrupt=[1, 3],
             callbacks=[_best_model_checkpoint(root / "vm")])
        keras.utils.set_random_seed(0)
        model = _NoCallGan()
        model.compile()
        _fit(model, _gan_fit_input(), str(root / "gan"), interrupt=[1, 3])
        return
    # the resumed process: first an uninterrupted reference run (its own dataset, so its own cache), then the
    # resumes, each from its folder
    reference = _regression()
    _fit(reference, _cached_fit_input(), str(root / "reference"))
    resumed = _regression()
    _fit(resumed, _cached_fit_input(), str(root / "cached"), callbacks=[_best_model_checkpoint(root / "vm")])
    differ = [v.path for v, w in zip(resumed.variables, reference.variables)
              if not np.array_equal(v.numpy(), w.numpy())]
    print("DIFFER " + json.dumps(differ), flush=True)
    resumed.load_weights(str(root / "vm" / "best.weights.h5"))   # what the example does after fit()
    print("LOADED", flush=True)
    keras.utils.set_random_seed(0)
    model = _NoCallGan()
    model.compile()
    _fit(model, _gan_fit_input(), str(root / "gan"))


# -- the test ----------------------------------------------------------------------------------------------

def _run(env, **spec):
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=300)
    explain = f"rc={done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr[-4000:]}"
    assert done.returncode == 0, explain
    return done.stdout, explain


def _section(out, name):
    """The lines a process printed while fitting into folder ``name``."""
    lines, inside = [], False
    for line in out.splitlines():
        if line.startswith("FIT "):
            inside = line == f"FIT {name}"
        elif inside:
            lines.append(line)
    return lines


def test_public_example_patterns_resume_exactly_or_say_what_cannot(tmp_path, ck_env):
    out, explain = _run(ck_env, root=str(tmp_path), phase="interrupt")
    assert "INTERRUPTED" in _section(out, "cached") and "INTERRUPTED" in _section(out, "gan"), explain
    # the GAN trained at all: it has no call(), so the model itself is never built
    (tmp_path / "vm" / "best.weights.h5").unlink()   # the interrupted VM's disk is gone
    out, explain = _run(ck_env, root=str(tmp_path), phase="resume")

    # a cache() above a reshuffling shuffle(): the resumed epochs read the order the cache replays
    cached = _section(out, "cached")
    assert "RESTORED [12, 1, 4]" in cached and 'DIFFER []' in cached, explain
    assert not [line for line in cached if "tf.data input" in line], explain
    # ModelCheckpoint(save_best_only=True) whose file was on the lost VM: written again, and said so
    [forgot] = [line for line in cached if "ModelCheckpoint's file" in line]
    assert "best.weights.h5 is not on this machine" in forgot and "written again" in forgot, explain
    assert "LOADED" in cached, explain

    gan = _section(out, "gan")
    assert "RESTORED [12, 1, 4]" in gan, explain
    [train_step] = [line for line in gan if "the train step draws random numbers" in line]
    assert "tf.random.normal" in train_step and "keras.random.SeedGenerator" in train_step, explain
    [parallel] = [line for line in gan if "num_parallel_calls" in line]
    assert "a Keras random layer" in parallel and "no two runs read the same batches" in parallel, explain


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the tests package, for _InterruptAt
    worker(json.loads(sys.argv[1]))
