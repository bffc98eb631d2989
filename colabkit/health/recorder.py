"""The flight recorder: while training runs, the machine's telemetry goes into a small ring file on local disk, so
that after a freeze, a hard reset or a kill someone can say what the machine looked like in its last minutes.

    colabkit.health.recorder.ensure_recording()   # what AutoResume, the monitors and `colabkit run` call
    colabkit.health.last_recording()              # read it back (also `colabkit health --last`)

Every ``flight_sample_every`` (2 s) one record holds, per GPU, temperature, power, SM and memory clocks, the
clock-event (throttle) reasons, memory used/total and utilization (NVML, through colabkit.health.sampler), and
for the host the CPU temperature where /sys has it, the 1-minute load average and RAM used %. NVML's Xid
critical-error events (xid_watch.py) go in as records of their own, synced at once. Records are
flushed to disk (fdatasync) every ``flight_sync_every`` (5 s): a power loss loses at most that much. The file
(flight_ring.py) is ``flight_ring_size`` (4 MiB: about 12 hours with two GPUs) and never grows.

One ring per machine and user, ``<cache_dir>/flight/flight.ring``, and one recording process at a time: the
telemetry is the machine's, not a process's, so a second trainer recording it too would only halve how far back
the ring reaches and interleave two copies of one timeline. The recorder holds an exclusive flock on the ring
while it records; a process that finds it held tries again every 30 s (so the next trainer takes over when the
first one exits). A clean end writes a "stopped" record: a recording without one ended by a kill, a crash, a
freeze or a power loss. Recording never raises into training: a failure is logged once and recording stops.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import glob
import logging
import os
import socket
import threading
import time
from pathlib import Path

from .flight_ring import MIN_CAPACITY, RingWriter

log = logging.getLogger("colabkit")

RETRY_LOCK_EVERY = 30.0
INFO_EVERY = 300          # samples between repeats of the start record's facts (the wrap overwrites the start)
RING_NAME = "flight.ring"
_CPU_SENSORS = ("coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu-thermal")
_CPU_ZONES = ("x86_pkg_temp", "cpu-thermal", "cpu_thermal", "soc_thermal", "acpitz")

_lock = threading.Lock()
_current: FlightRecorder | None = None
_warned = False
_held_fds: set = set()    # the locked ring's descriptor while this process records


def _drop_ring_in_child() -> None:
    """After a fork (a DataLoader worker): close the child's copy of the locked ring. A flock belongs to the open
    file, so a worker that outlives its trainer would otherwise hold it and pass for a live recorder."""
    for fd in list(_held_fds):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held_fds.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_ring_in_child)


def ring_path(settings=None) -> Path:
    """Where this machine's ring file lives: ``<cache_dir>/flight/flight.ring`` (local disk, never Drive)."""
    from ..config import load
    settings = settings or load()
    return Path(settings.resolved_cache_dir()) / "flight" / RING_NAME


def boot_id() -> str | None:
    """The kernel's id of this boot: it changes at every reboot, so a recording from another boot means the
    machine went down since."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def ensure_recording():
    """Start this process's flight recorder unless it runs already or the ``flight_recorder`` setting is off.
    Idempotent and cheap; never raises. Returns the :class:`FlightRecorder` or None."""
    global _current
    try:
        with _lock:
            if _current is not None and _current.pid == os.getpid() and _current.alive:
                return _current
            from ..config import load
            settings = load()
            if not settings.flight_recorder:
                return None
            _current = FlightRecorder(ring_path(settings), size=settings.flight_ring_size,
                                      sample_every=settings.flight_sample_every,
                                      sync_every=settings.flight_sync_every).start()
            atexit.register(_current.stop)
            return _current
    except Exception as exc:  # noqa: BLE001 - a recorder must never stop a training
        _warn_once(f"the flight recorder could not start: {exc}")
        return None


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("colabkit: %s", message)


def host_reading(sensor: str | None) -> list:
    """[CPU temperature C or None, 1-minute load average, RAM used %] (what a sample record holds for the host)."""
    cpu = None
    if sensor:
        try:
            with open(sensor) as fh:
                cpu = round(int(fh.read().strip()) / 1000.0, 1)
        except (OSError, ValueError):
            cpu = None
    try:
        load1 = round(os.getloadavg()[0], 2)
    except OSError:
        load1 = None
    return [cpu, load1, _ram_percent()]


def _ram_percent() -> float | None:
    """RAM in use as `free` and psutil count it: 100 * (1 - MemAvailable / MemTotal)."""
    try:
        fields = {}
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    fields[key] = int(rest.split()[0])
        return round(100.0 * (1 - fields["MemAvailable"] / fields["MemTotal"]), 1)
    except (OSError, KeyError, ValueError, ZeroDivisionError, IndexError):
        return None


def cpu_sensor() -> str | None:
    """The file with the CPU package temperature (millidegrees C): hwmon coretemp/k10temp, else a thermal zone."""
    for folder in sorted(glob.glob("/sys/class/hwmon/hwmon*")):
        try:
            name = Path(folder, "name").read_text().strip()
        except OSError:
            continue
        if name in _CPU_SENSORS and os.path.exists(os.path.join(folder, "temp1_input")):
            return os.path.join(folder, "temp1_input")   # coretemp: Package id 0; k10temp: Tctl
    for kind in _CPU_ZONES:
        for folder in sorted(glob.glob("/sys/class/thermal/thermal_zone*")):
            try:
                if Path(folder, "type").read_text().strip() == kind:
                    return os.path.join(folder, "temp")
            except OSError:
                continue
    return None


def gpu_reading(s) -> list:
    """[index, temperature C, power W, SM clock MHz, memory clock MHz, utilization %, memory used MiB,
    memory total MiB, throttle reason bits] from a sampler.GpuSample."""
    def num(value, digits=1):
        return None if value is None else round(value, digits)
    mib = 2 ** 20
    return [s.index, num(s.temperature), num(s.power), num(s.sm_clock, 0), num(s.memory_clock, 0),
            num(s.utilization), None if s.memory_used is None else round(s.memory_used / mib),
            None if s.memory_total is None else round(s.memory_total / mib), s.reason_bits]


def _xid_watch(sampler):
    """NVML Xid events for the GPUs, or None (no GPU, no NVML events here): see xid_watch.py."""
    if not sampler.gpus:
        return None
    try:
        from ..devices.nvml import open_nvml
        from .xid_watch import XidWatch
        return XidWatch.open(open_nvml())
    except Exception:
        log.debug("colabkit: no NVML Xid events", exc_info=True)
        return None


class FlightRecorder:
    """Records the machine into the ring at ``path`` from a daemon thread, once it holds the ring's lock."""

    def __init__(self, path, *, size: int = 4 * 2 ** 20, sample_every: float = 2.0, sync_every: float = 5.0,
                 gpus: bool = True):
        if size < MIN_CAPACITY:
            raise ValueError(f"flight_ring_size={size} is too small: use at least {MIN_CAPACITY // 1024}KiB "
                             f"(e.g. \"4MiB\")")
        self.path, self.size, self.sample_every, self.sync_every = Path(path), int(size), sample_every, sync_every
        self.pid = os.getpid()
        self.recording = False        # holds the lock and writes
        self.bytes_written = 0
        self.syncs = 0
        self._gpus = gpus
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> FlightRecorder:
        self._thread = threading.Thread(target=self._run, name="colabkit-flight-recorder", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """End the recording cleanly (a "stop" record, synced) and release the ring."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _acquire(self) -> int | None:
        """The ring's file descriptor, exclusively locked; None once stopped before another process let go."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                _held_fds.add(fd)
                return fd
            except BlockingIOError:
                os.close(fd)   # another process records this machine: take over when it ends
            if self._stop.wait(RETRY_LOCK_EVERY):
                return None

    def _run(self) -> None:
        fd = None
        try:
            fd = self._acquire()
            if fd is not None:
                self._record(fd)
        except Exception as exc:  # noqa: BLE001 - never into training: say it once, stop recording
            _warn_once(f"the flight recorder stopped: {exc}")
        finally:
            self.recording = False
            if fd is not None:
                _held_fds.discard(fd)
                os.close(fd)    # releases the lock

    def _record(self, fd: int) -> None:
        from .sampler import Sampler
        writer = RingWriter(fd, self.size)
        # every GPU of the machine: the ring is the machine's, and a trainer limited to one GPU by
        # CUDA_VISIBLE_DEVICES holds it while others train on the rest
        sampler = Sampler(history=2, gpus=self._gpus, every_gpu=True)
        sensor = cpu_sensor()
        started = time.time()
        info = {"host": socket.gethostname(), "boot_id": boot_id(), "pid": self.pid, "started": started,
                "sample_every": self.sample_every, "sync_every": self.sync_every}
        writer.set_info({**info, "state": "recording"})
        gpus = [{"index": g.index, "name": g.name, **{k: v for k, v in g.thresholds.items() if v is not None}}
                for g in sampler.gpus]
        facts = {**info, "gpus": gpus, "note": sampler.note}
        writer.append({"k": "start", "t": round(started, 3), **facts})
        writer.sync()
        self.recording = True
        xids = _xid_watch(sampler)
        try:
            self._loop(writer, sampler, sensor, info, facts, xids)
        except Exception as exc:
            # the end is the recorder's own, not the machine's: say so in the ring, where it still takes records
            with contextlib.suppress(Exception):
                writer.append({"k": "stop", "t": round(time.time(), 3), "pid": self.pid, "error": str(exc)[:300]})
                writer.set_info({**info, "state": "stopped"})
                writer.sync()
            raise
        finally:
            if xids is not None:
                xids.close()

    def _loop(self, writer: RingWriter, sampler, sensor, info: dict, facts: dict, xids=None) -> None:
        last_sync, count = time.monotonic(), 0
        while True:
            count += 1
            if count % INFO_EVERY == 0:
                writer.append({"k": "info", "t": round(time.time(), 3), **facts})
            sampler.sample()
            samples = [q[-1] for q in sampler.gpu_history.values() if q]
            writer.append({"k": "s", "t": round(time.time(), 3), "g": [gpu_reading(s) for s in samples],
                           "h": host_reading(sensor)})
            errors = xids.poll() if xids is not None else []
            for event in errors:
                writer.append({"k": "xid", "t": round(time.time(), 3), **event})
            if errors:   # an Xid is often the last thing before a freeze: on disk now, not at the next sync
                writer.sync()
            stopping = self._stop.wait(self.sample_every)
            # synced now unless the next sample still comes within sync_every of the last sync
            if stopping or time.monotonic() - last_sync + self.sample_every > self.sync_every:
                if stopping:
                    writer.append({"k": "stop", "t": round(time.time(), 3), "pid": self.pid})
                    writer.set_info({**info, "state": "stopped"})
                writer.sync()
                self.syncs += 1
                last_sync = time.monotonic()
            self.bytes_written = writer.bytes_written
            if stopping:
                return
