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

HERE = Path(__file__).parent
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
    with pytest.raises(ValueError, match="Empty `directory`"):
        colabkit.keras.AutoResume(directory)
    with pytest.raises(ValueError):
        keras.callbacks.BackupAndRestore(directory)


def test_unbuilt_model_is_rejected_like_backup_and_restore(tmp_path, ck_env):
    model = keras.Sequential([keras.layers.Dense(1)])
    model.compile("adam", "mse")
    x, y = workers.data(np)
    with pytest.raises(ValueError, match="must be built"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[colabkit.keras.AutoResume(str(tmp_path / "u"))])


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
    import colabkit.keras as ck
    monkeypatch.setattr(ck, "FINAL_WAIT_FLOOR_S", 1.0)
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
