"""gdrive:// checkpoints through the real pydrive2 client against the local Drive API server."""
import json
import logging
import shutil
import warnings

import numpy as np
import pytest

import colabkit
import colabkit.gdrive as g
from colabkit.checkpoints.drive_api import DriveApiFolder


def make(tmp_path, location="gdrive://runs/a", **kw):
    return colabkit.Checkpoints(location, local_dir=tmp_path / "local", **kw)


def steps_on_drive(server, path="runs/a"):
    with server.state.lock:  # the server's threads may be deleting (pruning) while this reads
        folder = server.state.find(path)
        names = sorted(m["title"] for m in server.state.children(folder["id"]) if m["title"].startswith("ckpt-")
                       and server.state.find(f"{path}/{m['title']}/MANIFEST.json"))
    return [int(n.split("-")[1]) for n in names]


def test_roundtrip_on_a_fresh_vm_and_manifest_uploaded_last(gdrive, tmp_path):
    with make(tmp_path) as ckpt:
        assert ckpt.restore() is None
        ckpt.save(7, {"w": np.arange(1000, dtype=np.float32), "lr": 0.5}, epoch=2, batch=3, wait=True)
    ckpt_folder = [m for m in gdrive.state.children(gdrive.state.find("runs/a")["id"])][0]
    files = sorted(gdrive.state.children(ckpt_folder["id"]), key=lambda m: m["_seq"])
    assert [f["title"] for f in files][-1] == "MANIFEST.json"
    assert {f["title"] for f in files} == {"arrays.npz", "state.json", "MANIFEST.json"}
    shutil.rmtree(tmp_path / "local")          # a fresh VM: only Drive has it
    restored = make(tmp_path).restore()
    assert restored.source == "destination" and restored.step == 7 and restored.epoch == 2
    np.testing.assert_array_equal(restored.state["w"], np.arange(1000, dtype=np.float32))


def test_large_file_uploads_resumably_through_injected_errors(gdrive, tmp_path, monkeypatch):
    monkeypatch.setattr(g, "CHUNK", 256 << 10)
    w = np.random.RandomState(0).rand(200_000)          # 1.6 MB: 7 chunks
    gdrive.fail(503, method="PUT", path="/upload", times=1)
    gdrive.fail(403, method="PUT", path="/upload", reason="rateLimitExceeded", times=1)
    gdrive.fail(429, method="PUT", path="/upload", times=1)
    gdrive.fail(500, method="POST", path="/upload", times=1)   # session start
    gdrive.fail(500, method="GET", path="/drive/v2/files", times=2)  # listings
    with make(tmp_path) as ckpt:
        assert ckpt.save(1, {"w": w}, wait=20)
        assert ckpt.status.last_error is None
    assert not gdrive.faults, "every injected error was hit"
    size = sum(int(m.get("fileSize", 0)) for m in gdrive.state.files.values())  # every byte stored
    assert gdrive.upload_bytes < size + 3 * (256 << 10), "a failed chunk resumes; the file is not re-sent"
    shutil.rmtree(tmp_path / "local")
    np.testing.assert_array_equal(make(tmp_path).restore().state["w"], w)


def test_persistent_errors_surface_as_oserror_and_uploader_retries(gdrive, tmp_path, monkeypatch):
    import colabkit.checkpoints.uploader as uploader
    monkeypatch.setattr(uploader, "BACKOFF_START", 0.05)
    gdrive.fail(503, method="POST", path="/upload", times=g.TRIES * 2)   # two rounds of retries fail
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt = make(tmp_path)
        ckpt.save(1, {"w": np.ones(3)})
        assert ckpt.wait(20)
        ckpt.close()
    assert any("could not upload" in str(w.message) and "503" in str(w.message) for w in caught)
    assert steps_on_drive(gdrive) == [1]
    with pytest.raises(OSError):
        gdrive.fail(500, path="/drive/v2/files", times=g.TRIES)
        DriveApiFolder("runs/a").committed()


def test_retention_and_leftovers_of_interrupted_uploads(gdrive, tmp_path, monkeypatch):
    with make(tmp_path, keep=2) as ckpt:
        ckpt.save(1, {"w": np.ones(3)}, wait=True)
    root = gdrive.state.find("runs/a")["id"]
    partial = gdrive.state.add("ckpt-000000000099-abcdef", root, mime="application/vnd.google-apps.folder")
    gdrive.state.add("arrays.npz", partial["id"], data=b"partial")
    assert make(tmp_path).restore().step == 1, "a folder without manifest is never chosen"
    assert DriveApiFolder("runs/a").leftovers() == ["ckpt-000000000099-abcdef"]
    with make(tmp_path, keep=2) as ckpt:
        ckpt.restore()
        ckpt.save(2, {"w": np.full(3, 2.0)}, wait=True)
    assert partial["id"] in gdrive.state.files, "a listing may not show another writer's manifest yet"
    import colabkit.checkpoints.uploader as uploader
    monkeypatch.setattr(uploader, "LEFTOVER_GRACE_S", 0.0)
    with make(tmp_path, keep=2) as ckpt:
        ckpt.restore()
        for step in range(3, 6):
            ckpt.save(step, {"w": np.full(3, float(step))}, wait=True)
            assert steps_on_drive(gdrive)[-1] == step and len(steps_on_drive(gdrive)) >= 2
    assert steps_on_drive(gdrive) == [4, 5]
    assert partial["id"] not in gdrive.state.files


def test_duplicate_names_are_reported_twin_folders_keep_the_one_with_the_run_newest_file_wins(gdrive, tmp_path,
                                                                                                 caplog):
    with make(tmp_path, keep=5) as ckpt:
        ckpt.save(1, {"w": np.full(3, 1.0)}, wait=True)
    # Someone else's client made a second, empty "runs" folder (Drive allows it).
    second_runs = gdrive.state.add("runs", mime="application/vnd.google-apps.folder")
    shutil.rmtree(tmp_path / "local")
    caplog.set_level(logging.WARNING, "colabkit")
    with colabkit.Checkpoints("gdrive://runs/a", local_dir=tmp_path / "l2") as ckpt:
        assert ckpt.restore().step == 1, "the 'runs' folder that holds the run wins, not the newer empty one"
    assert any("2 folders named 'runs'" in r.getMessage() and second_runs["id"] in r.getMessage()
               for r in caplog.records)
    gdrive.state.delete(second_runs["id"])
    # a duplicate data file inside a checkpoint: the newest is read (here the newer one is right)
    g.forget_clients()
    folder = DriveApiFolder("runs/a")
    [info] = folder.committed()
    ck = gdrive.state.find(f"runs/a/{info.name}")
    good = gdrive.state.find(f"runs/a/{info.name}/arrays.npz")
    data = gdrive.state.content[good["id"]]
    good["createdDate"] = "2000-01-01T00:00:00.000Z"
    gdrive.state.add("arrays.npz", ck["id"], data=data)     # newer duplicate, same bytes
    folder.verify(folder.committed()[0], full=True)


def test_damaged_newest_on_drive_falls_back_with_warning(gdrive, tmp_path):
    with make(tmp_path) as ckpt:
        ckpt.save(1, {"w": np.full(100, 1.0)}, wait=True)
        ckpt.save(2, {"w": np.full(100, 2.0)}, wait=True)
    newest = DriveApiFolder("runs/a").committed()[-1]
    item = gdrive.state.find(f"runs/a/{newest.name}/arrays.npz")
    data = bytearray(gdrive.state.content[item["id"]]); data[-50] ^= 0xFF
    gdrive.state.set_content(item["id"], bytes(data))
    shutil.rmtree(tmp_path / "local")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = make(tmp_path).restore()
    assert restored.step == 1
    assert any("damaged" in str(w.message) and "step 2" in str(w.message) for w in caught)
    assert not (tmp_path / "local" / newest.name).exists(), "nothing half-downloaded is left committed"


def test_drive_colon_means_gdrive_when_configured(gdrive, tmp_path, monkeypatch):
    monkeypatch.setenv("COLABKIT_DRIVE_VIA", "api")
    with colabkit.Checkpoints("drive:runs/b", local_dir=tmp_path / "local") as ckpt:
        assert isinstance(ckpt.dest, DriveApiFolder)
        ckpt.save(3, {"w": np.ones(2)}, wait=True)
    assert steps_on_drive(gdrive, "runs/b") == [3]
    monkeypatch.setenv("COLABKIT_DRIVE_VIA", "sometimes")
    with pytest.raises(colabkit.ConfigError, match="COLABKIT_DRIVE_VIA"):
        colabkit.Checkpoints("drive:runs/b")


@pytest.mark.parametrize("location", ["gdrive://", "gdrive:///", "gdrive://runs/../x"])
def test_malformed_gdrive_location_is_one_clear_error(gdrive, location):
    with pytest.raises(ValueError, match="names no usable folder"):
        colabkit.Checkpoints(location)


def test_revoked_invalid_and_missing_credentials_fail_fast_with_one_message(gdrive, tmp_path, monkeypatch):
    gdrive.revoked.add(json.loads(gdrive.key.read_text())["client_email"])
    with pytest.raises(g.DriveAuthError, match="refused the credentials.*colabkit drive login"):
        colabkit.Checkpoints("gdrive://runs/a", local_dir=tmp_path / "local")
    assert not (tmp_path / "local").exists() and gdrive.state.find("runs") is None
    g.forget_clients()
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    monkeypatch.setenv("COLABKIT_DRIVE_CREDENTIALS", str(bad))
    with pytest.raises(g.DriveAuthError, match="not a Google credentials JSON"):
        colabkit.Checkpoints("gdrive://runs/a")
    monkeypatch.setenv("COLABKIT_DRIVE_CREDENTIALS", str(tmp_path / "none.json"))
    with pytest.raises(g.DriveAuthError, match="No Google Drive credentials.*colabkit drive login"):
        colabkit.Checkpoints("gdrive://runs/a")
    assert isinstance(g.DriveAuthError("x"), OSError)


def test_checkpoints_report_reads_a_gdrive_location(gdrive, tmp_path):
    from colabkit.checkpoints.report import checkpoints_report
    with make(tmp_path) as ckpt:
        ckpt.save(1, {"w": np.zeros(10)}, wait=True)
        ckpt.save(2, {"w": np.ones(10)}, wait=True)
    text, ok = checkpoints_report("gdrive://runs/a", verify=True)
    assert ok and "2 committed checkpoint(s)" in text and text.count("OK") == 2


def test_gdrive_locations_resolve_to_the_drive_api_destination(gdrive, tmp_path):
    from colabkit.checkpoints.destinations import Destination, resolve_destination
    from colabkit.checkpoints.folder import CheckpointFolder
    from colabkit.locations import RemoteLocation, resolve
    assert resolve("gdrive:///runs/a/") == RemoteLocation("gdrive://", "runs/a")   # a location: nothing connects
    dest = resolve_destination("gdrive:///runs/a/")
    assert isinstance(dest, DriveApiFolder) and str(dest) == "gdrive://runs/a"
    assert isinstance(dest, Destination) and isinstance(CheckpointFolder(tmp_path), Destination)
    assert resolve_destination(tmp_path / "x") == tmp_path / "x"
