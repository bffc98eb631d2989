"""GPU and host sampling for the training monitor: NVML (opened and called through colabkit.devices.nvml) and
psutil, read by a background thread.

Per GPU, each sample holds utilization (the driver's own buffered samples from ``nvmlDeviceGetSamples`` where the
driver has it, else ``nvmlDeviceGetUtilizationRates``: % of time a kernel ran over the driver's sample period),
memory used, temperature, power draw and limit, SM and memory clocks, and the clock-event (throttle) reasons;
the cumulative throttled time comes from ``nvmlDeviceGetViolationStatus`` (thermal and power policies) and the
temperature thresholds (slowdown, shutdown, GPU max) are read once. Every call may raise NVMLError_NotSupported on
some boards (GeForce, MIG, old drivers): such a field is None, never a failure.

Which GPUs: those this process can see (CUDA_VISIBLE_DEVICES by index under PCI_BUS_ID order, or by UUID),
else all. Host: system CPU %, RAM % and this process's resident memory.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time

from ..devices.nvml import SourceUnavailable, call, open_nvml, text, visible_handles

log = logging.getLogger("colabkit")

# clock-event reason bits (nvmlClocksEventReason*; the same values as the older *ThrottleReason* names); the bits
# not listed are not slowdowns and are ignored: 0x1 GpuIdle, 0x2 ApplicationsClocksSetting, 0x10 SyncBoost,
# 0x100 DisplayClockSetting
REASONS = {
    0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}


@dataclasses.dataclass
class GpuSample:
    t: float
    index: int
    utilization: float | None      # %
    memory_used: float | None      # bytes
    memory_total: float | None
    temperature: float | None      # C
    power: float | None            # W
    power_limit: float | None
    reasons: tuple = ()            # active throttle reasons (names), idle and settings bits left out
    sm_clock: float | None = None       # MHz (nvmlDeviceGetClockInfo, NVML_CLOCK_SM)
    memory_clock: float | None = None   # MHz (NVML_CLOCK_MEM)
    reason_bits: int = 0           # the same reasons as REASONS bits (compact, for the flight recorder)


@dataclasses.dataclass
class HostSample:
    t: float
    cpu_percent: float | None
    ram_percent: float | None
    rss: float | None


class _Gpu:
    """One GPU's NVML handle, its sample cursor and its violation counters."""

    def __init__(self, nv, index: int, handle):
        self.nv, self.index, self.handle = nv, index, handle
        self.name = text(call(nv, "nvmlDeviceGetName", handle)) or f"GPU {index}"
        # the driver keeps ~20 s of samples: the first read starts now, not with what ran before training
        self.last_sample_us = int(time.time() * 1e6)
        self.had_samples = False
        self.samples_supported = hasattr(nv, "nvmlDeviceGetSamples")
        self.thresholds = {}
        for key, const in (("slowdown", "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
                           ("shutdown", "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN"),
                           ("gpu_max", "NVML_TEMPERATURE_THRESHOLD_GPU_MAX")):
            if hasattr(nv, const):
                self.thresholds[key] = call(nv, "nvmlDeviceGetTemperatureThreshold", handle, getattr(nv, const))
        self.violation_start = self.violations()
        # readings of the cumulative counters, one per sample, so a window's share covers that window only
        self.violation_history = collections.deque([self.violation_start], maxlen=4000)

    def violations(self) -> dict:
        """{"thermal"|"power": (reference time s, violation time s)} where the driver reports them."""
        out = {}
        for key, const in (("thermal", "NVML_PERF_POLICY_THERMAL"), ("power", "NVML_PERF_POLICY_POWER")):
            if hasattr(self.nv, const):
                v = call(self.nv, "nvmlDeviceGetViolationStatus", self.handle, getattr(self.nv, const))
                if v is not None:
                    out[key] = (v.referenceTime / 1e6, v.violationTime / 1e9)
        return out

    def utilization(self) -> float | None:
        nv = self.nv
        if self.samples_supported and hasattr(nv, "NVML_GPU_UTILIZATION_SAMPLES"):
            try:
                _kind, samples = nv.nvmlDeviceGetSamples(self.handle, nv.NVML_GPU_UTILIZATION_SAMPLES,
                                                         self.last_sample_us)
                if samples:
                    self.last_sample_us = max(s.timeStamp for s in samples)
                    self.had_samples = True
                    return sum(s.sampleValue.uiVal for s in samples) / len(samples)
                if self.had_samples:
                    return None
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) != getattr(nv, "NVML_ERROR_NOT_FOUND", 6):
                    self.samples_supported = False   # NotSupported: the instantaneous rate from now on
                elif self.had_samples:
                    return None    # no new sample since the last read (the sampler keeps the last value)
            # no driver sample since the monitor started yet: the instantaneous rate meanwhile
        rates = call(nv, "nvmlDeviceGetUtilizationRates", self.handle)
        return None if rates is None else float(rates.gpu)

    def sample(self) -> GpuSample:
        nv, h = self.nv, self.handle
        mem = call(nv, "nvmlDeviceGetMemoryInfo", h)
        temp = call(nv, "nvmlDeviceGetTemperature", h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
        power = call(nv, "nvmlDeviceGetPowerUsage", h)
        limit = call(nv, "nvmlDeviceGetEnforcedPowerLimit", h)
        bits = call(nv, "nvmlDeviceGetCurrentClocksEventReasons", h)
        if bits is None:
            bits = call(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        reasons = tuple(name for bit, name in REASONS.items() if bits and bits & bit)
        sm_clock = memory_clock = None
        if hasattr(nv, "NVML_CLOCK_SM"):
            sm_clock = call(nv, "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM)
            memory_clock = call(nv, "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_MEM)
        return GpuSample(t=time.time(), index=self.index, utilization=self.utilization(),
                         memory_used=None if mem is None else float(mem.used),
                         memory_total=None if mem is None else float(mem.total),
                         temperature=None if temp is None else float(temp),
                         power=None if power is None else power / 1000.0,
                         power_limit=None if limit is None else limit / 1000.0, reasons=reasons,
                         sm_clock=None if sm_clock is None else float(sm_clock),
                         memory_clock=None if memory_clock is None else float(memory_clock),
                         reason_bits=sum(bit for bit in REASONS if bits and bits & bit))


class Sampler:
    """Samples GPUs (NVML) and the host (psutil) when ``sample()`` is called (by the monitor's thread).

    ``history`` samples are kept per source (ring buffers). Without NVML or a GPU, ``gpus`` is empty. The GPUs are
    those this process sees (CUDA_VISIBLE_DEVICES), or with ``every_gpu`` all of the machine's."""

    def __init__(self, history: int = 3600, gpus: bool = True, every_gpu: bool = False):
        self.gpu_history: dict[int, collections.deque] = {}
        self.host_history: collections.deque = collections.deque(maxlen=history)
        self._gpus: list[_Gpu] = []
        self.note = ""
        self._lock = threading.Lock()
        self._history = history
        self._every_gpu = every_gpu     # the machine's GPUs, not only this process's (the flight recorder)
        if gpus:
            self._open_nvml()
        try:
            import psutil
            self._psutil = psutil
            self._process = psutil.Process()
            psutil.cpu_percent(None)   # the first call only starts the measurement
        except Exception:  # noqa: BLE001 - psutil missing or unusable: no host figures
            self._psutil = None
        self.started_at = time.time()

    def _open_nvml(self):
        try:
            nv = open_nvml()
            handles = ([(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount())]
                       if self._every_gpu else visible_handles(nv))
            self._gpus = [_Gpu(nv, i, h) for i, h in handles]
            self.note = "" if self._gpus else "NVML sees no GPU for this process"
        except SourceUnavailable as exc:
            self.note = f"no GPU figures: {exc}"
        except Exception as exc:  # noqa: BLE001 - never fail training for a monitor
            self.note = f"no GPU figures: NVML failed ({exc})"
        for g in self._gpus:
            self.gpu_history[g.index] = collections.deque(maxlen=self._history)

    @property
    def gpus(self) -> list:
        return list(self._gpus)

    def sample(self) -> None:
        gpu_samples = []
        for g in self._gpus:
            try:
                gpu_samples.append(g.sample())
                reading = g.violations()
                if reading:
                    g.violation_history.append(reading)
            except Exception:
                log.debug("colabkit: GPU %s sample failed", g.index, exc_info=True)
        host = None
        if self._psutil is not None:
            try:
                host = HostSample(t=time.time(), cpu_percent=self._psutil.cpu_percent(None),
                                  ram_percent=self._psutil.virtual_memory().percent,
                                  rss=float(self._process.memory_info().rss))
            except Exception:  # noqa: BLE001
                host = None
        with self._lock:
            for s in gpu_samples:
                if s.utilization is None and self.gpu_history[s.index]:
                    s.utilization = self.gpu_history[s.index][-1].utilization   # no new driver sample yet
                self.gpu_history[s.index].append(s)
            if host is not None:
                self.host_history.append(host)

    def window(self, since: float | None = None) -> dict:
        """Summary since ``since`` (wall time; None: everything kept): per GPU mean utilization, last memory and
        temperature, max temperature, share of samples with each throttle reason, violation shares; host means."""
        since = self.started_at if since is None else since
        with self._lock:
            per_gpu = {i: [s for s in q if s.t >= since] for i, q in self.gpu_history.items()}
            host = [s for s in self.host_history if s.t >= since]
        gpus = []
        for g in self._gpus:
            samples = per_gpu.get(g.index, [])
            utils = [s.utilization for s in samples if s.utilization is not None]
            temps = [s.temperature for s in samples if s.temperature is not None]
            last = samples[-1] if samples else None
            reason_share = {}
            for s in samples:
                for r in s.reasons:
                    reason_share[r] = reason_share.get(r, 0) + 1
            reason_share = {r: n / len(samples) for r, n in reason_share.items()} if samples else {}
            gpus.append({
                "index": g.index, "name": g.name, "samples": len(samples),
                "utilization": sum(utils) / len(utils) if utils else None,
                "memory_used": last.memory_used if last else None, "memory_total": last.memory_total if last else None,
                "temperature": last.temperature if last else None, "temperature_max": max(temps) if temps else None,
                "power": last.power if last else None, "power_limit": last.power_limit if last else None,
                "reasons": reason_share, "violation": self._violation_share(g, since),
                "thresholds": {k: v for k, v in g.thresholds.items() if v is not None},
            })
        cpus = [s.cpu_percent for s in host if s.cpu_percent is not None]
        return {"gpus": gpus,
                "host": {"cpu_percent": sum(cpus) / len(cpus) if cpus else None,
                         "ram_percent": host[-1].ram_percent if host else None,
                         "rss": host[-1].rss if host else None, "samples": len(host)},
                "note": self.note}

    def _violation_share(self, g: _Gpu, since: float) -> dict:
        """Share of wall time throttled by each policy from ``since`` (wall time; the driver's counters, read at
        each sample: from the last reading at or before ``since``, else the first one) to now."""
        now = g.violations()
        with self._lock:
            history = list(g.violation_history)
        out = {}
        for key, (ref, viol) in now.items():
            start = None
            for reading in history:
                if key not in reading:
                    continue
                if start is None or reading[key][0] <= since:
                    start = reading[key]
                if reading[key][0] > since:
                    break
            if start is None or ref <= start[0]:
                continue
            out[key] = max(0.0, min(1.0, (viol - start[1]) / (ref - start[0])))
        return out

    def series(self, seconds: float = 600.0) -> dict:
        """{gpu index: [(t, utilization, memory used fraction, temperature)]} for plots."""
        since = time.time() - seconds
        with self._lock:
            return {i: [(s.t, s.utilization, (s.memory_used / s.memory_total) if s.memory_used is not None
                         and s.memory_total else None, s.temperature) for s in q if s.t >= since]
                    for i, q in self.gpu_history.items()}
