"""A %%guard cell run in a real IPython shell: the cell body is the shell command, its output reaches the cell,
its checkpoint is committed, and the guard's lines say where it is."""
import subprocess
import sys

import pytest

from tests.guard.helpers import committed, vm_env

pytest.importorskip("IPython")

CELL = '''
import sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
assert shell.run_cell("%load_ext colabkit").success
watch, dest = sys.argv[1], sys.argv[2]
body = ("mkdir -p " + watch + "/checkpoint-3 && echo '{}' > " + watch + "/checkpoint-3/trainer_state.json "
        "&& echo trained in the cell")
result = shell.run_cell("%%guard --watch " + watch + " --to " + dest + " --settle 0.1 --every 0.1 "
                        "--deadline off\\n" + body + "\\n")
assert result.success, result.error_in_exec
'''


def test_a_guard_cell_runs_its_command_and_commits_the_checkpoint(tmp_path):
    dest, watch = tmp_path / "dest", tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", CELL, str(watch), str(dest)], env=vm_env(tmp_path, "vm"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "trained in the cell" in done.stdout
    assert [c.step for c in committed(dest)] == [3], done.stderr
    assert f"step 3 (checkpoint-3) is in {dest}" in done.stderr
