"""Energy: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ since the driver loaded; Volta and newer).

Scenario key per GPU: ``energy_counter``: true (the counter starts at 0 when NVML is initialized, as if the driver
had just loaded) or a number of mJ it starts at; it grows by ``power_usage`` W for every second since
``nvmlInit``. Without the key the call raises NotSupported, as on pre-Volta GPUs (the power draw is then all
there is).
"""
import sys
import time

__all__ = ["nvmlDeviceGetTotalEnergyConsumption"]


def nvmlDeviceGetTotalEnergyConsumption(handle):
    # the package as imported now: tests re-import pynvml while this submodule stays in sys.modules
    nv = sys.modules[__package__]
    rec = nv._whole_gpu(handle)
    start = rec.get("energy_counter")
    if start is None or start is False:
        raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
    base = 0 if start is True else int(start)
    return base + int(nv._field(rec, "power_usage") * 1000 * (time.time() - nv._init_time))   # W * s * 1000 = mJ
