"""`%load_ext colabkit` in a real IPython shell (a fresh interpreter per test): load, use, unload, reload."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

RUNNER = r"""
import contextlib, io, json, sys
shell_kind = sys.argv[1]
if shell_kind == "terminal":
    from IPython.terminal.interactiveshell import TerminalInteractiveShell
    shell = TerminalInteractiveShell.instance(simple_prompt=True)
else:
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance()

def state():
    manager = shell.magics_manager
    return {"line": sorted(manager.magics["line"]), "cell": sorted(manager.magics["cell"]),
            "registry": sorted(manager.registry), "extensions": sorted(shell.extension_manager.loaded)}

results = [{"state": state()}]
for cell in json.loads(sys.argv[2]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if cell.startswith("python:"):
            exec(cell[len("python:"):], {"shell": shell})
            result = None
        else:
            result = shell.run_cell(cell)
    error = None if result is None else (result.error_before_exec or result.error_in_exec)
    results.append({"cell": cell, "stdout": out.getvalue(), "stderr": err.getvalue(),
                    "error": type(error).__name__ if error else None, "state": state()})
print("RESULTS" + json.dumps(results))
"""


def run_shell(cells, shell="plain", env=None):
    """Run `cells` in a fresh IPython shell; returns [initial state, {cell, stdout, stderr, error, state}...]."""
    out = subprocess.run([sys.executable, "-c", RUNNER, shell, json.dumps(cells)], capture_output=True,
                         text=True, timeout=120, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULTS")][-1]
    return json.loads(line[len("RESULTS"):])


@pytest.mark.parametrize("shell", ["plain", "terminal"])
def test_load_shows_status_and_unload_removes_exactly_what_load_added(shell):
    initial, loaded, status, unloaded, after = run_shell(
        ["%load_ext colabkit", "%colabkit", "%unload_ext colabkit", "%colabkit"], shell=shell)
    assert "colabkit" not in initial["state"]["line"]
    assert loaded["error"] is None and loaded["stdout"] == ""
    assert "colabkit" in loaded["state"]["line"]
    assert "ColabkitMagics" in loaded["state"]["registry"]
    assert loaded["state"]["extensions"] == ["colabkit"]

    assert status["error"] is None
    text = status["stdout"]
    assert text.startswith("colabkit: running on script\n")
    for label in ("VM age", "runtime     no runtime cap", "idle cutoff none", "drive root", "GPUs"):
        assert label in text
    assert "Traceback" not in status["stderr"]

    assert unloaded["error"] is None
    # magics, registry and extension list as before loading; IPython 9 registers its own ExtensionMagics
    # lazily on the first %load_ext, which is not ours to undo
    lazily_ipython = {"ExtensionMagics"}
    assert {k: v for k, v in unloaded["state"].items() if k != "registry"} == \
        {k: v for k, v in initial["state"].items() if k != "registry"}
    assert set(unloaded["state"]["registry"]) - lazily_ipython == set(initial["state"]["registry"]) - lazily_ipython
    assert after["error"] == "UsageError"
    assert "Line magic function `%colabkit` not found" in after["stderr"]


def test_loading_twice_is_harmless():
    _, first, second, direct, status, unloaded = run_shell([
        "%load_ext colabkit", "%load_ext colabkit",
        "python:import colabkit; colabkit.load_ipython_extension(shell); colabkit.load_ipython_extension(shell)",
        "%colabkit version", "%unload_ext colabkit"])
    assert second["error"] is None
    assert "already loaded" in second["stdout"]
    assert second["state"] == first["state"] == direct["state"]
    assert status["error"] is None
    assert status["stdout"].strip() == f"colabkit {__import__('colabkit').__version__}"
    assert "colabkit" not in unloaded["state"]["line"]
    assert "ColabkitMagics" not in unloaded["state"]["registry"]


def test_reload_and_load_after_unload_work():
    _, loaded, reloaded, unloaded, again, status = run_shell([
        "%load_ext colabkit", "%reload_ext colabkit", "%unload_ext colabkit", "%load_ext colabkit",
        "%colabkit --json"])
    assert reloaded["error"] is None and reloaded["state"] == loaded["state"]
    assert "colabkit" not in unloaded["state"]["line"]
    assert again["state"] == loaded["state"]
    assert json.loads(status["stdout"])["kind"] == "script"


def test_status_json_and_config_subcommands():
    _, _, as_json, config = run_shell(["%load_ext colabkit", "%colabkit status --json", "%colabkit config"])
    data = json.loads(as_json["stdout"])
    assert data["kind"] == "script"
    assert {"vm_age_s", "uptime_source", "runtime_cap_s", "time_left_s", "idle_cutoff_s", "drive_root",
            "gpus"} <= set(data)
    assert "config file:" in config["stdout"]
    assert "keep" in config["stdout"] and "(default)" in config["stdout"]


@pytest.mark.parametrize("line, fragment", [
    ("%colabkit bogus", "invalid choice: 'bogus'"),
    ("%colabkit --frobnicate", "unrecognized arguments: --frobnicate"),
    ("%colabkit status extra", "unrecognized arguments: extra"),
])
def test_bad_arguments_give_a_clean_usage_error(line, fragment):
    _, _, bad = run_shell(["%load_ext colabkit", line])
    assert bad["error"] == "UsageError"
    assert fragment in bad["stderr"]
    assert bad["stderr"].startswith("UsageError: ")
    assert "Traceback" not in bad["stderr"] + bad["stdout"]
    assert len(bad["stderr"].strip().splitlines()) == 1


def test_bad_setting_gives_a_one_line_usage_error(monkeypatch):
    monkeypatch.setenv("COLABKIT_KEEP", "lots")
    _, _, bad = run_shell(["%load_ext colabkit", "%colabkit"])
    assert bad["error"] == "UsageError"
    assert "Traceback" not in bad["stderr"] + bad["stdout"]
    assert bad["stderr"].startswith("UsageError: colabkit: Bad value 'lots' for environment variable COLABKIT_KEEP")
    assert len(bad["stderr"].strip().splitlines()) == 1


def test_magic_help_documents_the_arguments():
    _, _, helped = run_shell(["%load_ext colabkit", "%colabkit?"])
    assert helped["error"] is None
    doc = helped["stdout"]
    assert "%colabkit [--json]" in doc
    assert "Show colabkit's status summary, settings or version." in doc
    assert "{status,config,version}" in doc and "--json" in doc and "status as JSON" in doc


def test_status_on_the_colab_standin_shows_colab_and_unmounted_drive(colab_standin):
    _, _, status = run_shell(["%load_ext colabkit", "import google.colab\n%colabkit"])
    text = status["stdout"]
    assert text.startswith("colabkit: running on colab\n")
    assert "left of a 12h 00m cap" in text
    assert "idle cutoff 1h 30m" in text
    assert "/content/drive/MyDrive (not mounted yet; mounted on first use)" in text
