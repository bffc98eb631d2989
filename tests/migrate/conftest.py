"""Fixtures for the colabkit migrate tests."""
from __future__ import annotations

import json

import pytest


def _colab_notebook(*sources, cell_type="code") -> str:
    """A minimal notebook in Colab's JSON layout whose code cells hold ``sources``."""
    cells = [{"cell_type": cell_type, "source": s.splitlines(True), "metadata": {"id": f"cell{i}"},
              "execution_count": None, "outputs": []} for i, s in enumerate(sources)]
    notebook = {"nbformat": 4, "nbformat_minor": 0,
                "metadata": {"colab": {"provenance": []}, "kernelspec": {"name": "python3", "display_name": "Python 3"},
                             "language_info": {"name": "python"}},
                "cells": cells}
    return json.dumps(notebook, indent=2)


@pytest.fixture
def migrate_sources():
    """migrate_sources(*cell_sources, **options) -> (new cell sources, findings)."""
    from colabkit.migrate import migrate_text

    def run(*sources, **options):
        text = _colab_notebook(*sources)
        new_text, findings, _ = migrate_text(text, **options)
        cells = json.loads(new_text)["cells"]
        return ["".join(c["source"]) for c in cells], findings

    return run


@pytest.fixture
def colab_notebook():
    """colab_notebook(*cell_sources) -> the JSON text of a minimal notebook in Colab's layout."""
    return _colab_notebook
