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

