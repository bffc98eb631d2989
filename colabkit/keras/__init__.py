"""`colabkit.keras`: crash-safe one-line resume for Keras 3 (`AutoResume`) and the training monitor (`Monitor`).

    model.fit(ds, epochs=50, callbacks=[colabkit.keras.AutoResume("drive:runs/mnist")])

The adapter's parts: autoresume.py (the callback: its arguments, when and what it saves), hooks.py (fit()
interception), restore.py (a checkpoint into the model, optimizers, metrics and RNGs), callbacks.py (the other
callbacks' state), state.py (what of a Keras training state a checkpoint holds), tfdata.py (where a tf.data input
stands), frames.py (where fit() is on the call stack), multiworker.py (the workers' agreement). Importing this
package imports Keras.
"""
from __future__ import annotations

from ..resume.schedule import FINAL_WAIT_FLOOR_S  # noqa: F401 - read-only here; it lives in colabkit.resume.schedule
from .autoresume import AutoResume, Monitor

__all__ = ["AutoResume", "Monitor"]
