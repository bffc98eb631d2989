"""Idle-aware checkpointing: with a short idle cutoff and no browser ever attached to the kernel, a Keras run
with AutoResume(deadline="auto") commits a checkpoint to its destination before the cutoff, and keeps training.

The kernel is started through a real Jupyter Server's REST API and driven over its own ZMQ ports, so the
server counts no browser connection: exactly the state of a runtime whose tab was closed before colabkit
looked. No browser was ever seen, so the time of the last browser contact is unknown: the cutoff that counts is
the one measured from the kernel's start (the earliest moment a browser can have left), not from when
presence detection happened to start, and the setup cell takes a while so that the two differ."""
from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.slow

SETUP_S = 12      # the kernel is busy this long (data loading, say) before keep-alive starts
# The cutoff lies this long after keep-alive starts, counted from the kernel's request. It covers building the
# model, fit() reaching its first batches on a loaded 2-core machine, the 8 s deadline margin and the upload.
AFTER_SETUP_S = 25

TRAINING = r"""
import json, os, time
import numpy as np
import keras
import colabkit
from colabkit import presence

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
x, y = np.random.rand(4000, 8).astype("float32"), np.random.rand(4000, 1).astype("float32")

# The cutoff as the platform would count it with no browser ever attached: from the kernel's start, which the
# test bounds from above by the time it asked the server for the kernel.
cutoff_s = int(time.time() - float(os.environ["REQUESTED_AT"])) + int(os.environ["AFTER_SETUP_S"])
os.environ["COLABKIT_IDLE_CUTOFF"] = f"{cutoff_s}s"
cutoff_at = float(os.environ["REQUESTED_AT"]) + cutoff_s
colabkit.keepalive("60s", poll="0.5s")          # presence detection + the idle clock
absent_since = presence.running_monitor().current.since

class Pace(keras.callbacks.Callback):
    # ~50 ms a batch, and stop a little after the cutoff would have struck
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.05)
        if time.time() > cutoff_at + 2:
            self.model.stop_training = True

cb = colabkit.keras.AutoResume(os.environ["CKPT_DIR"], deadline="auto", deadline_margin="8s")
colabkit.widgets.track(cb)
model.fit(x, y, batch_size=8, epochs=1, callbacks=[Pace(), cb], verbose=0)
status = cb.checkpoints.status
print("RESULT" + json.dumps({
    "absent_since": absent_since, "cutoff_at": cutoff_at, "cutoff_s": cutoff_s, "ended_at": time.time(),
    "presence_text": presence.running_monitor().current.text(), "kernel_started_at": presence.kernel_started_at(),
    "presence": [presence.running_monitor().current.state, presence.running_monitor().current.connections],
    "events": cb.events,
    "uploaded_step": status.last_uploaded.step if status.last_uploaded else None,
    "panel": colabkit.widgets.text(),
}))
"""


def test_idle_save_before_the_cutoff_with_no_browser(start_server, kernel_client, run_code, tmp_path):
    pytest.importorskip("keras")
    destination = tmp_path / "ckpt"
    server = start_server(env={"COLABKIT_IDLE_CUTOFF": "90min"})
    requested_at = time.time()
    kid = server.api("api/kernels", "POST", {"name": "python3"})["id"]
    client = kernel_client(server, kid)
    # The kernel keeps busy for a while (imports, data loading) before keep-alive is switched on, so the kernel's
    # last activity is well after its start.
    setup = run_code(client, f"import os, time\nos.environ['CKPT_DIR'] = {str(destination)!r}\n"
                             f"os.environ['REQUESTED_AT'] = {str(requested_at)!r}\n"
                             f"os.environ['AFTER_SETUP_S'] = '{AFTER_SETUP_S}'\n"
                             "import keras, numpy\n"
                             f"time.sleep(max(0.0, {requested_at} + {SETUP_S} - time.time()))")
    assert setup["error"] is None, setup["error"]

    out = run_code(client, TRAINING, timeout=240)
    assert out["error"] is None, out["error"]
    line = [ln for ln in out["stdout"].splitlines() if ln.startswith("RESULT")][-1]
    result = json.loads(line[len("RESULT"):])
    assert server.api(f"api/kernels/{kid}")["connections"] == 0
    assert result["presence"] == ["absent", 0]
    # No browser was ever seen: the absence is dated from the kernel's start, and the text says it is a guess.
    assert requested_at <= result["absent_since"] <= requested_at + SETUP_S / 2, result
    assert result["absent_since"] == pytest.approx(result["kernel_started_at"], abs=0.01)
    assert "no browser seen yet" in result["presence_text"], result["presence_text"]
    from colabkit.presence import idle_label
    cutoff = idle_label(result["cutoff_s"])

    idle_saves = [(t, detail) for t, kind, detail in result["events"]
                  if kind == "deadline-save" and f"before the {cutoff} idle cutoff" in detail]
    assert len(idle_saves) == 1, result["events"]   # once per absence, not once per batch
    saved_at, detail = idle_saves[0]
    step = int(detail.split()[1])
    # The save returned (it waits for the upload) before the cutoff, and training went on past the cutoff.
    assert saved_at < result["cutoff_at"], (saved_at, result["cutoff_at"])
    assert result["ended_at"] > result["cutoff_at"]
    assert not any(kind == "stop" for _, kind, _ in result["events"])
    assert f"saved step {step} before the {cutoff} idle cutoff; training continues" in out["stdout"]

    # Committed on the destination (manifest last) before the cutoff.
    from colabkit.checkpoints.folder import CheckpointFolder
    from colabkit.checkpoints.manifest import MANIFEST_NAME
    committed = {c.step: c.path / MANIFEST_NAME for c in CheckpointFolder(destination).committed()}
    assert step in committed, sorted(committed)
    assert committed[step].stat().st_mtime < result["cutoff_at"]
    assert result["uploaded_step"] >= step

    # The status panel's text form shows when it happened.
    assert "last deadline save" in result["panel"] and f"before the {cutoff} idle cutoff" in result["panel"]
    assert "unless a browser returns (at the earliest: no browser seen yet)" in result["panel"], result["panel"]
    print(f"\nidle save of step {step} committed {result['cutoff_at'] - saved_at:.1f} s before the "
          f"{cutoff} cutoff (absence began {time.strftime('%H:%M:%S', time.localtime(result['absent_since']))})")
