"""A last.pt that its script rewrites in place all the time (truncated and written again through one inode, as
torch.save in a loop does): what the guard commits is always one whole version, never a mix of two writes or a
half-written file."""
import io
import subprocess
import sys
import zipfile

from colabkit.checkpoints.folder import CheckpointFolder
from tests.guard.helpers import SCRIPTS, guard_args, vm_env


def test_every_committed_copy_of_a_constantly_rewritten_last_pt_is_one_whole_version(tmp_path):
    dest, watch = tmp_path / "dest", tmp_path / "out"
    args = guard_args(watch, dest, "--settle", "0.02", "--every", "0.05", "--keep", "1000", "--",
                      sys.executable, str(SCRIPTS / "rewriter.py"), str(watch), "6", resume=None)
    done = subprocess.run(args, env=vm_env(tmp_path, "vm"), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    folder = CheckpointFolder(dest)
    copies = folder.committed()
    assert copies, done.stderr[-2000:]   # how many depends on when the script pauses: never a mix, whatever it is
    versions = []
    for info in copies:
        folder.verify(info, full=True)
        data = (info.path / "files" / "last.pt").read_bytes()
        with zipfile.ZipFile(io.BytesIO(data)) as zf:   # a whole archive: its end record is there
            version = int(zf.read("archive/version"))
            payload = zf.read("archive/data.pkl")
        assert payload == bytes([version % 251]) * (256 * 1024), f"committed copy {info.step} mixes two writes"
        versions.append(version)
    assert versions == sorted(versions), "a later commit holds an older version"
