"""notebooks/home_rig.ipynb runs top to bottom on a machine without GPUs (the CPU path), executed by nbclient."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "home_rig.ipynb"


def test_notebook_has_a_kernelspec():
    meta = json.loads(NOTEBOOK.read_text())["metadata"]
    assert meta["kernelspec"]["name"] == "python3" and meta["kernelspec"]["language"] == "python"


@pytest.mark.slow
def test_home_rig_runs_on_the_cpu_path(fake_gpus, tmp_path, monkeypatch):
    pytest.importorskip("tensorflow")   # the notebook trains with TensorFlow
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    fake_gpus(None)  # no driver: both stand-ins say so, whatever this machine has
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(
        out.get("text", "") + str(out.get("data", {}).get("text/plain", ""))
        for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)
    assert "No NVIDIA GPU found" in text and "running on the CPU" in text
    assert "_DefaultDistributionStrategy with 1 replica(s)" in text
    assert "generator on /device:CPU:0" in text and "discriminator on /device:CPU:0" in text
    assert "all 2 job(s) succeeded" in text and "exit code 0" in text
    assert "small_steps: lr=0.01" in text and "big_steps: lr=0.1" in text
    assert not any(out.get("output_type") == "error" for cell in nb.cells if cell.cell_type == "code"
                   for out in cell.outputs)
    summary = json.loads((tmp_path / "home_rig_demo" / "run" / "summary.json").read_text())
    assert [j["status"] for j in summary["jobs"]] == ["ok", "ok"] and summary["slots"] == ["CPU"]
    assert os.environ.get("CUDA_VISIBLE_DEVICES") is None  # the kernel's choice stayed in the kernel
