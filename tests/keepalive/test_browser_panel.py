"""Real frontends, real browser: JupyterLab 4 and Notebook 7 on 127.0.0.1 started here, the notebook opened in
headless Chromium.

Runs `%load_ext colabkit`, `%colabkit`, `%keepalive`, `%keepalive --script` (and `--reconnect`), a checkpoint,
and a cell that runs for a while; asserts
the status panel renders and updates while that cell keeps the kernel busy, presence is "attached" while the
page is open and "absent" soon after it is closed (the cell still running), the copy button copies the
keep-alive script, and the browser console shows no errors. Saves a screenshot of the panel (to
notebooks/status_panel.png when COLABKIT_UPDATE_SCREENSHOTS=1, for the README)."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from colabkit import keepalive
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ABSENCE_BOUND_S = 15.0
# Read at import: the autouse isolated_env fixture removes COLABKIT_* variables before each test runs.
UPDATE_SCREENSHOT = os.environ.get("COLABKIT_UPDATE_SCREENSHOTS") == "1"


def notebook(cells: list[str]) -> dict:
    return {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
                     "language_info": {"name": "python"}},
        "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "outputs": [],
                   "source": src} for i, src in enumerate(cells)],
    }


def read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


APP_READY = """() => {
  const app = window.jupyterapp;
  const panel = app && app.shell && app.shell.currentWidget;
  const kernel = panel && panel.sessionContext && panel.sessionContext.session && panel.sessionContext.session.kernel;
  return !!kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
}"""


# Where each frontend opens a notebook from its URL (both expose window.jupyterapp when asked to).
FRONTENDS = {"notebook": "notebooks/", "jupyterlab": "lab/tree/"}


@pytest.mark.parametrize("app", ["notebook", "jupyterlab"])
def test_panel_presence_and_keepalive_in_a_real_browser(chromium, start_server, tmp_path, app):
    started = time.monotonic()
    presence_log, stop_file = tmp_path / "presence.jsonl", tmp_path / "stop"
    server = start_server(app, env={
        # Colab-like clock so the panel shows every row; presence itself is real.
        "COLABKIT_RUNTIME_CAP": "12h", "COLABKIT_IDLE_CUTOFF": "90min",
        "COLABKIT_DRIVE_ROOT": str(tmp_path / "drive")})
    long_cell = (
        "import json, os, time\nimport colabkit\n"
        f"log, stop = open({str(presence_log)!r}, 'a'), {str(stop_file)!r}\n"
        "t0 = time.time()\n"
        "while time.time() - t0 < 90 and not os.path.exists(stop):\n"
        "    p = colabkit.presence()\n"
        "    log.write(json.dumps({'t': time.time(), 'state': p.state, 'connections': p.connections}) + '\\n')\n"
        "    log.flush()\n"
        "    time.sleep(0.25)\n"
        "print('long cell done')")
    cells = ["%load_ext colabkit", "%colabkit", "%keepalive --poll 1s", "%keepalive --reconnect --script --poll 1s",
             "%keepalive --script --poll 1s",
             ("import numpy as np, colabkit\n"
              "ck = colabkit.widgets.track(colabkit.Checkpoints('drive:runs/mnist'))\n"
              "ck.save(1200, {'weights': np.zeros(1000, 'float32')}, epoch=3, wait=True)"),
             long_cell]
    (server.root / "panel.ipynb").write_text(json.dumps(notebook(cells)))

    context = chromium.new_context(viewport={"width": 1100, "height": 900},
                                   permissions=["clipboard-read", "clipboard-write"])
    page = context.new_page()
    console = []
    page.on("console", lambda m: console.append((m.type, m.text, m.location.get("url", ""))))
    page.on("pageerror", lambda e: console.append(("pageerror", str(e), "")))
    try:
        page.goto(f"{server.url}{FRONTENDS[app]}panel.ipynb?token={server.token}")
        page.wait_for_function(APP_READY, timeout=60_000)
        # The frontend itself may log an error while the page loads (Notebook 7: a settings-schema TypeError in
        # notebook_core, with or without colabkit); everything logged from here on comes after our cells ran.
        at_load = list(console)
        # Not awaited: the command's promise settles only when every cell has run.
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

        # The panel renders, and presence says a browser is attached.
        panel = page.locator(".colabkit-status")
        assert wait_for(lambda: panel.is_visible(), 60), "the status panel did not render"
        rendered_at = time.monotonic()
        assert wait_for(lambda: presence_log.exists(), 60), "the long cell did not start"
        print(f"\npage ready and panel rendered {rendered_at - started:.1f} s after the test started")
        browser_row = panel.locator("[data-row=browser] td.v")
        assert wait_for(lambda: browser_row.inner_text().startswith("attached (1 browser connection)"), 10), \
            browser_row.inner_text()
        kid = next(s["kernel"]["id"] for s in server.api("api/sessions") if s["path"].endswith("panel.ipynb"))
        # The page's own mark of a running cell: the server's execution_state follows the kernel's last status
        # message, and a request the page sends while it connects (kernel info, comms) can make that "idle"
        # for a moment while the cell still runs.
        long_prompt = page.locator(".jp-Cell").nth(len(cells) - 1).locator(".jp-InputPrompt")
        assert "[*]" in long_prompt.inner_text(), long_prompt.inner_text()
        assert {e["state"] for e in read_log(presence_log)} == {"attached"}

        # It updates from its thread while the long cell keeps the kernel's shell busy.
        updated = panel.locator(".colabkit-updated")
        first = updated.inner_text()
        assert wait_for(lambda: updated.inner_text() != first, 8), f"panel stuck at {first!r}"
        assert "[*]" in long_prompt.inner_text(), long_prompt.inner_text()
        rows = {r: panel.locator(f"[data-row={r}] td.v").inner_text() for r in
                ("environment", "idle", "keepalive", "checkpoint", "next_save")}
        assert rows["environment"].startswith("jupyter · VM age")
        assert "left of a 12h 00m cap" in panel.inner_text()
        assert rows["idle"].startswith("90min · not counting (a browser is attached)")
        assert rows["keepalive"].startswith("on since")
        assert rows["checkpoint"].startswith("step 1200 (epoch 3) · ") and \
            rows["checkpoint"].endswith("uploaded to drive:runs/mnist")
        assert "before the 12h 00m runtime cap (jupyter): save, then stop" in rows["next_save"]
        bar = panel.locator(".colabkit-cap-bar .progress-bar")
        assert bar.is_visible() and 0 < float(bar.evaluate("e => parseFloat(e.style.width)")) < 100

        # %keepalive outside Colab: one line saying what applies here and what presence detection sees.
        cell_outputs = page.locator(".jp-Cell").nth(2).locator(".jp-OutputArea-output")
        text = cell_outputs.first.inner_text()
        assert text.startswith("colabkit: an idle cutoff of 90min applies here (jupyter)")
        assert "Presence detection started (every 1s): attached (1 browser connection)" in text

        # %keepalive --reconnect --script: the script that reconnects, and the text says what that costs.
        panels = page.locator(".colabkit-keepalive")
        assert wait_for(lambda: panels.count() == 2, 10), panels.count()
        opted = panels.nth(0)
        assert opted.locator("a.colabkit-bookmarklet").get_attribute("href") == \
            keepalive.bookmarklet("60s", reconnect=True)
        assert "reconnects, which gives you a fresh VM with an empty disk" in opted.inner_text()

        # %keepalive --script: the panel with the bookmarklet and a working copy button.
        ka = panels.nth(1)
        assert ka.locator("a.colabkit-bookmarklet").get_attribute("href") == keepalive.bookmarklet("60s")
        text = ka.inner_text()
        assert "does not lift the runtime cap" in text and "it does not reconnect" in text
        assert "everything since your last checkpoint" in text
        assert "Colab extension for VS Code" in text and "Colab CLI" in text
        ka.locator("button.colabkit-copy").click()
        assert wait_for(lambda: ka.locator("button.colabkit-copy").inner_text() == "Copied", 5)
        assert page.evaluate("navigator.clipboard.readText()") == keepalive.script("60s")

        shot = tmp_path / "status_panel.png"
        panel.scroll_into_view_if_needed()
        panel.screenshot(path=str(shot))
        assert shot.stat().st_size > 5_000
        if UPDATE_SCREENSHOT and app == "notebook":
            shutil.copyfile(shot, REPO / "notebooks" / "status_panel.png")

        errors = [m for m in console[len(at_load):] if m[0] in ("error", "pageerror")]
        assert errors == [], errors
        assert [m for m in at_load if m[0] in ("error", "pageerror") and
                any(word in m[1].lower() for word in ("colabkit", "widget", "keepalive"))] == []
    finally:
        closed_at = time.time()
        page.close()
        context.close()

    # The page is gone: presence turns "absent" within a bounded time, the cell still running.
    def absent_entry():
        return next((e for e in read_log(presence_log) if e["state"] == "absent" and e["t"] > closed_at), None)

    entry = wait_for(absent_entry, ABSENCE_BOUND_S + 5)
    assert entry is not None, "presence never turned absent after the page was closed"
    latency = entry["t"] - closed_at
    print(f"\nabsence detected {latency:.2f} s after the page closed (poll 1s)")
    assert latency < ABSENCE_BOUND_S
    assert entry["connections"] == 0
    assert server.api(f"api/kernels/{kid}")["execution_state"] == "busy"
    n = len(read_log(presence_log))
    assert wait_for(lambda: len(read_log(presence_log)) > n + 2, 5), "the cell stopped running"

    stop_file.touch()
    assert wait_for(lambda: server.api(f"api/kernels/{kid}")["execution_state"] == "idle", 20)
    total = time.monotonic() - started
    print(f"browser test took {total:.1f} s")
