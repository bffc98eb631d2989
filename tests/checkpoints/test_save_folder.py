"""Checkpoints.save_folder() with hard links: a program may remove its own folder once the save returned (the
store's links keep the contents), and a file rewritten in place before it is hashed is still refused."""
import os
import shutil
import warnings

import colabkit


def _written(folder, *, big=0):
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(os.urandom(big or 1000))
    (folder / "optimizer.bin").write_bytes(b"adam" * 100)
    return folder


def test_a_folder_removed_right_after_save_folder_returned_is_committed(tmp_path, ck_env):
    """Removing a linked file's other name changes its ctime and nothing else: the save must still commit (the
    HF Trainer prunes old checkpoint-N folders; AccelerateResume deletes its save_state folder once taken)."""
    source = _written(tmp_path / "out" / "checkpoint-5")
    want = (source / "model.safetensors").read_bytes()
    with colabkit.Checkpoints(tmp_path / "dest", local_dir=tmp_path / "local") as ckpt:
        ckpt.save_folder(5, source, link=True)
        shutil.rmtree(source)
        assert ckpt.wait(60), ckpt.status.last_error
    restored = colabkit.Checkpoints(tmp_path / "dest").restore_folder()
    assert restored.step == 5 and (restored.path / "model.safetensors").read_bytes() == want


def test_a_linked_file_rewritten_in_place_before_it_is_hashed_is_not_committed(tmp_path, ck_env, caplog):
    first = _written(tmp_path / "out" / "checkpoint-1")
    with colabkit.Checkpoints(tmp_path / "dest", local_dir=tmp_path / "local") as ckpt:
        assert ckpt.save_folder(1, first, link=True, wait=60)
        source = _written(tmp_path / "out" / "checkpoint-2", big=64 << 20)   # hashing it takes a while
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ckpt.save_folder(2, source, link=True)
            with open(source / "model.safetensors", "r+b") as f:   # rewritten in place, as torch.save would
                f.write(b"rewritten")
            assert not ckpt.wait(60)
    assert "model.safetensors was rewritten in place" in caplog.text
    assert [c.step for c in colabkit.Checkpoints(tmp_path / "dest").list()] == [1]
