"""Stand-in for nvidia-ml-py's `pynvml` module, driven by the JSON scenario named by COLABKIT_TEST_GPUS.

Function names, signatures, return shapes and errors follow nvidia-ml-py 12/13: handles are opaque objects,
memory is in bytes, strings are str (bytes with "bytes_strings": true, like bindings before 11.515),
`nvmlPciInfo_t.busId` is bytes (a ctypes char array), errors are NVMLError subclasses chosen by code, and every
call before nvmlInit() raises NVMLError_Uninitialized. See ../README.md.
"""
from __future__ import annotations

import json
import os
import string
import sys
import time
import types

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2
NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3
NVML_PERF_POLICY_POWER = 0
NVML_PERF_POLICY_THERMAL = 1
NVML_PERF_POLICY_SYNC_BOOST = 2
NVML_PERF_POLICY_BOARD_LIMIT = 3
NVML_PERF_POLICY_LOW_UTILIZATION = 4
NVML_PERF_POLICY_RELIABILITY = 5
NVML_TOTAL_POWER_SAMPLES = 0
NVML_GPU_UTILIZATION_SAMPLES = 1
NVML_MEMORY_UTILIZATION_SAMPLES = 2
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonApplicationsClocksSetting = 0x2
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSyncBoost = 0x10
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksEventReasonHwThermalSlowdown = 0x40
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
nvmlClocksEventReasonDisplayClockSetting = 0x100
nvmlClocksEventReasonNone = 0x0
# the deprecated names, still exported by nvidia-ml-py
nvmlClocksThrottleReasonGpuIdle = nvmlClocksEventReasonGpuIdle
nvmlClocksThrottleReasonSwPowerCap = nvmlClocksEventReasonSwPowerCap
nvmlClocksThrottleReasonHwSlowdown = nvmlClocksEventReasonHwSlowdown
nvmlClocksThrottleReasonSwThermalSlowdown = nvmlClocksEventReasonSwThermalSlowdown
nvmlClocksThrottleReasonHwThermalSlowdown = nvmlClocksEventReasonHwThermalSlowdown
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = nvmlClocksEventReasonHwPowerBrakeSlowdown
NVML_DEVICE_MIG_DISABLE = 0x0
NVML_DEVICE_MIG_ENABLE = 0x1
NVML_VALUE_NOT_AVAILABLE = -1

_MIB = 2 ** 20


class NVMLError(Exception):
    _valClassMapping = dict()
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_ALREADY_INITIALIZED: "Already Initialized",
        NVML_ERROR_NOT_FOUND: "Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    def __new__(typ, value):
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self):
        return NVMLError._errcode_to_string.get(self.value, "NVML Error with code %d" % self.value)

    def __eq__(self, other):
        return self.value == other.value

    __hash__ = Exception.__hash__


def _extract_errors_as_classes():
    module = sys.modules[__name__]
    for err_name in [x for x in dir(module) if x.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        value = getattr(module, err_name)

        def gen_new(val):
            def new(typ, *args):
                return NVMLError.__new__(typ, val)
            return new
        cls = type(class_name, (NVMLError,), {"__new__": gen_new(value)})
        cls.__module__ = __name__
        setattr(module, class_name, cls)
        NVMLError._valClassMapping[value] = cls


_extract_errors_as_classes()


class c_nvmlDevice_t:  # noqa: N801 - the real name
    """Opaque handle, like the ctypes pointer the real binding returns."""

    def __init__(self, gpu: dict, index: int, instance: dict | None = None):
        self._gpu, self._index, self._instance = gpu, index, instance

    def __repr__(self):
        return f"<c_nvmlDevice_t object at {id(self):#x}>"


_scenario = None
_init_time = 0.0          # wall time of nvmlInit: violation counters count from there
_SAMPLE_PERIOD_US = 166_666   # the driver's utilization sample period (1/6 s on recent GPUs)
_SAMPLE_BUFFER = 120          # samples the driver keeps


def _load():
    path = os.environ.get("COLABKIT_TEST_GPUS")
    if not path:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    with open(path) as fh:
        data = json.load(fh)
    if data.get("driver_loaded") is False:
        raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
    if data.get("nvml") is False:  # a driver whose libnvidia-ml.so.1 cannot be loaded: nvidia-smi still works
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    return data


def _need():
    if _scenario is None:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _scenario


def _str(value):
    return value.encode() if _need().get("bytes_strings") else value


def _field(record: dict, key: str):
    value = record.get(key)
    if value is None or value == "not_supported":
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return value


def _record(handle) -> dict:
    _need()
    if not isinstance(handle, c_nvmlDevice_t):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return handle._instance if handle._instance is not None else handle._gpu


def nvmlInitWithFlags(flags):
    global _scenario, _init_time
    _scenario = _load()
    _init_time = time.time()


def nvmlInit():
    nvmlInitWithFlags(0)
    return None


def nvmlShutdown():
    global _scenario
    _need()
    _scenario = None


def nvmlSystemGetDriverVersion():
    return _str(_need().get("driver_version", "535.183.01"))


def nvmlSystemGetProcessName(pid):
    for gpu in _need()["gpus"]:
        for proc in gpu.get("processes", []) + [p for i in gpu.get("mig", {}).get("instances", [])
                                                for p in i.get("processes", [])]:
            if proc["pid"] == pid:
                return _str(proc["name"])
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetCount():
    return len(_need()["gpus"])


def nvmlDeviceGetHandleByIndex(index):
    gpus = _need()["gpus"]
    if not 0 <= int(index) < len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if gpus[index].get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return c_nvmlDevice_t(gpus[index], int(index))


def nvmlDeviceGetHandleByUUID(uuid):
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    for i, gpu in enumerate(_need()["gpus"]):
        if gpu["uuid"] == uuid:
            return c_nvmlDevice_t(gpu, i)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle):
    _record(handle)
    return handle._index


def nvmlDeviceGetName(handle):
    if handle._instance is not None:
        _record(handle)
        return _str(f"{handle._gpu['name']} MIG {handle._instance['profile']}")
    return _str(_record(handle)["name"])


def nvmlDeviceGetUUID(handle):
    return _str(_record(handle)["uuid"])


def nvmlDeviceGetMemoryInfo(handle, version=None):
    rec = _record(handle)
    total, used = _field(rec, "memory_total"), _field(rec, "memory_used")
    free = rec.get("memory_free", total - used)
    return types.SimpleNamespace(total=total * _MIB, used=used * _MIB, free=free * _MIB,
                                 **({"version": version, "reserved": 0} if version else {}))


def nvmlDeviceGetUtilizationRates(handle):
    rec = _record(handle)
    if handle._instance is not None or rec.get("mig", {}).get("enabled"):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return types.SimpleNamespace(gpu=_field(rec, "utilization"), memory=rec.get("memory_utilization", 0))


def nvmlDeviceGetTemperature(handle, sensor):
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if handle._instance is not None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return _field(_record(handle), "temperature")


def nvmlDeviceGetPciInfo(handle):
    rec = _record(handle)
    if handle._instance is not None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    bus_id = rec["pci_bus_id"]
    domain, bus, rest = bus_id.split(":")
    return types.SimpleNamespace(busId=bus_id.encode(), busIdLegacy=bus_id[4:].encode(), domain=int(domain, 16),
                                 bus=int(bus, 16), device=int(rest.split(".")[0], 16), pciDeviceId=0x1B8010DE,
                                 pciSubSystemId=0)


def nvmlDeviceGetComputeRunningProcesses(handle):
    rec = _record(handle)
    procs = list(rec.get("processes", []))
    if handle._instance is None and rec.get("mig", {}).get("enabled"):
        procs += [p for i in rec["mig"].get("instances", []) for p in i.get("processes", [])]
    return [types.SimpleNamespace(pid=p["pid"], usedGpuMemory=None if p.get("used_memory") is None
                                  else p["used_memory"] * _MIB, gpuInstanceId=0xFFFFFFFF,
                                  computeInstanceId=0xFFFFFFFF) for p in procs]


def nvmlDeviceGetMigMode(device):
    rec = _record(device)
    if device._instance is not None or not (rec.get("mig") or rec.get("mig_capable")):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    mode = NVML_DEVICE_MIG_ENABLE if rec.get("mig", {}).get("enabled") else NVML_DEVICE_MIG_DISABLE
    return [mode, mode]


def nvmlDeviceGetMaxMigDeviceCount(device):
    rec = _record(device)
    if not rec.get("mig"):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return rec["mig"].get("max", 7)


def nvmlDeviceGetMigDeviceHandleByIndex(device, index):
    rec = _record(device)
    if not rec.get("mig", {}).get("enabled"):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    for instance in rec["mig"].get("instances", []):
        if instance["slot"] == index:
            return c_nvmlDevice_t(rec, device._index, instance)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceIsMigDeviceHandle(device):
    _record(device)
    return int(device._instance is not None)


def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migDevice):  # noqa: N803 - the real parameter name
    _record(migDevice)
    if migDevice._instance is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return c_nvmlDevice_t(migDevice._gpu, migDevice._index)


# -- health: samples, clock-event (throttle) reasons, violation counters, thresholds, power -------------------
# Scenario keys per GPU (all optional): "utilization_samples" (a list of % values the driver's buffer cycles
# through, one per 1/6 s; default: "utilization"), "clocks_event_reasons" (a bit mask, or a list of names such
# as "sw_thermal_slowdown"), "violation": {"thermal": share, "power": share} (the share of time since nvmlInit
# that the counter grows by), "temperature_thresholds": {"slowdown": C, "shutdown": C, "gpu_max": C},
# "power_usage" and "power_limit" (W). "samples": false makes nvmlDeviceGetSamples NotSupported (old drivers).

_REASON_NAMES = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
                 "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
                 "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100}
_THRESHOLD_KEYS = {NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown", NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "slowdown",
                   NVML_TEMPERATURE_THRESHOLD_MEM_MAX: "mem_max", NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "gpu_max"}


class c_nvmlValue_t:  # noqa: N801 - the real name (a ctypes Union there)
    def __init__(self, value):
        self.dVal = float(value)
        self.uiVal = self.ulVal = self.ullVal = self.sllVal = self.siVal = self.usVal = int(value)


class c_nvmlSample_t:  # noqa: N801
    def __init__(self, time_stamp, value):
        self.timeStamp, self.sampleValue = time_stamp, c_nvmlValue_t(value)


class c_nvmlViolationTime_t:  # noqa: N801
    def __init__(self, reference_time, violation_time):
        self.referenceTime, self.violationTime = reference_time, violation_time   # us timestamp, ns


def _whole_gpu(handle) -> dict:
    rec = _record(handle)
    if handle._instance is not None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return rec


def nvmlDeviceGetSamples(device, sampling_type, timeStamp):  # noqa: N803 - the real parameter name
    """(value type, [c_nvmlSample_t]) newer than ``timeStamp`` (us, CPU clock); NotFound when none is."""
    rec = _whole_gpu(device)
    if rec.get("samples") is False:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if sampling_type != NVML_GPU_UTILIZATION_SAMPLES:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    values = rec.get("utilization_samples") or [_field(rec, "utilization")]
    now = int(time.time() * 1e6)
    last = now - now % _SAMPLE_PERIOD_US
    first = max(int(timeStamp) + 1, last - (_SAMPLE_BUFFER - 1) * _SAMPLE_PERIOD_US)
    stamps = list(range(last, first - 1, -_SAMPLE_PERIOD_US))[::-1]
    if not stamps:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return (NVML_VALUE_TYPE_UNSIGNED_INT,
            [c_nvmlSample_t(t, values[(t // _SAMPLE_PERIOD_US) % len(values)]) for t in stamps])


def _reasons(rec) -> int:
    value = rec.get("clocks_event_reasons", 0)
    if isinstance(value, list):
        return sum(_REASON_NAMES[name] for name in value)
    return int(value)


def nvmlDeviceGetCurrentClocksEventReasons(handle):
    return _reasons(_whole_gpu(handle))


def nvmlDeviceGetCurrentClocksThrottleReasons(handle):   # the name before driver 535
    return _reasons(_whole_gpu(handle))


def nvmlDeviceGetViolationStatus(device, perfPolicyType):  # noqa: N803
    rec = _whole_gpu(device)
    shares = rec.get("violation")
    if shares is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    key = {NVML_PERF_POLICY_THERMAL: "thermal", NVML_PERF_POLICY_POWER: "power"}.get(perfPolicyType)
    if key is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    now = time.time()
    return c_nvmlViolationTime_t(int(now * 1e6), int(shares.get(key, 0.0) * (now - _init_time) * 1e9))


def nvmlDeviceGetTemperatureThreshold(handle, threshold):
    rec = _whole_gpu(handle)
    key = _THRESHOLD_KEYS.get(threshold)
    if key is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _field(rec.get("temperature_thresholds") or {}, key)


def nvmlDeviceGetPowerUsage(handle):
    return int(_field(_whole_gpu(handle), "power_usage") * 1000)   # mW


def nvmlDeviceGetEnforcedPowerLimit(handle):
    return int(_field(_whole_gpu(handle), "power_limit") * 1000)   # mW
from ._doctor import *  # noqa: E402,F401,F403
from ._recorder import *  # noqa: E402,F401,F403
from ._energy import *  # noqa: E402,F401,F403
from ._thermal import *  # noqa: E402,F401,F403
from ._xid import *  # noqa: E402,F401,F403
