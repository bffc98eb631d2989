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


def test_accelerate_loop_resume_books_the_batches_trained_again(tmp_path, ck_env, monkeypatch):
    torch = pytest.importorskip("torch")
    accelerate = pytest.importorskip("accelerate")
    import colabkit
    from colabkit.health import ledger, progress
    monkeypatch.setattr(progress, "EVERY", 0.0)
    monkeypatch.setenv("COLABKIT_LEDGER", str(tmp_path / "ledger.jsonl"))

    def train(stop_at=None):
        torch.manual_seed(0)
        accelerator = accelerate.Accelerator(cpu=True)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(24, 3)), batch_size=4)
        model, opt, loader = accelerator.prepare(model, opt, loader)
        ar = colabkit.hf.AccelerateResume(tmp_path / "run", accelerator, save_freq=2, deadline=None, verbose=0)
        for _ in ar.epochs(1):
            for (x,) in ar.batches(loader):
                opt.zero_grad()
                accelerator.backward(model(x).sum())
                opt.step()
                if ar.step == stop_at:
                    break      # a crash: the last save was at step 2
            break
        ar.close()
        return ar

    train(stop_at=3)
    again = train()
    assert again.restored.step == 2
    assert [(r["kind"], r["lost_steps"]) for r in ledger.read(tmp_path / "ledger.jsonl")] == [("resume", 1)]
