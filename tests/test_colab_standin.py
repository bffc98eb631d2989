"""The google.colab stand-in behaves like the real module where tests rely on it, and "drive:" locations
mount Drive through it on (simulated) Colab."""
import inspect
import json
import subprocess
import sys

import pytest


def test_signatures_match_the_real_module(colab_standin):
    from google.colab import drive, output, runtime, userdata
    assert str(inspect.signature(drive.mount)) == "(mountpoint, force_remount=False, timeout_ms=120000, readonly=False)"
    assert list(inspect.signature(drive.flush_and_unmount).parameters) == ["timeout_ms"]
    assert str(inspect.signature(output.eval_js)) == "(script, ignore_result=False, timeout_sec=None)"
    assert list(inspect.signature(output.register_callback).parameters) == ["function_name", "callback"]
    assert list(inspect.signature(output.enable_custom_widget_manager).parameters) == []
    assert list(inspect.signature(runtime.unassign).parameters) == []
    assert list(inspect.signature(userdata.get).parameters) == ["key"]


def test_mount_refuses_a_space_and_a_path_object(colab_standin):
    from google.colab import drive
    with pytest.raises(ValueError, match="Mountpoint must not contain a space."):
        drive.mount(str(colab_standin.mountpoint.parent / "my drive"))
    with pytest.raises(TypeError):  # the real mount also does `" " in mountpoint`
        drive.mount(colab_standin.mountpoint)
    assert not colab_standin.mountpoint.exists()


def test_mount_refuses_a_non_empty_folder_and_a_missing_parent(colab_standin, tmp_path):
    from google.colab import drive
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "file").write_text("x")
    with pytest.raises(ValueError, match="Mountpoint must not already contain files"):
        drive.mount(str(busy))
    with pytest.raises(ValueError, match="Mountpoint must be in a directory that exists"):
        drive.mount(str(tmp_path / "no" / "such" / "drive"))


def test_mount_write_unmount_remount_keeps_the_files(colab_standin, capsys):
    from google.colab import drive
    mountpoint = str(colab_standin.mountpoint)
    drive.mount(mountpoint)
    assert capsys.readouterr().out == f"Mounted at {mountpoint}\n"
    (colab_standin.my_drive / "runs").mkdir()
    (colab_standin.my_drive / "runs" / "ckpt.bin").write_bytes(b"weights")
    assert (colab_standin.backing / "runs" / "ckpt.bin").read_bytes() == b"weights"

    drive.mount(mountpoint)
    assert "Drive already mounted at" in capsys.readouterr().out

    drive.flush_and_unmount()
    assert not colab_standin.my_drive.exists()
    drive.flush_and_unmount()
    assert "Drive not mounted" in capsys.readouterr().out

    drive.mount(mountpoint, force_remount=True)
    assert (colab_standin.my_drive / "runs" / "ckpt.bin").read_bytes() == b"weights"
    from google.colab._standin import read_log
    calls = [c["call"] for c in read_log(colab_standin.log)]
    assert calls.count("drive.mount") == 3 and calls.count("drive.flush_and_unmount") == 2


def test_eval_js_without_a_frontend(colab_standin):
    from google.colab import _message, output
    assert output.eval_js("1 + 1", ignore_result=True) is None
    with pytest.raises(_message.TimeoutException):
        output.eval_js("1 + 1", timeout_sec=0.01)
    with pytest.raises(output.StandinWouldBlockForever):
        output.eval_js("1 + 1")


def test_eval_js_with_a_frontend_and_invoke_function(colab_standin):
    from google.colab import output
    output.set_frontend(lambda script: {"connections": 1} if "ping" in script else None)
    try:
        assert output.eval_js("ping()", timeout_sec=1) == {"connections": 1}
    finally:
        output.set_frontend(None)
    seen = []
    output.register_callback("colabkit.presence", lambda *args, **kwargs: seen.append((args, kwargs)) or "ok")
    assert output._invoke_function("colabkit.presence", "[1, 2]", '{"tab": "visible"}') == "ok"
    assert seen == [((1, 2), {"tab": "visible"})]
    with pytest.raises(ValueError, match="Function not found: nope"):
        output._invoke_function("nope", "[]", "{}")


def test_widget_manager_and_unassign_are_recorded(colab_standin):
    from google.colab import _standin, output, runtime
    output.enable_custom_widget_manager()
    assert output.custom_widget_manager_enabled()
    runtime.unassign()
    assert runtime.unassigned
    assert [c["call"] for c in _standin.CALLS][-2:] == ["output.enable_custom_widget_manager", "runtime.unassign"]


def test_userdata_secrets(colab_standin, monkeypatch):
    from google.colab import errors, userdata
    monkeypatch.setenv("COLABKIT_TEST_SECRETS", json.dumps({"HF_TOKEN": "hf_x",
                                                            "WANDB": {"value": "w", "access": False}}))
    assert userdata.get("HF_TOKEN") == "hf_x"
    with pytest.raises(userdata.NotebookAccessError, match="Notebook does not have access to secret WANDB"):
        userdata.get("WANDB")
    with pytest.raises(userdata.SecretNotFoundError, match="Secret MISSING does not exist."):
        userdata.get("MISSING")
    assert issubclass(userdata.SecretNotFoundError, errors.Error)


def test_subprocess_calls_are_logged(colab_standin):
    code = "from google.colab import drive; drive.mount({!r})".format(str(colab_standin.mountpoint))
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, capture_output=True)
    from google.colab._standin import read_log
    assert [e["call"] for e in read_log(colab_standin.log)] == ["drive.mount"]
    assert colab_standin.my_drive.is_dir()


def test_other_google_packages_still_import(colab_standin):
    # The stand-in is a PEP 420 portion of the `google` namespace: google.protobuf (TensorFlow needs it)
    # must keep working next to it.
    pytest.importorskip("google.protobuf")
    import google.colab
    import google.protobuf
    assert google.colab._STANDIN and google.protobuf.__version__


# ---- colabkit's "drive:" locations on (simulated) Colab ----

def test_drive_location_mounts_drive_on_colab(colab_standin):
    import google.colab  # noqa: F401  (a Colab kernel)
    from colabkit import locations
    assert not colab_standin.my_drive.exists()
    folder = locations.resolve("drive:runs/mnist")
    assert folder == colab_standin.my_drive / "runs" / "mnist"
    assert colab_standin.my_drive.is_dir()  # mounted through google.colab.drive.mount
    folder.mkdir(parents=True)
    (folder / "x").write_text("1")
    assert (colab_standin.backing / "runs" / "mnist" / "x").read_text() == "1"
    from google.colab._standin import CALLS
    assert [c for c in CALLS if c["call"] == "drive.mount"] == [
        {"call": "drive.mount", "mountpoint": str(colab_standin.mountpoint), "force_remount": False,
         "timeout_ms": 120000, "readonly": False}]
    locations.resolve("drive:other")  # already mounted: no second mount
    assert len([c for c in CALLS if c["call"] == "drive.mount"]) == 1


@pytest.mark.fuse
def test_drive_location_uses_a_drive_the_notebook_mounted_elsewhere(colab_standin, drive_mount_factory):
    """An old notebook's drive.mount('/content/gdrive') (a real FUSE mount of type fuse.drive, as Colab's):
    "drive:" uses it instead of mounting Drive a second time at /content/drive; so does the status line."""
    import google.colab  # noqa: F401  (a Colab kernel)
    from colabkit import locations, summary
    gdrive = drive_mount_factory(rate=None, mountpoint=colab_standin.mountpoint.parent / "gdrive")
    (colab_standin.my_drive / "ckpt").mkdir(parents=True)   # a plain local folder made before any mount
    assert locations.resolve("drive:runs/a") == gdrive.my_drive / "runs" / "a"
    assert summary.status().drive_root == str(gdrive.my_drive)
    from google.colab._standin import CALLS
    assert not [c for c in CALLS if c["call"] == "drive.mount"]


def test_drive_location_off_colab_uses_the_configured_root(monkeypatch, tmp_path, isolated_env):
    from colabkit import locations
    assert locations.resolve("drive:runs/a") == isolated_env / "colabkit-drive" / "runs" / "a"
    monkeypatch.setenv("COLABKIT_DRIVE_ROOT", str(tmp_path / "gdrive"))
    assert locations.resolve("drive:/runs/a") == tmp_path / "gdrive" / "runs" / "a"


def test_drive_on_colab_without_google_colab_says_what_to_do(tmp_path, monkeypatch):
    # A child process on a Colab VM (marker file present) where google.colab cannot be imported.
    from colabkit import locations, runtime
    marker = tmp_path / "hostname"
    marker.write_text("vm")
    monkeypatch.setattr(runtime, "COLAB_MARKER", marker)
    monkeypatch.setattr(locations, "COLAB_MOUNTPOINT", tmp_path / "drive")
    monkeypatch.setitem(sys.modules, "google.colab", None)
    with pytest.raises(ImportError) as info:
        locations.resolve("drive:runs")
    message = str(info.value)
    assert "drive.mount(" in message and "COLABKIT_DRIVE_ROOT" in message
    assert "pip install" not in message  # google.colab is not on PyPI


@pytest.mark.parametrize("bad", ["", "   ", "drive:", "drive:/", "s3://bucket/x", "gdrive://"])
def test_bad_locations_raise_value_error(bad):
    from colabkit import locations
    with pytest.raises(ValueError):
        locations.resolve(bad)


def test_a_location_that_is_not_a_string_raises_type_error_naming_its_type():
    from colabkit import locations
    with pytest.raises(TypeError, match="NoneType; a location must be a str or a path"):
        locations.resolve(None)
