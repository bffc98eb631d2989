"""The guard's stop and exit, as the script and a fresh VM see them: the stop signal reaches each process once
(a script saving in ``except KeyboardInterrupt`` finishes its save), a periodic checkpoint that was settling at
the stop does not cut the final save short, a folder the script died in the middle of is never committed, and
after a normal or crashed exit one line says where the checkpoint is. The scripts report where they are with
marker files (tests/guard/scripts/stopper.py); the tests wait on those, not on time."""
import os
import signal
import sys
import threading

from tests.guard.helpers import SCRIPTS, committed, guard_args, output, start, vm_env, wait_until

STOPPER = str(SCRIPTS / "stopper.py")


def _restore(dest, tmp_path, monkeypatch):
    """What a fresh VM gets back from ``dest``."""
    import colabkit
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "fresh-cache"))
    return colabkit.Checkpoints(str(dest)).restore_folder(tmp_path / "fresh")


def test_a_shell_command_saving_on_keyboard_interrupt_gets_one_sigint_and_its_save_is_committed(
        tmp_path, monkeypatch, capfd):
    """A shell-string command (as %%guard runs): the script is in the shell's process group. It gets SIGINT once;
    a second one (sent only after it caught the first: the wrapper below waits for that) would abort its save."""
    import colabkit.guard
    from colabkit.guard import launch
    dest, watch, marks = tmp_path / "dest", tmp_path / "out", tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SCRIPTS.parents[2]), os.environ.get("PYTHONPATH", "")]))
    killpg, signal_tree = os.killpg, launch.Child.signal

    def killpg_then_wait(pgid, sig):   # the group has it; anything sent after reaches a script in its except
        killpg(pgid, sig)
        if sig == signal.SIGINT:
            wait_until(lambda: (marks / "caught").exists(), 30, "the script caught SIGINT")

    def signal_then_go(self, sig):
        signal_tree(self, sig)
        if sig == signal.SIGINT:
            (marks / "go").touch()   # the guard has sent everything it sends: the script saves now
    monkeypatch.setattr(launch.os, "killpg", killpg_then_wait)
    monkeypatch.setattr(launch.Child, "signal", signal_then_go)

    def ctrl_c():   # the user presses Ctrl-C once the script runs
        wait_until(lambda: (marks / "ready").exists(), 30, "the script started")
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=ctrl_c, daemon=True).start()
    command = f"{sys.executable} {STOPPER} interrupt --out {watch} --marks {marks}; echo shell-went-on"
    colabkit.guard.run(command, watch=watch, to=str(dest), deadline=None, settle=0.2, every=0.1, grace="30s")
    out, err = capfd.readouterr()
    assert "saved step 1 on KeyboardInterrupt" in out, (out, err)
    assert [c.step for c in committed(dest)] == [1], err
    restored = _restore(dest, tmp_path, monkeypatch)
    assert (restored.path / "trainer_state.json").exists()


def test_a_periodic_checkpoint_settling_at_the_stop_does_not_cut_the_final_save_short(tmp_path):
    dest, watch, marks = tmp_path / "dest", tmp_path / "out", tmp_path / "marks"
    marks.mkdir()
    # settle 2 s: checkpoint-1 (written just before "ready") is still settling when the guard gets SIGINT
    args = guard_args(watch, dest, "--grace", "40s", "--settle", "2", "--", sys.executable, STOPPER, "periodic",
                      "--out", str(watch), "--marks", str(marks), "--dest", str(dest), resume=None)
    guard = start(args, vm_env(tmp_path, "vm"), tmp_path, "vm")
    wait_until(lambda: (marks / "ready").exists(), 30, "the script started", guard)
    guard.send_signal(signal.SIGINT)   # Ctrl-C to the guard
    assert guard.wait(60) == 0, output(tmp_path, "vm")
    out, err = output(tmp_path, "vm")
    assert not (marks / "terminated").exists(), err
    assert "saved step 2 on SIGINT" in out, err
    assert [c.step for c in committed(dest)] == [1, 2], err
    assert "step 2 (checkpoint-2) is in" in err


def test_a_folder_the_script_died_in_the_middle_of_is_not_committed_and_the_exit_says_where_the_checkpoint_is(
        tmp_path, monkeypatch):
    """accelerate writes random_states_0.pkl before custom_checkpoint_0.pkl: a script killed between the two
    leaves a folder with its marker that load_state cannot load. A fresh VM must get the whole step_1."""
    dest, watch, marks = tmp_path / "dest", tmp_path / "out", tmp_path / "marks"
    marks.mkdir()
    args = guard_args(watch, dest, "--", sys.executable, STOPPER, "accel", "--out", str(watch), "--marks",
                      str(marks), "--dest", str(dest), resume=None)
    guard = start(args, vm_env(tmp_path, "vm"), tmp_path, "vm")
    assert guard.wait(60) == 1, output(tmp_path, "vm")
    _, err = output(tmp_path, "vm")
    assert (watch / "step_2" / "random_states_0.pkl").exists()
    assert [c.step for c in committed(dest)] == [1], err
    restored = _restore(dest, tmp_path, monkeypatch)
    assert restored.step == 1 and (restored.path / "custom_checkpoint_0.pkl").exists()
    assert f"the training ended with exit status 1; step 1 (step_1) is in {dest}" in err
