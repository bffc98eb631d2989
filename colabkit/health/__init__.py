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
`colabkit health --last` prints), kernel_log.py (Xid, thermal, OOM lines of the kernel log), thermal.py
(ThermalGuard: every AutoResume pauses between steps while a GPU is too hot), and what a run cost: energy.py,
prices.py, runcost.py, ledger.py, progress.py. Importing this package imports no framework, NVML or matplotlib.
"""
from __future__ import annotations

from .flight_report import last_recording
from .health_monitor import HealthMonitor, latest_monitor
from .recorder import ensure_recording
from .thermal import ThermalGuard

__all__ = ["HealthMonitor", "ThermalGuard", "costs", "ensure_recording", "last_recording", "latest_monitor",
           "monitor"]

# what a run cost (energy.py, prices.py, runcost.py, ledger.py, progress.py): imported when first named
_SUBMODULES = ("energy", "ledger", "prices", "progress", "runcost")


def __getattr__(name):
    if name in _SUBMODULES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def costs(since=None, by: str = "project", path=None) -> dict:
    """``colabkit costs`` as a dict: the cost ledger's GPU-hours, kWh, money, cloud cost, saved and time lost per
    ``by`` ("user" or "project") for the runs that ended since ``since`` (a date "2026-11-01", a datetime, or
    a time back from now such as "7d"); see :func:`colabkit.health.ledger.costs`."""
    from .ledger import costs as _costs
    return _costs(since=since, by=by, path=path)


def monitor(directory=None, **options) -> HealthMonitor:
    """``colabkit.monitor()``: a started :class:`HealthMonitor` for a custom training loop (also a context
    manager that stops it).

    Options: see :class:`colabkit.health.HealthMonitor` (hang_timeout="auto"|"off"|"10min", hang_floor,
    hang_ceiling, first_step_timeout, sample_every, gpus, verbose, input_kind, project)."""
    return HealthMonitor(directory, **options).start()
