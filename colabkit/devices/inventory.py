"""``gpus()``: the machine's GPUs from NVML, else from ``nvidia-smi``, else an empty inventory that says why."""
from __future__ import annotations

import logging

from .nvml import from_nvml
from .records import Inventory, SourceUnavailable
from .smi import from_smi

log = logging.getLogger("colabkit")


def gpus(*, processes: bool = True, source: str = "auto", claims: bool | None = None) -> Inventory:
    """The GPUs this machine has: index, UUID, name, memory total/used/free, utilization, temperature, PCI bus id,
    compute processes, MIG instances.

    source: "auto" (NVML through nvidia-ml-py, else `nvidia-smi`), "nvml" or "nvidia-smi". Never raises for a
    missing driver or library: the inventory is then empty and ``note`` says why. claims (default: with
    processes): read the machine's GPU claims too (``.claims``; shown in the table: who holds each GPU).
    """
    inventory = _inventory(processes, source)
    if (processes if claims is None else claims) and inventory:
        from . import claims as _claims
        inventory.claims = _claims.read_view()
    return inventory


def _inventory(processes: bool, source: str) -> Inventory:
    if source not in ("auto", "nvml", "nvidia-smi"):
        raise ValueError(f"gpus(source={source!r}): expected 'auto', 'nvml' or 'nvidia-smi'.")
    reasons = []
    if source in ("auto", "nvml"):
        try:
            return from_nvml(processes)
        except SourceUnavailable as exc:
            reasons.append(f"NVML: {exc}")
    if source in ("auto", "nvidia-smi"):
        try:
            inventory = from_smi(processes)
            if reasons:
                log.debug("GPU inventory from nvidia-smi (%s)", "; ".join(reasons))
            return inventory
        except SourceUnavailable as exc:
            reasons.append(f"nvidia-smi: {exc}")
    return Inventory(note=f"No NVIDIA GPU found ({'; '.join(reasons)}).")
