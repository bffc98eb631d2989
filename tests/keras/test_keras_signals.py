"""AutoResume's SIGTERM / SIGINT / deadline saves in every epoch, for every input kind Keras accepts, and its
handlers after a fit() that ended by an exception.

Each run is a subprocess (this file is also the worker: ``python test_keras_signals.py MODE SPEC``). Signals
are sent from inside a callback at a chosen (epoch, batch), so nothing depends on timing. Epochs of unknown
length (a filtered tf.data dataset, a Python generator) end with an exception inside the train function that
Keras catches; the saves must work in the epochs after it.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

keras = pytest.importorskip("keras")
pytest.importorskip("tensorflow")

HERE = Path(__file__).resolve().parent.parent / "checkpoints"   # workers.py, shared with test_kill.py
BATCHES = 12   # 96 samples in batches of 8 (workers.data)


# -- the worker (runs in the subprocess) -----------------------------------------------------------------

def _workers():
    import importlib.util
    spec = importlib.util.spec_from_file_location("ck_workers", HERE / "workers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fit_input(kind, x, y):
    """(args, kwargs) for model.fit: the same 12 batches of 8 in every form Keras accepts."""
    import tensorflow as tf
    if kind == "arrays":
        return (x, y), {"batch_size": 8}
    if kind == "tfdata":                       # known cardinality
        return (tf.data.Dataset.from_tensor_slices((x, y)).batch(8),), {}
    if kind == "tfdata_unknown":               # cardinality unknown: every epoch ends with OutOfRangeError
        ds = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(8)
        assert int(ds.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)
        return (ds,), {}
    if kind == "generator":                    # unknown length; Keras replays its 2 peeked batches in later epochs
        def batches():
            for i in range(0, 96, 8):
                yield x[i:i + 8], y[i:i + 8]
        return (batches(),), {}
    if kind == "pydataset":
        class Batches(keras.utils.PyDataset):
            def __len__(self):
                return BATCHES

            def __getitem__(self, i):
                return x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8]
        return (Batches(),), {}
    raise ValueError(kind)


class _Clock:
    """A deadline clock (deadline=clock) that a callback arms: the deadline save then happens at that batch."""

    def __init__(self):
        self.at = None

    def next_deadline(self):
        from colabkit.deadline import Deadline
        if self.at is None:
            return None
        return Deadline(at=self.at, reason="the test deadline", stop_training=False, key="test")


class _Script(keras.callbacks.Callback):
    """At chosen (epoch, batch) ends: send a signal to this process, arm the deadline clock, or fail."""

    def __init__(self, events, clock=None):
        super().__init__()
        self.events = {(e, b): action for e, b, action in events}
        self.clock, self.epoch, self.step = clock, None, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        action = self.events.pop((self.epoch, batch), None)
        if action is None:
            return
        print(f"AT {action} {self.epoch} {batch} {self.step}", flush=True)
        if action in ("SIGTERM", "SIGINT"):
            os.kill(os.getpid(), getattr(signal, action))
        elif action == "deadline":
            self.clock.at = time.time() + 30   # inside the margin: due at this batch end, 30 s to upload
        elif action == "raise":
            raise RuntimeError("another callback failed")


def _handlers_are_the_originals():
    return (signal.getsignal(signal.SIGINT) is signal.default_int_handler
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)


def _result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


def worker(mode, spec):
    import colabkit
    workers = _workers()
    x, y = workers.data(np)
    model, counter = workers.build_model(keras)
    clock = _Clock()
    auto = colabkit.keras.AutoResume(spec["dest"], deadline=clock, keep=20, verbose=1)

    def fit(events, epochs=3):
        args, kw = _fit_input(spec["kind"], x, y)
        model.fit(*args, epochs=epochs, shuffle=False, verbose=0, callbacks=[_Script(events, clock), auto], **kw)

    if mode == "train":       # fit with the scripted events; a SIGTERM ends this process
        try:
            fit(spec["events"])
        except KeyboardInterrupt as exc:
            print(f"KEYBOARDINTERRUPT {exc}", flush=True)
        _result(counter=int(counter.count.numpy()), handlers_restored=_handlers_are_the_originals(),
                weights=[w.tolist() for w in model.get_weights()] if spec.get("weights") else None)
    elif mode == "resume":    # a fresh process continuing from the folder
        fit([])
        restored = auto.restored
        _result(step=restored.step, epoch=restored.epoch, batch=restored.batch, counter=int(counter.count.numpy()),
                weights=[w.tolist() for w in model.get_weights()])
    elif mode == "after_failure":   # fit() left by another callback's exception, then a signal, then fit() again
        try:
            fit([[1, 2, "raise"]])
        except RuntimeError as exc:
            print(f"FIT FAILED {exc}", flush=True)
        # the exception leaving fit() went through AutoResume's hooks: Keras's own train function is back
        keras_train_function = model.train_function
        unwrapped = getattr(keras_train_function, "_colabkit_original", None) is None
        sig = getattr(signal, spec["signal"])
        try:
            signal.raise_signal(sig)   # the handler runs before raise_signal returns
        except KeyboardInterrupt:
            print("KEYBOARDINTERRUPT after the failed fit", flush=True)
        print("SURVIVED the signal", flush=True)
        after_signal = _handlers_are_the_originals()
        try:
            fit([[1, 3, "SIGINT"]])
        except KeyboardInterrupt as exc:
            print(f"KEYBOARDINTERRUPT {exc}", flush=True)
        _result(handlers_after_signal=after_signal, handlers_restored=_handlers_are_the_originals(),
                restored_step=auto.restored.step, unwrapped_after_failure=unwrapped,
                train_function_restored=model.train_function is keras_train_function)
    elif mode == "double":    # a second SIGINT while the interrupt's final save runs
        save = auto.checkpoints.save_snapshot

        def save_and_interrupt_again(step, specs, fill, **kw):
            if (kw.get("info") or {}).get("reason") != "SIGINT received":
                return save(step, specs, fill, **kw)

            def fill_then_interrupt(buffers):   # the snapshot is taken, its buffers held: the save runs
                state = fill(buffers)
                os.kill(os.getpid(), signal.SIGINT)
                return state
            return save(step, specs, fill_then_interrupt, **kw)

        auto.checkpoints.save_snapshot = save_and_interrupt_again
        try:
            fit([[1, 3, "SIGINT"]])
        except KeyboardInterrupt as exc:
            print(f"KEYBOARDINTERRUPT {exc!r}", flush=True)
        _result(handlers_restored=_handlers_are_the_originals())


# -- the tests ---------------------------------------------------------------------------------------------

def _run(mode, env, **spec):
    return subprocess.run([sys.executable, str(Path(__file__).resolve()), mode, json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=300)


def _lines(proc, prefix):
    return [line[len(prefix):].split() for line in proc.stdout.splitlines() if line.startswith(prefix)]


def _sent(proc, action):
    """(epoch, batch, steps trained so far) at which the worker's callback did ``action``."""
    found = [rest for name, *rest in _lines(proc, "AT ") if name == action]
    assert len(found) == 1, f"the worker did not do {action} once\n{_explain(proc)}"
    [[epoch, batch, step]] = found
    return int(epoch), int(batch), int(step)


def _result_of(proc):
    [line] = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


def _committed(dest):
    from colabkit.checkpoints.folder import CheckpointFolder
    return CheckpointFolder(dest).committed()


def _saved_at(dest, reason):
    """(step, epoch, batch) of the one committed checkpoint saved for ``reason``."""
    committed = [(c.step, c.epoch, c.batch, c.manifest["info"]["reason"]) for c in _committed(dest)]
    found = [c[:3] for c in committed if c[3] == reason]
    assert len(found) == 1, f"no single checkpoint saved for {reason!r}: {committed}"
    return found[0]


def _explain(proc):
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-4000:]}"


def test_sigterm_in_the_second_epoch_of_an_unknown_length_dataset_saves_then_terminates(tmp_path, ck_env):
    dest = str(tmp_path / "run")
    proc = _run("train", ck_env, dest=dest, kind="tfdata_unknown", events=[[1, 3, "SIGTERM"]])
    assert proc.returncode == -signal.SIGTERM, _explain(proc)
    assert "SIGTERM received" in proc.stdout and "RESULT" not in proc.stdout, _explain(proc)
    assert _sent(proc, "SIGTERM") == (1, 3, BATCHES + 4)
    assert _saved_at(dest, "SIGTERM received") == (BATCHES + 4, 1, 4)
    resumed = _run("resume", ck_env, dest=dest, kind="tfdata_unknown")
    assert resumed.returncode == 0, _explain(resumed)
    result = _result_of(resumed)
    assert (result["step"], result["epoch"], result["batch"]) == (BATCHES + 4, 1, 4)
    # the resumed run trained exactly the batches left: it ends where an uninterrupted run ends
    reference = _run("train", ck_env, dest=str(tmp_path / "reference"), kind="tfdata_unknown", events=[], weights=True)
    assert reference.returncode == 0, _explain(reference)
    expected = _result_of(reference)
    # (TensorFlow runs the counting layer in the failing get-next call that ends an epoch of unknown length
    # too, so the counter reads 13 per epoch here; it is compared, not computed)
    assert result["counter"] == expected["counter"]
    for got, want in zip(result["weights"], expected["weights"]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_sigint_in_the_second_epoch_of_an_unknown_length_dataset_saves_then_raises(tmp_path, ck_env):
    import colabkit
    dest = str(tmp_path / "run")
    proc = _run("train", ck_env, dest=dest, kind="tfdata_unknown", events=[[1, 3, "SIGINT"]])
    assert proc.returncode == 0, _explain(proc)
    assert "KEYBOARDINTERRUPT training interrupted; the last checkpoint was committed first" in proc.stdout, \
        _explain(proc)
    assert _result_of(proc) == {"counter": BATCHES + 1 + 4, "handlers_restored": True, "weights": None}
    with colabkit.Checkpoints(dest) as checkpoints:   # this process did not train: it reads the folder afresh
        restored = checkpoints.restore()
    assert (restored.step, restored.epoch, restored.batch) == (BATCHES + 4, 1, 4)
    assert _saved_at(dest, "SIGINT received") == (BATCHES + 4, 1, 4)


def test_sigterm_in_a_later_epoch_of_a_python_generator_saves_then_terminates(tmp_path, ck_env):
    dest = str(tmp_path / "run")
    proc = _run("train", ck_env, dest=dest, kind="generator", events=[[2, 0, "SIGTERM"]])
    assert proc.returncode == -signal.SIGTERM, _explain(proc)
    epoch, batch, step = _sent(proc, "SIGTERM")
    assert (epoch, batch) == (2, 0) and step > BATCHES
    assert _saved_at(dest, "SIGTERM received") == (step, 2, 1)
    resumed = _run("resume", ck_env, dest=dest, kind="generator")
    assert resumed.returncode == 0, _explain(resumed)
    result = _result_of(resumed)
    assert (result["step"], result["epoch"], result["batch"]) == (step, 2, 1)
    assert "epoch 2 restarts at batch 0" in resumed.stdout   # a generator cannot be positioned mid-epoch


@pytest.mark.parametrize("kind", ["arrays", "tfdata", "tfdata_unknown", "generator", "pydataset"])
def test_deadline_and_sigterm_saves_work_in_later_epochs_for_every_input_kind(tmp_path, ck_env, kind):
    """A deadline save (training continues) in epoch 1, then SIGTERM in epoch 2: both saved at their batch."""
    dest = str(tmp_path / "run")
    proc = _run("train", ck_env, dest=dest, kind=kind, events=[[1, 1, "deadline"], [2, 0, "SIGTERM"]])
    assert proc.returncode == -signal.SIGTERM, _explain(proc)
    assert "before the test deadline; training continues" in proc.stdout, _explain(proc)
    _, _, deadline_step = _sent(proc, "deadline")
    _, _, sigterm_step = _sent(proc, "SIGTERM")
    assert _saved_at(dest, "before the test deadline") == (deadline_step, 1, 2)
    assert _saved_at(dest, "SIGTERM received") == (sigterm_step, 2, 1)
    assert _committed(dest)[-1].step == sigterm_step


def test_sigint_after_fit_failed_in_another_callback_raises_and_the_next_fit_works(tmp_path, ck_env):
    dest = str(tmp_path / "run")
    proc = _run("after_failure", ck_env, dest=dest, kind="arrays", signal="SIGINT")
    assert proc.returncode == 0, _explain(proc)
    out = proc.stdout
    assert "FIT FAILED another callback failed" in out, _explain(proc)
    assert "KEYBOARDINTERRUPT after the failed fit" in out, "the handler left by the failed fit() swallowed SIGINT"
    # the second fit() with the same callback resumes from epoch 1's start, and its interrupt saves and raises
    assert "KEYBOARDINTERRUPT training interrupted; the last checkpoint was committed first" in out, _explain(proc)
    # ... Keras's own train function was put back when the exception left the first fit(), and again after
    # the second
    assert _result_of(proc) == {"handlers_after_signal": True, "handlers_restored": True, "restored_step": BATCHES,
                                "unwrapped_after_failure": True, "train_function_restored": True}
    assert _saved_at(dest, "SIGINT received") == (BATCHES + 4, 1, 4)


def test_sigterm_after_fit_failed_in_another_callback_terminates_the_process(tmp_path, ck_env):
    proc = _run("after_failure", ck_env, dest=str(tmp_path / "run"), kind="arrays", signal="SIGTERM")
    assert proc.returncode == -signal.SIGTERM, _explain(proc)
    assert "FIT FAILED another callback failed" in proc.stdout and "SURVIVED" not in proc.stdout, _explain(proc)


def test_a_second_sigint_during_the_final_save_is_passed_on_at_once(tmp_path, ck_env):
    proc = _run("double", ck_env, dest=str(tmp_path / "run"), kind="tfdata_unknown")
    assert proc.returncode == 0, _explain(proc)
    # the previous handler's own KeyboardInterrupt, raised inside the save: not the one after a finished save
    assert "KEYBOARDINTERRUPT KeyboardInterrupt()" in proc.stdout, _explain(proc)
    assert "SIGINT received: saved step" not in proc.stdout, _explain(proc)
    assert _result_of(proc) == {"handlers_restored": True}


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    worker(sys.argv[1], json.loads(sys.argv[2]))
