"""The step-reached mark behind "lost steps": keyed by the checkpoint folder itself, so two projects that both
name theirs "checkpoints" do not book each other's steps as trained twice."""
from __future__ import annotations

from colabkit.health import ledger
from colabkit.health.progress import start_mark


def test_the_same_relative_folder_name_in_two_projects_is_two_marks(tmp_path, monkeypatch):
    monkeypatch.setenv("COLABKIT_LEDGER", str(tmp_path / "ledger.jsonl"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    first = start_mark("checkpoints", 0)
    first.reached(5000)                      # project a reached step 5000
    monkeypatch.chdir(tmp_path / "b")
    assert start_mark("checkpoints", 0).lost == 0     # project b starts fresh: nothing trained twice
    monkeypatch.chdir(tmp_path / "a")
    assert start_mark("checkpoints", 4000).lost == 1000   # project a resumes from 4000
    assert [(r["kind"], r["lost_steps"]) for r in ledger.read(tmp_path / "ledger.jsonl")] == [("resume", 1000)]
