"""Bit-exact resume, in a fresh process, of everything Keras tracks for training.

Each case trains three times, each in its own process (this file is also the worker: ``python
test_keras_exact_resume.py SPEC``): uninterrupted; interrupted (SIGTERM at a batch in the middle of an epoch,
or an exception at an epoch's start, after that epoch's checkpoint); and resumed from the interrupted run's
folder. The resumed run must end bit-equal to the uninterrupted one: every variable of the model (seed
generators included), of every optimizer and of the metrics, the global RNG states, and the other callbacks'
state. The worker lists these with Keras' own API, not with colabkit's.
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

keras = pytest.importorskip("keras")
pytest.importorskip("tensorflow")


# -- the worker (runs in the subprocess) -----------------------------------------------------------------

def _batch_counter():
    class BatchCounter(keras.layers.Layer):
        """Counts the batches it was trained on."""

        def build(self, input_shape):
            self.count = self.add_weight(shape=(), initializer="zeros", trainable=False, dtype="int64",
                                         name="count")

        def call(self, x, training=False):
            if training:
                self.count.assign_add(1)
            return x
    return BatchCounter()


class _Gan(keras.Model):
    """A GAN in the style of Keras' examples: two optimizers as attributes, a custom train_step, its own
    metrics and seed generator; compile() gets no optimizer, so model.optimizer is None."""

    def __init__(self):
        super().__init__()
        self.generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                           keras.layers.Dense(8)])
        self.discriminator = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"),
                                               keras.layers.Dropout(0.3), keras.layers.Dense(1)])
        self.counter = _batch_counter()
        self.seed_generator = keras.random.SeedGenerator(1337)
        self.d_opt = keras.optimizers.Adam(1e-2)
        self.g_opt = keras.optimizers.Adam(2e-2, beta_1=0.5)
        self.d_loss = keras.metrics.Mean(name="d_loss")
        self.g_loss = keras.metrics.Mean(name="g_loss")
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    @property
    def metrics(self):
        return [self.d_loss, self.g_loss]

    def call(self, z, training=False):
        return self.discriminator(self.generator(z, training=training), training=training)

    def train_step(self, real):
        import tensorflow as tf
        real = self.counter(real, training=True)
        z = keras.random.normal((tf.shape(real)[0], 4), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            fake = self.generator(z, training=True)
            p_real, p_fake = self.discriminator(real, training=True), self.discriminator(fake, training=True)
            d_loss = self.loss_fn(tf.ones_like(p_real), p_real) + self.loss_fn(tf.zeros_like(p_fake), p_fake)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_opt.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            p_fake = self.discriminator(self.generator(z, training=True), training=True)
            g_loss = self.loss_fn(tf.ones_like(p_fake), p_fake)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_opt.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss.update_state(d_loss)
        self.g_loss.update_state(g_loss)
        return {"d_loss": self.d_loss.result(), "g_loss": self.g_loss.result()}


def _noise_layer():
    class Noise(keras.layers.Layer):
        """Adds noise drawn from a seed generator of its own."""

        def __init__(self):
            super().__init__()
            self.seed_generator = keras.random.SeedGenerator(5)

        def call(self, x, training=False):
            if training:
                return x + 0.1 * keras.random.normal(keras.ops.shape(x), seed=self.seed_generator)
            return x
    return Noise()


def _case(name):
    """(model, fit args, fit kwargs, callbacks after AutoResume, {name: optimizer}) for a case."""
    import tensorflow as tf
    keras.utils.set_random_seed(1)
    tf.random.set_global_generator(tf.random.Generator.from_seed(7))   # else it starts from the OS's entropy
    rng = np.random.RandomState(0)
    x = rng.rand(64, 8).astype("float32")
    y = (x @ rng.rand(8, 1)).astype("float32")
    if name == "gan":
        model = _Gan()
        model.compile(optimizer=None)
        model(np.zeros((1, 4), "float32"))
        model.counter(x[:1])
        return model, (x,), {"batch_size": 8}, [], {"d_opt": model.d_opt, "g_opt": model.g_opt}
    if name == "seed_dropout":
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), _batch_counter(),
                                  keras.layers.Dropout(0.3, seed=11), _noise_layer(), keras.layers.Dropout(0.2),
                                  keras.layers.GaussianNoise(0.05, seed=3), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"])
        return model, (x, y), {"batch_size": 8}, [], {"optimizer": model.optimizer}
    if name == "plateau":
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), _batch_counter(),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"])
        xv = rng.rand(16, 8).astype("float32")
        yv = (xv @ rng.rand(8, 1)).astype("float32")
        # an improvement under 10 is none: the learning rate halves after every epoch but the first, and
        # training stops (restoring the best weights) once 3 epochs brought none
        callbacks = [keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=1, min_delta=10.0),
                     keras.callbacks.EarlyStopping(monitor="val_loss", patience=3, min_delta=10.0,
                                                   restore_best_weights=True)]
        return model, (x, y), {"batch_size": 8, "validation_data": (xv, yv)}, callbacks, \
            {"optimizer": model.optimizer}
    if name == "steps_per_execution":
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), _batch_counter(),
                                  keras.layers.Dropout(0.2), keras.layers.Dense(1)])
        # 8 batches an epoch in executions of 3: the last one holds 2
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"], steps_per_execution=3)
        return model, (x, y), {"batch_size": 8}, [], {"optimizer": model.optimizer}
    if name == "large_weights":
        # a 1 MB kernel (and its two Adam moments): restored without Keras' own copy (keras/restore.py), as a
        # view of the checkpoint's buffer; the callback after AutoResume adds to it in place at each epoch's
        # start, which a mid-epoch resume must undo (it applies the checkpoint again after that epoch's
        # on_epoch_begin)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(512, activation="relu"),
                                  keras.layers.Dense(512), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
        return model, (x, y), {"batch_size": 8}, [_NudgeAtEpochStart(model.layers[1].kernel)], \
            {"optimizer": model.optimizer}
    raise ValueError(name)


class _NudgeAtEpochStart(keras.callbacks.Callback):
    """Adds a fixed amount to a variable, in place, at every epoch's start."""

    def __init__(self, variable):
        super().__init__()
        self.variable = variable

    def on_epoch_begin(self, epoch, logs=None):
        self.variable.assign_add(np.full(self.variable.shape, 0.25, "float32"))


class _Interrupt(keras.callbacks.Callback):
    """First in the list: SIGTERM to this process at a batch's end, or an exception at an epoch's start."""

    def __init__(self, sigterm_at=None, raise_at_epoch=None):
        super().__init__()
        self.sigterm_at, self.raise_at_epoch, self.epoch = sigterm_at, raise_at_epoch, None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        if epoch == self.raise_at_epoch:
            raise RuntimeError(f"interrupted at the start of epoch {epoch}")

    def on_train_batch_end(self, batch, logs=None):
        if [self.epoch, batch] == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def _dump(model, optimizers, callbacks, out):
    """Every variable of the training state, listed with Keras' API, and the other callbacks' state."""
    import tensorflow as tf
    from keras.src.backend.common import global_state
    arrays = {f"model/{i}": v.numpy() for i, v in enumerate(model.variables)}   # seed generators included
    arrays.update({f"metrics/{i}": v.numpy() for i, v in enumerate(model.metrics_variables)})
    for name, optimizer in optimizers.items():
        arrays.update({f"{name}/{i}": v.numpy() for i, v in enumerate(optimizer.variables)})
    arrays["rng/tf_global"] = tf.random.get_global_generator().state.numpy()
    seed = global_state.get_global_attribute("global_seed_generator")
    if seed is not None:
        arrays["rng/keras_global"] = seed.state.numpy()
    arrays["rng/numpy"] = np.random.get_state()[1]
    state = {}
    for callback in callbacks:
        for attribute in ("wait", "best", "cooldown_counter", "best_epoch", "stopped_epoch"):
            if hasattr(callback, attribute):
                state[f"{type(callback).__name__}.{attribute}"] = _plain(getattr(callback, attribute))
        for i, w in enumerate(getattr(callback, "best_weights", None) or []):
            arrays[f"{type(callback).__name__}.best_weights/{i}"] = w
    np.savez(out, **arrays)
    return state


def worker(spec):
    import colabkit
    model, args, kwargs, after, optimizers = _case(spec["case"])
    auto = colabkit.keras.AutoResume(spec["dest"], deadline=None, verbose=1)
    interrupt = _Interrupt(spec.get("sigterm_at"), spec.get("raise_at_epoch"))
    try:
        model.fit(*args, epochs=spec.get("epochs", 3), shuffle=False, verbose=0,
                  callbacks=[interrupt, auto, *after], **kwargs)
    except RuntimeError as exc:
        print(f"FIT FAILED {exc}", flush=True)
    from colabkit.checkpoints.folder import CheckpointFolder
    newest = CheckpointFolder(Path(spec["dest"])).committed()[-1]
    result = _dump(model, optimizers, after, spec["out"])
    result.update(restored=None if auto.restored is None else [auto.restored.step, auto.restored.epoch,
                                                                    auto.restored.batch],
                  newest=[newest.step, newest.epoch, newest.batch])
    print("RESULT " + json.dumps(result), flush=True)


# -- the tests ---------------------------------------------------------------------------------------------

def _start(env, **spec):
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), json.dumps(spec)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc, expect_rc=0):
    stdout, stderr = proc.communicate(timeout=300)
    explain = f"rc={proc.returncode}\n--- stdout\n{stdout}\n--- stderr\n{stderr[-4000:]}"
    assert proc.returncode == expect_rc, explain
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    return (json.loads(lines[0][len("RESULT "):]) if lines else None), stdout, explain


def _equivalence(tmp_path, env, case, epochs=3, **interruption):
    """Run ``case`` uninterrupted and interrupted (in parallel), then resume the interrupted one; return
    (uninterrupted result, resumed result, differing variables, the interrupted run's stdout)."""
    ref = _start(env, case=case, epochs=epochs, dest=str(tmp_path / "ref"), out=str(tmp_path / "ref.npz"))
    cut = _start(env, case=case, epochs=epochs, dest=str(tmp_path / "run"), out=str(tmp_path / "cut.npz"),
                 **interruption)
    expected, _, explain = _finish(ref)
    _, cut_out, cut_explain = _finish(cut, -signal.SIGTERM if "sigterm_at" in interruption else 0)
    resumed, _, explain = _finish(_start(env, case=case, epochs=epochs, dest=str(tmp_path / "run"),
                                         out=str(tmp_path / "resumed.npz")))
    assert resumed["restored"] is not None, explain
    with np.load(tmp_path / "ref.npz") as want, np.load(tmp_path / "resumed.npz") as got:
        assert sorted(want.files) == sorted(got.files)
        differing = [k for k in want.files if want[k].shape != got[k].shape or not np.array_equal(want[k], got[k])]
    return expected, resumed, differing, cut_out


@pytest.mark.slow
def test_gan_with_two_optimizers_resumes_bit_exactly_in_a_fresh_process(tmp_path, ck_env):
    expected, resumed, differing, _ = _equivalence(tmp_path, ck_env, "gan", sigterm_at=[1, 2])
    assert resumed["restored"] == [8 + 3, 1, 3]
    assert not differing, f"variables that differ after the resume: {differing}"
    assert resumed["newest"] == expected["newest"] == [24, 3, 0]


@pytest.mark.slow
def test_seed_generators_and_dropout_resume_bit_exactly_in_a_fresh_process(tmp_path, ck_env):
    # in the last epoch: the metrics that compile() made (built in the first step) must carry on too
    expected, resumed, differing, _ = _equivalence(tmp_path, ck_env, "seed_dropout", sigterm_at=[2, 5])
    assert resumed["restored"] == [16 + 6, 2, 6]
    assert not differing, f"variables that differ after the resume: {differing}"


@pytest.mark.slow
@pytest.mark.parametrize("interruption", [{"sigterm_at": [2, 3]}, {"raise_at_epoch": 2}],
                         ids=["mid-epoch", "epoch-boundary"])
def test_validation_with_reduce_lr_and_early_stopping_resumes_bit_exactly(tmp_path, ck_env, interruption):
    """ReduceLROnPlateau and EarlyStopping come after AutoResume in the list: the epoch-end checkpoint must hold
    the learning rate they set at that epoch's end, and their counters must carry on."""
    expected, resumed, differing, cut_out = _equivalence(tmp_path, ck_env, "plateau", epochs=8, **interruption)
    if "raise_at_epoch" in interruption:
        assert "FIT FAILED interrupted at the start of epoch 2" in cut_out
        assert "the last checkpoint (step 16) is committed" in cut_out, cut_out
        assert resumed["restored"] == [16, 2, 0]
    else:
        assert resumed["restored"] == [16 + 4, 2, 4]
    # the reference stops early after epoch 3 (3 epochs without improvement), with lr 0.01 / 2**3
    assert expected["EarlyStopping.stopped_epoch"] == 3 and expected["newest"] == [32, 4, 0]
    assert {k: v for k, v in resumed.items() if k != "restored"} == {
        k: v for k, v in expected.items() if k != "restored"}
    assert not differing, f"variables that differ after the resume: {differing}"


@pytest.mark.slow
def test_large_variables_restored_in_place_resume_bit_exactly_mid_epoch(tmp_path, ck_env):
    expected, resumed, differing, _ = _equivalence(tmp_path, ck_env, "large_weights", sigterm_at=[1, 3])
    assert resumed["restored"] == [8 + 4, 1, 4]
    assert not differing, f"variables that differ after the resume: {differing}"


@pytest.mark.slow
def test_steps_per_execution_with_a_short_last_execution_counts_and_resumes_exactly(tmp_path, ck_env):
    expected, resumed, differing, _ = _equivalence(tmp_path, ck_env, "steps_per_execution", sigterm_at=[2, 5])
    assert expected["newest"] == [24, 3, 0], "3 epochs of 8 batches are 24 steps"
    assert resumed["restored"] == [16 + 6, 2, 6]
    assert resumed["newest"] == [24, 3, 0]
    assert not differing, f"variables that differ after the resume: {differing}"


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    worker(json.loads(sys.argv[1]))
