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
plots.py (live plots: matplotlib into an ipywidgets Image; text in a terminal), recorder.py (the flight
recorder: machine telemetry into a ring file, flight_ring.py), flight_report.py (``last_recording()``, what
`colabkit health --last` prints), kernel_log.py (Xid, thermal, OOM lines of the kernel log). Importing this
package imports no framework, NVML or matplotlib.
"""
from __future__ import annotations

from .flight_report import last_recording
from .health_monitor import HealthMonitor, latest_monitor
from .recorder import ensure_recording

__all__ = ["HealthMonitor", "ensure_recording", "last_recording", "latest_monitor", "monitor"]


def monitor(directory=None, **options) -> HealthMonitor:
    """``colabkit.monitor()``: a started :class:`HealthMonitor` for a custom training loop (also a context
    manager that stops it).

    Options: see :class:`colabkit.health.HealthMonitor` (hang_timeout="auto"|"off"|"10min", hang_floor,
    hang_ceiling, first_step_timeout, sample_every, gpus, verbose, input_kind)."""
    return HealthMonitor(directory, **options).start()
