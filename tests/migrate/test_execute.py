"""The migrated golden notebooks run top to bottom in a real Jupyter kernel (nbclient), twice:

- locally, with no google.colab anywhere: colabkit's portable calls take the home-rig branch;
- "on Colab", with the google.colab stand-in imported at kernel start as on a Colab VM: every portable call takes
  the Colab branch and reaches the stand-in, which logs it.

Tiny local data only; no network (pip runs with PIP_NO_INDEX and packages that are already installed).
"""
from __future__ import annotations

import base64
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

GOLDEN = Path(__file__).resolve().parent / "golden"
EXECUTED = ["colab_drive_training", "colab_secrets_files", "colab_magics_gpu", "colab_wild_run"]
TRAIN_CSV = "x,y\n1,2\n3,4\n"
KAGGLE_JSON = '{"username":"ck","key":"0123456789abcdef"}'  # 42 bytes, as in the notebook's saved output
PROBE = "import sys\nprint('google.colab imported:', 'google.colab' in sys.modules)"


def _execute(name: str, cwd: Path) -> nbformat.NotebookNode:
    notebook = nbformat.reads((GOLDEN / f"{name}.expected.ipynb").read_text(encoding="utf-8"), as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(PROBE))
    client = NotebookClient(notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return notebook


def _text(notebook) -> str:
    """All stream and text/plain output of the notebook, in order."""
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                parts.append(output["text"])
            elif "data" in output and "text/plain" in output["data"]:
                parts.append(output["data"]["text/plain"] + "\n")
    return "".join(parts)


def _pngs(notebook) -> list:
    return [base64.b64decode(o["data"]["image/png"]) for c in notebook.cells for o in c.get("outputs", [])
            if "data" in o and "image/png" in o["data"]]


def _first_pixel(png: bytes) -> tuple:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height, _, color = struct.unpack(">IIBB", png[16:26])
    pos, idat = 8, b""
    while pos < len(png):
        length = struct.unpack(">I", png[pos:pos + 4])[0]
        tag = png[pos + 4:pos + 8]
        if tag == b"IDAT":
            idat += png[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    return (width, height, color), tuple(raw[1:4])


@pytest.fixture
def common_env(monkeypatch, tmp_path, isolated_env):
    """What every run needs: no network for pip, a clean IPython dir, a Hugging Face token; returns paths."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    # a machine without an NVIDIA driver, even where the test runs on one
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "nvidia-smi").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    ipython_dir = tmp_path / "ipython"
    monkeypatch.setenv("IPYTHONDIR", str(ipython_dir))
    return {"home": isolated_env, "ipython": ipython_dir}


@pytest.fixture
def local_rig(common_env, monkeypatch, tmp_path):
    """A home machine: drive_root with the training data, the notebook's folder with an uploads/ folder,
    a secret in the environment, Google Cloud credentials from `gcloud auth application-default login`."""
    drive_root = tmp_path / "gdrive-for-desktop"
    (drive_root / "colabkit-test" / "data").mkdir(parents=True)
    (drive_root / "colabkit-test" / "data" / "train.csv").write_text(TRAIN_CSV)
    monkeypatch.setenv("COLABKIT_DRIVE_ROOT", str(drive_root))
    work = tmp_path / "notebooks"
    (work / "uploads").mkdir(parents=True)
    (work / "uploads" / "kaggle.json").write_text(KAGGLE_JSON)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    adc = common_env["home"] / ".config" / "gcloud" / "application_default_credentials.json"
    adc.parent.mkdir(parents=True)
    adc.write_text('{"type": "authorized_user"}')
    return {"drive_root": drive_root, "work": work, **common_env}


@pytest.fixture
def colab_vm(common_env, colab_standin, monkeypatch, tmp_path):
    """A Colab VM: the stand-in google.colab imported when the kernel starts (as Colab's kernel has it),
    /content and the Drive mount point under tmp, Drive's files in the stand-in's backing folder, a notebook
    secret, and the files the user will pick in the upload dialog."""
    content = colab_standin.mountpoint.parent
    (colab_standin.backing / "colabkit-test" / "data").mkdir(parents=True)
    (colab_standin.backing / "colabkit-test" / "data" / "train.csv").write_text(TRAIN_CSV)
    picked = tmp_path / "picked-in-browser"
    picked.mkdir()
    (picked / "kaggle.json").write_text(KAGGLE_JSON)
    monkeypatch.setenv("COLABKIT_TEST_UPLOADS", str(picked))
    monkeypatch.setenv("COLABKIT_TEST_SECRETS", json.dumps({"HF_TOKEN": "hf_colab1"}))
    startup = common_env["ipython"] / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-colab-vm.py").write_text(
        "import google.colab  # a Colab kernel starts with google.colab imported\n"
        "assert google.colab._STANDIN\n"
        "from pathlib import Path\n"
        "import colabkit.locations, colabkit.portable\n"
        f"colabkit.locations.COLAB_MOUNTPOINT = Path({str(colab_standin.mountpoint)!r})\n"
        f"colabkit.portable.COLAB_CONTENT = Path({str(content)!r})\n")
    return {"content": content, "standin": colab_standin, **common_env}


def _calls(standin) -> list:
    log = Path(standin.log)
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


# --- Drive-backed training ---------------------------------------------------------------------------------------

def test_drive_training_runs_locally(local_rig):
    nb = _execute("colab_drive_training", local_rig["work"])
    out = _text(nb)
    assert f"Not on Colab: Google Drive is the folder {local_rig['drive_root']}" in out
    assert "3 rows" in out
    assert "['baseline.npy']" in out
    assert "True\nx,y\n" in out
    assert (local_rig["drive_root"] / "colabkit-test" / "runs" / "baseline.npy").is_file()
    assert (local_rig["work"] / "work" / "train.csv").read_text() == TRAIN_CSV  # /content -> the notebook folder
    assert "Not on Colab: nothing to flush or unmount" in out
    assert "google.colab imported: False" in out


def test_drive_training_takes_the_colab_branch(colab_vm):
    standin = colab_vm["standin"]
    nb = _execute("colab_drive_training", colab_vm["content"])
    out = _text(nb)
    assert f"Mounted at {standin.mountpoint}" in out
    assert "3 rows" in out and "['baseline.npy']" in out and "True\nx,y\n" in out
    assert (standin.backing / "colabkit-test" / "runs" / "baseline.npy").is_file()  # written to "Drive"
    assert (colab_vm["content"] / "work" / "train.csv").read_text() == TRAIN_CSV      # /content/work
    calls = [c["call"] for c in _calls(standin)]
    assert calls == ["drive.mount", "drive.flush_and_unmount"]
    assert _calls(standin)[0]["mountpoint"] == str(standin.mountpoint)
    assert "google.colab imported: True" in out


# --- constructs from real notebooks: mount check, form paths, "My\\ Drive", continued shell lines ------

def test_wild_constructs_run_locally(local_rig):
    nb = _execute("colab_wild_run", local_rig["work"])
    out = _text(nb)
    assert "Drive connected: True" in out
    assert "Not on Colab: Google Drive is the folder" not in out  # the mount check found drive_root: no mount
    assert "header x,y" in out                      # the form field's Drive path, mapped
    assert "2 data rows" in out                     # a script in Drive, run by an unquoted path
    backup = local_rig["drive_root"] / "colabkit-test" / "backup"
    assert (backup / "train copy.csv").read_text() == TRAIN_CSV  # the continued !cp line, quoted paths
    assert "train copy.csv" in out and f"saved {backup / 'train copy.csv'}" in out
    assert not (local_rig["drive_root"] / "My\\ Drive").exists()
    assert "google.colab imported: False" in out


def test_wild_constructs_take_the_colab_branch(colab_vm):
    standin = colab_vm["standin"]
    nb = _execute("colab_wild_run", colab_vm["content"])
    out = _text(nb)
    assert "Drive connected: True" in out and "header x,y" in out and "2 data rows" in out
    assert (standin.backing / "colabkit-test" / "backup" / "train copy.csv").read_text() == TRAIN_CSV
    assert [c["call"] for c in _calls(standin)] == ["drive.mount"]  # mounted once, by the notebook's own check
    assert "google.colab imported: True" in out


# --- secrets, uploads, downloads, credentials, images ----------------------------------------------------------

def test_secrets_and_files_run_locally(local_rig):
    nb = _execute("colab_secrets_files", local_rig["work"])
    out = _text(nb)
    assert "token length 9" in out
    assert "Saving kaggle.json to kaggle.json" in out
    assert 'User uploaded file "kaggle.json" with length 42 bytes' in out
    assert (local_rig["home"] / ".kaggle" / "kaggle.json").is_file()
    assert (local_rig["work"] / "result.txt").read_text() == "42\n"
    assert f"is already on this machine at {local_rig['work'] / 'result.txt'}" in out
    assert "Not on Colab: using Google Cloud credentials from" in out and "Authenticated" in out
    pngs = _pngs(nb)
    assert len(pngs) == 1
    assert _first_pixel(pngs[0]) == ((8, 8, 2), (255, 0, 0))  # BGR red shown as red
    assert "google.colab imported: False" in out


def test_secrets_and_files_take_the_colab_branch(colab_vm):
    standin = colab_vm["standin"]
    nb = _execute("colab_secrets_files", colab_vm["content"])
    out = _text(nb)
    assert "token length 9" in out
    assert 'User uploaded file "kaggle.json" with length 42 bytes' in out
    assert (colab_vm["home"] / ".kaggle" / "kaggle.json").is_file()
    calls = _calls(standin)
    assert [c["call"] for c in calls] == ["userdata.get", "files.upload", "files.download",
                                          "auth.authenticate_user", "patches.cv2_imshow"]
    assert calls[0]["key"] == "HF_TOKEN"
    assert calls[2]["filename"] == str(colab_vm["content"] / "result.txt")
    assert calls[4]["shape"] == [8, 8, 3]
    assert _first_pixel(_pngs(nb)[0]) == ((8, 8, 2), (255, 0, 0))
    assert "Not on Colab" not in out


# --- magics, shell, Colab-only calls ------------------------------------------------------------------------------

def test_magics_and_shell_run_locally(local_rig):
    nb = _execute("colab_magics_gpu", local_rig["work"])
    out = _text(nb)
    assert "Not connected to a GPU" in out  # the classic Colab GPU check still works where there is none
    assert "colabkit: nvidia-smi failed or is missing" in out
    assert "hello from the shell" in out
    assert "IN_COLAB = False" in out and "ON_COLAB = False" in out and "running on Colab" not in out
    assert "google.colab imported: False" in out


def test_magics_and_shell_take_the_colab_branch(colab_vm):
    standin = colab_vm["standin"]
    nb = _execute("colab_magics_gpu", colab_vm["content"])
    out = _text(nb)
    assert "hello from the shell" in out
    assert "running on Colab" in out and "IN_COLAB = True" in out and "ON_COLAB = True" in out
    calls = [c["call"] for c in _calls(standin)]
    assert calls == ["output.enable_custom_widget_manager", "data_table.enable_dataframe_formatter",
                     "runtime.unassign"]


@pytest.mark.parametrize("name", EXECUTED)
def test_original_colab_notebook_fails_locally(name, local_rig):
    """The reason for all this: unmigrated, the same notebooks stop with an error on a home machine."""
    from nbclient.exceptions import CellExecutionError
    notebook = nbformat.reads((GOLDEN / f"{name}.ipynb").read_text(encoding="utf-8"), as_version=4)
    client = NotebookClient(notebook, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(local_rig["work"])}})
    with pytest.raises(CellExecutionError):
        client.execute()


STANDIN_GPU = Path(__file__).resolve().parent.parent / "standins" / "gpu"


@pytest.mark.parametrize("scenario, shows, fallback", [
    ("colab_t4.json", "GPU 0: Tesla T4", False),           # a GPU: nvidia-smi's own output, no extra line
    (None, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", True),  # no driver
    ("missing", "", True),                                  # no nvidia-smi at all
])
def test_migrated_nvidia_smi_line_in_a_real_shell(scenario, shows, fallback, monkeypatch):
    """`!nvidia-smi -L || echo ...` as IPython hands it to /bin/sh: unchanged output with a GPU, an explanation
    without one."""
    from colabkit.migrate.rules import NVIDIA_SMI_FALLBACK
    env = {k: v for k, v in os.environ.items() if k != "COLABKIT_TEST_GPUS"}
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if d and not (Path(d) / "nvidia-smi").exists())
    if scenario != "missing":
        env["PATH"] = str(STANDIN_GPU / "bin") + os.pathsep + env["PATH"]
        env["COLABKIT_TEST_PYTHON"] = sys.executable
    if scenario not in (None, "missing"):
        env["COLABKIT_TEST_GPUS"] = str(STANDIN_GPU / "scenarios" / scenario)
    done = subprocess.run(["/bin/sh", "-c", "nvidia-smi -L" + NVIDIA_SMI_FALLBACK], capture_output=True, text=True,
                          env=env, timeout=30)
    assert done.returncode == 0
    assert shows in done.stdout + done.stderr
    assert ("colabkit: nvidia-smi failed or is missing" in done.stdout) == fallback
