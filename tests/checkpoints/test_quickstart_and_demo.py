"""The README's main job (`colabkit demo`) and notebooks/quickstart.ipynb, executed for real."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_quickstart_notebook_executes(tmp_path, ck_env, monkeypatch):
    pytest.importorskip("keras")      # the notebook trains with Keras (its PyTorch cell is optional)
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + ":" + ck_env["PATH"])
    nb = nbformat.read(REPO / "notebooks" / "quickstart.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = {i: "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                          for o in cell.get("outputs", [])) for i, cell in enumerate(nb.cells)}
    text = "\n".join(outputs.values())
    assert outputs[1], "%colabkit showed nothing"  # a status panel (widget) or text, depending on the frontend
    assert "stopped early: True" in text
    assert "resumed from step" in text and "final accuracy" in text
    assert "newest: 5 [5. 5. 5. 5.]" in text
    try:
        import torch  # noqa: F401
        assert re.search(r"session 1: the 3s time budget is .*saved step \d+", text), text
        assert re.search(r"torch: resumed from step [1-9]\d*; 375 batches trained in all", text), text
    except ImportError:
        assert "PyTorch is not installed; skipping this cell" in text
    assert "OK" in outputs[len(nb.cells) - 1] and "DAMAGED" not in text
    assert (Path(ck_env["COLABKIT_DRIVE_ROOT"]) / "colabkit-quickstart").is_dir()


def test_demo_command_cuts_resumes_and_finishes(tmp_path, ck_env):
    pytest.importorskip("keras")      # the default demo is a Keras run
    proc = subprocess.run([sys.executable, "-m", "colabkit", "demo", "--cap", "3s", "--epochs", "12",
                           "--dir", str(tmp_path / "demo")], env=ck_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(r"deadline-save +step \d+ .*time budget is", out) and re.search(r"stop +the 3s time budget", out), out
    assert re.search(r"restore +step \d+ \(epoch \d+, batch \d+\) from destination", out), out
    assert "end of training" in out and "test accuracy" in out
    from colabkit.checkpoints.folder import CheckpointFolder
    newest = CheckpointFolder(tmp_path / "demo").committed()[-1]
    assert newest.epoch == 12 and newest.batch == 0


def test_demo_command_with_torch_cuts_resumes_and_finishes(tmp_path, ck_env):
    """Two short epochs (626 tiny batches) would end well inside 3s on their own: the demo paces session 1, so
    the cut comes from the deadline on any machine, however fast."""
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-m", "colabkit", "demo", "--framework", "torch", "--cap", "3s",
                           "--epochs", "2", "--dir", str(tmp_path / "demo")], env=ck_env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "a 2-epoch PyTorch run" in out
    assert re.search(r"stop +the 3s time budget is", out), out
    assert re.search(r"restore +step \d+ \(epoch \d+, batch \d+\)", out), out
    assert "end of training" in out and "test accuracy" in out
    from colabkit.checkpoints.folder import CheckpointFolder
    newest = CheckpointFolder(tmp_path / "demo").committed()[-1]
    assert newest.epoch == 2 and newest.batch == 0 and newest.step == 2 * 313


def test_checkpoints_command_lists_and_verifies(tmp_path, ck_env):
    import numpy as np
    import colabkit
    with colabkit.Checkpoints(str(tmp_path / "c"), local_dir=tmp_path / "l") as ckpt:
        ckpt.save(1, {"w": np.zeros(3)}, wait=True)
        ckpt.save(2, {"w": np.ones(3)}, wait=True)
    run = lambda *a: subprocess.run([sys.executable, "-m", "colabkit", "checkpoints", *a], env=ck_env,
                                    capture_output=True, text=True)
    (tmp_path / "c" / "ckpt-000000000003-abcdef").mkdir()   # an interrupted write
    ok = run(str(tmp_path / "c"), "--verify")
    assert ok.returncode == 0 and "2 committed checkpoint(s), 1 leftover(s)" in ok.stdout
    assert ok.stdout.count("OK") == 2
    newest = sorted((tmp_path / "c").glob("ckpt-00000000000[12]-*"))[-1]
    (newest / "arrays.npz").write_bytes(b"x" * (newest / "arrays.npz").stat().st_size)
    bad = run(str(tmp_path / "c"), "--verify")
    assert bad.returncode == 1 and "DAMAGED" in bad.stdout
    missing = run(str(tmp_path / "nope"))
    assert missing.returncode == 1 and "is not a folder" in missing.stderr and "Traceback" not in missing.stderr
