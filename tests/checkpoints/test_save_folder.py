"""Checkpoints that another program wrote (a Trainer's checkpoint-N folder, a script's last.pt), taken into the
store with save_folder() and brought back with restore_folder(): committed whole or not at all, never a mix of
two writes, restored on a fresh machine from the destination alone."""
import os
import shutil
import time
import types
import warnings

import pytest

import colabkit
from colabkit.checkpoints import files as files_module
from colabkit.checkpoints.folder import CheckpointFolder


def store(tmp_path, local="local", **kw):
    return colabkit.Checkpoints(str(tmp_path / "dest"), local_dir=tmp_path / local, **kw)


def trainer_folder(root, step, payload=b"w"):
    folder = root / f"checkpoint-{step}"
    (folder / "nested").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(payload * 1000 + os.urandom(16))
    (folder / "nested" / "optimizer.pt").write_bytes(os.urandom(2000))
    (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    return folder


def tree(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_folder_is_committed_whole_and_a_fresh_machine_restores_it_from_the_destination(tmp_path, ck_env):
    out = tmp_path / "out"
    first, second = trainer_folder(out, 5), trainer_folder(out, 10)
    expected = tree(second)
    with store(tmp_path) as ckpt:
        assert ckpt.restore_folder() is None
        ckpt.save_folder(5, first, wait=True)
        ckpt.save_folder(10, second, epoch=1, batch=3, wait=True)
    shutil.rmtree(out)   # the Trainer rotated both away: the store's copies do not depend on them
    shutil.rmtree(tmp_path / "local")
    fresh = store(tmp_path, local="fresh-vm")
    restored = fresh.restore_folder(tmp_path / "new-out")
    assert (restored.step, restored.epoch, restored.batch, restored.source) == (10, 1, 3, "destination")
    assert restored.path == tmp_path / "new-out" / "checkpoint-10"
    assert tree(restored.path) == expected
    in_place = fresh.restore_folder()   # no `into`: the verified local copy, where it is
    assert in_place.path.name == "checkpoint-10" and tree(in_place.path) == expected


def test_a_single_file_round_trips_under_its_own_name(tmp_path, ck_env):
    last = tmp_path / "run" / "last.pt"
    last.parent.mkdir()
    last.write_bytes(b"v1" * 500)
    with store(tmp_path) as ckpt:
        ckpt.save_folder(3, last, link=False, wait=True)
    restored = store(tmp_path, local="fresh").restore_folder(tmp_path / "back")
    assert restored.path == tmp_path / "back" / "last.pt" and restored.path.read_bytes() == b"v1" * 500


def test_a_linked_file_rewritten_in_place_before_it_is_hashed_is_never_committed(tmp_path, ck_env, monkeypatch):
    out = tmp_path / "out"
    good = trainer_folder(out, 1)
    with store(tmp_path) as ckpt:
        ckpt.save_folder(1, good, wait=True)
    bad = trainer_folder(out, 2)
    real_copy = files_module.copy_file

    def program_rewrites_then_copy(path, *args, **kw):   # the program rewrites its file in place at the worst moment
        with open(bad / "model.safetensors", "r+b") as fh:
            fh.write(b"half of another write")
        return real_copy(path, *args, **kw)

    monkeypatch.setattr(files_module, "copy_file", program_rewrites_then_copy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with store(tmp_path) as ckpt:
            ckpt.restore_folder()
            assert ckpt.save_folder(2, bad, wait=True) is False
    assert any("rewritten in place" in str(w.message) for w in caught), [str(w.message) for w in caught]
    monkeypatch.undo()
    assert [c.step for c in CheckpointFolder(tmp_path / "dest").committed()] == [1]
    assert store(tmp_path, local="fresh").restore_folder().step == 1


def test_a_file_rewritten_during_its_copy_is_copied_again_and_committed_as_one_version(tmp_path, ck_env,
                                                                                     monkeypatch):
    last = tmp_path / "run" / "last.pt"
    last.parent.mkdir()
    last.write_bytes(b"A" * 4000)
    copies = []

    def copy_while_the_script_rewrites(src, dst):
        shutil.copyfile(src, dst)
        if not copies:   # during the first copy the script writes its next version in place
            with open(src, "r+b") as fh:
                fh.write(b"B" * 4000)
        copies.append(dst)

    monkeypatch.setattr(files_module, "shutil", types.SimpleNamespace(copyfile=copy_while_the_script_rewrites,
                                                                       copytree=shutil.copytree))
    with store(tmp_path) as ckpt:
        ckpt.save_folder(7, last, link=False, wait=True)
    monkeypatch.undo()
    assert len(copies) == 2
    restored = store(tmp_path, local="fresh").restore_folder(tmp_path / "back")
    assert restored.path.read_bytes() == b"B" * 4000


def test_restoring_over_a_different_file_moves_it_aside_and_deletes_nothing(tmp_path, ck_env):
    src = tmp_path / "src" / "last.pt"
    src.parent.mkdir()
    src.write_bytes(b"committed")
    with store(tmp_path) as ckpt:
        ckpt.save_folder(4, src, wait=True)
    watched = tmp_path / "watched"
    watched.mkdir()
    (watched / "last.pt").write_bytes(b"half-written by a run that died")
    restored = store(tmp_path, local="fresh").restore_folder(watched)
    assert restored.path.read_bytes() == b"committed"
    assert (watched / "last.pt.colabkit-replaced-1").read_bytes() == b"half-written by a run that died"
    again = store(tmp_path, local="fresh2").restore_folder(watched)   # the same content: left as it is
    assert again.path.read_bytes() == b"committed" and not (watched / "last.pt.colabkit-replaced-2").exists()


def test_a_damaged_folder_checkpoint_falls_back_to_the_previous_one(tmp_path, ck_env):
    out = tmp_path / "out"
    with store(tmp_path) as ckpt:
        ckpt.save_folder(1, trainer_folder(out, 1), wait=True)
        ckpt.save_folder(2, trainer_folder(out, 2), wait=True)
    newest = max(CheckpointFolder(tmp_path / "dest").committed(), key=lambda c: c.step)
    damaged = newest.path / "files" / "checkpoint-2" / "model.safetensors"
    damaged.write_bytes(b"\0" * damaged.stat().st_size)
    with pytest.warns(RuntimeWarning, match="damaged"):
        restored = store(tmp_path, local="fresh").restore_folder(tmp_path / "back")
    assert restored.step == 1 and restored.path.name == "checkpoint-1"


def test_a_store_of_save_states_is_not_mistaken_for_files(tmp_path, ck_env):
    with store(tmp_path) as ckpt:
        ckpt.save(1, {"lr": 0.1}, wait=True)
    with pytest.raises(colabkit.CheckpointError, match="save_folder"):
        store(tmp_path, local="fresh").restore_folder()


def test_careless_sources_get_an_error_naming_them(tmp_path, ck_env):
    with store(tmp_path) as ckpt:
        with pytest.raises(ValueError, match="no-such-checkpoint"):
            ckpt.save_folder(1, tmp_path / "no-such-checkpoint")
        os.mkfifo(tmp_path / "pipe")
        with pytest.raises(ValueError, match="neither a folder nor a regular file"):
            ckpt.save_folder(1, tmp_path / "pipe")
    assert CheckpointFolder(tmp_path / "dest").committed() == []


def test_a_folder_removed_right_after_save_folder_returned_is_committed(tmp_path, ck_env):
    """Removing a linked file's other name changes its ctime and nothing else: the save must still commit (the
    Trainer prunes old checkpoint-N folders; AccelerateResume deletes its save_state folder once taken)."""
    source = trainer_folder(tmp_path / "out", 5)
    want = tree(source)
    with store(tmp_path) as ckpt:
        ckpt.save_folder(5, source, link=True)
        shutil.rmtree(source)
        assert ckpt.wait(60), ckpt.status.last_error
    restored = store(tmp_path, local="fresh").restore_folder()
    assert restored.step == 5 and tree(restored.path) == want


def test_a_file_rewritten_in_place_all_the_time_is_never_committed_as_a_mix_of_two_writes(tmp_path, ck_env):
    """A script rewrites last.pt in place, as torch.save does, many times a second: writes within one tick of the
    kernel's file clock leave size and mtime as they were, and a write may stall half way (descheduled, waiting
    for its disk). Every copy the store commits is one version; a copy taken mid-write is refused."""
    import random
    import threading
    last = tmp_path / "run" / "last.pt"
    last.parent.mkdir()
    size = 64 * 1024
    last.write_bytes(b"a" * size)
    stop = threading.Event()

    def script():
        rng, version = random.Random(0), 0
        while not stop.is_set():
            version += 1
            part = bytes([97 + version % 26]) * (size // 8)
            fd = os.open(last, os.O_WRONLY)
            try:
                for k in range(8):
                    os.pwrite(fd, part, k * len(part))
                    if k == 3 and version % 5 == 0:
                        time.sleep(0.15)   # stalled half way, longer than the quiet time
            finally:
                os.close(fd)
            if version % 3 == 0:
                time.sleep(rng.uniform(0.05, 0.15))

    writer = threading.Thread(target=script)
    saved = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with store(tmp_path, keep=100) as ckpt:
            writer.start()
            try:
                deadline = time.monotonic() + 2.5
                step = 0
                while time.monotonic() < deadline:
                    step += 1
                    try:
                        saved += ckpt.save_folder(step, last, link=False, wait=True)
                    except OSError:
                        pass   # refused: taken while it was being written
            finally:
                stop.set()
                writer.join()
            # once the script has stopped writing, the file is taken at once
            assert ckpt.save_folder(step + 1, last, link=False, wait=True)
            saved += 1
    committed = CheckpointFolder(tmp_path / "dest").committed()
    assert len(committed) == saved
    for info in committed:
        data = (info.path / "files" / "last.pt").read_bytes()
        assert len(data) == size and len(set(data)) == 1, f"step {info.step} mixes two writes"


def test_restore_folder_asks_a_function_where_to_put_the_checkpoint(tmp_path, ck_env):
    """``into`` may be a function of the verified checkpoint: a guard puts each one back where it came from."""
    weights = tmp_path / "run" / "exp" / "weights" / "last.pt"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"epoch 3")
    with store(tmp_path) as ckpt:
        ckpt.save_folder(3, weights, link=False, info={"from": "exp/weights"}, wait=True)
    seen = []

    def where(restored):
        seen.append((restored.step, restored.manifest["info"]["from"], restored.path.name))
        return tmp_path / "fresh" / restored.manifest["info"]["from"]

    restored = store(tmp_path, local="fresh-vm").restore_folder(into=where)
    assert seen == [(3, "exp/weights", "last.pt")]
    assert restored.path == tmp_path / "fresh" / "exp" / "weights" / "last.pt"
    assert restored.path.read_bytes() == b"epoch 3"


def test_a_committed_checkpoint_shares_no_file_with_the_program_that_wrote_it(tmp_path, ck_env):
    """Linked on the calling thread, the files get copies of their own before the commit: the program rewriting
    its files in place afterwards (a same-step save, a fixed-name folder) damages nothing committed, locally or
    at the destination."""
    folder = trainer_folder(tmp_path / "out", 3)
    want = tree(folder)
    with store(tmp_path) as ckpt:
        ckpt.save_folder(3, folder, closed=True, wait=True)
        for f in folder.rglob("*"):
            if f.is_file():
                with open(f, "r+b") as fh:
                    fh.write(b"rewritten in place later")
        local = ckpt.restore_folder()
        assert local.source == "local" and tree(local.path) == want
    assert tree(store(tmp_path, local="fresh").restore_folder().path) == want


def test_files_on_another_filesystem_are_copied_and_said_once(tmp_path, ck_env, monkeypatch):
    import errno as errno_module

    def no_links(src, dst):
        raise OSError(errno_module.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(files_module.os, "link", no_links)
    out = tmp_path / "out"
    with pytest.warns(RuntimeWarning, match="another filesystem") as caught:
        with store(tmp_path) as ckpt:
            ckpt.save_folder(1, trainer_folder(out, 1), closed=True, wait=True)
            ckpt.save_folder(2, trainer_folder(out, 2), closed=True, wait=True)
    assert sum("another filesystem" in str(w.message) for w in caught) == 1
    monkeypatch.undo()
    assert tree(store(tmp_path, local="fresh").restore_folder().path) == tree(out / "checkpoint-2")
