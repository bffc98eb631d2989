"""Run by test_tensorflow.py in a subprocess (one TensorFlow import for all checks); prints a JSON report.

Expects the GPU stand-ins (2 fake GPUs) on PATH / PYTHONPATH; TensorFlow itself sees no GPU on this machine.
"""
import json
import logging
import os
import warnings

import tensorflow as tf

import colabkit
from colabkit import devices
from colabkit.devices.apply import _tf_state

lines = []
handler = logging.Handler()
handler.emit = lambda record: lines.append(record.getMessage())
logging.getLogger("colabkit").addHandler(handler)
report = {"state_at_import": _tf_state(tf)}

chosen = colabkit.use_gpus(1)
report["chosen"] = [g.index for g in chosen]
report["env_after_choice"] = os.environ.get("CUDA_VISIBLE_DEVICES")
report["state_after_choice"] = _tf_state(tf)  # use_gpus must not make TensorFlow touch its devices

strategy = colabkit.strategy()
report["strategy"] = type(strategy).__name__
report["default_strategy"] = strategy is tf.distribute.get_strategy() and not tf.distribute.has_strategy()
report["replicas"] = strategy.num_replicas_in_sync
with colabkit.device(0) as name:
    report["device0"] = [name, tf.constant(1.0).device]
with colabkit.device(1) as name:
    report["device1"] = name
try:
    with colabkit.device(-1):
        pass
except devices.GPUSelectionError as exc:
    report["device_negative"] = str(exc)
report["state_after_strategy"] = _tf_state(tf)

try:
    colabkit.use_gpus("0")
    report["late_choice"] = "no error"
except devices.DevicesAlreadyInitialized as exc:
    report["late_choice"] = str(exc)
report["env_after_late_choice"] = os.environ.get("CUDA_VISIBLE_DEVICES")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    colabkit.use_gpus("0", strict=False)
report["late_choice_lenient"] = [str(w.message) for w in caught]
report["env_after_lenient"] = os.environ.get("CUDA_VISIBLE_DEVICES")
colabkit.use_gpus("0")  # what is already in force: nothing to change, no error
report["log"] = lines
print("REPORT " + json.dumps(report))
