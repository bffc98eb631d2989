"""Training health: step time and input-wait share, GPU utilization/throttling, verdicts, a hang watchdog, plots.

    with colabkit.monitor() as mon:            # any training loop
        for batch in mon.wrap(loader):
            ...
            mon.step(loss=loss)
    print(mon.text()); mon.report()            # a plain dict

    model.fit(ds, callbacks=[colabkit.keras.Monitor()])            # Keras
    model.fit(ds, callbacks=[colabkit.keras.AutoResume("drive:runs/x", monitor=True)])

Modules: health_monitor.py (HealthMonitor: the measurements and report; ``monitor()`` here starts one),
sampler.py (NVML through colabkit.devices.nvml, and psutil), verdicts.py (thresholds and advice), watchdog.py
(hang budgets, stack dumps, heartbeat), keras_monitor.py (the Keras callback, ``colabkit.keras.Monitor``),
plots.py (live plots: matplotlib into an ipywidgets Image; text in a terminal), thermal.py (ThermalGuard: every
AutoResume pauses between steps while a GPU is too hot). Importing this package imports
no framework, NVML or matplotlib.
"""
from __future__ import annotations

from .health_monitor import HealthMonitor, latest_monitor
from .thermal import ThermalGuard

__all__ = ["HealthMonitor", "ThermalGuard", "latest_monitor", "monitor"]


def monitor(directory=None, **options) -> HealthMonitor:
    """``colabkit.monitor()``: a started :class:`HealthMonitor` for a custom training loop (also a context
    manager that stops it).

    Options: see :class:`colabkit.health.HealthMonitor` (hang_timeout="auto"|"off"|"10min", hang_floor,
    hang_ceiling, first_step_timeout, sample_every, gpus, verbose, input_kind)."""
    return HealthMonitor(directory, **options).start()
