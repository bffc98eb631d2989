"""Energy a run used: its GPUs (NVML) and the CPU packages (RAPL), measured from ``start()`` to now.

    meter = EnergyMeter().start()      # the GPUs this process claimed (use_gpus), else those it can see
    ...; meter.sample()                # call every second or so (the training monitor's thread does)
    meter.reading()                    # {"gpu_kwh", "cpu_kwh", "kwh", "gpu_hours", "estimate", "method", ...}

GPU: NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded, Volta and
newer) where the GPU has one; otherwise the power draw (``nvmlDeviceGetPowerUsage``, mW) read at each
``sample()`` and integrated (trapezoids), which misses what happens between samples. A GPU that also runs
another process's kernels (NVML's compute processes) gets its energy split evenly between the processes seen on
it: an estimate.

CPU: the Intel/AMD RAPL package counters (``/sys/class/powercap/intel-rapl:N/energy_uj``, wrapping at
``max_energy_range_uj``) where they are readable (often root only since 2020). They cover the whole CPU, not
this run: the figure is this run's only when nothing else ran, so it is marked an estimate when ``cpu_share``
is below 1 (the caller knows that several runs share the box) or another program runs on any of the
machine's GPUs (NVML's compute processes: other training on the box). ``COLABKIT_TEST_POWERCAP`` names another powercap
root (a file tree in the same layout, for tests).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger("colabkit")

POWERCAP_ROOT = "/sys/class/powercap"
J_PER_KWH = 3.6e6


def powercap_root() -> Path:
    return Path(os.environ.get("COLABKIT_TEST_POWERCAP") or POWERCAP_ROOT)


class Rapl:
    """The CPU package energy counters (top-level ``intel-rapl:N`` zones; their subzones are inside them)."""

    def __init__(self, root: Path | None = None):
        root = powercap_root() if root is None else Path(root)
        self.zones = []
        try:
            candidates = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)
        except OSError:
            candidates = []
        for zone in candidates:
            value = _read_int(zone / "energy_uj")
            if value is None:
                continue     # not readable by this user (the usual case since CVE-2020-8694)
            wrap = _read_int(zone / "max_energy_range_uj") or 0
            self.zones.append({"path": zone, "wrap": wrap, "last": value, "joules": 0.0})
        self.note = "" if self.zones else f"no readable RAPL counters under {root}"

    @property
    def available(self) -> bool:
        return bool(self.zones)

    def sample(self) -> float:
        """Joules used since the previous call (all packages); a counter that went back has wrapped."""
        total = 0.0
        for zone in self.zones:
            value = _read_int(zone["path"] / "energy_uj")
            if value is None:
                continue
            delta = value - zone["last"]
            if delta < 0:
                delta += zone["wrap"] if zone["wrap"] else 0
                delta = max(delta, 0)
            zone["last"] = value
            zone["joules"] += delta / 1e6
            total += delta / 1e6
        return total


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def run_gpus(nv) -> list:
    """[(index, handle)] of the GPUs this run uses: those its use_gpus claim holds, else those it can see."""
    from ..devices import state
    from ..devices.nvml import visible_handles
    claim = getattr(state.current, "claim", None)
    if claim is not None and getattr(claim, "held", False):
        out = []
        for g in claim.gpus:
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(g["uuid"])
                out.append((nv.nvmlDeviceGetIndex(handle), handle))
            except (nv.NVMLError, KeyError):
                continue
        if out:
            return out
    return visible_handles(nv)


class _GpuEnergy:
    def __init__(self, nv, index: int, handle):
        from ..devices.nvml import call, text
        self.nv, self.index, self.handle = nv, index, handle
        self.name = text(call(nv, "nvmlDeviceGetName", handle)) or f"GPU {index}"
        self.counter_start = call(nv, "nvmlDeviceGetTotalEnergyConsumption", handle)   # mJ
        self.counter_last = self.counter_start
        self.joules = 0.0           # this run's share
        self.last_power = None      # (t, W) of the previous sample, integrated method
        self.shared = False
        self.users = 1
        self.method = "counter" if self.counter_start is not None else "power"

    def sample(self, now: float, own_pids) -> None:
        from ..devices.nvml import call
        users = self._users(own_pids)
        if self.method == "counter":
            value = call(self.nv, "nvmlDeviceGetTotalEnergyConsumption", self.handle)
            if value is None:
                return      # a failed read: the next one covers this interval
            if value >= self.counter_last:
                # the interval's sharers: whichever count, its start's or its end's, is larger
                self.joules += (value - self.counter_last) / 1000.0 / max(users, self.users)
            self.counter_last = value    # (lower: the driver reloaded and the counter restarted)
        else:
            mw = call(self.nv, "nvmlDeviceGetPowerUsage", self.handle)
            if mw is None:
                return
            watts = mw / 1000.0
            if self.last_power is not None:
                t0, w0 = self.last_power
                self.joules += (now - t0) * (w0 + watts) / 2 / max(users, self.users)
            self.last_power = (now, watts)
        self.users = users

    def _users(self, own_pids) -> int:
        """The compute processes on this GPU, counting this run as one (an estimate's divisor). Any process that
        is not the run's makes the figure an estimate; where none of the run's is listed (not on the GPU yet, or
        a container whose process ids NVML does not share), the run's share cannot be told: the GPU's whole
        energy counts, as an estimate."""
        from ..devices.nvml import call
        procs = call(self.nv, "nvmlDeviceGetComputeRunningProcesses", self.handle) or []
        mine = own_pids() if callable(own_pids) else set(own_pids or ())
        pids = {int(p.pid) for p in procs}
        others = pids - set(mine)
        if others:
            self.shared = True
        return max(1, len(others) + (1 if pids & set(mine) else 0))


def own_process_tree(pid: int | None = None) -> set:
    """``pid`` (default: this process) and its descendants (psutil where installed)."""
    pid = os.getpid() if pid is None else pid
    pids = {pid}
    try:
        import psutil
        pids |= {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except Exception:  # noqa: BLE001 - psutil missing or the process gone: the pid alone
        pass
    return pids


class EnergyMeter:
    """GPU and CPU energy of one run from ``start()``; see the module docs.

    Args:
        gpus: [(index, handle)] to measure (None: :func:`run_gpus`); ``[]``: no GPU.
        own_pids: a set, or a function returning one, of the run's processes (default: this process and its
            children): compute processes outside it on the run's GPUs make the GPU figure an estimate.
        cpu: read RAPL (False: no CPU figure, e.g. when the caller measures the CPU once for several runs).
    """

    def __init__(self, gpus=None, *, own_pids=None, cpu: bool = True):
        self._gpu_request, self.own_pids = gpus, own_pids or own_process_tree
        self._want_cpu = cpu
        self.gpus: list = []
        self.rapl: Rapl | None = None
        self.cpu_joules = 0.0
        self.cpu_estimate = False
        self.cpu_measured = False
        self.started = self.ended = None
        self.note = ""
        self._lock = threading.Lock()   # the monitor's thread and report() both sample
        self._nv = None

    def start(self) -> EnergyMeter:
        handles = self._gpu_request
        if handles is None or handles:
            try:
                from ..devices.nvml import open_nvml
                nv = self._nv = open_nvml()
                if handles is None:
                    handles = run_gpus(nv)
                self.gpus = [_GpuEnergy(nv, i, h) for i, h in handles]
            except Exception as exc:  # noqa: BLE001 - no NVML: no GPU figure, never a failed run
                self.note = f"no GPU energy: {exc}"
        if self._want_cpu:
            self.rapl = Rapl()
        self.started = time.time()    # after the first counter reads: the span they cover
        self.sample()
        return self

    def sample(self, cpu_share: float = 1.0) -> None:
        """Read the counters (and the power draw where there is no counter). ``cpu_share``: this run's share of
        the CPU energy since the previous sample (below 1 makes the CPU figure an estimate)."""
        with self._lock:
            self._sample(cpu_share)

    def _sample(self, cpu_share: float) -> None:
        now = time.time()
        for g in self.gpus:
            try:
                g.sample(now, self.own_pids)
            except Exception:
                log.debug("colabkit: energy sample of GPU %s failed", g.index, exc_info=True)
        if self.rapl is not None and self.rapl.available:
            self.add_cpu(self.rapl.sample() * cpu_share, estimate=cpu_share < 1 or self._others_on_box())
        self.ended = time.time()

    def _others_on_box(self) -> bool:
        """Another program runs on one of the machine's GPUs: the CPU energy is not this run's alone."""
        if self._nv is None:
            return False
        from ..devices.nvml import call
        mine = self.own_pids() if callable(self.own_pids) else set(self.own_pids or ())
        for index in range(call(self._nv, "nvmlDeviceGetCount") or 0):
            handle = call(self._nv, "nvmlDeviceGetHandleByIndex", index)
            procs = (call(self._nv, "nvmlDeviceGetComputeRunningProcesses", handle) or []) if handle else []
            if any(int(p.pid) not in mine for p in procs):
                return True
        return False

    def add_cpu(self, joules: float, estimate: bool = False) -> None:
        """CPU energy measured elsewhere (a runner that reads RAPL once for all its jobs)."""
        self.cpu_joules += joules
        self.cpu_estimate = self.cpu_estimate or estimate
        self.cpu_measured = True

    def reading(self) -> dict:
        """{gpu_kwh, cpu_kwh (None: not measured), kwh, gpu_hours, seconds, gpus: [names], gpu_count, method,
        estimate, why_estimate}."""
        start = self.started or time.time()
        seconds = max(0.0, (self.ended or time.time()) - start)
        gpu_j = sum(g.joules for g in self.gpus)
        cpu_measured = self.cpu_measured
        why = []
        if any(g.shared for g in self.gpus):
            why.append("a GPU was shared with another process")
        if self.cpu_estimate:
            why.append("CPU energy is the whole box's, shared")
        methods = sorted({g.method for g in self.gpus})
        return {
            "gpus": [g.name for g in self.gpus], "gpu_count": len(self.gpus), "seconds": round(seconds, 3),
            "gpu_hours": len(self.gpus) * seconds / 3600.0,
            "gpu_kwh": gpu_j / J_PER_KWH if self.gpus else None,
            "cpu_kwh": self.cpu_joules / J_PER_KWH if cpu_measured else None,
            "kwh": (gpu_j + self.cpu_joules) / J_PER_KWH if (self.gpus or cpu_measured) else None,
            "method": "+".join(methods) if methods else None,
            "estimate": bool(why), "why_estimate": why, "note": "; ".join(n for n in (
                self.note, self.rapl.note if self.rapl is not None and not self.rapl.available else "") if n),
        }
