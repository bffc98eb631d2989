"""colabkit guard around real PyTorch scripts, killed -9 with the guard mid-run (a reclaimed VM), resumed on a fresh
VM from the destination: a plain script that rewrites last.pt in place (torch.save) and an `accelerate launch`
script that saves accelerator.save_state(step_N). Each ends with exactly the parameters of an uninterrupted run."""
import shutil
import subprocess
import sys

import pytest

from tests.guard.helpers import (SCRIPTS, committed, guard_args, kill_tree, output, result, start, vm_env,
                                 wait_until)

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.subprocess_kill]


def _kill_then_resume(tmp_path, command, resume, first_commit, steps):
    """Start the guarded command on VM 1 (the reference run without the guard beside it), kill the tree once
    ``first_commit`` is committed, then run it on VM 2; (reference result, VM 2 result, VM 2 stdout, newest)."""
    dest = tmp_path / "drive" / "run"
    ref_out = tmp_path / "reference"
    reference = subprocess.Popen(command(ref_out, 0.0), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watch1 = tmp_path / "vm1" / "out"
    guard = start(guard_args(watch1, dest, "--", *command(watch1, 0.3), resume=resume), vm_env(tmp_path, "vm1"),
                  tmp_path, "vm1")
    wait_until(lambda: any(c.step >= first_commit for c in committed(dest)), 120, "a commit", guard)
    kill_tree(guard)
    newest = max(c.step for c in committed(dest))
    assert newest < steps and not (watch1 / "result.json").exists()
    shutil.rmtree(tmp_path / "vm1")   # the VM's disk is gone
    watch2 = tmp_path / "vm2" / "out"
    guard = start(guard_args(watch2, dest, "--", *command(watch2, 0.0), resume=resume), vm_env(tmp_path, "vm2"),
                  tmp_path, "vm2")
    assert guard.wait(120) == 0, output(tmp_path, "vm2")
    assert reference.wait(120) == 0
    return result(ref_out), result(watch2), output(tmp_path, "vm2")[0], newest


def test_plain_script_rewriting_last_pt_resumes_on_a_fresh_vm_to_the_uninterrupted_result(tmp_path):
    def command(out, sleep):
        return [sys.executable, str(SCRIPTS / "plain_train.py"), "--out", str(out), "--steps", "40",
                "--save-every", "5", "--sleep", str(sleep)]
    ref, resumed, out, newest = _kill_then_resume(tmp_path, command, "--resume {latest}", 1, 40)
    # last.pt carries no step in its name: it is counted (1, 2, ...); the script's own step is inside the file
    assert resumed["started_from"] > 0 and f"resumed from step {resumed['started_from']}" in out
    assert resumed["started_from"] % 5 == 0 and resumed["started_from"] < 40
    assert resumed["params"] == ref["params"]


def test_accelerate_launch_script_resumes_on_a_fresh_vm_to_the_uninterrupted_result(tmp_path):
    accelerate = shutil.which("accelerate", path=str(__import__("pathlib").Path(sys.executable).parent))
    if accelerate is None:
        pytest.skip("accelerate is not installed")

    def command(out, sleep):
        return [accelerate, "launch", "--num_processes", "1", "--cpu", "--mixed_precision", "no",
                "--num_machines", "1", "--dynamo_backend", "no", str(SCRIPTS / "accel_train.py"),
                "--output_dir", str(out), "--steps", "30", "--checkpointing_steps", "5", "--sleep", str(sleep)]
    ref, resumed, out, newest = _kill_then_resume(tmp_path, command, "--resume_from_checkpoint={latest}", 10, 30)
    assert resumed["started_from"] == newest and f"resumed from step {newest}" in out
    assert resumed["params"] == ref["params"]
