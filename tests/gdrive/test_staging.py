"""colabkit.stage: folder and archive sources (path, drive:, gdrive://, link), cache hits, resume, disk full."""
import errno
import os
import shutil
import subprocess
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pytest

import colabkit
from colabkit import mounts
from colabkit.gdrive import staging
from colabkit.cli import main


_REAL_SENDFILE = os.sendfile


def make_tree(root: Path, n=30, big=0):
    (root / "imgs" / "a").mkdir(parents=True)
    for i in range(n):
        (root / "imgs" / ("a" if i % 2 else "") / f"{i:03d}.bin").write_bytes(os.urandom(100 + i))
    if big:
        (root / "big.bin").write_bytes(os.urandom(big))
    return root


def make_classes(root: Path, classes=("cat", "dog"), n=6) -> Path:
    """A folder-per-class dataset, as torchvision's ImageFolder or Keras' image_dataset_from_directory read it."""
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(n):
            (root / c / f"{i:03d}.jpg").write_bytes(os.urandom(200 + i))
    return root


def tree(root: Path) -> dict:
    """Every file below root (hidden ones included) and its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def listing(root: Path) -> list:
    """Every entry below root, folders ending in "/", hidden ones included: what os.listdir-based loaders see."""
    found = []
    for base, dirs, files in os.walk(root):
        rel = Path(base).relative_to(root)
        found += [(rel / d).as_posix() + "/" for d in dirs] + [(rel / f).as_posix() for f in files]
    return sorted(found)


def identities(root: Path) -> dict:
    """(inode, mtime) of every file: a file copied again (written as a part file, then renamed) gets a new inode."""
    return {p.relative_to(root).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns) for p in root.rglob("*")
            if p.is_file()}


def count_sendfile(monkeypatch, fail_after=None):
    """Count bytes through os.sendfile; optionally make the source 'drop' (ENOTCONN, like a Drive mount)
    after ``fail_after`` calls."""
    real, calls = _REAL_SENDFILE, {"n": 0, "bytes": 0}

    def sendfile(out_fd, in_fd, offset, count):
        calls["n"] += 1
        if fail_after is not None and calls["n"] > fail_after:
            raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")
        sent = real(out_fd, in_fd, offset, count)
        calls["bytes"] += sent
        return sent
    monkeypatch.setattr(os, "sendfile", sendfile)
    return calls


def test_folder_is_copied_then_cached_then_refreshed(tmp_path, monkeypatch, capsys):
    src = make_tree(tmp_path / "data", big=300_000)
    out = colabkit.stage(str(src), tmp_path / "local")
    assert out == tmp_path / "local" and tree(out) == tree(src)
    assert "files" in capsys.readouterr().err, "a tqdm bar with bytes and a file count"
    calls = count_sendfile(monkeypatch)
    assert colabkit.stage(str(src), tmp_path / "local") == out and calls["n"] == 0, "unchanged: a no-op"
    (src / "imgs" / "001.bin").write_bytes(b"changed")            # size and mtime change
    (src / "imgs" / "000.bin").unlink()
    assert colabkit.stage(str(src), tmp_path / "local") == out
    assert tree(out) == tree(src) and calls["bytes"] == len(b"changed"), "only the changed file is copied"


@pytest.mark.parametrize("how", ["refused", "missing"])
def test_copies_without_sendfile(tmp_path, monkeypatch, how):
    """macOS allows sendfile only to sockets (ENOTSOCK); Windows has no os.sendfile."""
    src = make_tree(tmp_path / "data", big=300_000)
    if how == "missing":
        monkeypatch.delattr(os, "sendfile")
    else:
        def refuse(*args):
            raise OSError(errno.ENOTSOCK, "Socket operation on non-socket")
        monkeypatch.setattr(os, "sendfile", refuse)
    assert tree(colabkit.stage(str(src), tmp_path / "local", quiet=True)) == tree(src)


def test_a_file_rewritten_during_the_copy_is_an_error_not_a_torn_copy(tmp_path, monkeypatch):
    src = make_tree(tmp_path / "data", n=4)
    labels = src / "labels.csv"
    labels.write_text("id,label\n1,dog\n")
    real_sendfile = os.sendfile

    def sendfile_while_another_process_appends(out_fd, in_fd, offset, count):
        sent = real_sendfile(out_fd, in_fd, offset, count)
        if os.fstat(in_fd).st_ino == labels.stat().st_ino:   # appended to while it is being copied
            with open(labels, "a") as fh:
                fh.write("2,cat\n3,owl\n")
        return sent
    monkeypatch.setattr(os, "sendfile", sendfile_while_another_process_appends)
    with pytest.raises(OSError, match="changed during the copy") as info:
        colabkit.stage(str(src), tmp_path / "local", workers=1, quiet=True)
    assert info.value.errno == errno.EIO and not (tmp_path / "local" / "labels.csv").exists()
    monkeypatch.setattr(os, "sendfile", real_sendfile)
    assert tree(colabkit.stage(str(src), tmp_path / "local", quiet=True)) == tree(src)


def test_file_names_that_are_not_utf8(tmp_path):
    src = make_tree(tmp_path / "data", n=2)
    odd = os.path.join(os.fsencode(src), b"caf\xe9.txt")
    with open(odd, "wb") as fh:
        fh.write(b"latin-1 name")
    out = colabkit.stage(str(src), tmp_path / "local", quiet=True)
    assert tree(out) == tree(src) and colabkit.stage(str(src), out, quiet=True) == out


def test_checksum_mode_notices_same_size_same_mtime_changes(tmp_path):
    src = make_tree(tmp_path / "data", n=4)
    out = colabkit.stage(str(src), tmp_path / "local", checksum=True, quiet=True)
    f = src / "imgs" / "000.bin"
    st = f.stat()
    f.write_bytes(b"X" * st.st_size)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert colabkit.stage(str(src), out, quiet=True) and (out / "imgs" / "000.bin").read_bytes() != f.read_bytes()
    colabkit.stage(str(src), out, checksum=True, quiet=True)
    assert (out / "imgs" / "000.bin").read_bytes() == f.read_bytes()


def test_interrupted_copy_resumes_without_recopying(tmp_path, monkeypatch):
    src = make_tree(tmp_path / "data", n=40)
    calls = count_sendfile(monkeypatch, fail_after=20)
    with pytest.raises(OSError, match="not connected"):
        colabkit.stage(str(src), tmp_path / "local", workers=1, quiet=True)
    assert not list((tmp_path / "local").rglob("*" + staging.PART)), "no partial file is left as data"
    first = calls["bytes"]
    calls = count_sendfile(monkeypatch)
    out = colabkit.stage(str(src), tmp_path / "local", quiet=True)
    assert tree(out) == tree(src)
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    assert calls["bytes"] == total - first, "files finished before the drop are not copied again"


def test_staged_folder_holds_exactly_the_source(tmp_path, monkeypatch):
    """No bookkeeping inside the copy: a folder-per-class loader (ImageFolder, os.listdir) sees only the classes."""
    src = make_classes(tmp_path / "pets")
    out = colabkit.stage(str(src), tmp_path / "local", quiet=True)
    assert sorted(os.listdir(out)) == ["cat", "dog"]
    assert listing(out) == listing(src) and tree(out) == tree(src)
    before = identities(out)
    calls = count_sendfile(monkeypatch)
    assert colabkit.stage(str(src), out, quiet=True) == out
    assert calls["n"] == 0 and identities(out) == before, "unchanged: a no-op, no file copied again"
    assert listing(out) == listing(src)
    # the source loses a class and gains one: the mirror keeps no empty folder of the old class
    shutil.rmtree(src / "dog")
    make_classes(src, classes=("owl",), n=2)
    assert colabkit.stage(str(src), out, quiet=True) == out
    assert listing(out) == listing(src) and tree(out) == tree(src)


def test_bookkeeping_is_kept_beside_the_copy(tmp_path):
    src = make_classes(tmp_path / "pets", n=2)
    out = colabkit.stage(str(src), tmp_path / "local", quiet=True)
    assert sorted(os.listdir(tmp_path)) == ["local", "local" + staging.STATE_SUFFIX, "pets"]
    assert staging.state_dir(out) == tmp_path / ("local" + staging.STATE_SUFFIX)
    default = colabkit.stage(str(src), quiet=True)                # the default destination, in the cache dir
    assert listing(default) == listing(src) and staging.state_dir(default).is_dir()
    assert sorted(os.listdir(default.parent)) == [default.name, default.name + staging.STATE_SUFFIX]


def test_interrupted_staging_holds_only_source_files_and_resumes(tmp_path, monkeypatch):
    src = make_classes(tmp_path / "pets", n=20)
    calls = count_sendfile(monkeypatch, fail_after=15)
    with pytest.raises(OSError, match="not connected"):
        colabkit.stage(str(src), tmp_path / "local", workers=1, quiet=True)
    partial = listing(tmp_path / "local")
    assert partial and set(partial) <= set(listing(src)), "no bookkeeping, no part file among the data"
    first = calls["bytes"]
    calls = count_sendfile(monkeypatch)
    out = colabkit.stage(str(src), tmp_path / "local", quiet=True)
    assert listing(out) == listing(src) and tree(out) == tree(src)
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    assert calls["bytes"] == total - first, "files finished before the drop are not copied again"


@pytest.mark.parametrize("when", ["complete", "interrupted"])
def test_a_copy_staged_by_an_older_version_is_cleaned(tmp_path, monkeypatch, when):
    """Older versions kept their bookkeeping in <dst>/.colabkit-stage/: the next stage moves it out, and
    keeps the cache hit (complete) or the resume (interrupted)."""
    src = make_classes(tmp_path / "pets", n=20)
    out = tmp_path / "local"
    calls = count_sendfile(monkeypatch, fail_after=15 if when == "interrupted" else None)
    if when == "interrupted":
        with pytest.raises(OSError, match="not connected"):
            colabkit.stage(str(src), out, workers=1, quiet=True)
    else:
        colabkit.stage(str(src), out, quiet=True)
    first = calls["bytes"]
    before = identities(out)
    os.replace(staging.state_dir(out), out / staging.STATE_DIR)      # the old layout
    assert staging.STATE_DIR in os.listdir(out)
    calls = count_sendfile(monkeypatch)
    assert colabkit.stage(str(src), out, quiet=True) == out
    assert listing(out) == listing(src) and tree(out) == tree(src), "the old bookkeeping is gone from the copy"
    assert staging.state_dir(out).is_dir()
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    assert calls["bytes"] == total - first, "nothing staged before is copied again"
    assert all(identities(out)[rel] == ident for rel, ident in before.items())
    calls = count_sendfile(monkeypatch)
    assert colabkit.stage(str(src), out, quiet=True) == out and calls["n"] == 0


def test_bookkeeping_of_a_deleted_copy_is_not_trusted(tmp_path, monkeypatch):
    src = make_classes(tmp_path / "pets", n=3)
    out = colabkit.stage(str(src), tmp_path / "local", quiet=True)
    shutil.rmtree(out)                          # the bookkeeping beside it stays
    calls = count_sendfile(monkeypatch)
    assert listing(colabkit.stage(str(src), out, quiet=True)) == listing(src)
    assert calls["bytes"] == sum(p.stat().st_size for p in src.rglob("*") if p.is_file()), "all copied again"
    mine = tmp_path / "mine"                    # replaced by a folder of the user's own
    mine.mkdir()
    (mine / "mine.txt").write_text("keep me")
    shutil.rmtree(out)
    os.replace(mine, out)
    with pytest.raises(FileExistsError, match="not made by colabkit.stage"):
        colabkit.stage(str(src), out, quiet=True)
    assert listing(out) == ["mine.txt"]


def test_bookkeeping_in_the_cache_when_the_folder_beside_dst_is_read_only(tmp_path, monkeypatch):
    """dst a mount point (say /mnt/scratch) in a folder this user cannot write: the bookkeeping goes to the cache."""
    src = make_classes(tmp_path / "pets", n=3)
    ro = tmp_path / "mnt"
    (ro / "scratch").mkdir(parents=True)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != ro and real_access(path, mode, **kw))
    out = colabkit.stage(str(src), ro / "scratch", quiet=True)
    assert listing(out) == listing(src) and os.listdir(ro) == ["scratch"]
    calls = count_sendfile(monkeypatch)
    assert colabkit.stage(str(src), out, quiet=True) == out and calls["n"] == 0


@pytest.mark.parametrize("fmt", ["zip", "tar", "tar.gz"])
def test_archive_is_copied_extracted_and_cached(tmp_path, fmt, monkeypatch):
    data = make_tree(tmp_path / "data", n=10)
    archive = tmp_path / f"ds.{fmt}"
    if fmt == "zip":
        with zipfile.ZipFile(archive, "w") as zf:
            for p in data.rglob("*"):
                zf.write(p, p.relative_to(data))
    else:
        with tarfile.open(archive, "w:gz" if fmt.endswith("gz") else "w") as tf:
            tf.add(data, arcname=".")
    out = colabkit.stage(str(archive), quiet=True)
    assert tree(out) == tree(data) and out.parent.name == "datasets" and out.name.startswith("ds-")
    assert listing(out) == listing(data)
    calls = count_sendfile(monkeypatch)
    assert colabkit.stage(str(archive), quiet=True) == out and calls["n"] == 0


def test_archive_with_escaping_member_is_refused(tmp_path):
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tf:
        info = tarfile.TarInfo("../../escaped.txt"); info.size = 1
        import io
        tf.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(OSError, match="outside the folder"):
        colabkit.stage(str(archive), tmp_path / "local", quiet=True)
    assert not (tmp_path / "escaped.txt").exists() and not list((tmp_path / "local").glob("*.txt"))


def test_drive_colon_gdrive_and_link_sources(tmp_path, gdrive, links, monkeypatch):
    data = make_tree(tmp_path / "data", n=6, big=600_000)
    monkeypatch.setenv("COLABKIT_DRIVE_ROOT", str(tmp_path))
    out = colabkit.stage("drive:data", tmp_path / "via-mount", quiet=True)
    assert tree(out) == tree(data)
    # the same tree on Drive's API, and as a share link
    from tests.standins.drive_api import FOLDER
    ds = gdrive.state.add("datasets", mime=FOLDER)
    links.folder(data, title="mnist", parent=ds["id"])
    out = colabkit.stage("gdrive://datasets/mnist", tmp_path / "via-api", quiet=True)
    assert tree(out) == tree(data)
    before = len(gdrive.requests)
    colabkit.stage("gdrive://datasets/mnist", tmp_path / "via-api", quiet=True)
    assert not any("alt" in p or m != "GET" for m, p in gdrive.requests[before:]), "cache hit: listings only"
    assert not [r for r in gdrive.requests[before:] if r[1].startswith("/upload")]
    url = "https://drive.google.com/drive/folders/" + gdrive.state.find("datasets/mnist")["id"]
    assert main(["stage", url, str(tmp_path / "via-link")]) == 0
    assert tree(tmp_path / "via-link") == tree(data)
    with pytest.raises(FileNotFoundError, match="does not exist on Google Drive"):
        colabkit.stage("gdrive://datasets/nope", tmp_path / "x", quiet=True)


@pytest.mark.fuse
def test_from_a_drive_mount_many_at_a_time_and_a_drop_loses_nothing(tmp_path, drive_mount_factory, caplog,
                                                                    monkeypatch):
    drive = drive_mount_factory(rate=None, extra_args=["--open-latency", "0.25"])   # a round trip per file
    expected = tree(make_tree(drive.backing / "MyDrive" / "data", n=40))            # put there beforehand
    src = drive.my_drive / "data"
    assert mounts.on_network_fs(src) and not mounts.on_network_fs(tmp_path)
    assert mounts.filesystem_of(src) == mounts.DRIVE_FSTYPE and str(drive.mountpoint) in mounts.drive_mounts()
    caplog.set_level("INFO", logger="colabkit")
    assert tree(colabkit.stage(str(src), tmp_path / "local", quiet=True)) == expected
    assert f"from the network, {staging.NETWORK_WORKERS} at a time" in caplog.text
    # the mount drops mid-copy (once the first files have landed): an error, no partial file kept, and the
    # next call copies only what is missing
    out = tmp_path / "local2"
    dropper = threading.Thread(target=drop_when_files_land, args=(drive, out))
    dropper.start()
    try:
        with pytest.raises(OSError) as info:
            colabkit.stage(str(src), out, quiet=True)
    finally:
        dropper.join()
    assert info.value.errno == errno.ENOTCONN
    drive.set_fault("ok")
    landed = list(out.rglob("*.bin"))
    assert 0 < len(landed) < 40 and not list(out.rglob("*" + staging.PART))
    calls = count_sendfile(monkeypatch)
    assert tree(colabkit.stage(str(src), out, quiet=True)) == expected
    assert calls["n"] == 40 - len(landed), "files that landed before the drop are not copied again"


def drop_when_files_land(drive, out, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(out.rglob("*.bin")):
        time.sleep(0.005)
    drive.set_fault("enotconn")


def test_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        colabkit.stage(str(tmp_path / "missing"), quiet=True)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="not a .zip/.tar"):
        colabkit.stage(str(tmp_path / "notes.txt"), quiet=True)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep me")
    make_tree(tmp_path / "data", n=2)
    with pytest.raises(FileExistsError, match="not made by colabkit.stage"):
        colabkit.stage(str(tmp_path / "data"), busy, quiet=True)
    assert (busy / "mine.txt").read_text() == "keep me"
    assert main(["stage", "https://drive.google.com/drive/folders/", str(tmp_path / "d")]) == 1


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (needs root and mount); skipped with the reason where it cannot be mounted."""
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root; test_disk_full_simulated covers the check")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_disk_full_is_refused_before_copying(tmp_path, small_disk):
    src = make_tree(tmp_path / "data", n=4, big=3_000_000)
    with pytest.raises(staging.InsufficientSpace, match=r"needs 2\.\d MiB|needs 2\.9|needs .* only .* free"):
        colabkit.stage(str(src), small_disk / "ds", quiet=True)
    assert not (small_disk / "ds").exists(), "nothing written"
    with pytest.raises(OSError) as info:
        colabkit.stage(str(src), small_disk / "ds", quiet=True)
    assert info.value.errno == errno.ENOSPC
    assert main(["stage", str(src), str(small_disk / "ds")]) == 1


def test_disk_full_simulated(tmp_path, monkeypatch):
    """Documented simulation for machines without mount rights: disk_usage reports 1 KiB free."""
    src = make_tree(tmp_path / "data", n=4, big=10_000)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1024, 1024))
    with pytest.raises(staging.InsufficientSpace, match="only 1.0 KiB is free"):
        colabkit.stage(str(src), tmp_path / "ds", quiet=True)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("ds")], "no folder, no bookkeeping"


# -- staging into a folder other users can write (/tmp) ---------------------------------------------------
OTHER_UID = 65534      # "nobody": the other local user (the tests run as root, so chown can give a folder away)


def shared_tmp(tmp_path) -> Path:
    """A folder like /tmp: every user may create entries in it (sticky)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    return shared


def plant(folder: Path, links: dict, owner=OTHER_UID, mode=0o777) -> list:
    """Another user's folder holding symbolic links {name: target}; returns what it holds."""
    folder.mkdir()
    for name, target in links.items():
        (folder / name).symlink_to(target)
        os.lchown(folder / name, owner, owner)
    os.chmod(folder, mode)
    os.chown(folder, owner, owner)
    return sorted(os.listdir(folder))


needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="giving a folder to another user (chown) needs root")


@needs_root
@pytest.mark.parametrize("dst_exists", [False, True])
def test_a_staging_folder_planted_by_another_user_is_refused_and_nothing_is_written_through_it(tmp_path, dst_exists):
    src = make_classes(tmp_path / "pets", n=2)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    shared = shared_tmp(tmp_path)
    dst = shared / "data"
    if dst_exists:                              # the user's own empty folder, made before staging
        dst.mkdir()
    planted = shared / ("data" + staging.STATE_SUFFIX)
    held = plant(planted, {name: victim for name in ("folder.json.tmp", "folder.json", "journal.tsv",
                                                     "complete.json.tmp")})
    with pytest.raises(PermissionError) as info:
        colabkit.stage(str(src), dst, quiet=True)
    message = str(info.value)
    assert str(planted) in message and f"uid {OTHER_UID}" in message and "another dst" in message, message
    assert victim.read_text() == "keep me"
    assert sorted(os.listdir(planted)) == held, "nothing landed in the other user's folder"
    assert not dst.exists() or not os.listdir(dst)
    assert main(["stage", str(src), str(dst)]) == 1 and victim.read_text() == "keep me"


@needs_root
def test_a_destination_planted_by_another_user_is_refused(tmp_path):
    src = make_classes(tmp_path / "pets", n=2)
    shared = shared_tmp(tmp_path)
    dst = shared / "data"
    plant(dst, {})                              # empty, and anyone may write into it
    with pytest.raises(PermissionError, match=f"{dst}.*uid {OTHER_UID}"):
        colabkit.stage(str(src), dst, quiet=True)
    assert os.listdir(dst) == [], "the dataset did not land in the other user's folder"
    assert not (shared / ("data" + staging.STATE_SUFFIX)).exists()


@needs_root
def test_a_link_at_the_staging_folder_s_name_is_refused(tmp_path):
    src = make_classes(tmp_path / "pets", n=2)
    shared = shared_tmp(tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    link = shared / ("data" + staging.STATE_SUFFIX)
    link.symlink_to(theirs)
    os.lchown(link, OTHER_UID, OTHER_UID)
    with pytest.raises(PermissionError, match="symbolic link"):
        colabkit.stage(str(src), shared / "data", quiet=True)
    assert os.listdir(theirs) == []


def test_the_staging_folder_is_private(tmp_path):
    out = colabkit.stage(str(make_classes(tmp_path / "pets", n=1)), tmp_path / "local", quiet=True)
    assert stat_mode(staging.state_dir(out)) == 0o700


def test_links_inside_colabkit_s_folders_are_never_followed(tmp_path):
    src = make_classes(tmp_path / "pets", n=3)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = colabkit.stage(str(src), tmp_path / "local", quiet=True)
    state = staging.state_dir(out)
    # links where colabkit writes its temporary and partial files, and its journal
    (src / "cat" / "new.jpg").write_bytes(b"new")
    for path in (state / "folder.json.tmp", state / "complete.json.tmp", state / "journal.tsv",
                 out / "cat" / ("new.jpg" + staging.PART)):
        path.symlink_to(victim)
    assert tree(colabkit.stage(str(src), out, quiet=True)) == tree(src)
    assert victim.read_text() == "keep me"
    assert not [p for p in [*out.rglob("*"), *state.rglob("*")] if p.is_symlink()]


def stat_mode(path: Path) -> int:
    return os.lstat(path).st_mode & 0o7777
