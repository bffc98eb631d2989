"""Clock readings for the flight recorder: ``nvmlDeviceGetClockInfo(handle, type)`` in MHz, from a GPU's
``"clocks": {"graphics", "sm", "memory", "video"}`` scenario key (a missing key or a GPU without "clocks":
NotSupported, as on boards that do not report that clock; a MIG instance: NotSupported)."""
from __future__ import annotations

from . import NVMLError, _field, _whole_gpu

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_VIDEO = 3
_CLOCK_KEYS = {NVML_CLOCK_GRAPHICS: "graphics", NVML_CLOCK_SM: "sm", NVML_CLOCK_MEM: "memory",
               NVML_CLOCK_VIDEO: "video"}

__all__ = ["NVML_CLOCK_GRAPHICS", "NVML_CLOCK_SM", "NVML_CLOCK_MEM", "NVML_CLOCK_VIDEO", "nvmlDeviceGetClockInfo"]


def nvmlDeviceGetClockInfo(handle, type):  # noqa: A002 - the real parameter name
    rec = _whole_gpu(handle)
    key = _CLOCK_KEYS.get(type)
    if key is None:
        raise NVMLError(2)   # NVML_ERROR_INVALID_ARGUMENT
    return int(_field(rec.get("clocks") or {}, key))
