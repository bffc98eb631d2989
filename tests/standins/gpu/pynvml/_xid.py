"""NVML events for the flight recorder: Xid critical errors (nvidia-ml-py 12/13 names, signatures and errors).

``nvmlEventSetCreate()`` -> an event set; ``nvmlDeviceRegisterEvents(handle, nvmlEventTypeXidCriticalError, set)``;
``nvmlEventSetWait_v2(set, timeoutms)`` -> ``c_nvmlEventData_t`` (``device``, ``eventType``, ``eventData`` = the Xid
number, ``gpuInstanceId``, ``computeInstanceId``), or NVMLError_Timeout when no event came within ``timeoutms``;
``nvmlEventSetFree(set)``; ``nvmlDeviceGetSupportedEventTypes(handle)`` -> a bit mask.

Scenario keys per GPU: ``"xid_events": [[seconds_after_nvmlInit, xid], ...]``: each is delivered once per event set
that registered the GPU, as soon as a wait comes at or after its time; ``"events_supported": false``: registering
raises NotSupported (as on Windows and some boards).

The package is looked up at call time (tests import a fresh ``pynvml`` per scenario while this submodule stays in
sys.modules), and NVMLError_Timeout is added to that package on first use.
"""
from __future__ import annotations

import sys
import time
import types

NVML_ERROR_TIMEOUT = 10
nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypePState = 0x4
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypeClock = 0x10
nvmlEventTypeNone = 0x0
nvmlEventTypeAll = 0x1F

__all__ = ["NVML_ERROR_TIMEOUT", "nvmlEventTypeSingleBitEccError", "nvmlEventTypeDoubleBitEccError",
           "nvmlEventTypePState", "nvmlEventTypeXidCriticalError", "nvmlEventTypeClock", "nvmlEventTypeNone",
           "nvmlEventTypeAll", "nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlDeviceGetSupportedEventTypes",
           "nvmlEventSetWait_v2", "nvmlEventSetWait", "nvmlEventSetFree"]


def _nvml():
    nv = sys.modules[__package__]
    if not hasattr(nv, "NVMLError_Timeout"):     # as _extract_errors_as_classes makes it in the real binding
        def new(typ, *args):
            return nv.NVMLError.__new__(typ, NVML_ERROR_TIMEOUT)
        cls = type("NVMLError_Timeout", (nv.NVMLError,), {"__new__": new, "__module__": nv.__name__})
        nv.NVMLError._valClassMapping[NVML_ERROR_TIMEOUT] = cls
        nv.NVMLError._errcode_to_string[NVML_ERROR_TIMEOUT] = "Timeout"
        nv.NVMLError_Timeout = cls
    return nv


class c_nvmlEventSet_t:
    """Opaque event set: the registered (handle, event types) and which scenario events it has delivered."""

    def __init__(self):
        self._registered, self._delivered, self._freed = [], set(), False


def nvmlEventSetCreate():
    _nvml()._need()
    return c_nvmlEventSet_t()


def nvmlDeviceGetSupportedEventTypes(handle):
    nv = _nvml()
    rec = nv._whole_gpu(handle)
    return nvmlEventTypeNone if rec.get("events_supported") is False else nvmlEventTypeAll


def nvmlDeviceRegisterEvents(handle, eventTypes, eventSet):
    nv = _nvml()
    rec = nv._whole_gpu(handle)
    if not isinstance(eventSet, c_nvmlEventSet_t) or eventSet._freed:
        raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
    if rec.get("events_supported") is False or int(eventTypes) & ~nvmlEventTypeAll:
        raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)
    eventSet._registered.append((handle, int(eventTypes)))


def _due(nv, eventSet):
    now = time.time() - nv._init_time
    for handle, types_ in eventSet._registered:
        if not types_ & nvmlEventTypeXidCriticalError:
            continue
        for n, (after, xid) in enumerate(handle._gpu.get("xid_events", [])):
            key = (handle._index, n)
            if key not in eventSet._delivered and after <= now:
                eventSet._delivered.add(key)
                return types.SimpleNamespace(device=handle, eventType=nvmlEventTypeXidCriticalError,
                                             eventData=int(xid), gpuInstanceId=0xFFFFFFFF,
                                             computeInstanceId=0xFFFFFFFF)
    return None


def nvmlEventSetWait_v2(eventSet, timeoutms):
    nv = _nvml()
    nv._need()
    if not isinstance(eventSet, c_nvmlEventSet_t) or eventSet._freed:
        raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
    deadline = time.monotonic() + max(0, int(timeoutms)) / 1000.0
    while True:
        event = _due(nv, eventSet)
        if event is not None:
            return event
        left = deadline - time.monotonic()
        if left <= 0:
            raise nv.NVMLError(NVML_ERROR_TIMEOUT)
        time.sleep(min(left, 0.01))


def nvmlEventSetWait(eventSet, timeoutms):
    return nvmlEventSetWait_v2(eventSet, timeoutms)


def nvmlEventSetFree(eventSet):
    nv = _nvml()
    if not isinstance(eventSet, c_nvmlEventSet_t) or eventSet._freed:
        raise nv.NVMLError(nv.NVML_ERROR_INVALID_ARGUMENT)
    eventSet._freed = True
