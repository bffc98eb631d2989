"""Thermal-guard additions to the NVML stand-in: a scenario that changes while a test runs ("live": true), and
the power-limit calls (nvidia-ml-py 12/13 names, signatures, units and errors).

With ``"live": true`` at the top of the scenario, the temperature and clock-event (throttle) reasons calls re-read
the scenario file whenever it changed (a test replaces it with os.replace, atomically) and apply its GPUs' values
to the handles already open, as a real GPU that heats up or cools down would report them.
"""
from __future__ import annotations

import json
import os
import sys

from . import NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NO_PERMISSION, NVML_TEMPERATURE_GPU


def _nvml():
    """The stand-in package as imported now: a test that imports pynvml afresh gets a new package, while this
    module, once imported, stays in sys.modules (so nothing of the old package is bound here)."""
    return sys.modules[__package__]


def _refresh() -> None:
    scenario = _nvml()._need()
    if not scenario.get("live"):
        return
    path = os.environ.get("COLABKIT_TEST_GPUS")
    try:
        st = os.stat(path)
    except (OSError, TypeError):
        return
    key = (st.st_ino, st.st_mtime_ns, st.st_size)
    if key == scenario.get("_seen_file"):
        return
    with open(path) as fh:
        data = json.load(fh)
    for gpu, new in zip(scenario["gpus"], data.get("gpus", [])):
        gpu.update(new)          # in place: open handles hold these dicts
        for gone in set(gpu) - set(new):
            del gpu[gone]
    scenario["_seen_file"] = key


def nvmlDeviceGetTemperature(handle, sensor):
    _refresh()
    nv = _nvml()
    if sensor != NVML_TEMPERATURE_GPU:
        raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
    if handle._instance is not None:
        raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
    return nv._field(nv._record(handle), "temperature")


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    _refresh()
    return _nvml()._reasons(_nvml()._whole_gpu(handle))


def nvmlDeviceGetCurrentClocksThrottleReasons(handle):   # the name before driver 535
    return nvmlDeviceGetCurrentClocksEventReasons(handle)


# -- setting the power limit (the getters and the "power_limit", "power_limit_default" and
# "power_limit_constraints" keys are _doctor.py's): "power_limit_settable": true (root; absent or false: setting
# raises NoPermission, as for a user without root); the new limit becomes "power_limit"

def nvmlDeviceSetPowerManagementLimit(handle, limit):
    nv = _nvml()
    rec = nv._whole_gpu(handle)
    low, high = nv._field(rec, "power_limit_constraints")
    if not rec.get("power_limit_settable"):
        raise nv.NVMLError(NVML_ERROR_NO_PERMISSION)
    if not low * 1000 <= int(limit) <= high * 1000:
        raise nv.NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    rec["power_limit"] = int(limit) / 1000.0
    return None
