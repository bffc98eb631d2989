"""NVML's Xid critical-error events, for the flight recorder: the GPU driver's own report of a GPU error (an Xid:
fell off the bus, double-bit ECC, page fault...) taken while training runs, so that ``colabkit health --last``
names it even where the kernel log (which also has it) needs root or the adm group.

    watch = XidWatch.open(nv)      # registers every GPU of the machine; None where NVML has no events here
    for event in watch.poll():     # what arrived since the last poll: {"gpu": 1, "xid": 79, "pci": "..."}
        ...
    watch.close()

NVML keeps no time for an event: it is stamped when polled (the recorder polls at every sample). Boards or
systems without events (Windows, some older boards) give NotSupported: those GPUs are left out, silently.
"""
from __future__ import annotations

import logging

from ..devices.nvml import call, text

log = logging.getLogger("colabkit")

XID_CRITICAL = 0x8          # nvmlEventTypeXidCriticalError, where the binding lacks the name
MAX_PER_POLL = 32           # a driver that repeats one event forever must not hold up a sample


class XidWatch:
    """An NVML event set with every GPU that supports Xid events registered."""

    def __init__(self, nv, event_set, gpus: dict):
        self.nv, self._set, self.gpus = nv, event_set, gpus    # gpus: {NVML index: PCI bus id or None}

    @classmethod
    def open(cls, nv) -> XidWatch | None:
        """Register the machine's GPUs (all of them: an Xid on any GPU is the machine's); None without any."""
        kind = getattr(nv, "nvmlEventTypeXidCriticalError", XID_CRITICAL)
        try:
            event_set = nv.nvmlEventSetCreate()
            count = nv.nvmlDeviceGetCount()
        except (AttributeError, nv.NVMLError):
            return None
        gpus = {}
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                nv.nvmlDeviceRegisterEvents(handle, kind, event_set)
            except nv.NVMLError:
                continue        # NotSupported on this board, or the GPU is lost already
            pci = call(nv, "nvmlDeviceGetPciInfo", handle)
            gpus[index] = text(pci.busId) if pci is not None else None
        if not gpus:
            call(nv, "nvmlEventSetFree", event_set)
            return None
        return cls(nv, event_set, gpus)

    def poll(self) -> list[dict]:
        """The Xid events that came since the last poll (without waiting): [{"gpu", "xid", "pci"}]."""
        nv, out = self.nv, []
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        for _ in range(MAX_PER_POLL):
            try:
                event = wait(self._set, 0)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) != getattr(nv, "NVML_ERROR_TIMEOUT", 10):
                    log.debug("colabkit: NVML event wait failed: %s", exc)
                break        # Timeout: nothing (more) now
            if not int(event.eventType) & XID_CRITICAL:
                continue
            index = call(nv, "nvmlDeviceGetIndex", event.device)
            out.append({"gpu": index, "xid": int(event.eventData), "pci": self.gpus.get(index)})
        return out

    def close(self) -> None:
        call(self.nv, "nvmlEventSetFree", self._set)
