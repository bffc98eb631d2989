"""colabkit.keras.AutoResume with real Keras 3 / TensorFlow on small models."""
import importlib.util
import os
import shutil
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

keras = pytest.importorskip("keras")
import colabkit  # noqa: E402
from colabkit.checkpoints.folder import CheckpointFolder  # noqa: E402

HERE = Path(__file__).resolve().parent.parent / "checkpoints"   # workers.py, shared with test_kill.py
_spec = importlib.util.spec_from_file_location("ck_workers", HERE / "workers.py")
workers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workers)


def fit(model, dest, epochs, callbacks=(), **kw):
    x, y = workers.data(np)
    auto = colabkit.keras.AutoResume(str(dest), deadline=None, **kw)
    model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, callbacks=[*callbacks, auto])
    return auto


class AtBatch(keras.callbacks.Callback):
    """Does ``action(model)`` once, after a given global batch."""

    def __init__(self, at, action):
        super().__init__()
        self.at, self.seen, self.action = at, 0, action

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.at:
            self.action(self.model)


def InterruptAt(at):
    """Presses the notebook's interrupt button (SIGINT to this process) after a given global batch."""
    return AtBatch(at, lambda model: os.kill(os.getpid(), signal.SIGINT))


def StopAt(at):
    """Another callback (a time limit, TerminateOnNaN) stopping training in the middle of an epoch."""
    return AtBatch(at, lambda model: setattr(model, "stop_training", True))


def test_interrupt_at_random_step_then_resume_equals_uninterrupted_run(tmp_path, ck_env):
    ref_model, ref_counter = workers.build_model(keras)
    fit(ref_model, tmp_path / "ref", epochs=3, save_freq=5)
    at = random.Random(int(os.environ.get("COLABKIT_TEST_SEED", "7"))).randrange(2, 34)
    model, _ = workers.build_model(keras)
    with pytest.raises(KeyboardInterrupt):
        fit(model, tmp_path / "run", epochs=3, save_freq=5, callbacks=[InterruptAt(at)])
    [saved] = [c for c in CheckpointFolder(tmp_path / "run").committed() if c.step == at]
    assert (saved.epoch, saved.batch) == divmod(at, 12), "the interrupt saves the exact position"
    model, counter = workers.build_model(keras, seed=123)  # a fresh process would start from other weights
    auto = fit(model, tmp_path / "run", epochs=3, save_freq=5)
    assert auto.restored.step == at
    assert int(counter.count.numpy()) == int(ref_counter.count.numpy()) == 36
    for got, want in zip(model.get_weights(), ref_model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_epoch_granularity_for_python_generator_input(tmp_path, ck_env, capsys):
    x, y = workers.data(np)

    def batches():  # a Python generator: Keras cannot restart it at a given batch
        while True:
            for i in range(0, 96, 8):
                yield x[i:i + 8], y[i:i + 8]

    model, counter = workers.build_model(keras)
    auto = colabkit.keras.AutoResume(str(tmp_path / "gen"), save_freq=5, deadline=None)
    with pytest.raises(KeyboardInterrupt):
        model.fit(batches(), steps_per_epoch=12, epochs=3, verbose=0, callbacks=[InterruptAt(17), auto])
    model2, counter2 = workers.build_model(keras)
    auto2 = colabkit.keras.AutoResume(str(tmp_path / "gen"), save_freq=5, deadline=None)
    model2.fit(batches(), steps_per_epoch=12, epochs=3, verbose=0, callbacks=[auto2])
    out = capsys.readouterr().out
    assert "cannot be positioned mid-epoch" in out and "epoch 1 restarts at batch 0" in out
    assert auto2.restored.step == 17 and auto2.restored.batch == 5
    # epoch 1 was restarted: 17 batches before, 24 after the restore
    assert int(counter2.count.numpy()) == 17 + 24


def test_architecture_mismatch_names_variable_and_shapes_and_changes_nothing(tmp_path, ck_env):
    model, _ = workers.build_model(keras)
    fit(model, tmp_path / "run", epochs=1)
    keras.utils.set_random_seed(3)
    other = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                              workers._Counter.layer_class(keras)(), keras.layers.Dropout(0.2),
                              keras.layers.Dense(1)])
    other.compile(optimizer="adam", loss="mse", metrics=["mae"])
    before = [w.copy() for w in other.get_weights()]
    with pytest.raises(colabkit.CheckpointError) as err:
        fit(other, tmp_path / "run", epochs=2)
    message = str(err.value)
    assert "kernel" in message and "(8, 32)" in message and "(8, 16)" in message and "Nothing was changed" in message
    for got, want in zip(other.get_weights(), before):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kwargs, match", [
    ({"save_freq": "batch"}, "Invalid value for argument `save_freq`.*'batch'.*'epoch' or an integer"),
    ({"save_freq": 0}, "save_freq=0"),
    ({"every": "soon"}, "every='soon'.*15min"),
    ({"keep": 0}, "keep=0"),
    ({"deadline": "whenever"}, "deadline='whenever'.*auto"),
])
def test_invalid_arguments_raise_value_error_naming_forms(tmp_path, ck_env, kwargs, match):
    with pytest.raises(ValueError, match=match):
        colabkit.keras.AutoResume(str(tmp_path / "x"), **kwargs)


@pytest.mark.parametrize("directory", ["", None])
def test_empty_directory_matches_backup_and_restore(ck_env, directory):
    with pytest.raises(ValueError, match="Empty `backup_dir` argument passed"):
        colabkit.keras.AutoResume(directory)
    with pytest.raises(ValueError):
        keras.callbacks.BackupAndRestore(directory)


def test_unbuilt_model_is_rejected_like_backup_and_restore(tmp_path, ck_env):
    model = keras.Sequential([keras.layers.Dense(1)])
    model.compile("adam", "mse")
    x, y = workers.data(np)
    with pytest.raises(ValueError, match="must be built") as refused:
        model.fit(x, y, epochs=1, verbose=0, callbacks=[colabkit.keras.AutoResume(str(tmp_path / "u"))])
    # the advice fits a model without call() too (a GAN or VAE with its own train_step)
    assert "model(x[:1])" in str(refused.value) and "give each sub-model a keras.Input" in str(refused.value)


@pytest.mark.parametrize("run", range(3))
def test_deadline_saves_and_stops_before_the_cap(tmp_path, ck_env, run, capsys):
    model, _ = workers.build_model(keras)
    x, y = workers.data(np)
    begun = []  # the budget counts from the start of training (AutoResume's on_train_begin, just before this)
    slow = keras.callbacks.LambdaCallback(on_train_begin=lambda logs: begun.append(time.time()),
                                          on_train_batch_end=lambda batch, logs: time.sleep(0.05))
    cap = 2.5 + run
    auto = colabkit.keras.AutoResume(str(tmp_path / "run"), deadline=cap, deadline_margin="0.8s")
    model.fit(x, y, batch_size=8, epochs=100, shuffle=False, verbose=0, callbacks=[auto, slow])
    started = begun[0]
    newest = CheckpointFolder(tmp_path / "run").committed()[-1]
    assert model.stop_training and newest.manifest["info"]["reason"].startswith("the ")
    assert newest.created < started + cap, "the final checkpoint must be committed before the cap"
    assert time.time() < started + cap + 1.0
    assert "Re-run this cell to resume" in capsys.readouterr().out
    assert newest.step > 0 and newest.step == auto._step


def test_sigterm_saves_then_terminates_and_resume_continues(tmp_path, ck_env):
    out = tmp_path / "o.npz"
    args = ["keras", tmp_path / "run", 50, "epoch", out, "--sleep", "0.05"]
    proc = subprocess.Popen([sys.executable, str(HERE / "workers.py"), *map(str, args)], env=ck_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    folder = CheckpointFolder(tmp_path / "run")
    deadline = time.time() + 60
    while not folder.committed() and time.time() < deadline:
        time.sleep(0.2)
    assert folder.committed(), "no epoch checkpoint appeared"
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, stderr
    assert "SIGTERM received" in stdout
    newest = folder.committed()[-1]
    assert newest.manifest["info"]["reason"] == "SIGTERM received" and newest.batch not in (None,)
    model, _ = workers.build_model(keras)
    auto = fit(model, tmp_path / "run", epochs=newest.epoch + 1)
    assert auto.restored.step == newest.step


def test_end_of_training_save_waits_for_upload_and_delete_checkpoint(tmp_path, ck_env):
    model, _ = workers.build_model(keras)
    fit(model, tmp_path / "run", epochs=2)
    assert CheckpointFolder(tmp_path / "run").committed()[-1].step == 24
    model, _ = workers.build_model(keras)
    fit(model, tmp_path / "run2", epochs=1, delete_checkpoint=True)
    assert not (tmp_path / "run2").exists()



def test_training_stopped_mid_epoch_by_another_callback_resumes_at_the_exact_batch(tmp_path, ck_env):
    model, _ = workers.build_model(keras)
    fit(model, tmp_path / "run", epochs=3, callbacks=[StopAt(18)])     # epoch 1, after its 6th batch
    newest = CheckpointFolder(tmp_path / "run").committed()[-1]
    assert (newest.step, newest.epoch, newest.batch) == (18, 1, 6)
    model, counter = workers.build_model(keras, seed=5)
    auto = fit(model, tmp_path / "run", epochs=3)
    assert auto.restored.step == 18 and int(counter.count.numpy()) == 36


def test_signal_handlers_are_restored_when_fit_fails(tmp_path, ck_env):
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    x, y = workers.data(np)

    def batches():
        for i in range(0, 48, 8):
            yield x[i:i + 8], y[i:i + 8]
        raise RuntimeError("the input pipeline broke")

    model, _ = workers.build_model(keras)
    with pytest.raises(Exception, match="input pipeline broke"):
        model.fit(batches(), steps_per_epoch=12, epochs=1, verbose=0,
                  callbacks=[colabkit.keras.AutoResume(str(tmp_path / "a"), deadline=None)])
    # Keras calls no callback when fit() fails: AutoResume's handler finds fit() gone at the next signal,
    # puts the previous handlers back and passes the signal on (here: an ordinary KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    fit(model, tmp_path / "b", epochs=1)
    other = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    other.compile("adam", "mse")
    with pytest.raises(colabkit.CheckpointError):
        fit(other, tmp_path / "b", epochs=2)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_final_save_is_bounded_when_the_destination_stays_down(tmp_path, ck_env, monkeypatch, capsys):
    import colabkit.resume.schedule as schedule
    monkeypatch.setattr(schedule, "FINAL_WAIT_FLOOR_S", 1.0)
    dest = tmp_path / "dest"
    model, _ = workers.build_model(keras)
    started = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # after the restore found nothing, the destination goes bad: every upload fails from then on
        def break_destination(model):
            shutil.rmtree(dest, ignore_errors=True)
            dest.write_text("a file where the folder should be")
        breaks = AtBatch(1, break_destination)
        auto = fit(model, dest, epochs=1, callbacks=[breaks])
    assert time.time() - started < 30
    out = capsys.readouterr().out
    assert "is not on" in out and "kept on local disk" in out
    assert auto.checkpoints.status.last_local.step == 12


def _restored_into_fresh_model(dest, epochs, callbacks=()):
    """A model built afresh (other weights) that restores ``dest``'s newest checkpoint and trains nothing more
    (its fit() asks for the epochs the checkpoint has already reached)."""
    model, _ = workers.build_model(keras, seed=99)
    auto = fit(model, dest, epochs=epochs, callbacks=callbacks)
    return model, auto


def test_epoch_end_checkpoint_is_taken_after_the_callbacks_listed_after_autoresume(tmp_path, ck_env):
    """ReduceLROnPlateau after AutoResume halves the learning rate at the end of epochs 1 and 2 (an improvement
    under 10 is none): the last checkpoint holds 0.0025 and the plateau counters, not 0.005."""
    def plateau():
        return keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1, min_delta=10.0)

    model, _ = workers.build_model(keras)
    x, y = workers.data(np)
    auto = colabkit.keras.AutoResume(str(tmp_path / "run"), deadline=None)
    reduce_lr = plateau()
    model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0, callbacks=[auto, reduce_lr])
    assert float(model.optimizer.learning_rate) == pytest.approx(0.0025)
    assert CheckpointFolder(tmp_path / "run").committed()[-1].step == 36
    restored_plateau = plateau()
    fresh, auto = _restored_into_fresh_model(tmp_path / "run", epochs=3, callbacks=[restored_plateau])
    assert auto.restored.step == 36
    assert float(fresh.optimizer.learning_rate) == pytest.approx(0.0025)
    for got, want in zip([*fresh.variables, *fresh.optimizer.variables],
                         [*model.variables, *model.optimizer.variables]):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    for name in ("wait", "best", "cooldown_counter"):
        assert getattr(restored_plateau, name) == getattr(reduce_lr, name), name


class _Counting(keras.callbacks.Callback):
    """A user callback with state of its own (the documented protocol): batches seen and the losses."""

    def __init__(self):
        super().__init__()
        self.seen, self.losses = 0, []

    def on_train_begin(self, logs=None):
        self.seen, self.losses = 0, []   # Keras' callbacks reset at train begin too; set_state comes after

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        self.losses.append(float(logs["loss"]))

    def get_state(self):
        return {"seen": self.seen, "losses": np.asarray(self.losses, dtype="float64")}

    def set_state(self, state):
        self.seen, self.losses = state["seen"], [float(v) for v in state["losses"]]


class _StepsOnlyTensorBoard(keras.callbacks.TensorBoard):
    """Keras' TensorBoard, counting its steps (on_train_batch_begin) but writing no scalars: tf.summary.scalar
    needs the tensorboard package, which the test environment does not have."""

    def on_train_batch_end(self, batch, logs=None):
        pass

    def on_epoch_end(self, epoch, logs=None):
        pass


def test_callback_state_protocol_and_keras_callbacks_carry_on_after_a_resume(tmp_path, ck_env):
    def callbacks(root):
        return [_Counting(), keras.callbacks.ModelCheckpoint(str(root / "best.keras"), monitor="loss",
                                                             save_best_only=True),
                _StepsOnlyTensorBoard(str(root / "tb"))]

    ref_model, _ = workers.build_model(keras)
    reference = callbacks(tmp_path / "ref")
    fit(ref_model, tmp_path / "ref", epochs=3, callbacks=reference)
    model, _ = workers.build_model(keras)
    with pytest.raises(KeyboardInterrupt):
        fit(model, tmp_path / "run", epochs=3, callbacks=[InterruptAt(17), *callbacks(tmp_path / "cut")])
    model, _ = workers.build_model(keras, seed=5)
    resumed = callbacks(tmp_path / "resumed")
    auto = fit(model, tmp_path / "run", epochs=3, callbacks=resumed)
    assert auto.restored.step == 17
    assert resumed[0].seen == reference[0].seen == 36
    np.testing.assert_array_equal(resumed[0].losses, reference[0].losses)
    assert resumed[1].best == reference[1].best    # ModelCheckpoint: best loss so far, across the resume
    assert resumed[2]._global_train_batch == reference[2]._global_train_batch == 36   # TensorBoard's step


def test_mid_epoch_resume_with_a_relative_learning_rate_schedule_equals_the_uninterrupted_run(tmp_path, ck_env):
    """The resumed epoch's on_epoch_begin runs again in the resumed fit(): LearningRateScheduler must not halve
    the learning rate of that epoch twice, and the epoch's metrics go on from the checkpoint."""
    def halve():
        return keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5 if epoch else lr)

    ref_model, _ = workers.build_model(keras)
    fit(ref_model, tmp_path / "ref", epochs=3, callbacks=[halve()])
    model, _ = workers.build_model(keras)
    with pytest.raises(KeyboardInterrupt):
        fit(model, tmp_path / "run", epochs=3, callbacks=[InterruptAt(29), halve()])   # epoch 2, batch 5
    model, _ = workers.build_model(keras, seed=5)
    auto = fit(model, tmp_path / "run", epochs=3, callbacks=[halve()])
    assert auto.restored.step == 29
    assert float(model.optimizer.learning_rate) == float(ref_model.optimizer.learning_rate) == pytest.approx(0.0025)
    for got, want in zip([*model.variables, *model.optimizer.variables, *model.metrics_variables],
                         [*ref_model.variables, *ref_model.optimizer.variables, *ref_model.metrics_variables]):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_csv_logger_appends_on_resume_from_where_the_checkpoint_was(tmp_path, ck_env):
    """A callback after CSVLogger fails at epoch 2's end: the CSV already has epoch 2's row, the checkpoint is
    epoch 1's end. The resumed run cuts that row and appends: every epoch once, one header."""
    class FailOnce(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 2:
                raise RuntimeError("a callback failed")

    csv = tmp_path / "log.csv"
    ref_csv = tmp_path / "ref.csv"
    fit(workers.build_model(keras)[0], tmp_path / "ref", epochs=4, callbacks=[keras.callbacks.CSVLogger(str(ref_csv))])
    model, _ = workers.build_model(keras)
    with pytest.raises(RuntimeError, match="a callback failed"):
        fit(model, tmp_path / "run", epochs=4, callbacks=[keras.callbacks.CSVLogger(str(csv)), FailOnce()])
    assert [line.split(",")[0] for line in csv.read_text().splitlines()] == ["epoch", "0", "1", "2"]
    logger = keras.callbacks.CSVLogger(str(csv))
    auto = fit(workers.build_model(keras, seed=5)[0], tmp_path / "run", epochs=4, callbacks=[logger])
    assert auto.restored.step == 24 and logger.append is False   # the user's setting is back after fit()
    assert csv.read_text() == ref_csv.read_text()


def test_backup_and_restore_arguments_are_accepted_with_their_meaning(tmp_path, ck_env):
    from pathlib import Path
    auto = colabkit.keras.AutoResume(backup_dir=str(tmp_path / "a"), double_checkpoint=True, keep=1, deadline=None)
    assert auto.directory == str(tmp_path / "a") and auto.checkpoints.keep == 2   # the previous one stays
    with pytest.raises(TypeError, match="backup_dir"):
        colabkit.keras.AutoResume(str(tmp_path / "a"), backup_dir=str(tmp_path / "b"))
    for empty in ("", None, Path(""), "  "):
        with pytest.raises(ValueError, match="Empty `backup_dir` argument passed"):
            colabkit.keras.AutoResume(empty)
        with pytest.raises(ValueError, match="Empty `backup_dir` argument passed"):
            colabkit.keras.AutoResume(backup_dir=empty) if empty is not None else colabkit.keras.AutoResume()
    # save_freq=False: no periodic saves, only the final one (and those for signals, deadlines, `every`)
    model, _ = workers.build_model(keras)
    fit(model, tmp_path / "nofreq", epochs=3, save_freq=False)
    assert [c.step for c in CheckpointFolder(tmp_path / "nofreq").committed()] == [36]


def test_the_callback_can_be_reused_across_fits_also_after_delete_checkpoint(tmp_path, ck_env):
    x, y = workers.data(np)
    model, counter = workers.build_model(keras)
    auto = colabkit.keras.AutoResume(str(tmp_path / "run"), deadline=None, delete_checkpoint=True)
    for _ in range(2):
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[auto])
        assert not (tmp_path / "run").exists()
        assert auto.restored is None   # each fit() started a run of its own, as with BackupAndRestore
    assert int(counter.count.numpy()) == 24
    kept = colabkit.keras.AutoResume(str(tmp_path / "kept"), deadline=None)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[kept])
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[kept])
    assert kept.restored.step == 12 and int(counter.count.numpy()) == 24 + 12 + 12


@pytest.mark.slow
@pytest.mark.parametrize("where", ["callback", "input"])
def test_an_exception_leaving_fit_commits_the_last_save_before_it_goes_on(tmp_path, ck_env, drive_mount_factory,
                                                                         where, capsys):
    """On a slow Drive-like mount (2 MB/s) a save of this model takes about a second to upload: when another
    callback raises (or the input pipeline fails), the checkpoint of the batch before is on Drive already when
    the exception reaches the notebook."""
    mount = drive_mount_factory(rate=2e6)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(384, activation="relu"),
                              keras.layers.Dense(384), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")   # ~150k weights + Adam's moments: ~1.8 MB a checkpoint
    x, y = workers.data(np)
    auto = colabkit.keras.AutoResume(str(mount.my_drive / "run"), save_freq=1, deadline=None)

    def batches():
        for i in range(0, 96, 8):
            if i == 24 and where == "input":
                raise RuntimeError("the input pipeline broke")
            yield x[i:i + 8], y[i:i + 8]

    class Fails(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2 and where == "callback":
                raise RuntimeError("another callback failed")

    with pytest.raises(Exception, match="broke|failed"):
        model.fit(batches(), steps_per_epoch=12, epochs=1, verbose=0, callbacks=[auto, Fails()])
    committed = CheckpointFolder(mount.backing / "MyDrive" / "run").committed()
    # a periodic save whose snapshot buffers are still being written is taken at a later batch, so which
    # batches were saved varies; the last one taken must be on Drive. The callback fails at the 3rd batch's
    # end (its save does not happen); the input, fetching the 4th batch.
    saved = [int(detail.split()[1]) for _, kind, detail in auto.events if kind == "save"]
    assert saved and saved[-1] <= (2 if where == "callback" else 3), auto.events
    assert [c.step for c in committed][-1:] == saved[-1:]
    assert "is committed to" in capsys.readouterr().out


def _two_towers(keras):
    """A model with optimizers in a list and in a dict (one a LossScaleOptimizer), a custom train_step, and
    model.optimizer None."""
    import tensorflow as tf

    class Towers(keras.Model):
        def __init__(self):
            super().__init__()
            self.a, self.b = keras.layers.Dense(4), keras.layers.Dense(4)
            self.head = keras.layers.Dense(1)
            self.opts = [keras.optimizers.Adam(1e-2), keras.optimizers.SGD(1e-2, momentum=0.9)]
            self.by_name = {"head": keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-2))}

        def call(self, x):
            return self.head(self.a(x) + self.b(x))

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = keras.ops.mean((self(x) - y) ** 2)
                scaled = self.by_name["head"].scale_loss(loss)
            groups = [self.a.trainable_weights, self.b.trainable_weights, self.head.trainable_weights]
            grads = tape.gradient(scaled, [v for g in groups for v in g])
            scale = self.by_name["head"].scale_loss(1.0)
            for opt, group in zip(self.opts, groups[:2]):
                opt.apply([g / scale for g in grads[:len(group)]], group)
                grads = grads[len(group):]
            self.by_name["head"].apply(grads, groups[2])
            return {"loss": loss}

    keras.utils.set_random_seed(1)
    model = Towers()
    model.compile(optimizer=None)
    model(np.zeros((1, 8), "float32"))
    return model


def _every_variable(model):
    optimizers = [*model.opts, model.by_name["head"]]
    return [v.numpy() for v in [*model.variables, *(v for o in optimizers for v in o.variables)]]


def test_optimizers_in_lists_and_dicts_and_loss_scale_internals_resume_exactly(tmp_path, ck_env):
    """Built again in the same process (its layers are dense_3, ... now, not dense): each variable still
    finds its own, by where it sits in the model."""
    reference = _two_towers(keras)
    fit(reference, tmp_path / "ref", epochs=3)
    model = _two_towers(keras)
    with pytest.raises(KeyboardInterrupt):
        fit(model, tmp_path / "run", epochs=3, callbacks=[InterruptAt(17)])
    model = _two_towers(keras)
    assert not model.opts[0].built   # it builds in its first apply; the resume must build it first
    auto = fit(model, tmp_path / "run", epochs=3)
    assert auto.restored.step == 17
    want, got = _every_variable(reference), _every_variable(model)
    assert len(got) == len(want) == 6 + 2 * (2 + 2 * 2) + (2 + 2 + 2 * 2)   # weights, Adam/SGD+momentum, LSO+Adam
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_a_checkpoint_of_the_earlier_layout_still_resumes(tmp_path, ck_env):
    """Checkpoints written before variables were matched by path hold model.variables,
    model.optimizer.variables and metrics_variables in order."""
    model, _ = workers.build_model(keras)
    fit(model, tmp_path / "scratch", epochs=1)
    old = {group: [np.array(v.numpy()) for v in variables] for group, variables in
           (("model", model.variables), ("optimizer", model.optimizer.variables),
            ("metrics", model.metrics_variables))}
    old.update({f"{group}_paths": [v.path for v in variables] for group, variables in
                (("model", model.variables), ("optimizer", model.optimizer.variables),
                 ("metrics", model.metrics_variables))})
    with colabkit.Checkpoints(str(tmp_path / "old")) as checkpoints:
        checkpoints.save(12, old, epoch=1, batch=0, wait=True)
    fresh, _ = _restored_into_fresh_model(tmp_path / "old", epochs=1)
    for got, want in zip(fresh.variables, model.variables):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_the_next_fit_works_after_one_left_by_an_exception_no_hook_sees(tmp_path, ck_env):
    """Validation data that fails inside evaluate's test function: AutoResume learns that fit() is gone only
    when the next fit() sets up its callbacks."""
    x, y = workers.data(np)

    def failing_validation():
        yield x[:8], y[:8]
        raise RuntimeError("the validation input broke")

    model, counter = workers.build_model(keras)
    auto = colabkit.keras.AutoResume(str(tmp_path / "run"), save_freq=6, deadline=None)
    with pytest.raises(Exception, match="validation input broke"):
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[auto],
                  validation_data=failing_validation(), validation_steps=2)
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[auto])
    assert auto.restored.step == 12 and int(counter.count.numpy()) == 24
    assert CheckpointFolder(tmp_path / "run").committed()[-1].step == 24
    assert getattr(model.train_function, "_colabkit_original", None) is None


@pytest.mark.parametrize("ends", ["returns", "raises"])
def test_after_fit_nothing_it_was_given_stays_alive(tmp_path, ck_env, ends):
    """Once fit() is over (normally or by an exception), the data it was given is freed as it is without
    AutoResume: a tf.data pipeline kept alive to interpreter exit can deadlock Python 3.10's shutdown."""
    import gc
    import weakref

    import tensorflow as tf
    x, y = workers.data(np)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    freed = weakref.ref(data)
    model, _ = workers.build_model(keras)
    auto = colabkit.keras.AutoResume(str(tmp_path / "run"), deadline=None, save_freq=2, verbose=0)
    callbacks = [auto] if ends == "returns" else [auto, AtBatch(3, lambda m: 1 / 0)]
    if ends == "returns":
        model.fit(data, epochs=1, verbose=0, callbacks=callbacks)
    else:
        with pytest.raises(ZeroDivisionError):
            model.fit(data, epochs=1, verbose=0, callbacks=callbacks)
    del data, callbacks
    gc.collect()
    assert freed() is None
    assert CheckpointFolder(tmp_path / "run").committed(), "and it saved"
