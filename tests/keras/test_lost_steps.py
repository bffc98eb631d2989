"""A Keras AutoResume that resumes from an older step than the last one reached books the batches it trains again
in the cost ledger."""
from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")


class _CrashBefore(keras.callbacks.Callback):
    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def on_train_batch_begin(self, batch, logs=None):
        if batch == self.batch:
            raise RuntimeError("the kernel died")


def _model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


def test_keras_resume_books_the_batches_trained_again(tmp_path, ck_env, monkeypatch):
    import colabkit
    from colabkit.health import ledger, progress
    monkeypatch.setattr(progress, "EVERY", 0.0)
    monkeypatch.setenv("COLABKIT_LEDGER", str(tmp_path / "ledger.jsonl"))
    x = np.random.RandomState(0).rand(64, 4).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    auto = colabkit.keras.AutoResume(tmp_path / "run", save_freq=2, deadline=None, verbose=0)
    with pytest.raises(RuntimeError, match="kernel died"):      # after 3 batches; the last save was at step 2
        _model().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[_CrashBefore(3), auto])
    again = colabkit.keras.AutoResume(tmp_path / "run", save_freq=2, deadline=None, verbose=0)
    _model().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[again])
    assert again.restored.step == 2
    assert [(r["kind"], r["lost_steps"]) for r in ledger.read(tmp_path / "ledger.jsonl")] == [("resume", 1)]
