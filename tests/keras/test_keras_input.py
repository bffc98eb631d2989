"""AutoResume with tf.data inputs: an interrupted run resumed in a fresh process ends bit-equal to an
uninterrupted one, whatever the pipeline does between epochs (a reshuffling shuffle draws a new seed for
every pass; ``.repeat()`` with ``steps_per_epoch`` carries one iterator across epochs).

Each run is a subprocess (this file is also the worker: ``python test_keras_input.py SPEC``): the reference
run and the interrupted run start together, then a fresh process resumes. The interrupt is SIGINT sent by a
callback at a chosen (epoch, batch), as the notebook's stop button does; AutoResume saves there and raises
KeyboardInterrupt. Every model and optimizer variable is compared bit for bit.
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

HERE = Path(__file__).resolve().parent.parent / "checkpoints"   # workers.py, shared with test_kill.py
SAMPLES, BATCH = 160, 8            # 20 batches an epoch
BATCHES = SAMPLES // BATCH


# -- the worker (runs in the subprocess) -----------------------------------------------------------------

def _data():
    rng = np.random.RandomState(0)
    x = rng.rand(SAMPLES, 8).astype("float32")
    return x, (x @ rng.rand(8, 1)).astype("float32")


def _build_model(strategy=None, steps_per_execution=1):
    keras.utils.set_random_seed(1)
    scope = strategy.scope() if strategy is not None else _nullcontext()
    with scope:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dropout(0.2), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"],
                      steps_per_execution=steps_per_execution)
    return model


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _fit_input(kind):
    """(dataset, fit() keyword arguments) for each kind of tf.data pipeline under test."""
    import tensorflow as tf
    x, y = _data()
    slices = tf.data.Dataset.from_tensor_slices((x, y))
    if kind == "arrays":
        return None, {"x": x, "y": y, "batch_size": BATCH, "shuffle": False}
    if kind == "arrays_shuffled":              # Keras's default for arrays
        return None, {"x": x, "y": y, "batch_size": BATCH, "shuffle": True}
    if kind == "shuffle_seed":                 # reshuffles each pass from its own seed
        return slices.shuffle(64, seed=0).batch(BATCH), {}
    if kind == "shuffle_global_seed":          # no seed of its own: keras.utils.set_random_seed decides
        keras.utils.set_random_seed(7)
        return slices.shuffle(64).batch(BATCH), {}
    if kind == "repeat_steps":                 # one iterator across epochs: 13 steps an epoch, 20 batches a pass
        return slices.shuffle(64, seed=0).batch(BATCH).repeat(), {"steps_per_epoch": 13}
    if kind == "parallel":                     # parallel interleave and map, deterministic order (the default)
        shards = tf.data.Dataset.range(4).shuffle(4, seed=2)
        ds = shards.interleave(lambda i: slices.shard(4, i), cycle_length=2, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.shuffle(32, seed=3).map(lambda a, b: (a * 2.0, b), num_parallel_calls=tf.data.AUTOTUNE)
        return ds.batch(BATCH).prefetch(tf.data.AUTOTUNE), {}
    if kind == "filter":                       # unknown length: every epoch ends with OutOfRangeError
        ds = slices.shuffle(64, seed=0).filter(lambda a, b: a[0] >= 0.0).batch(BATCH)
        assert int(ds.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)
        return ds, {}
    if kind == "stateful_map":                 # a random op in map(): state tf.data cannot save
        keras.utils.set_random_seed(5)
        return slices.shuffle(64, seed=0).map(lambda a, b: (a + tf.random.uniform(tf.shape(a)) * 0.1, b)).batch(
            BATCH), {}
    if kind == "from_generator":               # Python code: colabkit cannot see its state
        def rows():
            yield from zip(x, y)
        spec = (tf.TensorSpec((8,), tf.float32), tf.TensorSpec((1,), tf.float32))
        return tf.data.Dataset.from_generator(rows, output_signature=spec).shuffle(64, seed=0).batch(BATCH), {}
    if kind == "shared_validation":            # validation_data reads the training data's shuffle, each epoch
        ds = slices.shuffle(64, seed=0)
        return ds.skip(32).batch(BATCH), {"validation_data": ds.take(32).batch(BATCH)}
    if kind == "keras_layer_map":              # a Keras random layer in map(): its seed state lives in a variable
        noise = keras.layers.GaussianNoise(0.05, seed=3)
        return slices.shuffle(64, seed=0).map(lambda a, b: (noise(a, training=True), b)).batch(BATCH), {}
    raise ValueError(kind)


class _InterruptAt(keras.callbacks.Callback):
    """Presses the interrupt button (SIGINT to this process) at the end of batch ``batch`` of ``epoch``."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            os.kill(os.getpid(), signal.SIGINT)


def _all_variables(model):
    return {f"v{i}:{v.path}": np.array(v.numpy()) for i, v in
            enumerate([*model.variables, *model.optimizer.variables])}


def worker(spec):
    import tensorflow as tf
    strategy = None
    if spec.get("devices"):
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    import colabkit
    model = _build_model(strategy, spec.get("steps_per_execution", 1))
    dataset, kw = _fit_input(spec["kind"])
    args = () if dataset is None else (dataset,)

    def fit(callbacks):
        monitor = {"verbose": 0, "directory": spec["dest"] + "-health"} if spec.get("monitor") else False
        auto = colabkit.keras.AutoResume(spec["dest"], save_freq=spec.get("save_freq", 5), deadline=None, keep=50,
                                         monitor=monitor)
        try:
            model.fit(*args, epochs=spec.get("epochs", 3), verbose=0, callbacks=[*callbacks, auto], **kw)
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
            return None
        return auto

    interrupt = spec.get("interrupt")
    auto = fit([_InterruptAt(*interrupt)] if interrupt else [])
    if auto is None and spec.get("again"):    # the same cell run again in the same process
        auto = fit([])
    if auto is not None:
        restored = auto.restored
        print("RESTORED " + json.dumps(None if restored is None else [restored.step, restored.epoch, restored.batch]),
              flush=True)
        np.savez(spec["out"], **_all_variables(model))
    print("DONE", flush=True)


# -- the tests ---------------------------------------------------------------------------------------------

def _start(env, **spec):
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), json.dumps(spec)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc):
    out, err = proc.communicate(timeout=300)
    proc.stdout_text, proc.stderr_text = out, err
    assert proc.returncode == 0, _explain(proc)
    return proc


def _explain(proc):
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout_text}\n--- stderr\n{proc.stderr_text[-4000:]}"


def _restored(proc):
    [line] = [line for line in proc.stdout_text.splitlines() if line.startswith("RESTORED ")]
    return json.loads(line[len("RESTORED "):])


def _assert_bit_equal(got_path, want_path, context=""):
    with np.load(got_path) as got, np.load(want_path) as want:
        assert sorted(got.files) == sorted(want.files)
        differ = [name for name in want.files if not np.array_equal(got[name], want[name])]
    assert not differ, f"{len(differ)} of {len(want.files)} variables differ from the uninterrupted run: {differ}" \
                       f"{context}"


def _interrupt_then_resume(tmp_path, env, kind, interrupt, **spec):
    """Reference and interrupted runs side by side, then the resume in a fresh process; returns both procs."""
    reference = _start(env, kind=kind, dest=str(tmp_path / "reference"), out=str(tmp_path / "reference.npz"), **spec)
    interrupted = _start(env, kind=kind, dest=str(tmp_path / "run"), out=str(tmp_path / "unused.npz"),
                         interrupt=interrupt, **spec)
    _finish(reference)
    _finish(interrupted)
    assert "INTERRUPTED" in interrupted.stdout_text, _explain(interrupted)
    resumed = _finish(_start(env, kind=kind, dest=str(tmp_path / "run"), out=str(tmp_path / "resumed.npz"), **spec))
    _assert_bit_equal(tmp_path / "resumed.npz", tmp_path / "reference.npz", f"\n{_explain(resumed)}")
    return interrupted, resumed


@pytest.mark.parametrize("kind", ["shuffle_seed", "shuffle_global_seed", "parallel", "filter", "stateful_map",
                                  "keras_layer_map", "arrays_shuffled"])
def test_interrupted_mid_epoch_and_resumed_in_a_fresh_process_is_bit_exact(tmp_path, ck_env, kind):
    _, resumed = _interrupt_then_resume(tmp_path, ck_env, kind, interrupt=[1, 7])
    assert _restored(resumed) == [BATCHES + 8, 1, 8]
    assert "the tf.data input" not in resumed.stdout_text, _explain(resumed)   # nothing to say about it


def test_repeat_with_steps_per_epoch_resumes_at_the_global_step(tmp_path, ck_env):
    # epoch 2, batch 4: 30 batches into the one iterator, in the middle of its second pass over the data
    _, resumed = _interrupt_then_resume(tmp_path, ck_env, "repeat_steps", interrupt=[2, 3])
    assert _restored(resumed) == [2 * 13 + 4, 2, 4]
    assert "the tf.data input" not in resumed.stdout_text, _explain(resumed)


@pytest.mark.parametrize("interrupt, save_freq, position", [
    ([1, BATCHES - 1], 5, [2, 0]),           # the last batch of an epoch: the next epoch's pass is not begun
    ([2, 3], "epoch", [2, 4]),               # mid-epoch, after an epoch-end save
])
def test_reshuffling_dataset_resumes_bit_exactly_at_epoch_boundaries(tmp_path, ck_env, interrupt, save_freq,
                                                                     position):
    _, resumed = _interrupt_then_resume(tmp_path, ck_env, "shuffle_seed", interrupt=interrupt, save_freq=save_freq)
    assert _restored(resumed)[1:] == position


@pytest.mark.slow
def test_repeat_with_steps_per_epoch_interrupted_at_an_epoch_end_resumes_bit_exactly(tmp_path, ck_env):
    _, resumed = _interrupt_then_resume(tmp_path, ck_env, "repeat_steps", interrupt=[1, 12], save_freq="epoch")
    assert _restored(resumed) == [26, 2, 0]


@pytest.mark.slow
def test_repeat_with_steps_per_execution_resumes_bit_exactly(tmp_path, ck_env):
    """Two batches per train-function call: 7 calls, so 14 batches drawn, for each epoch of 13 steps."""
    _, resumed = _interrupt_then_resume(tmp_path, ck_env, "repeat_steps", interrupt=[2, 5], steps_per_execution=2,
                                        save_freq=4)
    assert _restored(resumed)[1:] == [2, 6]


@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_the_health_monitor_leaves_resume_bit_exact(tmp_path, ck_env, steps_per_execution):
    """AutoResume(monitor=True): the monitor draws sampled steps' batches itself (its wrapper sits under
    AutoResume's), and the interrupted, monitored run resumes bit-exactly against an unmonitored reference."""
    reference = _start(ck_env, kind="repeat_steps", dest=str(tmp_path / "reference"),
                       out=str(tmp_path / "reference.npz"), steps_per_execution=steps_per_execution, save_freq=4)
    interrupted = _start(ck_env, kind="repeat_steps", dest=str(tmp_path / "run"), out=str(tmp_path / "unused.npz"),
                         interrupt=[1, 5], steps_per_execution=steps_per_execution, save_freq=4, monitor=True)
    _finish(reference)
    _finish(interrupted)
    assert "INTERRUPTED" in interrupted.stdout_text, _explain(interrupted)
    resumed = _finish(_start(ck_env, kind="repeat_steps", dest=str(tmp_path / "run"), out=str(tmp_path / "resumed.npz"),
                             steps_per_execution=steps_per_execution, save_freq=4, monitor=True))
    _assert_bit_equal(tmp_path / "resumed.npz", tmp_path / "reference.npz", f"\n{_explain(resumed)}")
    assert not (tmp_path / "run-health").exists()   # no hang, no stack dump


@pytest.mark.slow
def test_rerunning_the_cell_in_the_same_process_resumes_bit_exactly(tmp_path, ck_env):
    """After the interrupt button, the same dataset object has drawn its seeds already: still exact."""
    reference = _start(ck_env, kind="shuffle_seed", dest=str(tmp_path / "reference"),
                       out=str(tmp_path / "reference.npz"))
    again = _start(ck_env, kind="shuffle_seed", dest=str(tmp_path / "run"), out=str(tmp_path / "again.npz"),
                   interrupt=[1, 7], again=True)
    _finish(reference)
    _finish(again)
    assert "INTERRUPTED" in again.stdout_text and _restored(again) == [BATCHES + 8, 1, 8], _explain(again)
    _assert_bit_equal(tmp_path / "again.npz", tmp_path / "reference.npz")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["arrays", "shuffle_seed"])
def test_mirrored_strategy_on_two_cpu_devices_resumes_bit_exactly(tmp_path, ck_env, kind):
    _, resumed = _interrupt_then_resume(tmp_path, ck_env, kind, interrupt=[1, 7], devices=2)
    assert _restored(resumed) == [BATCHES + 8, 1, 8]


@pytest.mark.slow
def test_validation_data_reading_the_training_shuffle(tmp_path, ck_env):
    """Mid-epoch: exact. At an epoch's last batch the validation's seed draws come after the save: said."""
    _, resumed = _interrupt_then_resume(tmp_path / "mid", ck_env, "shared_validation", interrupt=[1, 7])
    assert "the tf.data input" not in resumed.stdout_text and "validation_data reads" not in resumed.stdout_text
    last = BATCHES - 32 // BATCH - 1
    interrupted = _finish(_start(ck_env, kind="shared_validation", dest=str(tmp_path / "last"),
                                 out=str(tmp_path / "u.npz"), interrupt=[1, last]))
    assert "INTERRUPTED" in interrupted.stdout_text, _explain(interrupted)
    resumed = _finish(_start(ck_env, kind="shared_validation", dest=str(tmp_path / "last"),
                             out=str(tmp_path / "r.npz")))
    notes = [line for line in resumed.stdout_text.splitlines() if "validation_data reads" in line]
    assert len(notes) == 1 and "epoch 2 may read" in notes[0], _explain(resumed)


def test_python_code_in_the_pipeline_is_named_in_one_line_at_resume(tmp_path, ck_env):
    """from_generator: exact when the generator yields the same rows in every pass, and the resume says so."""
    _, resumed = _interrupt_then_resume(tmp_path, ck_env, "from_generator", interrupt=[1, 7])
    notes = [line for line in resumed.stdout_text.splitlines() if "runs Python code" in line]
    assert len(notes) == 1 and "from_generator" in notes[0] and "epoch 1, batch 8" in notes[0], _explain(resumed)


def test_a_changed_pipeline_is_not_positioned_silently(tmp_path, ck_env):
    interrupted = _finish(_start(ck_env, kind="shuffle_seed", dest=str(tmp_path / "run"), out=str(tmp_path / "u.npz"),
                                 interrupt=[1, 7]))
    assert "INTERRUPTED" in interrupted.stdout_text, _explain(interrupted)
    resumed = _finish(_start(ck_env, kind="parallel", dest=str(tmp_path / "run"), out=str(tmp_path / "r.npz")))
    assert "tf.data input cannot be positioned" in resumed.stdout_text, _explain(resumed)
    assert "epoch 1 restarts at batch 0" in resumed.stdout_text, _explain(resumed)


def test_the_saved_position_holds_no_elements_of_a_large_shuffle_buffer(tmp_path, ck_env):
    """A shuffle buffer of 10,000 elements of 3 kB each (31 MB): the checkpoint stays small."""
    import tensorflow as tf
    import colabkit
    from colabkit.checkpoints.folder import CheckpointFolder
    keras.utils.set_random_seed(0)
    x = np.random.RandomState(0).rand(12_000, 784).astype("float32")
    y = x[:, :1].copy()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10_000, seed=0).batch(600)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    auto = colabkit.keras.AutoResume(str(tmp_path / "run"), save_freq=7, deadline=None)

    class CommittedFirst(keras.callbacks.Callback):   # a later save would replace step 7 while it waits to be written
        def on_train_batch_end(self, batch, logs=None):
            if batch == 7:
                assert auto.checkpoints.wait(60)

    model.fit(ds, epochs=1, verbose=0, callbacks=[auto, CommittedFirst()])
    first = CheckpointFolder(tmp_path / "run").committed()[0]
    assert (first.step, first.batch) == (7, 7)
    with colabkit.Checkpoints(str(tmp_path / "run")) as checkpoints:
        state = checkpoints.restore().state
    assert len(state["input"]["seeds"]) == 1 and state["input"]["drawn"] == 0   # the next epoch's start
    total = sum(f.stat().st_size for f in first.path.iterdir())
    assert total < 512 * 1024, f"checkpoint of {total} bytes: the shuffle buffer's elements were saved"


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    worker(json.loads(sys.argv[1]))
