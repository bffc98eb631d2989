"""Retention does not fill Drive's Trash: through the API (gdrive://) old checkpoints are deleted for good; on the
Drive mount, where a delete moves the file to Trash (counted against the quota for 30 days), colabkit deletes its
own trashed checkpoints for good through the API when signed in, and otherwise says once how much it put there and
how to empty it. The stand-ins' Trash is pinned first, against the real pydrive2 client."""
import warnings

import numpy as np
import pytest

import colabkit
from tests.standins import drive_mount as _drive_mount

drivefs = _drive_mount._drivefs_module()


@pytest.fixture(autouse=True)
def no_settling(monkeypatch):
    """Retention on the mount waits for Drive's upload to settle; these tests look at what it deletes."""
    import colabkit.checkpoints.uploader as uploader
    monkeypatch.setattr(uploader, "SETTLE_S", 0.0)


def _drive(gdrive):
    from pydrive2.drive import GoogleDrive
    return GoogleDrive(colabkit.gdrive.connect().auth)


def _quota(server):
    """(bytes stored, bytes in Trash) as Drive's about.get reports them."""
    from pydrive2.drive import GoogleDrive
    about = GoogleDrive(colabkit.gdrive.connect().auth).GetAbout()
    return int(about["quotaBytesUsed"]), int(about["quotaBytesUsedInTrash"])


def _trashed_titles(server):
    with server.state.lock:
        server.state.sync_mount()
        return sorted(m["title"] for m in server.state.files.values() if server.state.in_trash(m["id"]))


# -- the stand-ins ----------------------------------------------------------------------------------------

def test_standin_delete_is_for_good_trash_counts_against_the_quota_and_empty_trash_empties_it(gdrive):
    drive = _drive(gdrive)
    files = []
    for name in ("a", "b", "c"):
        f = drive.CreateFile({"title": name})
        f.SetContentString(name * 100)
        f.Upload()
        files.append(f)
    assert _quota(gdrive) == (300, 0)
    files[0].Delete()                                   # files.delete: gone, not in Trash
    files[1].Trash()                                    # files.trash: in Trash, still counted
    assert _quota(gdrive) == (200, 100)
    assert [f["title"] for f in drive.ListFile({"q": "trashed = true"}).GetList()] == ["b"]
    drive.auth.service.files().emptyTrash().execute()
    assert _quota(gdrive) == (100, 0)
    assert [f["title"] for f in drive.ListFile({"q": "trashed = false"}).GetList()] == ["c"]


def test_standin_mount_deletes_go_to_a_trash_the_linked_api_sees_and_can_empty(gdrive, drive_mount_factory):
    mount = drive_mount_factory(rate=None, trash=True)
    gdrive.link_mount(mount.backing / "MyDrive", mount.trash)
    (mount.my_drive / "runs").mkdir()
    (mount.my_drive / "runs" / "kept.bin").write_bytes(b"k" * 10)
    (mount.my_drive / "runs" / "old.bin").write_bytes(b"o" * 40)
    assert _quota(gdrive) == (50, 0)                    # synced while it lived
    (mount.my_drive / "runs" / "old.bin").unlink()
    (mount.my_drive / "runs" / "brief.bin").write_bytes(b"b" * 5)
    (mount.my_drive / "runs" / "brief.bin").unlink()    # uploaded by Drive before the delete: in Trash too
    assert [(e["path"], e["size"]) for e in drivefs.read_trash(mount.trash)] == [
        ("/MyDrive/runs/old.bin", 40), ("/MyDrive/runs/brief.bin", 5)]
    assert _quota(gdrive) == (55, 45)
    drive = _drive(gdrive)
    [old] = [f for f in drive.ListFile({"q": "trashed = true"}).GetList() if f["title"] == "old.bin"]
    assert old["parents"][0]["id"] == gdrive.state.find("runs")["id"]
    old.Delete()                                        # for good: out of the mount's Trash too
    assert [e["path"] for e in drivefs.read_trash(mount.trash)] == ["/MyDrive/runs/brief.bin"]
    assert _quota(gdrive) == (15, 5)


# -- colabkit's retention ---------------------------------------------------------------------------------

def _save_three(where, tmp_path, **kw):
    with colabkit.Checkpoints(where, keep=1, local_dir=tmp_path / "local", **kw) as ckpt:
        for step in (1, 2, 3):
            assert ckpt.save(step, {"w": np.full(5000, float(step))}, wait=True)
        return ckpt


def test_retention_through_the_api_deletes_for_good(gdrive, tmp_path):
    _save_three("gdrive://runs/a", tmp_path)
    used, in_trash = _quota(gdrive)
    assert in_trash == 0 and _trashed_titles(gdrive) == []
    assert used > 40_000 and used < 2 * 40_000, "one checkpoint of 40 kB is stored, not three"


def test_retention_on_the_mount_empties_its_own_trash_through_the_api_when_signed_in(gdrive, drive_mount_factory,
                                                                                        tmp_path):
    mount = drive_mount_factory(rate=None, trash=True)
    gdrive.link_mount(mount.backing / "MyDrive", mount.trash)
    (mount.my_drive / "runs").mkdir()
    (mount.my_drive / "runs" / "notes.txt").write_text("the user's")
    (mount.my_drive / "runs" / "notes.txt").unlink()               # the user's own trash, from the mount ...
    mine = _drive(gdrive).CreateFile({"title": "draft.txt"})
    mine.SetContentString("the user's too")
    mine.Upload()
    mine.Trash()                                                   # ... and from the Drive web page
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _save_three(str(mount.my_drive / "runs" / "a"), tmp_path)
    assert not [w for w in caught if "Trash" in str(w.message)], "nothing to say: Trash holds none of ours"
    trashed = _trashed_titles(gdrive)
    assert trashed == ["draft.txt", "notes.txt"], trashed
    assert [e["path"] for e in drivefs.read_trash(mount.trash)] == ["/MyDrive/runs/notes.txt"]
    used, in_trash = _quota(gdrive)
    assert in_trash == len("the user's") + len("the user's too")


def test_retention_on_the_mount_says_once_how_much_it_put_in_trash_when_not_signed_in(drive_mount_factory,
                                                                                       tmp_path, caplog):
    mount = drive_mount_factory(rate=None, trash=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with colabkit.Checkpoints(str(mount.my_drive / "runs" / "b"), local_dir=tmp_path / "b") as ckpt:
            ckpt.save(1, {"w": np.ones(3)}, wait=True)
    assert [e["path"] for e in drivefs.read_trash(mount.trash)] == ["/MyDrive/runs/b/.colabkit-lease.json"]
    assert not [w for w in caught if "Trash" in str(w.message)], "a run that deleted no checkpoint says nothing"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _save_three(str(mount.my_drive / "runs" / "a"), tmp_path)
    said = [str(w.message) for w in caught if "Trash" in str(w.message)]
    assert len(said) == 1, said
    first = [e for e in drivefs.read_trash(mount.trash) if e["path"].startswith("/MyDrive/runs/a/ckpt-000000000001")]
    size = colabkit.units.format_size(sum(e["size"] for e in first))
    assert size in said[0] and "https://drive.google.com/drive/trash" in said[0]
    assert "colabkit drive login" in said[0] and "gdrive://" in said[0]
    ours = [e for e in drivefs.read_trash(mount.trash) if e["path"].startswith("/MyDrive/runs/a/")]
    assert sum(e["size"] for e in ours) > 2 * 40_000, "two checkpoints went to Trash"
