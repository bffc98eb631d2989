"""A cache() above a reshuffling shuffle() outlives fit(): a second fit() over the same dataset in the same process
(fine-tuning after a first fit) replays the order the first fit's first epoch cached. Interrupted in that second
fit and resumed in a fresh process, it must read that order again.

Run as a script, this file is the worker: ``python test_keras_cache_second_fit.py ROOT PHASE``.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

keras = pytest.importorskip("keras")
pytest.importorskip("tensorflow")


def _two_fits(root, tag, interrupt=None):
    import colabkit
    from tests.keras.test_keras_input import _InterruptAt
    from tests.keras.test_keras_resume_notes import _cached_fit_input, _regression

    model, data = _regression(), _cached_fit_input()
    for part, cut in (("A", None), ("B", interrupt)):
        auto = colabkit.keras.AutoResume(f"{root}/{tag}{part}", save_freq=2, deadline=None)
        try:
            model.fit(data, epochs=2, verbose=0, callbacks=[*([_InterruptAt(*cut)] if cut else []), auto])
        except KeyboardInterrupt:
            print(f"INTERRUPTED {tag}{part}", flush=True)
    return model


def worker(root, phase):
    if phase == "interrupt":
        _two_fits(root, "run", interrupt=[1, 3])
        return
    reference = _two_fits(root, "ref")    # its own dataset, so its own cache
    resumed = _two_fits(root, "run")
    differ = [v.path for v, w in zip(resumed.variables, reference.variables)
              if not np.array_equal(v.numpy(), w.numpy())]
    print("DIFFER " + json.dumps(differ), flush=True)


def _run(env, *args):
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], env=env, cwd=root,
                          capture_output=True, text=True, timeout=300)
    explain = f"rc={done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr[-4000:]}"
    assert done.returncode == 0, explain
    return done.stdout, explain


def test_a_second_fit_over_a_cached_shuffle_resumes_in_the_order_its_cache_replays(tmp_path, ck_env):
    out, explain = _run(ck_env, str(tmp_path), "interrupt")
    assert "INTERRUPTED runB" in out, explain
    out, explain = _run(ck_env, str(tmp_path), "resume")
    assert "resumed from step 12 (epoch 1, batch 4)" in out and "DIFFER []" in out, explain


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    worker(sys.argv[1], sys.argv[2])
