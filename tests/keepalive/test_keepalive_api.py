"""colabkit.keepalive() / %keepalive / the status panel without a browser: bad input, on/off, the Colab path
(google.colab stand-in), the panel's rows, and what importing these modules costs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import colabkit
from colabkit import deadline, keepalive, presence, widgets
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]

RUNNER = r"""
import contextlib, io, json, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
results = []
for cell in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        result = shell.run_cell(cell)
    error = result.error_before_exec or result.error_in_exec
    from colabkit import keepalive, presence, deadline
    results.append({"cell": cell, "stdout": out.getvalue(), "stderr": err.getvalue(),
                    "error": type(error).__name__ if error else None,
                    "on": keepalive.is_on(), "describe": keepalive.describe(),
                    "monitor": presence.running_monitor() is not None, "clocks": len(deadline.registered())})
print("RESULTS" + json.dumps(results))
"""


def run_shell(cells, env=None):
    out = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(cells)], capture_output=True, text=True,
                         timeout=120, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULTS")][-1]
    return json.loads(line[len("RESULTS"):])


@pytest.fixture(autouse=True)
def keepalive_off():
    yield
    with_output = keepalive.is_on() or presence.running_monitor() is not None
    if with_output:
        keepalive.keepalive(False)


BAD = {
    "%keepalive 5 parsecs": "%keepalive: keep-alive interval '5 parsecs' is not a duration",
    "%keepalive -5s": "%keepalive: keep-alive interval '-5s' is negative",
    "%keepalive -5": "%keepalive: keep-alive interval '-5' is negative",
    "%keepalive 0": "%keepalive: keep-alive interval '0' is negative or zero",
    "%keepalive 0.5s": "%keepalive: keep-alive interval '0.5s' is too short; use at least 30s",
    "%keepalive 10s": "%keepalive: keep-alive interval '10s' is too short; use at least 30s",
    "%keepalive --poll soon": "%keepalive: poll='soon' is not a valid interval",
}


def test_bad_input_is_one_line_and_changes_nothing(colab_standin):
    # on Colab (the stand-in) the status panel's keep-alive row names the interval and the reconnect choice
    cells = ["import google.colab", "%load_ext colabkit", "%keepalive 30s", *BAD]
    results = run_shell(cells)
    on = results[2]
    assert on["error"] is None and on["on"] and on["monitor"]
    assert "checks every 30s" in on["describe"] and "runtime gone: tells you, no reconnect" in on["describe"]
    for result in results[3:]:
        assert result["error"] == "UsageError", result
        lines = [ln for ln in result["stderr"].splitlines() if ln.strip()]
        assert len(lines) == 1, result["stderr"]
        assert lines[0].startswith("UsageError: " + BAD[result["cell"]]), (result["cell"], lines[0])
        assert "Traceback" not in result["stderr"] and result["stdout"] == ""
        # nothing changed: still on, the same interval and reconnect choice, a monitor running
        assert (result["on"], result["describe"], result["monitor"]) == (True, on["describe"], True)


def test_keepalive_off_and_on_outside_colab():
    results = run_shell(["%load_ext colabkit", "%keepalive", "%keepalive off", "%keepalive off"])
    _, on, off, again = results
    assert on["stdout"].startswith("colabkit: no idle cutoff applies here (script): nothing needs keeping alive. "
                                   "Presence detection started (every 5s): unknown: this Python process is not a "
                                   "Jupyter kernel")
    assert on["stdout"].count("\n") == 1 and on["on"] and on["monitor"]
    assert on["clocks"] == 0   # no idle cutoff here: no idle clock
    assert off["stdout"].startswith("colabkit: keep-alive off") and "stopKeepAlive()" in off["stdout"]
    assert not off["on"] and not off["monitor"] and off["clocks"] == 0
    assert again["stdout"] == "colabkit: keep-alive was not on; nothing to stop.\n"


def test_reconnect_is_an_opt_in_of_the_magic(colab_standin):
    results = run_shell(["import google.colab", "%load_ext colabkit", "%keepalive 45s", "%keepalive --reconnect 45s",
                         "%keepalive 45s"])
    _, _, plain, opted, again = results
    assert all(r["error"] is None for r in results), results
    gone = [r["describe"].partition("runtime gone: ")[2] for r in (plain, opted, again)]
    assert gone == ["tells you, no reconnect); presence monitored", "reconnects); presence monitored",
                    "tells you, no reconnect); presence monitored"], gone
    assert "checks every 45s" in opted["describe"] and opted["on"]


def test_magic_is_documented_by_magic_arguments():
    results = run_shell(["%load_ext colabkit",
                         "from colabkit.magics import ColabkitMagics; print(ColabkitMagics.keepalive.__doc__)"])
    doc = results[1]["stdout"]
    for word in ("%keepalive", "[--reconnect]", "[--no-notify]", "[--script]", "[--poll POLL]", "interval", '"off"', "at least 30s",
                 "fresh VM", "VS Code", "Colab CLI"):
        assert word in doc, doc


def test_colabkit_text_status_lists_the_live_rows():
    results = run_shell(["%load_ext colabkit", "%keepalive 2min", "%colabkit --text"])
    text = results[2]["stdout"]
    assert text.startswith("colabkit: running on script\n")
    for label in ("browser             unknown:", "keep-alive          on since", "last checkpoint     none",
                  "next deadline save  none scheduled"):
        assert label in text, text


def test_the_colab_path_shows_the_script_panel(colab_standin, capsys, monkeypatch):
    import google.colab  # noqa: F401 - now this process looks like a Colab kernel
    from google.colab import _standin
    _standin.CALLS.clear()
    monkeypatch.setattr(sys, "argv", ["python"])  # not a kernel: presence is "unknown"
    keepalive.keepalive("45s")
    out = capsys.readouterr().out
    assert "VBox(" in out   # outside a frontend, display() shows the widget's repr
    assert out.strip().endswith("colabkit: presence detection started (every 5s): unknown: this Python process "
                                "is not a Jupyter kernel started by a notebook server (no kernel-<id>.json "
                                "connection file).")
    assert {"call": "output.enable_custom_widget_manager"} in _standin.CALLS
    m = presence.running_monitor()
    assert m is not None and m.idle_cutoff == 90 * 60 and m in deadline.registered()
    assert m.next_deadline() is None   # presence unknown: no guessed deadline
    assert keepalive.describe().startswith("on since")

    box = keepalive.panel("45s")
    intro, button, code = box.children
    assert code.value == keepalive.script("45s") and '"intervalMs": 45000' in code.value
    assert '"reconnect": false' in code.value
    assert keepalive.bookmarklet("45s").replace("&", "&amp;") in intro.value
    assert "does not lift the runtime cap" in intro.value and "stopKeepAlive()" in intro.value
    assert "does not reconnect" in intro.value and "everything since your last checkpoint" in intro.value
    assert "Colab extension for VS Code" in intro.value and "Colab CLI" in intro.value
    assert "checks every 45s" in keepalive.describe() and "no reconnect" in keepalive.describe()

    keepalive.keepalive("45s", reconnect=True)
    capsys.readouterr()
    assert "runtime gone: reconnects" in keepalive.describe()
    intro, _, code = keepalive.panel("45s", reconnect=True).children
    assert '"reconnect": true' in code.value and "fresh VM" in intro.value
    assert 'class="colabkit-copy"' in button.value and "navigator.clipboard" in button.value
    assert '"notify": true' in code.value

    # notify=False reaches the script the panel hands out (no desktop notification, no tone).
    keepalive.keepalive("45s", notify=False)
    capsys.readouterr()
    intro, _, code = keepalive.panel("45s", notify=False).children
    assert '"notify": false' in code.value and "desktop notification" not in intro.value
    real_panel, seen = keepalive.panel, []
    monkeypatch.setattr(keepalive, "panel", lambda *a, **kw: seen.append(kw) or real_panel(*a, **kw))
    keepalive.keepalive("45s", notify=False)
    capsys.readouterr()
    assert seen == [{"reconnect": False, "notify": False}]


def test_script_and_bookmarklet_forms():
    js = keepalive.script(90)
    assert js.rstrip().endswith('})({"intervalMs": 90000, "jitter": 0.2, "reconnect": false, "notify": true});')
    assert "//" not in js.replace("://", "")
    assert '"reconnect": true' in keepalive.script(90, reconnect=True)
    assert "colab-connect-button" in js and "colab-toolbar-button#connect" in js and "shadowRoot" in js
    assert keepalive.bookmarklet(90).startswith("javascript:%2F%2A")
    with pytest.raises(ValueError, match="not a duration"):
        keepalive.script("soon")


def test_callable_modules_survive_submodule_imports():
    import importlib
    importlib.import_module("colabkit.keepalive")
    importlib.import_module("colabkit.presence")
    assert callable(colabkit.keepalive) and colabkit.keepalive.script is keepalive.script
    assert callable(colabkit.presence) and colabkit.presence.running_monitor is presence.running_monitor


def test_importing_these_modules_loads_no_frontend_or_framework():
    code = ("import sys, colabkit\ncolabkit.keepalive; colabkit.presence; colabkit.widgets\n"
            "colabkit.keepalive.script(); colabkit.presence(); colabkit.widgets.text()\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('ipywidgets', 'IPython', 'tensorflow', 'keras', 'google', 'jupyter_client', 'tornado')]\n"
            "print(sorted(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- the status panel ---------------------------------------------------------------------------------------
def test_panel_rows_follow_checkpoints_and_deadlines(tmp_path, monkeypatch):
    import numpy as np
    monkeypatch.setenv("COLABKIT_RUNTIME_CAP", "1000d")
    panel = widgets.StatusPanel(refresh="1s")
    try:
        table = panel.table.value
        assert "data-row='browser'" in table and "not monitored: run %keepalive" in table
        assert panel.bar_row.layout.display is None and 0 < panel.bar.value < 1
        before = dict((k, v) for k, _, v in widgets.snapshot().rows)["checkpoint"]
        assert before.startswith("none") or before.startswith("step"), before   # stores earlier tests left open

        store = widgets.track(colabkit.Checkpoints(str(tmp_path / "runs" / "a"), local_dir=tmp_path / "local"))
        assert widgets.track(store) is store   # tracking twice is harmless
        store.save(7, {"w": np.ones(3)}, epoch=2, wait=True)
        clock = deadline.FixedClock(__import__("time").time() + 3600, reason="the test budget")
        deadline.register(clock)
        try:
            panel.update()
            rows = dict((k, v) for k, _, v in widgets.snapshot().rows)
            assert rows["checkpoint"].startswith("step 7 (epoch 2) · ")
            assert rows["checkpoint"].endswith(f"uploaded to {tmp_path / 'runs' / 'a'}")
            assert "before the test budget: save, then stop" in rows["next_save"]
            assert "no AutoResume" in rows["next_save"]
            assert "step 7 (epoch 2)" in panel.table.value
        finally:
            deadline.unregister(clock)
            store.close()
    finally:
        panel.close()
    assert panel.closed


def test_panel_without_a_cap_hides_the_bar():
    panel = widgets.StatusPanel()
    try:
        assert panel.bar_row.layout.display == "none"
        assert "no runtime cap here" in widgets.snapshot().cap_text
    finally:
        panel.close()


def test_only_the_newest_panels_stay_live():
    panels = [widgets.StatusPanel(refresh="1s") for _ in range(widgets.MAX_LIVE_PANELS + 1)]
    clock = deadline.FixedClock(__import__("time").time() + 3600, reason="the frozen-panel test's budget")
    try:
        assert "frozen: a newer %colabkit panel is live" in panels[0].header.value
        assert all("frozen: a newer %colabkit panel is live" not in p.header.value for p in panels[1:])
        deadline.register(clock)   # something new to show: the live panels refresh, the frozen one does not
        assert wait_for(lambda: all("frozen-panel test" in p.table.value for p in panels[1:]), 30)
        assert "frozen-panel test" not in panels[0].table.value
    finally:
        deadline.unregister(clock)
        for p in panels:
            p.close()
    assert all(p.closed for p in panels)
