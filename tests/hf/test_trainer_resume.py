"""colabkit.hf.AutoResume with transformers' Trainer and TRL's SFTTrainer (real, on CPU, a tiny model): a run
stopped mid-epoch (SIGTERM, a deadline, kill -9 while a checkpoint is written) and resumed in a fresh process on a
fresh VM (a new local cache; only the destination is kept) ends with every parameter and optimizer state bit-equal
to an uninterrupted run; the Trainer's own rotation deletes nothing at the destination; the run shows in
`colabkit checkpoints` and the status panel.

The runs are in fresh processes (tests/hf/runner.py: forked from a server that imported transformers once), as
tests/hf/worker.py describes: GPT-2 with 2 layers of width 32 (dropout on), 24 examples of 16 tokens, batches of 4:
6 optimizer steps an epoch, 2 epochs.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tests.hf.runner import REPO, Run, run

pytestmark = pytest.mark.subprocess_kill


def _env(root) -> dict:
    """A VM of its own: a local cache (the staging folder, restored copies) and a Drive root."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLABKIT_")}
    env.update({"XDG_CACHE_HOME": str(root / "cache"), "XDG_CONFIG_HOME": str(root / "config"),
                "COLABKIT_DRIVE_ROOT": str(root / "drive"), "PYTHONPATH": str(REPO)})
    return env


def _new_vm(env, root) -> dict:
    """The same Drive, a fresh local disk."""
    return {**env, "XDG_CACHE_HOME": str(root / "new-vm-cache")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run (no AutoResume-triggered stop): its final tensors and the batches of every step."""
    root = tmp_path_factory.mktemp("reference")
    result, _, explain = run(_env(root), root, "ref", dest="drive:runs/ref")
    assert result["step"] == 12, explain
    return result, root / "ref.npz"


def _differing(reference_npz, got_npz) -> list:
    with np.load(reference_npz) as want, np.load(got_npz) as got:
        assert sorted(want.files) == sorted(got.files) and len(want.files) > 20
        return [k for k in want.files if want[k].shape != got[k].shape or not np.array_equal(want[k], got[k])]


def _committed(env, dest="runs/llm") -> list:
    """(step, epoch, batch) of the committed checkpoints at the destination, as `colabkit checkpoints` lists them."""
    done = subprocess.run([sys.executable, "-m", "colabkit", "checkpoints", f"drive:{dest}", "--json", "--verify"],
                          env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["invalid"] == {}, done.stdout + done.stderr
    assert all(row["valid"] for row in report["checkpoints"]), report
    return [(r["step"], r["epoch"], r["batch"]) for r in report["checkpoints"]]


def test_stopped_mid_epoch_by_sigterm_or_a_deadline_resumes_bit_exactly_on_a_fresh_vm(tmp_path, reference):
    expected, reference_npz = reference
    sig_env, dl_env = _env(tmp_path / "sig"), _env(tmp_path / "dl")
    # SIGTERM arrives while step 8 runs: latched, acted on at its end. A 1s time budget with the default 60s
    # margin: due at the first step's end.
    sig = Run(sig_env, tmp_path, "sig-cut", dest="drive:runs/llm", sigterm_in_step=7)
    dl = Run(dl_env, tmp_path, "dl-cut", dest="drive:runs/llm", deadline="1s")
    _, sig_out, explain = sig.finish(-signal.SIGTERM)
    assert ("colabkit: SIGTERM received: saved step 8 (committed to drive:runs/llm) and stopped training. "
            "Re-run this cell to resume.") in sig_out, explain
    cut, dl_out, explain = dl.finish()
    assert cut["step"] == 1 and "the 1s time budget is" in cut["stopped"], explain
    assert "Re-run this cell to resume" in cut["stopped"], explain
    assert _committed(sig_env) == [(8, 1, 2)] and _committed(dl_env) == [(1, 0, 1)]

    sig = Run(_new_vm(sig_env, tmp_path / "sig"), tmp_path, "sig-resumed", dest="drive:runs/llm")
    dl = Run(_new_vm(dl_env, tmp_path / "dl"), tmp_path, "dl-resumed", dest="drive:runs/llm")
    for proc, step, where in ((sig, 8, "epoch 1, step 2 of it"), (dl, 1, "epoch 0, step 1 of it")):
        resumed, out, explain = proc.finish()
        assert (f"colabkit: resumed from step {step} ({where}) of drive:runs/llm (downloaded and verified); the "
                f"Trainer skips the") in out, explain
        assert resumed["resume_from"].startswith(str(tmp_path)) and "new-vm-cache" in resumed["resume_from"]
        assert resumed["step"] == 12 and resumed["stopped"] is None, explain
        assert resumed["seen"] == expected["seen"][step:], explain   # the same batches, none replayed
        assert _differing(reference_npz, proc.log.with_suffix(".npz")) == [], explain


@pytest.mark.parametrize("kill", ["while-the-trainer-writes", "after-on_save"])
def test_kill_9_during_a_checkpoint_leaves_no_partial_one_and_the_next_run_resumes_from_the_previous(
        tmp_path, reference, kill):
    """save_freq=3: saves at steps 3 and 6 (each committed before training goes on: the store coalesces a save
    that arrives while two are in hand, which would make the expected list a race), then kill -9 at step 9's save:
    while the Trainer writes checkpoint-9 (its optimizer.pt half written), or just after AutoResume took it (hashed
    and committed in the background)."""
    expected, reference_npz = reference
    env = _env(tmp_path)
    if kill == "while-the-trainer-writes":
        cut = Run(env, tmp_path, "cut", dest="drive:runs/llm", save_freq=3, slow_save_at=9, commit_each_save=True)
        cut.wait_for("WRITING")
        end = time.monotonic() + 60
        while [s for s, _, _ in _committed(env)] != [3, 6] and time.monotonic() < end:
            time.sleep(0.1)
        cut.kill()
        cut.finish(-signal.SIGKILL)
    else:
        Run(env, tmp_path, "cut", dest="drive:runs/llm", save_freq=3, kill_after_save=9,
            commit_each_save=True).finish(-signal.SIGKILL)
    steps = [s for s, _, _ in _committed(env)]   # every committed checkpoint verifies (checked in _committed)
    assert steps in ([3, 6], [3, 6, 9]), steps
    resumed, out, explain = run(_new_vm(env, tmp_path), tmp_path, "resumed", dest="drive:runs/llm", save_freq=3)
    assert f"colabkit: resumed from step {steps[-1]} " in out, explain
    assert resumed["seen"] == expected["seen"][steps[-1]:], explain
    assert _differing(reference_npz, tmp_path / "resumed.npz") == [], explain


def test_trainer_rotation_deletes_nothing_at_the_destination_and_the_run_shows_in_the_cli_and_panel(tmp_path):
    """save_total_limit=1 keeps one checkpoint-N in output_dir; the destination keeps the store's keep=3 (each
    save committed before training goes on, so that none is coalesced with the next)."""
    env = _env(tmp_path)
    result, out, explain = run(env, tmp_path, "run", dest="drive:runs/llm", save_strategy="steps", save_steps=2,
                               save_total_limit=1, keep=3, panel=True, commit_each_save=True)
    assert sorted(p.name for p in (tmp_path / "run-output").iterdir()) == ["checkpoint-12"]
    assert _committed(env) == [(8, 1, 2), (10, 1, 4), (12, 2, 0)], explain
    done = subprocess.run([sys.executable, "-m", "colabkit", "checkpoints", "drive:runs/llm"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "3 committed checkpoint(s)" in done.stdout and "epoch 1, batch 4" in done.stdout, done.stdout
    panel = json.loads(next(ln for ln in out.splitlines() if ln.startswith("PANEL "))[len("PANEL "):])
    assert "training run        colabkit.hf.AutoResume · last event" in panel, panel
    assert "last checkpoint     step 12 (epoch 2)" in panel and "uploaded to drive:runs/llm" in panel, panel


def test_sft_trainer_stopped_by_sigterm_resumes_bit_exactly(tmp_path):
    pytest.importorskip("trl")
    env = _env(tmp_path)
    ref = Run(env, tmp_path, "ref", dest="drive:runs/ref", trainer="sft")
    cut = Run(env, tmp_path, "cut", dest="drive:runs/sft", trainer="sft", sigterm_in_step=4)
    expected, _, explain = ref.finish()
    _, out, explain = cut.finish(-signal.SIGTERM)
    assert "colabkit: SIGTERM received: saved step 5 (committed to drive:runs/sft)" in out, explain
    resumed, out, explain = run(_new_vm(env, tmp_path), tmp_path, "resumed", dest="drive:runs/sft", trainer="sft")
    assert "colabkit: resumed from step 5 (epoch 0, step 5 of it) of drive:runs/sft" in out, explain
    assert resumed["step"] == expected["step"] == 12 and resumed["seen"] == expected["seen"][5:], explain
    assert _differing(tmp_path / "ref.npz", tmp_path / "resumed.npz") == [], explain
