"""Shared links through the real gdown client, routed to the local server: fetch, resume_from, bad input."""
import json
import tarfile
import zipfile

import numpy as np
import pytest

import colabkit
from colabkit.gdrive import links as L
from colabkit.checkpoints.folder import CheckpointFolder
from colabkit.cli import main

FOLDER_URL = "https://drive.google.com/drive/folders/{}?usp=sharing"
FILE_URL = "https://drive.google.com/file/d/{}/view?usp=sharing"


@pytest.fixture
def shared_run(tmp_path, links):
    """A friend's run folder (two committed checkpoints) shared by link; returns (folder id, its local path)."""
    run = tmp_path / "friend-run"
    with colabkit.Checkpoints(str(run), local_dir=tmp_path / "friend-local", keep=5) as ckpt:
        ckpt.save(10, {"w": np.full(50, 10.0), "note": "friend"}, epoch=1, wait=True)
        ckpt.save(20, {"w": np.full(50, 20.0), "note": "friend"}, epoch=2, wait=True)
    return links.folder(run), run


def test_fetch_file_and_folder_with_progress(tmp_path, links, capsys):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"a" * 1000)
    (src / "sub" / "b.txt").write_text("hello")
    folder_id = links.folder(src)
    assert main(["fetch", FOLDER_URL.format(folder_id), str(tmp_path / "got")]) == 0
    assert (tmp_path / "got" / "a.bin").read_bytes() == b"a" * 1000
    assert (tmp_path / "got" / "sub" / "b.txt").read_text() == "hello"
    file_id = links.file(src / "a.bin", title="weights.bin")
    out = L.fetch(FILE_URL.format(file_id), tmp_path / "files")
    assert out == tmp_path / "files" / "weights.bin" and out.read_bytes() == b"a" * 1000
    assert "%" in capsys.readouterr().err, "gdown's progress bar is shown"


def test_resume_from_shared_folder_continues_into_own_location(tmp_path, shared_run, ck_env_local):
    folder_id, _ = shared_run
    mine = tmp_path / "mine"
    ckpt = colabkit.Checkpoints(str(mine), local_dir=tmp_path / "local", resume_from=FOLDER_URL.format(folder_id))
    restored = ckpt.restore()
    assert restored.step == 20 and restored.state["note"] == "friend" and restored.epoch == 2
    assert restored.source == "link"
    ckpt.save(21, {"w": restored.state["w"] + 1, "note": "mine"}, wait=True)
    ckpt.close()
    assert [c.step for c in CheckpointFolder(mine).committed()] == [21]
    again = colabkit.Checkpoints(str(mine), local_dir=tmp_path / "local2", resume_from=FOLDER_URL.format("x" * 33))
    own = again.restore()
    assert own.step == 21 and own.source == "destination", "own checkpoints win; the link is not even fetched"


@pytest.mark.parametrize("kind", ["zip", "tar.gz", "single"])
def test_resume_from_archive_or_single_checkpoint_folder(tmp_path, shared_run, links, kind):
    _, run = shared_run
    newest = CheckpointFolder(run).committed()[-1].path
    if kind == "single":
        url = FOLDER_URL.format(links.folder(newest, title="my checkpoint"))
    else:
        archive = tmp_path / f"ckpt.{kind}"
        if kind == "zip":
            with zipfile.ZipFile(archive, "w") as zf:
                for f in newest.rglob("*"):
                    zf.write(f, f"{newest.name}/{f.relative_to(newest)}")
        else:
            with tarfile.open(archive, "w:gz") as tf:
                tf.add(newest, arcname="checkpoint")
        url = FILE_URL.format(links.file(archive))
    restored = colabkit.Checkpoints(str(tmp_path / "mine"), local_dir=tmp_path / "local", resume_from=url).restore()
    assert restored.step == 20


def _tampered(run, how):
    newest = CheckpointFolder(run).committed()[-1].path
    if how == "bytes":
        data = bytearray((newest / "arrays.npz").read_bytes()); data[-20] ^= 1
        (newest / "arrays.npz").write_bytes(bytes(data))
    elif how == "pickle":  # a manifest (self-consistent) that lists a file format colabkit never reads
        from colabkit.checkpoints import manifest as M
        (newest / "model.pkl").write_bytes(b"cos\nsystem\n")
        man = json.loads((newest / "MANIFEST.json").read_text())
        files = {**man["files"], "model.pkl": {"size": 11, "sha256": "0" * 64}}
        (newest / "MANIFEST.json").write_bytes(M.dumps(M.build(step=20, epoch=2, batch=None, files=files)))
    return newest


@pytest.mark.parametrize("case,message", [
    ("malformed", "is not a URL"),
    ("no-id", "has no file or folder id"),
    ("other-host", "is not a Google Drive link"),
    ("missing-folder", "does not exist, or it is not shared"),
    ("missing-file", "does not exist, or it is not shared"),
    ("not-a-checkpoint-file", "not a checkpoint"),
    ("not-a-checkpoint-folder", "does not hold a colabkit checkpoint"),
    ("tampered", "does not match its manifest"),
    ("unsafe-format", "only arrays.npz, state.json"),
])
def test_bad_links_give_one_clear_message_and_write_nothing(tmp_path, links, shared_run, case, message):
    _, run = shared_run
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("not a checkpoint")
    url = {"malformed": "drive.google.com/drive/folders/abc",
           "no-id": "https://drive.google.com/drive/folders/",
           "other-host": "https://example.com/drive/folders/1abcdefghijklmnopqrstuvwxyz",
           "missing-folder": FOLDER_URL.format("1" + "m" * 32),
           "missing-file": FILE_URL.format("1" + "n" * 32),
           "not-a-checkpoint-file": FILE_URL.format(links.file(other / "notes.txt")),
           "not-a-checkpoint-folder": FOLDER_URL.format(links.folder(other)),
           "tampered": None, "unsafe-format": None}[case]
    if url is None:
        url = FOLDER_URL.format(links.folder(_tampered(run, "bytes" if case == "tampered" else "pickle")))
    mine, local = tmp_path / "mine", tmp_path / "local"
    with pytest.raises((ValueError, OSError), match=message):
        colabkit.Checkpoints(str(mine), local_dir=local, resume_from=url).restore()
    assert not mine.exists()
    assert not local.exists() or not any(local.iterdir()), list(local.iterdir())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".shared-")]
    # the CLI says the same in one line, exit 1, nothing at DEST
    if case not in ("tampered", "unsafe-format", "not-a-checkpoint-file", "not-a-checkpoint-folder"):
        assert main(["fetch", url, str(tmp_path / "dest")]) == 1
        assert not (tmp_path / "dest").exists()


def test_keras_autoresume_continues_a_shared_run_into_its_own_folder(tmp_path, links, ck_env_local, capsys):
    keras = pytest.importorskip("keras")
    from tests.checkpoints import workers
    x, y = workers.data(np)

    def fit(model, directory, epochs, **kw):
        auto = colabkit.keras.AutoResume(str(directory), deadline=None, **kw)
        model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, callbacks=[auto])
        return auto

    reference, _ = workers.build_model(keras)
    fit(reference, tmp_path / "reference", epochs=3)
    friends, _ = workers.build_model(keras)
    fit(friends, tmp_path / "friend-run", epochs=2)                   # a friend's first two epochs, shared by link
    url = FOLDER_URL.format(links.folder(tmp_path / "friend-run"))
    mine, counter = workers.build_model(keras, seed=123)
    auto = fit(mine, tmp_path / "mine", epochs=3, resume_from=url)
    assert (auto.restored.source, auto.restored.step, auto.restored.epoch) == ("link", 24, 2)
    assert f"[shared checkpoint {url}]" in capsys.readouterr().out
    assert int(counter.count.numpy()) == 36, "the shared run's 24 batches came with it; 12 were trained here"
    for got, want in zip(mine.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert [c.step for c in CheckpointFolder(tmp_path / "mine").committed()][-1] == 36
    assert [c.step for c in CheckpointFolder(tmp_path / "friend-run").committed()][-1] == 24, "theirs untouched"
