"""A PyTorch AutoResume that resumes from an older step than the last one reached books the batches it trains
again in the cost ledger; `colabkit costs` (a fresh process) shows them."""
import json

import pytest

from tests.devices.conftest import run_cli  # noqa: F401 - `python -m colabkit` in a subprocess

torch = pytest.importorskip("torch")


def _train(directory, stop_at=None):
    import colabkit
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4))
    ar = colabkit.torch.AutoResume(directory, model=model, opt=opt, save_freq=3, deadline=None, verbose=0)
    start = ar.step
    for _ in ar.epochs(1):
        for (x,) in ar.batches(torch.utils.data.DataLoader(data, batch_size=2)):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            if ar.step == stop_at:
                break     # a crash: the last save was at step 3
        break
    ar.close()
    return start


def test_resume_books_the_batches_trained_again(tmp_path, monkeypatch, run_cli):  # noqa: F811
    from colabkit.health import progress
    monkeypatch.setattr(progress, "EVERY", 0.0)     # mark every batch (the default is every 10 s)
    monkeypatch.setenv("COLABKIT_DRIVE_ROOT", str(tmp_path / "drive"))
    monkeypatch.setenv("COLABKIT_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("COLABKIT_PROJECT", "tiny")
    assert _train(tmp_path / "run", stop_at=5) == 0
    assert not (tmp_path / "ledger.jsonl").exists()          # a first run trains nothing twice
    assert _train(tmp_path / "run") == 3                      # resumed at step 3; step 5 had been reached
    records = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["lost_steps"], r["project"]) for r in records] == [("resume", 2, "tiny")]
    out = run_cli("costs", "--json")
    assert json.loads(out.stdout)["total"]["lost_steps"] == 2, out.stderr


def test_lightning_resume_books_the_steps_trained_again(tmp_path, monkeypatch, ck_env):
    pytest.importorskip("lightning")
    import colabkit
    from colabkit.health import ledger, progress
    from tests.torch.test_lightning_resume import _build, _trainer
    monkeypatch.setattr(progress, "EVERY", 0.0)
    monkeypatch.setenv("COLABKIT_LEDGER", str(tmp_path / "ledger.jsonl"))
    model, loader = _build({"loader": "plain"})
    steps = []

    def failing_step(batch, batch_idx, _orig=model.training_step):
        steps.append(batch_idx)
        if len(steps) == 4:
            raise RuntimeError("a NaN check failed")     # after 3 steps; the last save was at step 2
        return _orig(batch, batch_idx)

    model.training_step = failing_step
    ar = colabkit.torch_lightning.AutoResume(tmp_path / "run", save_freq=2, deadline=None, verbose=0)
    with pytest.raises(RuntimeError, match="NaN check"):
        _trainer(tmp_path, ar).fit(model, loader, ckpt_path="last")
    fresh, loader = _build({"loader": "plain"})
    ar = colabkit.torch_lightning.AutoResume(tmp_path / "run", save_freq=2, deadline=None, verbose=0)
    _trainer(tmp_path, ar, max_epochs=1).fit(fresh, loader, ckpt_path="last")
    assert [(r["kind"], r["lost_steps"]) for r in ledger.read(tmp_path / "ledger.jsonl")] == [("resume", 1)]
