"""Clock readings for the flight recorder: ``nvmlDeviceGetClockInfo(handle, type)`` in MHz, from a GPU's
``"clocks": {"graphics", "sm", "memory", "video"}`` scenario key (a missing key or a GPU without "clocks":
NotSupported, as on boards that do not report that clock; a MIG instance: NotSupported).

The package's helpers are looked up through the handle's own module at call time, not imported: tests import
a fresh ``pynvml`` per scenario while this submodule stays in sys.modules, and a helper bound at the first
import would check handles and raise errors of a stale module."""
from __future__ import annotations

import sys

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_VIDEO = 3
_CLOCK_KEYS = {NVML_CLOCK_GRAPHICS: "graphics", NVML_CLOCK_SM: "sm", NVML_CLOCK_MEM: "memory",
               NVML_CLOCK_VIDEO: "video"}

__all__ = ["NVML_CLOCK_GRAPHICS", "NVML_CLOCK_SM", "NVML_CLOCK_MEM", "NVML_CLOCK_VIDEO", "nvmlDeviceGetClockInfo"]


def _package(handle) -> dict:
    """The globals of the pynvml module that made ``handle`` (else the one imported now)."""
    found = getattr(getattr(type(handle), "__init__", None), "__globals__", None)
    if found is not None and "_whole_gpu" in found:
        return found
    return vars(sys.modules[__name__.rpartition(".")[0]])


def nvmlDeviceGetClockInfo(handle, type):  # noqa: A002 - the real parameter name
    nv = _package(handle)
    rec = nv["_whole_gpu"](handle)
    key = _CLOCK_KEYS.get(type)
    if key is None:
        raise nv["NVMLError"](nv["NVML_ERROR_INVALID_ARGUMENT"])
    return int(nv["_field"](rec.get("clocks") or {}, key))
