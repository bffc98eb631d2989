"""Fault campaign on the guard's commits, on the Drive mount stand-in (tests/standins/drivefs.py): a guarded run
resumes from a destination holding checkpoint-2 and -4, and commits checkpoint-6 and -8 (restore, uploads,
retention); one filesystem operation of that cycle fails (EIO, ENOTCONN), for operations spread over the whole
cycle. Afterwards, with the mount healthy, no checkpoint the destination had is lost unless a newer one replaced
it, the newest verified checkpoint is at least the one the run started from, and a fresh VM restores it whole."""
import json
import shutil
import sys

import pytest

from tests.guard.helpers import SCRIPTS
from tests.standins.drive_mount import fuse_unavailable_reason, mounted_drive

pytestmark = [pytest.mark.fuse, pytest.mark.slow,
              pytest.mark.skipif(bool(fuse_unavailable_reason()), reason=f"FUSE: {fuse_unavailable_reason()}")]

TRIALS = 10          # operations tried per fault kind, spread evenly over the cycle (keeps the campaign < 60 s)


def _cycle(watch, dest):
    import colabkit.guard
    return colabkit.guard.run([sys.executable, str(SCRIPTS / "folders.py"), "--out", str(watch), "--steps", "8",
                               "--save-every", "2", "--sleep", "0.05"], watch=watch, to=str(dest), keep=3,
                              resume_arg="--resume_from_checkpoint={latest}", deadline=None, settle=0.1,
                              every=0.05, verbose=False)


def _verified(folder):
    from colabkit.checkpoints.folder import CheckpointFolder, CorruptCheckpoint
    good = []
    for info in CheckpointFolder(folder).committed():
        try:
            CheckpointFolder(folder).verify(info, full=True)
            good.append(info.step)
        except CorruptCheckpoint:
            pass
    return sorted(good)


def test_a_failing_destination_never_loses_a_commit_and_a_fresh_vm_restores_the_newest(tmp_path, monkeypatch):
    import warnings

    import colabkit
    from colabkit.checkpoints import uploader
    from tests.standins.drivefs import read_count
    monkeypatch.setattr(uploader, "BACKOFF_START", 0.01)
    monkeypatch.setattr(uploader, "BACKOFF_MAX", 0.05)
    warnings.simplefilter("ignore")
    n = [0]

    def fresh(name):
        n[0] += 1
        path = tmp_path / f"{name}{n[0]}"
        monkeypatch.setenv("XDG_CACHE_HOME", str(path / "cache"))
        return path

    with mounted_drive(tmp_path, rate=None) as drive:
        template = drive.backing / "MyDrive" / "template"
        fresh("prep")
        first = tmp_path / "prep-out"
        assert _cycle_steps(first, drive.my_drive / "template", 4) == 0
        assert _verified(template) == [2, 4]

        def trial(fault):
            name = f"t{n[0]}"
            shutil.copytree(template, drive.backing / "MyDrive" / name)
            vm = fresh("vm")
            drive.set_fault(fault)
            status = _cycle(vm / "out", drive.my_drive / name)
            ops = read_count(drive.control)
            drive.set_fault("ok")
            fresh("check")
            restored = colabkit.Checkpoints(str(drive.my_drive / name), read_timeout=5).restore_folder(
                tmp_path / f"check-{name}")
            verified = _verified(drive.backing / "MyDrive" / name)
            return status, ops, verified, restored

        status, ops, verified, restored = trial("fail-op 1000000000 EIO")   # the dry run counts the operations
        assert status == 0 and verified[-1] == 8 and ops > 50, (status, ops, verified)
        outcomes = []
        for kind in ("EIO", "ENOTCONN"):
            for k in sorted({1 + i * ops // TRIALS for i in range(TRIALS)}):
                status, _, verified, restored = trial(f"fail-op {k} {kind}")
                lost = [s for s in (2, 4) if s not in verified and not any(v > s for v in verified)]
                ok = (bool(verified) and not lost and verified[-1] >= 4 and restored is not None
                      and restored.step == verified[-1]
                      and json.loads((restored.path / "trainer_state.json").read_text())["global_step"]
                      == verified[-1])
                outcomes.append((kind, k, status, verified, None if restored is None else restored.step, ok))
        bad = [o for o in outcomes if not o[-1]]
        assert not bad, bad
        assert len(outcomes) >= 2 * TRIALS - 2


def _cycle_steps(watch, dest, steps):
    import colabkit.guard
    return colabkit.guard.run([sys.executable, str(SCRIPTS / "folders.py"), "--out", str(watch), "--steps",
                               str(steps), "--save-every", "2", "--sleep", "0.05"], watch=watch, to=str(dest),
                              keep=3, deadline=None, settle=0.1, every=0.05, verbose=False)
