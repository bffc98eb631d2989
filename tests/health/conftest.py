"""Fixtures for the training-health tests: the GPU stand-ins (tests/standins/gpu) and tiny Keras models."""
from __future__ import annotations

import os

import pytest

from tests.devices.conftest import fake_gpus, run_cli  # noqa: F401 - shared fixtures: NVML stand-in, CLI
from tests.keepalive.conftest import start_server  # noqa: F401 - Jupyter server


@pytest.fixture(scope="session")
def tf_keras():
    """(tensorflow, keras), quiet; skipped where TensorFlow is missing."""
    with pytest.MonkeyPatch.context() as mp:   # session-wide, so not the per-test monkeypatch
        if "TF_CPP_MIN_LOG_LEVEL" not in os.environ:
            mp.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
        tf = pytest.importorskip("tensorflow")
        keras = pytest.importorskip("keras")
        yield tf, keras


def tiny_model(keras, width=16, steps_per_execution=1, extra=()):
    model = keras.Sequential([keras.Input((32,)), *extra, keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(width, activation="relu"), keras.layers.Dense(1)])
    model.compile("adam", "mse", steps_per_execution=steps_per_execution)
    return model
