"""What `colabkit run --cluster` sends with a job: links are sent as links, never followed, and a link that leaves
the job's folder stays home (and the user is told). Real folders and real zips; no Ray cluster needed."""
from __future__ import annotations

import io
import os
import stat
import zipfile

import pytest

from colabkit.cluster.packing import pack, pack_changes, snapshot, unpack_folder

SECRET = b"-----BEGIN OPENSSH PRIVATE KEY----- colabkit-test-secret"
SECRET_DIR = b'{"token": "colabkit-test-secret-in-a-folder"}'


@pytest.fixture
def outside(tmp_path):
    """Files outside any job folder: a private key and a folder of credentials."""
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / "id_ed25519").write_bytes(SECRET)
    (home / ".aws" / "credentials.json").write_bytes(SECRET_DIR)
    return home


def _entries(data: bytes) -> dict:
    """{name: (kind, bytes)} of a packed zip; kind "link" or "file"."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {info.filename: ("link" if stat.S_ISLNK(info.external_attr >> 16) else "file", zf.read(info))
                for info in zf.infolist()}


def _tree(root) -> dict:
    """{relative path: ("link", target) or ("file", bytes)} under root, without following any link."""
    out = {}
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                with open(path, "rb") as fh:
                    out[rel] = ("file", fh.read())
    return out


def test_links_that_leave_the_job_folder_are_never_followed_and_named(tmp_path, outside):
    src = tmp_path / "job"
    (src / "sub").mkdir(parents=True)
    (src / "train.py").write_text("print('ran')\n")
    (src / "config.txt").symlink_to(outside / "id_ed25519")                        # absolute
    (src / "sub" / "key").symlink_to(os.path.join("..", "..", "home", "id_ed25519"))  # through ..
    (src / "aws").symlink_to(outside / ".aws")                                      # a folder
    packed = pack(src, [])
    entries = _entries(packed.data)
    assert sorted(entries) == ["train.py"]
    assert not any(SECRET in body or SECRET_DIR in body for _, body in entries.values())
    told = packed.describe()
    assert told.startswith("1 file(s), 13 B; not sent: 3 link(s) that point outside the folder (never followed): ")
    assert f"config.txt -> {outside / 'id_ed25519'}" in told
    assert f"sub/key -> {os.path.join('..', '..', 'home', 'id_ed25519')}" in told
    assert f"aws -> {outside / '.aws'}" in told
    assert "copy what the job needs into the folder, or put it on storage every machine sees and pass --shared" \
        in told


def test_links_inside_the_job_folder_travel_as_links(tmp_path):
    src, dst = tmp_path / "job", tmp_path / "there"
    (src / "data").mkdir(parents=True)
    (src / "data" / "train.csv").write_text("1,2\n")
    (src / "latest.csv").symlink_to(os.path.join("data", "train.csv"))
    (src / "pinned.csv").symlink_to(src / "data" / "train.csv")   # absolute, but into the folder
    (src / "inputs").symlink_to("data")
    packed = pack(src, [])
    entries = _entries(packed.data)
    assert entries == {"data/train.csv": ("file", b"1,2\n"), "latest.csv": ("link", b"data/train.csv"),
                       "pinned.csv": ("link", b"data/train.csv"), "inputs": ("link", b"data")}  # its bytes once
    assert packed.describe() == "1 file(s) and 3 link(s), 4 B"
    unpack_folder(packed.data, dst)
    assert _tree(dst) == {"data/train.csv": ("file", b"1,2\n"), "latest.csv": ("link", "data/train.csv"),
                          "pinned.csv": ("link", "data/train.csv"), "inputs": ("link", "data")}
    assert (dst / "pinned.csv").read_text() == (dst / "inputs" / "train.csv").read_text() == "1,2\n"
    assert os.readlink(dst / "inputs") == "data"


def test_gitignore_sees_the_links_own_name(tmp_path, outside):
    src, dst = tmp_path / "job", tmp_path / "there"
    src.mkdir()
    (src / ".gitignore").write_text(".env\n*.key\n")
    (src / ".env").write_bytes(SECRET)
    (src / "settings").symlink_to(".env")                         # a link to an ignored file: the name travels
    (src / "deploy.key").symlink_to(outside / "id_ed25519")       # an ignored link stays home, like any ignored file
    packed = pack(src, [])
    entries = _entries(packed.data)
    assert entries == {".gitignore": ("file", b".env\n*.key\n"), "settings": ("link", b".env")}
    assert "not sent" not in packed.describe()
    unpack_folder(packed.data, dst)
    assert not (dst / "settings").exists() and os.readlink(dst / "settings") == ".env"   # dangling there


def _zip_with_link(name: str, target: str, *then) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        info = zipfile.ZipInfo(name)
        info.create_system = 3
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, target)
        for extra in then:
            zf.writestr(extra, b"written through the link")
    return buffer.getvalue()


@pytest.mark.parametrize("target", ["/etc", "..", "../../somewhere", "a/../../x"])
def test_unpacking_refuses_a_link_out_of_the_target(tmp_path, target):
    dst = tmp_path / "deep" / "there"
    with pytest.raises(ValueError, match=f"refusing to unpack the link 'escape' -> {target!r}: it points outside"):
        unpack_folder(_zip_with_link("escape", target, "escape/pwned"), dst)
    assert not os.path.lexists(dst / "escape")
    assert not (tmp_path / "deep" / "pwned").exists() and not (tmp_path / "pwned").exists()


def test_what_a_job_writes_comes_back_without_following_its_links(tmp_path, outside):
    copy = tmp_path / "copy"
    (copy / "ckpt").mkdir(parents=True)
    before = snapshot(copy)
    (copy / "ckpt" / "epoch5.pt").write_bytes(b"weights")
    (copy / "best.pt").symlink_to(os.path.join("ckpt", "epoch5.pt"))
    (copy / "leak").symlink_to(outside / "id_ed25519")
    data, count, nbytes, left_out = pack_changes(copy, before, 1 << 20)
    entries = _entries(data)
    assert entries == {"ckpt/epoch5.pt": ("file", b"weights"), "best.pt": ("link", b"ckpt/epoch5.pt")}
    assert (count, nbytes, left_out) == (2, 7, [])
