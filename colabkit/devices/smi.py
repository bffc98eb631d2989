"""The inventory from ``nvidia-smi`` (when NVML cannot be used): running it and parsing its CSV and ``-L`` output."""
from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import subprocess
from collections.abc import Sequence

from .records import GPU, NA, Inventory, Process, SourceUnavailable, short_name

log = logging.getLogger("colabkit")

# `nvidia-smi --query-gpu` fields, in this order. `name` is the only free-text field (it may contain ", ").
SMI_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "memory.free", "utilization.gpu",
              "temperature.gpu", "pci.bus_id", "driver_version", "mig.mode.current")
SMI_BASE_FIELDS = SMI_FIELDS[:-2]  # for old drivers that reject driver_version / mig.mode.current
SMI_TIMEOUT = 20.0
_MIB = 2 ** 20


def _smi(exe: str, *args: str) -> str:
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise SourceUnavailable(f"nvidia-smi did not answer within {SMI_TIMEOUT:.0f} s") from None
    except OSError as exc:
        raise SourceUnavailable(f"cannot run {exe}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        message = (proc.stdout.strip() or proc.stderr.strip() or f"exit status {proc.returncode}").splitlines()[0]
        raise SourceUnavailable(f"{message} (exit status {proc.returncode})")
    return proc.stdout


def _smi_value(text: str) -> str | None:
    """None for [N/A], [Not Supported], [Unknown Error], N/A and empty fields."""
    text = text.strip()
    if not text or (text.startswith("[") and text.endswith("]")) or text.upper() in ("N/A", "NA"):
        return None
    return text


def _smi_number(text: str, scale: int = 1) -> int | None:
    value = _smi_value(text)
    try:
        return None if value is None else int(round(float(value) * scale))
    except ValueError:
        return None


def _split_fields(line: str, fields: Sequence[str], free: str = "name") -> dict | None:
    """Split one CSV line on ", " when one field (the name) may itself contain ", "."""
    parts = line.split(", ")
    if len(parts) < len(fields):
        return None
    at = fields.index(free)
    after = len(fields) - at - 1
    joined = ", ".join(parts[at:len(parts) - after])
    values = parts[:at] + [joined] + parts[len(parts) - after:]
    return dict(zip(fields, values))


def from_smi(processes: bool) -> Inventory:
    """The inventory as `nvidia-smi` reports it (MIG instances from `nvidia-smi -L`). Raises SourceUnavailable."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise SourceUnavailable("nvidia-smi is not on PATH")
    fields = SMI_FIELDS
    try:
        out = _smi(exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
    except SourceUnavailable as exc:
        if "not a valid field" not in str(exc):
            raise
        fields = SMI_BASE_FIELDS  # a driver that predates driver_version / mig.mode.current in --query-gpu
        out = _smi(exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
    items, driver = [], None
    for line in out.splitlines():
        row = _split_fields(line.rstrip("\r"), fields)
        if row is None or _smi_number(row["index"]) is None:
            if line.strip():
                log.debug("nvidia-smi: skipped a line that is not a GPU record: %r", line)
            continue
        driver = driver or _smi_value(row.get("driver_version", ""))
        items.append(GPU(
            index=_smi_number(row["index"]), uuid=_smi_value(row["uuid"]) or NA, name=_smi_value(row["name"]) or NA,
            memory_total=_smi_number(row["memory.total"], _MIB), memory_used=_smi_number(row["memory.used"], _MIB),
            memory_free=_smi_number(row["memory.free"], _MIB), utilization=_smi_number(row["utilization.gpu"]),
            temperature=_smi_number(row["temperature.gpu"]), pci_bus_id=_smi_value(row["pci.bus_id"]),
            mig_enabled=(_smi_value(row.get("mig.mode.current", "")) or "").lower() == "enabled"))
    if any(g.mig_enabled for g in items):
        items = _with_mig_instances(items, _smi(exe, "-L"))
    if processes and items:
        items = _with_smi_processes(items, exe)
    return Inventory(items, source="nvidia-smi", driver=driver)


_L_GPU = re.compile(r"^GPU\s+(\d+):.*\(UUID:\s*([^)\s]+)\)\s*$")
_L_MIG = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*([^)\s]+)\)\s*$")


def _with_mig_instances(items: list, listing: str) -> list:
    """Insert the MIG instances that `nvidia-smi -L` lists after their GPU. Memory/utilization: n/a here."""
    by_index = {g.index: g for g in items}
    instances: dict[int, list] = {}
    parent = None
    for line in listing.splitlines():
        m = _L_GPU.match(line)
        if m:
            parent = by_index.get(int(m.group(1)))
            continue
        m = _L_MIG.match(line)
        if m and parent is not None:
            number = len(instances.setdefault(parent.index, []))
            instances[parent.index].append(GPU(index=parent.index, uuid=m.group(3),
                                               name=f"{parent.name} MIG {m.group(1)}", mig_index=number))
    out = []
    for g in items:
        out.append(g)
        out.extend(instances.get(g.index, ()))
    return out


def _with_smi_processes(items: list, exe: str) -> list:
    try:
        out = _smi(exe, "--query-compute-apps=gpu_uuid,pid,process_name,used_memory", "--format=csv,noheader,nounits")
    except SourceUnavailable as exc:
        log.debug("nvidia-smi: no process list (%s)", exc)
        return items
    procs: dict[str, list] = {}
    for line in out.splitlines():
        row = _split_fields(line.rstrip("\r"), ("gpu_uuid", "pid", "process_name", "used_memory"), "process_name")
        if row is None or _smi_number(row["pid"]) is None:
            continue
        procs.setdefault(row["gpu_uuid"].strip(), []).append(Process(
            pid=_smi_number(row["pid"]), name=short_name(_smi_value(row["process_name"])),
            used_memory=_smi_number(row["used_memory"], _MIB)))
    return [dataclasses.replace(g, processes=tuple(procs.get(g.uuid, ()))) if g.uuid in procs else g for g in items]
