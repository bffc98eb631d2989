"""The one NVML binding (nvidia-ml-py's ``pynvml``): opening it once, tolerant calls, and the inventory it reads."""
from __future__ import annotations

import importlib
import os

from .records import GPU, NA, Inventory, Process, SourceUnavailable, short_name

_nvml_module = None  # the pynvml module object nvmlInit succeeded on (NVML stays initialized, as in nvitop)


def open_nvml():
    """The ``pynvml`` module, initialized (once per module object). Raises SourceUnavailable without
    nvidia-ml-py or a driver."""
    global _nvml_module
    try:
        nv = importlib.import_module("pynvml")
    except ImportError:
        raise SourceUnavailable('nvidia-ml-py is not installed (pip install "colabkit[gpu]")') from None
    if _nvml_module is not nv:
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise SourceUnavailable(str(exc)) from None
        except OSError as exc:  # pragma: no cover - exotic loader failures
            raise SourceUnavailable(str(exc)) from None
        _nvml_module = nv
    return nv


def call(nv, name: str, *args):
    """``nv.<name>(*args)``, or None where the call fails (NotSupported on some boards, MIG, old drivers) or this
    nvidia-ml-py does not have it."""
    fn = getattr(nv, name, None)
    if fn is None:
        return None
    try:
        return fn(*args)
    except nv.NVMLError:
        return None


def text(value) -> str | None:
    """Older nvidia-ml-py returns bytes where newer returns str."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace").rstrip("\x00")
    return str(value)


def visible_handles(nv) -> list:
    """[(index, handle)] for the GPUs this process sees (CUDA_VISIBLE_DEVICES), else every GPU."""
    count = nv.nvmlDeviceGetCount()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
    chosen = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry:
            continue
        try:
            if entry.isdigit():
                # under CUDA_DEVICE_ORDER=PCI_BUS_ID (what colabkit sets) CUDA's index is NVML's
                index = int(entry)
                if index >= count:
                    break        # CUDA stops at the first invalid entry
                chosen.append((index, nv.nvmlDeviceGetHandleByIndex(index)))
            elif entry.startswith("GPU-"):
                handle = nv.nvmlDeviceGetHandleByUUID(entry)
                chosen.append((nv.nvmlDeviceGetIndex(handle), handle))
            else:
                break            # "-1", MIG ids: nothing NVML can sample per process here
        except nv.NVMLError:
            break
    return chosen


def from_nvml(processes: bool) -> Inventory:
    """The inventory as NVML reports it, MIG instances after their GPU. Raises SourceUnavailable."""
    nv = open_nvml()

    def record(handle, index, mig_index=None, mig_enabled=False):
        mem = call(nv, "nvmlDeviceGetMemoryInfo", handle)
        util = call(nv, "nvmlDeviceGetUtilizationRates", handle)
        pci = None if mig_index is not None else call(nv, "nvmlDeviceGetPciInfo", handle)
        return GPU(
            index=index, uuid=text(call(nv, "nvmlDeviceGetUUID", handle)) or NA,
            name=text(call(nv, "nvmlDeviceGetName", handle)) or NA,
            memory_total=_int(getattr(mem, "total", None)), memory_used=_int(getattr(mem, "used", None)),
            memory_free=_int(getattr(mem, "free", None)),
            utilization=None if mig_enabled else _int(getattr(util, "gpu", None)),
            temperature=_int(call(nv, "nvmlDeviceGetTemperature", handle, nv.NVML_TEMPERATURE_GPU)),
            pci_bus_id=text(getattr(pci, "busId", None)) or None,
            processes=_processes(nv, handle) if processes else (),
            mig_index=mig_index, mig_enabled=mig_enabled)

    try:
        count = nv.nvmlDeviceGetCount()
    except nv.NVMLError as exc:
        raise SourceUnavailable(str(exc)) from None
    driver = text(call(nv, "nvmlSystemGetDriverVersion"))
    items, skipped = [], []
    for i in range(count):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError as exc:  # e.g. "GPU is lost", "Insufficient Permissions"
            skipped.append(f"GPU {i}: {exc}")
            continue
        mode = call(nv, "nvmlDeviceGetMigMode", handle)
        mig_enabled = bool(mode) and mode[0] == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)
        items.append(record(handle, i, mig_enabled=mig_enabled))
        if mig_enabled:
            number = 0
            for slot in range(call(nv, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
                mig = call(nv, "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)  # NotFound: empty slot
                if mig is not None:
                    items.append(record(mig, i, mig_index=number))
                    number += 1
    note = f"NVML could not open {', '.join(skipped)}." if skipped else None
    return Inventory(items, source="nvml", driver=driver, note=note)


def _processes(nv, handle) -> tuple:
    try:
        infos = nv.nvmlDeviceGetComputeRunningProcesses(handle)
    except nv.NVMLError:
        return ()
    out = []
    for info in infos:
        pid = int(info.pid)
        try:
            name = text(nv.nvmlSystemGetProcessName(pid))
        except nv.NVMLError:
            name = None
        out.append(Process(pid=pid, name=short_name(name) or _proc_name(pid),
                           used_memory=_int(getattr(info, "usedGpuMemory", None))))
    return tuple(out)


def _proc_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _int(value) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    # NVML marks missing values with all-ones (NVML_VALUE_NOT_AVAILABLE) in some fields
    return None if number < 0 or number in (2 ** 32 - 1, 2 ** 64 - 1) else number
