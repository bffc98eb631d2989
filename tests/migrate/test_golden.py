"""Golden notebooks: Colab-style inputs, their expected migration byte for byte, idempotence, fidelity.

To regenerate the expected files after an intended change: COLABKIT_REGEN_GOLDEN=1 python -m pytest
tests/migrate/test_golden.py, then review `git diff tests/migrate/golden` line by line.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from colabkit.migrate import RULES, migrate_text
from colabkit.migrate import nbjson

GOLDEN = Path(__file__).resolve().parent / "golden"


def golden_inputs() -> list:
    """The golden inputs; each has <name>.expected.ipynb and <name>.findings.txt next to it."""
    return sorted(p.stem for p in GOLDEN.glob("*.ipynb") if not p.name.endswith(".expected.ipynb"))


REGEN = os.environ.get("COLABKIT_REGEN_GOLDEN") == "1"


def _findings_text(findings) -> str:
    return "".join(f"{f'new cell before cell {f.cell + 1}' if f.new_cell else f'cell {f.cell + 1} line {f.line}'} "
                   f"{f.code} {'applied' if f.applied else 'report'}\n" for f in findings)


def _read(path) -> str:
    return path.read_bytes().decode("utf-8")


@pytest.mark.parametrize("name", golden_inputs())
def test_golden_output_byte_for_byte(name):
    original = _read(GOLDEN / f"{name}.ipynb")
    new_text, findings, changes = migrate_text(original)
    expected_path = GOLDEN / f"{name}.expected.ipynb"
    findings_path = GOLDEN / f"{name}.findings.txt"
    if REGEN:
        expected_path.write_bytes(new_text.encode("utf-8"))
        findings_path.write_text(_findings_text(findings), encoding="utf-8")
    assert new_text.encode("utf-8") == expected_path.read_bytes()
    assert _findings_text(findings) == findings_path.read_text(encoding="utf-8")
    assert bool(changes) == (new_text != original)


@pytest.mark.parametrize("name", golden_inputs())
def test_migrating_twice_changes_nothing(name):
    once, _, _ = migrate_text(_read(GOLDEN / f"{name}.ipynb"))
    twice, findings, changes = migrate_text(once)
    assert twice == once
    assert changes == []
    assert not [f for f in findings if f.applied]


def _without_added_cells(new_text, changes):
    """The migrated text without the cells migrate added (the install cell), and the changes to the others."""
    added = sorted(c.cell for c in changes if c.new)
    spans = nbjson.cell_spans(new_text)
    for position, cell in enumerate(added):
        start, end = spans[cell + position]
        following = spans[cell + position + 1][0]  # the cell it was put before: up to there goes
        new_text = new_text[:start] + new_text[following:]
        spans = nbjson.cell_spans(new_text)
    return new_text, [c for c in changes if not c.new]


@pytest.mark.parametrize("name", golden_inputs())
def test_round_trip_fidelity_everything_but_changed_sources(name):
    original = _read(GOLDEN / f"{name}.ipynb")
    new_text, _, changes = migrate_text(original)
    new_text, changes = _without_added_cells(new_text, changes)
    changed = {c.cell for c in changes}
    before, after = json.loads(original), json.loads(new_text)
    # Parsed: identical except the sources of changed cells (key order included).
    for index, (old_cell, new_cell) in enumerate(zip(before["cells"], after["cells"])):
        assert list(old_cell) == list(new_cell)
        if index not in changed:
            assert old_cell == new_cell
        else:
            assert {k: v for k, v in old_cell.items() if k != "source"} == \
                   {k: v for k, v in new_cell.items() if k != "source"}
            assert type(old_cell["source"]) is type(new_cell["source"])
    assert len(before["cells"]) == len(after["cells"])
    assert {k: v for k, v in before.items() if k != "cells"} == {k: v for k, v in after.items() if k != "cells"}
    assert list(before) == list(after)
    # Bytes: outside the changed source values, the file is the same text.
    old_spans, new_spans = nbjson.source_spans(original), nbjson.source_spans(new_text)
    old_pos = new_pos = 0
    for index in sorted(changed):
        (o_start, o_end), (n_start, n_end) = old_spans[index], new_spans[index]
        assert original[old_pos:o_start] == new_text[new_pos:n_start]
        old_pos, new_pos = o_end, n_end
    assert original[old_pos:] == new_text[new_pos:]


def test_golden_set_covers_the_issue_constructs():
    """The goldens exercise every automatic rule and the report-only ones, so a rule cannot silently rot."""
    seen = set()
    for name in golden_inputs():
        _, findings, _ = migrate_text(_read(GOLDEN / f"{name}.ipynb"))
        seen.update(f.code for f in findings)
    expected = {"CK001", "CK002", "CK003", "CK101", "CK102", "CK103", "CK104", "CK105", "CK106", "CK107", "CK108",
                "CK109", "CK110", "CK201", "CK202", "CK203", "CK204", "CK205", "CK206", "CK207", "CK208", "CK209",
                "CK210", "CK301", "CK302", "CK303", "CK304", "CK305", "CK306", "CK307", "CK308", "CK309", "CK310",
                "CK311", "CK312", "CK401", "CK402", "CK501", "CK502", "CK503"}
    assert expected == {rule.code for rule in RULES}
    assert expected <= seen, sorted(expected - seen)


def test_already_portable_notebook_is_left_alone():
    original = _read(GOLDEN / "already_portable.ipynb")
    new_text, findings, changes = migrate_text(original)
    assert new_text is original or new_text == original
    assert changes == [] and findings == []


def test_colab_layout_and_metadata_survive():
    """Spot checks on what a real Colab file carries: two-space indent, unsorted keys, cell ids in metadata,
    outputs with outputId, nbformat_minor 0, no trailing newline."""
    original = _read(GOLDEN / "colab_drive_training.ipynb")
    new_text, _, _ = migrate_text(original)
    assert new_text.startswith('{\n  "nbformat": 4,\n  "nbformat_minor": 0,\n  "metadata": {\n    "colab": {')
    assert not new_text.endswith("\n")
    notebook = json.loads(new_text)
    assert notebook["metadata"]["accelerator"] == "GPU" and notebook["metadata"]["colab"]["gpuType"] == "T4"
    install_cell = notebook["cells"][1]  # added before the first code cell, in the layout of its neighbour
    assert list(install_cell) == ["cell_type", "source", "metadata", "execution_count", "outputs"]
    assert install_cell["metadata"] == {"id": "colabkit-install"} and install_cell["source"][2] == "try:\n"
    mount_cell = notebook["cells"][2]
    assert mount_cell["metadata"]["cellView"] == "form" and "outputId" in mount_cell["metadata"]
    assert mount_cell["outputs"][0]["text"] == ["Mounted at /content/drive\n"]
    assert mount_cell["source"][0].startswith("#@title")  # the form title stays the first line


def test_jupyter_layout_unicode_and_string_sources_survive():
    original = _read(GOLDEN / "jupyter_saved.ipynb")
    new_text, _, changes = migrate_text(original)
    assert [(c.cell, c.new) for c in changes] == [(1, True), (1, False)]
    notebook = json.loads(new_text)
    install_cell = notebook["cells"][1]  # nbformat 4.5's layout: sorted keys, an id of its own, a string source
    assert list(install_cell) == ["cell_type", "execution_count", "id", "metadata", "outputs", "source"]
    assert install_cell["id"] == "colabkit-install" and install_cell["metadata"] == {}
    assert isinstance(install_cell["source"], str)
    assert isinstance(notebook["cells"][2]["source"], str)  # a string source stays a string
    assert "données" in new_text and "\\u00e9" not in new_text  # raw UTF-8 stays raw
    assert new_text.startswith('{\n "cells": [\n  {\n   "cell_type": "markdown"')
    assert notebook["cells"][3]["source"] == []
