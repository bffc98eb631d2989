"""Fixtures for the colabkit migrate tests."""
from __future__ import annotations

import json
import os

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
    """migrate_sources(*cell_sources, **options) -> (new sources of these cells, findings about them). The cell
    migrate adds to install colabkit (CK003) is left out of both: tests/migrate/test_install_cell.py is about it."""
    from colabkit.migrate import migrate_text

    def run(*sources, **options):
        text = _colab_notebook(*sources)
        new_text, findings, changes = migrate_text(text, **options)
        added = {c.cell for c in changes if c.new}
        cells = [c for i, c in enumerate(json.loads(new_text)["cells"]) if i not in added]
        return ["".join(c["source"]) for c in cells], [f for f in findings if not f.new_cell]

    return run


@pytest.fixture
def colab_notebook():
    """colab_notebook(*cell_sources) -> the JSON text of a minimal notebook in Colab's layout."""
    return _colab_notebook


RUN_CELL = """\
import sys
from IPython.core.interactiveshell import InteractiveShell
result = InteractiveShell.instance().run_cell(sys.stdin.read())
sys.exit(0 if result.success else 1)
"""


@pytest.fixture
def run_cell_alone(tmp_path):
    """run_cell_alone(source, cwd=None) -> (ok, output): one cell run by IPython in a fresh Python process, as a
    user runs a cell first in a new kernel (nothing from other cells is defined)."""
    import subprocess
    import sys

    def run(source, cwd=None):
        ipython_dir = tmp_path / "ipython-alone"
        env = dict(os.environ, IPYTHONDIR=str(ipython_dir), PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        done = subprocess.run([sys.executable, "-c", RUN_CELL], input=source, capture_output=True, text=True,
                              cwd=str(cwd or tmp_path), env=env, timeout=120)
        return done.returncode == 0, done.stdout + done.stderr

    return run
