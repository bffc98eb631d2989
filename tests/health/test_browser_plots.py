"""Real frontend, real browser: Notebook 7 started here, headless Chromium, a cell that trains a Keras model.

`%monitor --refresh 1s` shows the live plots (and `%colabkit`'s status panel gains them); while the training cell keeps the kernel busy the plot image is
redrawn and the step count grows; the verdict names the Python generator; the console shows no errors.
Saves a screenshot (to notebooks/health_plots.png when COLABKIT_UPDATE_SCREENSHOTS=1, for the README)."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.keepalive.test_browser_panel import APP_READY, notebook
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
UPDATE_SCREENSHOT = os.environ.get("COLABKIT_UPDATE_SCREENSHOTS") == "1"

TRAIN = """
import os, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np, keras, colabkit
rng = np.random.default_rng(0)
x, y = rng.random((512, 32), dtype="float32"), rng.random((512, 1), dtype="float32")
def batches():
    while True:
        time.sleep(0.02)            # slow CPU-side loading: input-bound
        i = rng.integers(0, 480)
        yield x[i:i + 32], y[i:i + 32]
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
model.compile("adam", "mse")
class UntilReleased(keras.callbacks.Callback):   # trains until the test says stop, however fast this machine is
    def on_epoch_end(self, epoch, logs=None):
        self.model.stop_training = os.path.exists(os.environ["RELEASE"])
monitor = colabkit.keras.Monitor(sample_every="0.5s", verbose=0)
model.fit(batches(), epochs=10_000, steps_per_epoch=50, verbose=0,
          validation_data=(x[:128], y[:128]), callbacks=[monitor, UntilReleased()])
print("fit", "done", "steps", monitor.report()["steps"])
"""


def test_live_plots_update_while_a_cell_trains(chromium, start_server, tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tensorflow")
    # GPU figures from the NVML stand-in (a throttling RTX 3090), so the GPU plot and verdict have data here
    standins = REPO / "tests" / "standins" / "gpu"
    server = start_server("notebook", env={
        "RELEASE": str(tmp_path / "release"), "COLABKIT_TEST_GPUS": str(standins / "scenarios" / "throttling.json"),
        "PYTHONPATH": os.pathsep.join([str(standins), str(REPO), os.environ.get("PYTHONPATH", "")])})
    (server.root / "health.ipynb").write_text(json.dumps(notebook(["%load_ext colabkit", "%monitor --refresh 1s",
                                                                    "%colabkit", TRAIN])))
    context = chromium.new_context(viewport={"width": 960, "height": 1500})
    page = context.new_page()
    console = []
    page.on("console", lambda m: console.append((m.type, m.text)))
    page.on("pageerror", lambda e: console.append(("pageerror", str(e))))
    try:
        page.goto(f"{server.url}notebooks/health.ipynb?token={server.token}")
        page.wait_for_function(APP_READY, timeout=60_000)
        at_load = len(console)
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
        panel = page.locator(".jp-Cell").nth(1).locator(".colabkit-health")
        assert wait_for(lambda: panel.is_visible(), 60), "the health panel did not render"
        image = panel.locator("img.colabkit-health-plot")
        steps = panel.locator(".colabkit-health-steps")
        assert wait_for(lambda: steps.count() and int(steps.get_attribute("data-steps")) > 0, 90), \
            "no training steps reached the panel"
        kid = next(s["kernel"]["id"] for s in server.api("api/sessions") if s["path"].endswith("health.ipynb"))
        seen_src, seen_steps = {image.get_attribute("src")}, {int(steps.get_attribute("data-steps"))}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (len(seen_src) < 3 or len(seen_steps) < 3):
            seen_src.add(image.get_attribute("src"))
            seen_steps.add(int(steps.get_attribute("data-steps")))
            time.sleep(0.3)
        assert len(seen_src) >= 3 and len(seen_steps) >= 3, (len(seen_src), sorted(seen_steps))
        train_cell = page.locator(".jp-Cell").nth(3)
        # the %colabkit status panel shows the same plots and a training-health row once the monitor runs
        status = page.locator(".colabkit-status")
        assert wait_for(lambda: status.locator("img.colabkit-health-plot").is_visible(), 20)
        assert "input-bound" in status.locator("[data-row=health] td.v").inner_text()
        text = train_cell.inner_text()
        assert text.startswith("[*]") and "fit done" not in text, f"training ended too early: {text[-2000:]}"
        assert image.evaluate("e => e.naturalWidth") > 300
        verdict = panel.locator(".colabkit-health-verdict")
        assert wait_for(lambda: "input-bound" in verdict.inner_text(), 30), verdict.inner_text()
        assert "Python generator" in verdict.inner_text()
        assert "thermal throttling: GPU 0 (NVIDIA GeForce RTX 3090)" in panel.inner_text()
        energy = panel.locator(".colabkit-health-energy")   # what the fit cost so far, from the GPU's power draw
        assert wait_for(lambda: energy.count() and "kWh" in energy.inner_text(), 30), panel.inner_text()
        shot = tmp_path / "health_plots.png"
        panel.scroll_into_view_if_needed()
        panel.screenshot(path=str(shot))
        assert shot.stat().st_size > 10_000
        if UPDATE_SCREENSHOT:
            shutil.copyfile(shot, REPO / "notebooks" / "health_plots.png")
        errors = [m for m in console[at_load:] if m[0] in ("error", "pageerror")]
        assert errors == [], errors
        # training finishes when released (no failure from the plot thread); the panel shows the final figures
        (tmp_path / "release").write_text("stop")
        assert wait_for(lambda: "fit done" in train_cell.inner_text(), 120), train_cell.inner_text()[-2000:]
        final = int(train_cell.inner_text().split("fit done steps", 1)[1].split()[0])
        assert final % 50 == 0 and final >= 50
        assert wait_for(lambda: int(steps.get_attribute("data-steps")) == final, 10)
    finally:
        page.close()
        context.close()
    assert server.api(f"api/kernels/{kid}")["execution_state"] == "idle"
