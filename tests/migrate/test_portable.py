"""colabkit's portable stand-ins for Colab-only calls (what migrated notebooks call): the home-rig branch, and the
Colab branch through the google.colab stand-in."""
from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

import colabkit
from colabkit import portable


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(portable, "_state", portable._State())


def _decode_png(data: bytes):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height, _, color = struct.unpack(">IIBB", data[16:26])
    pos, idat = 8, b""
    while pos < len(data):
        length, tag = struct.unpack(">I", data[pos:pos + 4])[0], data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        assert struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0] == zlib.crc32(tag + body) & 0xFFFFFFFF
        if tag == b"IDAT":
            idat += body
        pos += 12 + length
    channels = {0: 1, 2: 3, 6: 4}[color]
    raw = zlib.decompress(idat)
    rows = [raw[r * (width * channels + 1) + 1:(r + 1) * (width * channels + 1)] for r in range(height)]
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(height, width, channels).squeeze()


# --- the home rig ----------------------------------------------------------------------------------------------

def test_facade_exposes_the_portable_api():
    for name in ("on_colab", "drive", "drive_mounted", "workdir", "portable_path", "mount_drive", "flush_and_unmount_drive", "upload",
                 "download", "secret", "authenticate_user", "cv2_imshow"):
        assert getattr(colabkit, name) is getattr(portable, name)
    assert colabkit.on_colab() is False


def test_drive_paths_under_the_configured_root(monkeypatch, tmp_path):
    root = tmp_path / "Google Drive" / "My Drive"
    monkeypatch.setenv("COLABKIT_DRIVE_ROOT", str(root))
    assert colabkit.drive() == str(root)
    assert colabkit.drive("data/train.csv") == str(root / "data" / "train.csv")
    assert colabkit.drive("/data/") == str(root / "data") + "/"
    assert colabkit.drive(Path("x")) == str(root / "x")
    assert colabkit.drive("a b.zip", quoted=True) == "'" + str(root / "a b.zip") + "'"


def test_drive_default_root_is_in_home(isolated_env):
    assert colabkit.drive("x") == str(isolated_env / "colabkit-drive" / "x")


def test_workdir_is_the_starting_folder_or_the_variable(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert colabkit.workdir() == str(tmp_path)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")  # a later %cd does not move it
    assert colabkit.workdir("out/model.h5") == str(tmp_path / "out" / "model.h5")
    monkeypatch.setenv("COLABKIT_WORKDIR", str(tmp_path / "scratch"))
    assert colabkit.workdir("x", quoted=True) == str(tmp_path / "scratch" / "x")


def test_portable_path(monkeypatch, tmp_path):
    monkeypatch.setenv("COLABKIT_DRIVE_ROOT", str(tmp_path / "d"))
    monkeypatch.setenv("COLABKIT_WORKDIR", str(tmp_path / "w"))
    assert colabkit.portable_path("/content/drive/MyDrive/a/b.csv") == str(tmp_path / "d" / "a" / "b.csv")
    assert colabkit.portable_path("/content/gdrive/My Drive/") == str(tmp_path / "d") + "/"
    assert colabkit.portable_path("/content/x") == str(tmp_path / "w" / "x")
    assert colabkit.portable_path(Path("/content")) == str(tmp_path / "w")
    assert colabkit.portable_path("data/x.csv") == "data/x.csv"
    assert colabkit.portable_path("/contents/x") == "/contents/x"
    with pytest.raises(ValueError, match="outside My Drive"):
        colabkit.portable_path("/content/drive/Shareddrives/team/x")


def test_mount_drive_locally(isolated_env, capsys):
    root = colabkit.mount_drive("/content/drive", force_remount=True)
    assert root == str(isolated_env / "colabkit-drive") and Path(root).is_dir()
    assert "Not on Colab: Google Drive is the folder" in capsys.readouterr().out


def test_mount_drive_with_a_missing_configured_root_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("COLABKIT_DRIVE_ROOT", str(tmp_path / "not-mounted"))
    with pytest.raises(FileNotFoundError, match=r"not-mounted \(from env COLABKIT_DRIVE_ROOT\) is not a folder"):
        colabkit.mount_drive()


def test_flush_locally_is_a_no_op_that_says_so(capsys):
    assert colabkit.flush_and_unmount_drive() is None
    assert "nothing to flush or unmount" in capsys.readouterr().out


def test_upload_takes_the_uploads_folder(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no upload button\. Put the files this notebook asks for into "):
        colabkit.upload()
    (tmp_path / "uploads").mkdir()
    (tmp_path / "uploads" / "kaggle.json").write_bytes(b"{}")
    (tmp_path / "uploads" / "b.txt").write_bytes(b"bb")
    assert colabkit.upload() == {"b.txt": b"bb", "kaggle.json": b"{}"}
    assert (tmp_path / "kaggle.json").read_bytes() == b"{}"
    assert "Saving b.txt to b.txt\nSaving kaggle.json to kaggle.json" in capsys.readouterr().out
    assert colabkit.upload("in") == {"b.txt": b"bb", "kaggle.json": b"{}"}
    assert (tmp_path / "in" / "b.txt").read_bytes() == b"bb"
    elsewhere = tmp_path / "picked"
    elsewhere.mkdir()
    (elsewhere / "c.csv").write_text("c")
    monkeypatch.setenv("COLABKIT_UPLOADS", str(elsewhere))
    assert colabkit.upload() == {"c.csv": b"c"}


def test_download_locally(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="Cannot find file: model.h5"):
        colabkit.download("model.h5")
    (tmp_path / "model.h5").write_bytes(b"w")
    assert colabkit.download("model.h5") == str(tmp_path / "model.h5")
    assert "already on this machine" in capsys.readouterr().out


def test_secret_from_the_environment(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    assert colabkit.secret("HF_TOKEN") == "hf_x"
    monkeypatch.delenv("HF_TOKEN")
    assert colabkit.secret("HF_TOKEN", default=None) is None
    with pytest.raises(KeyError) as info:
        colabkit.secret("HF_TOKEN")
    assert isinstance(info.value, portable.SecretNotFoundError)
    assert "reads the environment variable HF_TOKEN" in str(info.value) and "export HF_TOKEN=" in str(info.value)
    with pytest.raises(ValueError, match="non-empty string"):
        colabkit.secret("")


def test_authenticate_user_checks_application_default_credentials(monkeypatch, isolated_env, tmp_path):
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.delenv("CLOUDSDK_CONFIG", raising=False)
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    with pytest.raises(portable.AuthenticationError, match="gcloud auth application-default login"):
        colabkit.authenticate_user()
    adc = isolated_env / ".config" / "gcloud" / "application_default_credentials.json"
    adc.parent.mkdir(parents=True)
    adc.write_text("{}")
    assert colabkit.authenticate_user(project_id="my-project") == str(adc)
    assert os.environ["GOOGLE_CLOUD_PROJECT"] == "my-project"
    key = tmp_path / "sa.json"
    key.write_text("{}")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    assert colabkit.authenticate_user() == str(key)


@pytest.mark.parametrize("shape", [(3, 4), (3, 4, 3), (3, 4, 4), (3, 4, 1)])
def test_png_encoding_round_trips(shape):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=shape, dtype=np.uint8)
    flat = image[:, :, 0] if image.ndim == 3 and image.shape[2] == 1 else image
    assert np.array_equal(_decode_png(portable._png(flat)), flat)


def test_cv2_imshow_converts_bgr_and_shows_a_png(monkeypatch):
    import IPython.display
    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    bgr = np.zeros((2, 3, 3), dtype=np.float64)
    bgr[..., 0] = 300.0  # blue, out of range: clipped like cv2_imshow does
    colabkit.cv2_imshow(bgr)
    (image,) = shown
    rgb = _decode_png(image.data)
    assert rgb.shape == (2, 3, 3) and tuple(rgb[0, 0]) == (0, 0, 255)
    with pytest.raises(ValueError, match="got shape"):
        colabkit.cv2_imshow(np.zeros((2, 2, 2)))


# --- on Colab (the google.colab stand-in, imported as a Colab kernel has it) -------------------------------------

@pytest.fixture
def on_colab(colab_standin, monkeypatch, tmp_path):
    import google.colab
    assert google.colab._STANDIN
    content = colab_standin.mountpoint.parent
    monkeypatch.setattr(portable, "COLAB_CONTENT", content)
    from google.colab import _standin
    monkeypatch.setattr(_standin, "CALLS", [])
    return colab_standin


def _calls():
    from google.colab import _standin
    return _standin.CALLS


def test_colab_branch_drive(on_colab):
    assert colabkit.on_colab() is True
    assert colabkit.mount_drive(readonly=True) == str(on_colab.my_drive)
    assert _calls()[0] == {"call": "drive.mount", "mountpoint": str(on_colab.mountpoint), "force_remount": False,
                           "timeout_ms": 120000, "readonly": True}
    assert colabkit.drive("runs/a") == str(on_colab.my_drive / "runs" / "a")
    assert colabkit.portable_path("/content/gdrive/My Drive/x") == str(on_colab.my_drive / "x")
    assert colabkit.portable_path("/content/x") == "/content/x"
    assert colabkit.portable_path("/content/drive/Shareddrives/t") == "/content/drive/Shareddrives/t"
    colabkit.flush_and_unmount_drive(timeout_ms=5)
    assert _calls()[-1] == {"call": "drive.flush_and_unmount", "timeout_ms": 5}


def test_colab_branch_drive_mounts_on_first_use(on_colab):
    assert colabkit.drive("x") == str(on_colab.my_drive / "x")
    assert [c["call"] for c in _calls()] == ["drive.mount"]


def test_colab_branch_custom_mountpoint_is_remembered(on_colab, tmp_path):
    other = tmp_path / "content" / "gdrive"
    assert colabkit.mount_drive(str(other)) == str(other / "MyDrive")
    assert colabkit.drive("x") == str(other / "MyDrive" / "x")
    assert [c["call"] for c in _calls()] == ["drive.mount"]


def test_colab_branch_workdir_secret_files_auth(on_colab, monkeypatch, tmp_path, capsys):
    assert colabkit.workdir("data") == str(on_colab.mountpoint.parent / "data")
    monkeypatch.setenv("COLABKIT_TEST_SECRETS", '{"HF_TOKEN": "hf_colab", "NO": {"value": "v", "access": false}}')
    monkeypatch.setenv("HF_TOKEN", "from-the-environment")  # not used on Colab
    assert colabkit.secret("HF_TOKEN") == "hf_colab"
    from google.colab import userdata
    with pytest.raises(userdata.SecretNotFoundError):
        colabkit.secret("MISSING")
    with pytest.raises(userdata.NotebookAccessError):
        colabkit.secret("NO")
    picked = tmp_path / "picked"
    picked.mkdir()
    (picked / "a.txt").write_text("aa")
    monkeypatch.setenv("COLABKIT_TEST_UPLOADS", str(picked))
    monkeypatch.chdir(tmp_path)
    assert colabkit.upload() == {"a.txt": b"aa"} and (tmp_path / "a.txt").exists()
    assert colabkit.download("a.txt") == "a.txt"
    colabkit.authenticate_user(project_id="p")
    calls = [(c["call"], c.get("key") or c.get("filename") or c.get("project_id")) for c in _calls()]
    assert calls == [("userdata.get", "HF_TOKEN"), ("userdata.get", "MISSING"), ("userdata.get", "NO"),
                     ("files.upload", None), ("files.download", "a.txt"), ("auth.authenticate_user", "p")]
    assert "Not on Colab" not in capsys.readouterr().out


def test_colab_branch_cv2_imshow(on_colab, monkeypatch):
    import IPython.display
    monkeypatch.setattr(IPython.display, "display", lambda obj: None)
    from google.colab import patches
    monkeypatch.setattr(patches, "display", lambda obj: None, raising=False)
    colabkit.cv2_imshow(np.zeros((2, 2, 3), dtype=np.uint8))
    assert _calls()[-1] == {"call": "patches.cv2_imshow", "shape": [2, 2, 3], "dtype": "uint8"}


def test_drive_mounted_off_colab_asks_whether_drive_root_is_there(monkeypatch, tmp_path):
    root = tmp_path / "My Drive"
    monkeypatch.setenv("COLABKIT_DRIVE_ROOT", str(root))
    assert colabkit.drive_mounted() is False
    root.mkdir()
    assert colabkit.drive_mounted() is True


def test_drive_mounted_on_colab_never_mounts(on_colab):
    colabkit.drive_mounted()
    assert _calls() == []  # the check a notebook makes before mounting must not mount (and ask for consent)
    colabkit.mount_drive()
    assert colabkit.drive_mounted() is True
    assert [c["call"] for c in _calls()] == ["drive.mount"]


def test_portable_path_of_a_quoted_path_keeps_its_quotes(monkeypatch, tmp_path):
    """Colab form fields meant for shell lines hold the path in quotes: "\"/content/drive/MyDrive/wavs.zip\""."""
    monkeypatch.setenv("COLABKIT_DRIVE_ROOT", str(tmp_path / "d"))
    monkeypatch.setenv("COLABKIT_WORKDIR", str(tmp_path / "w"))
    assert colabkit.portable_path('"/content/drive/MyDrive/wavs.zip"') == f'"{tmp_path / "d" / "wavs.zip"}"'
    assert colabkit.portable_path("'/content/data'") == f"'{tmp_path / 'w' / 'data'}'"
    assert colabkit.portable_path('"data.zip"') == '"data.zip"'
    assert colabkit.portable_path('"/content/x\'') == '"/content/x\''
