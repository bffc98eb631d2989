"""Checkpoint files the guard takes and puts back: a file already in the watched folder that differs from the
committed checkpoint is moved aside at restore, and the guard says so; a torch.save file in the legacy format
(_use_new_zipfile_serialization=False) is committed and a fresh VM loads it; a file is copied once (its private
copy is what the store takes, linked)."""
import subprocess
import sys
import zipfile

import pytest

from tests.guard.helpers import committed, guard_args, vm_env

WRITE_ZIP = ("import sys, os, zipfile; os.makedirs(sys.argv[1], exist_ok=True); "
             "z = zipfile.ZipFile(os.path.join(sys.argv[1], 'last.pt'), 'w'); z.writestr('v', sys.argv[2]); z.close()")


def _guard(tmp_path, vm, watch, dest, *command):
    return subprocess.run(guard_args(watch, dest, "--", *command, resume="--resume {latest}"),
                          env=vm_env(tmp_path, vm), capture_output=True, text=True, timeout=120)


def test_a_differing_file_in_the_way_of_the_restore_is_moved_aside_and_the_guard_says_so(tmp_path):
    dest = tmp_path / "dest"
    done = _guard(tmp_path, "vm1", tmp_path / "vm1", dest, sys.executable, "-c", WRITE_ZIP, str(tmp_path / "vm1"),
                  "committed")
    assert done.returncode == 0, done.stderr
    assert [c.step for c in committed(dest)] == [0]
    assert f"the training ended with exit status 0; step 0 (last.pt) is in {dest}" in done.stderr

    watch = tmp_path / "vm2"
    watch.mkdir()
    with zipfile.ZipFile(watch / "last.pt", "w") as zf:   # the user's own, different last.pt
        zf.writestr("v", "mine")
    done = _guard(tmp_path, "vm2", watch, dest, sys.executable, "-c", "print('ran')")
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(watch / "last.pt") as zf:
        assert zf.read("v") == b"committed"
    with zipfile.ZipFile(watch / "last.pt.colabkit-replaced-1") as zf:
        assert zf.read("v") == b"mine"
    assert (f"last.pt in {watch} differed from the committed checkpoint: it was moved aside to "
            "last.pt.colabkit-replaced-1 (not deleted), and the verified step 0 is resumed") \
        in done.stderr


def test_a_legacy_format_torch_save_is_committed_and_a_fresh_vm_loads_it(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    dest, watch = tmp_path / "dest", tmp_path / "out"
    script = ("import sys, os, torch; os.makedirs(sys.argv[1], exist_ok=True); "
              "torch.save({'w': torch.zeros(64), 'step': 7}, os.path.join(sys.argv[1], 'last.pt'), "
              "_use_new_zipfile_serialization=False)")
    done = _guard(tmp_path, "vm", watch, dest, sys.executable, "-c", script, str(watch))
    assert done.returncode == 0, done.stderr
    assert [c.step for c in committed(dest)] == [0], done.stderr
    import colabkit
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "fresh-cache"))
    restored = colabkit.Checkpoints(str(dest)).restore_folder(tmp_path / "fresh")
    assert torch.load(restored.path, weights_only=True)["step"] == 7


def test_a_legacy_format_torch_save_is_whole_and_cut_short_is_not(tmp_path):
    torch = pytest.importorskip("torch")
    from colabkit.guard.patterns import looks_whole
    path = tmp_path / "last.pt"
    torch.save({"w": torch.zeros(64), "h": torch.ones(3, dtype=torch.float16), "step": 7}, path,
               _use_new_zipfile_serialization=False)
    assert looks_whole(path)
    data = path.read_bytes()
    for cut in (1, 100, len(data) // 2):
        path.write_bytes(data[:-cut])
        assert not looks_whole(path), cut


def test_a_file_checkpoint_is_copied_once_and_its_private_copy_linked(tmp_path):
    from colabkit.guard.commit import Committer
    from colabkit.guard.patterns import DEFAULT_PATTERNS
    from colabkit.guard.watch import Watcher
    watch = tmp_path / "out"
    watch.mkdir()
    with zipfile.ZipFile(watch / "last.pt", "w") as zf:
        zf.writestr("v", "1")
    (tmp_path / "staging").mkdir()
    taken = []

    class Store:   # records what the committer hands over, as the store would take it
        def save_folder(self, step, source, *, link, info):
            taken.append((source, link, source.read_bytes()))

    committer = Committer(Watcher(watch, DEFAULT_PATTERNS, settle=0.0), Store(), every=1.0, say=print,
                          staging=tmp_path / "staging")
    assert committer.commit_ready(writers_gone=True) == [0]
    (source, link, data), = taken
    assert source != watch / "last.pt" and source.name == "last.pt" and data == (watch / "last.pt").read_bytes()
    assert link is True   # the private copy is linked into the store, not copied again
