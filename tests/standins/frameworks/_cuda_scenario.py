"""What CUDA shows a framework on the GPU stand-in's scenario (COLABKIT_TEST_GPUS): shared by the `torch` and
`tensorflow` stand-ins here. CUDA's default order, FASTEST_FIRST, is modelled as most memory first (then PCI);
CUDA_DEVICE_ORDER=PCI_BUS_ID gives NVML's order; CUDA_VISIBLE_DEVICES picks by index (in CUDA's order) or UUID
and stops at the first entry it cannot match, as CUDA does."""
from __future__ import annotations

import json
import os


def scenario() -> dict | None:
    path = os.environ.get("COLABKIT_TEST_GPUS")
    if not path:
        return None
    with open(path) as fh:
        return json.load(fh)


def framework(name: str) -> dict:
    """The scenario's entry for a framework ({"version", "cuda", ...}); ImportError where it has none (or null),
    as where the framework is not installed."""
    data = scenario() or {}
    if data.get(name) is None:
        raise ImportError(f"No module named '{name}'")
    return data[name]


def visible_gpus() -> list:
    """The scenario's GPU records CUDA enumerates, in CUDA's order; none without a driver."""
    data = scenario()
    if not data or data.get("driver_loaded") is False:
        return []
    gpus = list(data["gpus"])
    if os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        gpus.sort(key=lambda g: (-g["memory_total"], g["pci_bus_id"]))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpus
    picked = []
    for token in (t.strip() for t in visible.split(",")):
        match = [g for n, g in enumerate(gpus) if token == str(n) or g["uuid"] == token]
        if not match:
            break
        picked.append(match[0])
    return picked


def pci_parts(gpu: dict) -> tuple:
    """(domain, bus, device) as ints from "00000000:3B:00.0"."""
    domain, bus, rest = gpu["pci_bus_id"].split(":")
    return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
