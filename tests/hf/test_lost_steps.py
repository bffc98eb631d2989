"""A Hugging Face Trainer resumed by colabkit.hf.AutoResume from an older step than the last one reached books the
steps it trains again in the cost ledger."""
from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")


def test_trainer_resume_books_the_steps_trained_again(tmp_path, ck_env, monkeypatch):
    import colabkit
    from colabkit.health import ledger, progress
    from tests.hf import test_trainer_input
    monkeypatch.setattr(test_trainer_input, "transformers", transformers, raising=False)
    monkeypatch.setattr(progress, "EVERY", 0.0)
    monkeypatch.setenv("COLABKIT_LEDGER", str(tmp_path / "ledger.jsonl"))

    class Crash(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise RuntimeError("the kernel died")     # after step 3; the last save was at step 2

    ar = colabkit.hf.AutoResume(tmp_path / "run", save_freq=2, deadline=None, verbose=0)
    with pytest.raises(RuntimeError, match="kernel died"):
        test_trainer_input._trainer(tmp_path, [ar, Crash()], max_steps=4).train(resume_from_checkpoint=ar.resume_from)
    ar.close()
    again = colabkit.hf.AutoResume(tmp_path / "run", save_freq=2, deadline=None, verbose=0)
    trainer = test_trainer_input._trainer(tmp_path, [again], max_steps=4, output_dir=tmp_path / "out2")
    trainer.train(resume_from_checkpoint=again.resume_from)
    assert [(r["kind"], r["lost_steps"]) for r in ledger.read(tmp_path / "ledger.jsonl")] == [("resume", 1)]
