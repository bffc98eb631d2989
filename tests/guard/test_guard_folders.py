"""colabkit guard around a script that writes checkpoint-N folders (trainer_state.json last): a kill -9 of the
whole tree mid-run, then a fresh VM that restores from the destination and resumes to the same result as an
uninterrupted run; the deadline stop; a folder without its marker is never committed; --retries; output and
exit status pass through unchanged."""
import signal
import subprocess
import sys

import pytest

from tests.guard.helpers import (SCRIPTS, committed, guard_args, kill_tree, output, result, start, vm_env,
                                 wait_until)

SCRIPT = str(SCRIPTS / "folders.py")


def reference(tmp_path, steps):
    out = tmp_path / "reference"
    subprocess.run([sys.executable, SCRIPT, "--out", str(out), "--steps", str(steps), "--sleep", "0"], check=True,
                   capture_output=True)
    return result(out)["value"]


@pytest.mark.subprocess_kill
def test_killed_mid_run_a_fresh_vm_restores_and_resumes_to_the_uninterrupted_result(tmp_path):
    dest = tmp_path / "drive" / "runs" / "hf"
    watch1 = tmp_path / "vm1" / "outputs"
    train = ["--", sys.executable, SCRIPT, "--steps", "16", "--save-every", "4", "--sleep", "0.15"]
    guard = start(guard_args(watch1, dest, *train, "--out", str(watch1)), vm_env(tmp_path, "vm1"), tmp_path, "vm1")
    wait_until(lambda: any(c.step >= 8 for c in committed(dest)), 60, "step 8 committed", guard)
    kill_tree(guard)   # the VM is reclaimed: guard and training die at once
    steps = [c.step for c in committed(dest)]
    assert steps and max(steps) < 16, steps
    assert not (watch1 / "result.json").exists()

    watch2 = tmp_path / "vm2" / "outputs"   # a fresh VM: empty disk, empty cache
    guard = start(guard_args(watch2, dest, *train, "--out", str(watch2)), vm_env(tmp_path, "vm2"), tmp_path, "vm2")
    assert guard.wait(60) == 0, output(tmp_path, "vm2")
    out, err = output(tmp_path, "vm2")
    newest = max(steps)
    assert f"resumed from step {newest}" in out
    assert f"restored step {newest} (checkpoint-{newest})" in err
    assert (watch2 / f"checkpoint-{newest}" / "trainer_state.json").exists()
    assert result(watch2)["started_from"] == newest
    assert result(watch2)["value"] == reference(tmp_path, 16)
    assert max(c.step for c in committed(dest)) == 16


def test_before_the_deadline_the_script_is_signalled_its_checkpoint_committed_and_its_status_kept(tmp_path):
    dest, watch = tmp_path / "dest", tmp_path / "out"
    args = guard_args(watch, dest, "--grace", "20s", "--margin", "0", "--save-every", "1000", resume=None)
    args[args.index("--deadline") + 1] = "2s"
    args.remove("--save-every"), args.remove("1000")
    args += ["--", sys.executable, SCRIPT, "--out", str(watch), "--steps", "1000", "--save-every", "1000",
             "--save-on-signal", "--exit-code", "5"]
    guard = start(args, vm_env(tmp_path, "vm"), tmp_path, "vm")
    assert guard.wait(60) == 5
    out, err = output(tmp_path, "vm")
    saved = [c.step for c in committed(dest)]
    assert len(saved) == 1 and f"saved step {saved[0]} on signal" in out
    lines = [line for line in err.splitlines() if "To resume" in line]
    assert len(lines) == 1 and f"step {saved[0]} (checkpoint-{saved[0]}) is in {dest}" in lines[0], err
    assert "SIGINT" in err


def test_a_folder_without_its_marker_is_never_committed(tmp_path):
    dest, watch = tmp_path / "dest", tmp_path / "out"
    args = guard_args(watch, dest, "--", sys.executable, SCRIPT, "--out", str(watch), "--steps", "100",
                      "--save-every", "2", "--half-at", "5", "--sleep", "0.05", resume=None)
    guard = start(args, vm_env(tmp_path, "vm"), tmp_path, "vm")
    wait_until(lambda: (watch / "checkpoint-5" / "model.bin").exists(), 60, "the half-written folder", guard)
    wait_until(lambda: [c.step for c in committed(dest)] == [2, 4], 30, "steps 2 and 4 committed", guard)
    import time
    time.sleep(1.5)   # five settle times and more: the folder without trainer_state.json stays uncommitted
    guard.send_signal(signal.SIGTERM)
    assert guard.wait(30) == 128 + signal.SIGTERM
    assert [c.step for c in committed(dest)] == [2, 4]


def test_retries_relaunch_a_crashed_script_from_the_newest_commit(tmp_path):
    dest, watch = tmp_path / "dest", tmp_path / "out"
    args = guard_args(watch, dest, "--retries", "1", "--", sys.executable, SCRIPT, "--out", str(watch), "--steps",
                      "12", "--save-every", "3", "--crash-at", "8", "--sleep", "0.1")
    guard = start(args, vm_env(tmp_path, "vm"), tmp_path, "vm")
    assert guard.wait(60) == 0, output(tmp_path, "vm")
    out, err = output(tmp_path, "vm")
    assert "crash at step 8" in err and "relaunching (1 of 1)" in err
    assert "resumed from step 6" in out and result(watch)["started_from"] == 6
    assert result(watch)["value"] == reference(tmp_path, 12)


def test_without_retries_a_crash_is_the_guards_exit_status(tmp_path):
    dest, watch = tmp_path / "dest", tmp_path / "out"
    args = guard_args(watch, dest, "--", sys.executable, SCRIPT, "--out", str(watch), "--steps", "12",
                      "--crash-at", "2", "--sleep", "0")
    assert subprocess.run(args, env=vm_env(tmp_path, "vm"), capture_output=True).returncode == 3


def test_output_streams_unchanged_and_the_exit_status_passes_through(tmp_path):
    watch = tmp_path / "out"
    script = [sys.executable, SCRIPT, "--out", str(watch), "--steps", "3", "--sleep", "0", "--exit-code", "7",
              "--save-every", "100"]
    bare = subprocess.run(script, capture_output=True)
    (watch / "result.json").unlink()
    guarded = subprocess.run(guard_args(watch, tmp_path / "dest", "--", *script, resume=None),
                             env=vm_env(tmp_path, "vm"), capture_output=True)
    assert (bare.returncode, guarded.returncode) == (7, 7)
    assert guarded.stdout == bare.stdout and b"\rstep 2/3\rstep 3/3" in guarded.stdout
    assert bare.stderr in guarded.stderr


def test_in_a_notebook_output_is_copied_to_the_cell_as_it_comes(tmp_path, capfd):
    """sys.stdout is not the process's (a notebook cell, here pytest's capture): the script's bytes are copied
    through, carriage returns included, and run() returns its exit status."""
    import colabkit.guard
    watch = tmp_path / "out"
    status = colabkit.guard.run([sys.executable, SCRIPT, "--out", str(watch), "--steps", "3", "--sleep", "0",
                                 "--exit-code", "4", "--save-every", "100"], watch=watch, to=tmp_path / "dest",
                                deadline=None, settle=0.2, every=0.2, verbose=False)
    out, err = capfd.readouterr()
    assert status == 4
    assert "\rstep 1/3\rstep 2/3\rstep 3/3\ndone at step 3" in out and "a line on stderr" in err


def test_nothing_to_restore_leaves_the_resume_argument_out_or_passes_fresh_arg(tmp_path, capfd):
    import colabkit.guard
    watch = tmp_path / "out"
    script = f"{sys.executable} {SCRIPT} --out {watch} --steps 2 --sleep 0 --save-every 1"
    assert colabkit.guard.run(script, watch=watch, to=tmp_path / "dest", deadline=None, settle=0.1, every=0.1,
                              resume_arg="--resume_from_checkpoint={latest}", fresh_arg="--save-every 2") == 0
    out, err = capfd.readouterr()
    assert "resumed" not in out and "nothing to restore" in err
    assert not (watch / "checkpoint-1").exists() and (watch / "checkpoint-2").exists()   # --save-every 2 was passed
