"""Keras checkpoints written before the state codec (commit BEFORE_CODEC, run from git history in a subprocess)
restore with this colabkit: a Keras AutoResume run resumes bit-exactly with the RNG states it saved, and
TensorFlow objects saved with Checkpoints.save restore in place."""
from __future__ import annotations

import hashlib
import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest

import colabkit
from colabkit.checkpoints import rng


def _sibling(name):
    """A test module of tests/checkpoints (no package), for its helpers."""
    path = Path(__file__).resolve().parent.parent / "checkpoints" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"ck_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compat = _sibling("test_state_compat")
REPO, _finish, _start = compat.REPO, compat._finish, compat._start


def test_a_keras_run_checkpointed_before_the_codec_resumes_with_its_rng_states(tmp_path, ck_env, old_colabkit):
    pytest.importorskip("keras")
    ref = _start(old_colabkit, ck_env, tmp_path / "cache-ref", kind="keras", dest=str(tmp_path / "ref"),
                 epochs=3, write=True)
    cut = _start(old_colabkit, ck_env, tmp_path / "cache-old", kind="keras", dest=str(tmp_path / "run"),
                 epochs=2, write=True)
    expected, _ = _finish(ref)
    _finish(cut)
    with colabkit.Checkpoints(tmp_path / "run") as ckpt:
        saved = ckpt.restore().state["rng"]

    resumed, explain = _finish(_start(REPO, ck_env, tmp_path / "cache-old", kind="keras",
                                      dest=str(tmp_path / "run"), epochs=3))
    assert resumed["restored"] == [12, 2], explain
    assert resumed["weights"] == expected["weights"], explain
    assert resumed["early_wait"] == expected["early_wait"]
    py = random.Random()
    py.setstate(rng.python_from_json(saved["python"]))
    keys = rng.numpy_from_json(saved["numpy"])[1]
    assert resumed["probe"] == {"python": hashlib.sha256(repr(py.getstate()).encode()).hexdigest(),
                                "numpy": hashlib.sha256(np.ascontiguousarray(keys).tobytes()).hexdigest()}, explain
    assert resumed["store"] == {"step": 4, "v": [1.0, 2.0, 3.0], "w": [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]],
                                "rest": ["dict", [[["str", "epoch"], ["int", 1]],
                                                  [["str", "w"], ["ndarray", "float64", [2], [1.0, 1.0]]]]]}
