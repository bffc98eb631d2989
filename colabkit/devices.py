"""GPUs: inventory (NVML, with an ``nvidia-smi`` fallback), selection, and applying the choice.

    colabkit.gpus()                                  # what is there, who uses it
    colabkit.use_gpus(2)                             # the 2 GPUs with most free memory, then least busy
    colabkit.use_gpus("0,1")                         # by index (nvidia-smi numbering) or UUID (GPU-..., MIG-...)
    colabkit.use_gpus("auto", min_free="8GiB", max_util=50)
    strategy = colabkit.strategy()                   # default strategy (0-1 GPU) or MirroredStrategy (2+)
    with colabkit.device(1): ...                     # the 2nd chosen GPU

Applying a choice sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and ``CUDA_VISIBLE_DEVICES`` (so CUDA's numbering is
nvidia-smi's) and, when the ``memory_growth`` setting is on (default), ``TF_FORCE_GPU_ALLOW_GROWTH=true`` unless
that variable is already set. CUDA reads these variables once, when a framework first touches the GPUs: call
``use_gpus`` before TensorFlow (or PyTorch) does. If TensorFlow has listed its GPUs but not yet created its
devices, the choice is applied with ``tf.config.set_visible_devices``; after that, ``DevicesAlreadyInitialized``
explains what to do (restart the kernel, call ``use_gpus`` first).

A machine without an NVIDIA GPU or driver has an empty inventory; ``use_gpus(n)`` / ``use_gpus("auto")`` then
take the CPU path with one log line, so the same notebook runs on a laptop. Values a driver does not report
(``[N/A]``, ``[Not Supported]``, NVML's NotSupported) are None in the records and "n/a" in tables.

With MIG, each instance is listed after its GPU with a label such as ``0:1`` and is selectable by its
``MIG-...`` UUID (or that label); CUDA uses at most one MIG instance per process, and a GPU in MIG mode cannot
be used as a whole.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import warnings
from typing import Iterable, Sequence

from .units import format_size, parse_size

log = logging.getLogger("colabkit")

NA = "n/a"
ORDER_VAR, VISIBLE_VAR, GROWTH_VAR = "CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH"
NO_GPUS = "-1"  # CUDA_VISIBLE_DEVICES value that hides every GPU (CUDA stops at the first invalid entry)

# `nvidia-smi --query-gpu` fields, in this order. `name` is the only free-text field (it may contain ", ").
SMI_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "memory.free", "utilization.gpu",
              "temperature.gpu", "pci.bus_id", "driver_version", "mig.mode.current")
SMI_BASE_FIELDS = SMI_FIELDS[:-2]  # for old drivers that reject driver_version / mig.mode.current
SMI_TIMEOUT = 20.0
_MIB = 2 ** 20


class GPUSelectionError(ValueError):
    """A GPU request that cannot be met; the message names what was asked and what exists."""


class DevicesAlreadyInitialized(RuntimeError):
    """A framework initialized its GPUs before the choice was applied; the message says what to do."""


class GPUSelectionWarning(UserWarning):
    """A request was only partly met (strict=False), or the choice only applies to child processes."""


class _Unavailable(Exception):
    """An inventory source cannot be used here (no driver, no library, no nvidia-smi)."""


# ----------------------------------------------------------------------------------------------- records

@dataclasses.dataclass(frozen=True)
class Process:
    """A compute process on a GPU. ``used_memory`` in bytes; None where not reported."""
    pid: int
    name: str | None
    used_memory: int | None

    def text(self) -> str:
        return f"{self.name or '?'}:{self.pid} {format_size(self.used_memory)}"


@dataclasses.dataclass(frozen=True)
class GPU:
    """One GPU, or one MIG instance of a GPU in MIG mode.

    index: the GPU's nvidia-smi/NVML index (for a MIG instance: its parent's). mig_index: the instance's
    number under its parent (None for a GPU). Memory in bytes, utilization in %, temperature in °C; None where
    the driver does not report a value. mig_enabled: a GPU in MIG mode (use its instances, not the GPU).
    """
    index: int
    uuid: str
    name: str
    memory_total: int | None = None
    memory_used: int | None = None
    memory_free: int | None = None
    utilization: int | None = None
    temperature: int | None = None
    pci_bus_id: str | None = None
    processes: tuple = ()
    mig_index: int | None = None
    mig_enabled: bool = False

    @property
    def is_mig(self) -> bool:
        return self.mig_index is not None

    @property
    def label(self) -> str:
        """'1' for GPU 1, '0:2' for MIG instance 2 of GPU 0."""
        return str(self.index) if self.mig_index is None else f"{self.index}:{self.mig_index}"

    @property
    def cuda_id(self) -> str:
        """What goes into CUDA_VISIBLE_DEVICES (with CUDA_DEVICE_ORDER=PCI_BUS_ID): the index, or a MIG UUID."""
        return self.uuid if self.is_mig else str(self.index)

    @property
    def usable(self) -> bool:
        """Whether CUDA can be given this device: not a GPU in MIG mode (its instances are the devices)."""
        return not self.mig_enabled

    def describe(self) -> str:
        """'GPU 1 (NVIDIA GeForce GTX 1080 Ti, 10.2 GiB free of 11.0 GiB, 3 % busy)'."""
        kind = "MIG instance" if self.is_mig else "GPU"
        util = NA if self.utilization is None else f"{self.utilization} %"
        return (f"{kind} {self.label} ({self.name}, {format_size(self.memory_free)} free of "
                f"{format_size(self.memory_total)}, {util} busy)")

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["processes"] = [dataclasses.asdict(p) for p in self.processes]
        d["label"] = self.label
        return d


class Inventory(list):
    """A list of GPU records plus where they came from. ``str()`` / notebook display: a table.

    source: "nvml", "nvidia-smi" or "none". note: one line on why it is empty or how the choice was made.
    """

    def __init__(self, items: Iterable[GPU] = (), *, source: str = "none", driver: str | None = None,
                 note: str | None = None):
        super().__init__(items)
        self.source, self.driver, self.note = source, driver, note
        self.leave_env = False  # a choice of nothing because nothing is there: CUDA_* stay as they are

    def _derive(self, items, note=None, leave_env=False) -> "Inventory":
        derived = Inventory(items, source=self.source, driver=self.driver, note=note)
        derived.leave_env = leave_env
        return derived

    def find(self, label: str) -> GPU | None:
        return next((g for g in self if g.label == label), None)

    def as_dict(self) -> dict:
        return {"source": self.source, "driver": self.driver, "note": self.note,
                "cuda_device_order": os.environ.get(ORDER_VAR), "cuda_visible_devices": os.environ.get(VISIBLE_VAR),
                "gpus": [g.as_dict() for g in self]}

    def json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    def table(self) -> str:
        via = {"nvml": "NVML", "nvidia-smi": "nvidia-smi"}.get(self.source, self.source)
        lines = []
        if self:
            n_gpu, n_mig = sum(not g.is_mig for g in self), sum(g.is_mig for g in self)
            head = f"{n_gpu} GPU{'s' * (n_gpu != 1)}" + (f", {n_mig} MIG instance{'s' * (n_mig != 1)}" if n_mig else "")
            lines.append(head + f" (via {via}" + (f", driver {self.driver})" if self.driver else ")"))
            rows = [("GPU", "Name", "Memory used / total", "Free", "Util", "Temp", "PCI bus id", "Processes")]
            for g in self:
                name = g.name + ("  [MIG mode: use its instances]" if g.mig_enabled else "")
                rows.append((("  " if g.is_mig else "") + g.label, name,
                             f"{format_size(g.memory_used)} / {format_size(g.memory_total)}",
                             format_size(g.memory_free),
                             NA if g.utilization is None else f"{g.utilization} %",
                             NA if g.temperature is None else f"{g.temperature} C",
                             g.pci_bus_id or NA,
                             "; ".join(p.text() for p in g.processes) or "-"))
            widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
            for r in rows:
                lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
        if self.note:
            lines.append(self.note)
        if os.environ.get(VISIBLE_VAR) is not None:
            lines.append(f"{VISIBLE_VAR}={os.environ[VISIBLE_VAR]!s}"
                         + (f" ({ORDER_VAR}={os.environ[ORDER_VAR]})" if os.environ.get(ORDER_VAR) else ""))
        return "\n".join(lines) if lines else "no GPUs"

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(self.table() if not cycle else "Inventory(...)")


# ------------------------------------------------------------------------------------------------ inventory

def gpus(*, processes: bool = True, source: str = "auto") -> Inventory:
    """The GPUs this machine has: index, UUID, name, memory total/used/free, utilization, temperature, PCI bus id,
    compute processes, MIG instances.

    source: "auto" (NVML through nvidia-ml-py, else `nvidia-smi`), "nvml" or "nvidia-smi". Never raises for a
    missing driver or library: the inventory is then empty and ``note`` says why.
    """
    if source not in ("auto", "nvml", "nvidia-smi"):
        raise ValueError(f"gpus(source={source!r}): expected 'auto', 'nvml' or 'nvidia-smi'.")
    reasons = []
    if source in ("auto", "nvml"):
        try:
            return _from_nvml(processes)
        except _Unavailable as exc:
            reasons.append(f"NVML: {exc}")
    if source in ("auto", "nvidia-smi"):
        try:
            inventory = _from_smi(processes)
            if reasons:
                log.debug("GPU inventory from nvidia-smi (%s)", "; ".join(reasons))
            return inventory
        except _Unavailable as exc:
            reasons.append(f"nvidia-smi: {exc}")
    return Inventory(note=f"No NVIDIA GPU found ({'; '.join(reasons)}).")


def _text(value) -> str | None:
    """Older nvidia-ml-py returns bytes where newer returns str."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace").rstrip("\x00")
    return str(value)


_nvml_module = None  # the pynvml module object nvmlInit succeeded on (NVML stays initialized, as in nvitop)


def _nvml():
    global _nvml_module
    try:
        nv = importlib.import_module("pynvml")
    except ImportError:
        raise _Unavailable('nvidia-ml-py is not installed (pip install "colabkit[gpu]")') from None
    if _nvml_module is not nv:
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise _Unavailable(str(exc)) from None
        except OSError as exc:  # pragma: no cover - exotic loader failures
            raise _Unavailable(str(exc)) from None
        _nvml_module = nv
    return nv


def _from_nvml(processes: bool) -> Inventory:
    nv = _nvml()

    def get(fn, *args):
        try:
            return fn(*args)
        except nv.NVMLError:
            return None

    def record(handle, index, mig_index=None, mig_enabled=False):
        mem = get(nv.nvmlDeviceGetMemoryInfo, handle)
        util = get(nv.nvmlDeviceGetUtilizationRates, handle)
        pci = None if mig_index is not None else get(nv.nvmlDeviceGetPciInfo, handle)
        return GPU(
            index=index, uuid=_text(get(nv.nvmlDeviceGetUUID, handle)) or NA,
            name=_text(get(nv.nvmlDeviceGetName, handle)) or NA,
            memory_total=_int(getattr(mem, "total", None)), memory_used=_int(getattr(mem, "used", None)),
            memory_free=_int(getattr(mem, "free", None)),
            utilization=None if mig_enabled else _int(getattr(util, "gpu", None)),
            temperature=_int(get(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)),
            pci_bus_id=_text(getattr(pci, "busId", None)) or None,
            processes=_nvml_processes(nv, handle) if processes else (),
            mig_index=mig_index, mig_enabled=mig_enabled)

    try:
        count = nv.nvmlDeviceGetCount()
    except nv.NVMLError as exc:
        raise _Unavailable(str(exc)) from None
    driver = _text(get(nv.nvmlSystemGetDriverVersion))
    items, skipped = [], []
    for i in range(count):
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError as exc:  # e.g. "GPU is lost", "Insufficient Permissions"
            skipped.append(f"GPU {i}: {exc}")
            continue
        mode = get(nv.nvmlDeviceGetMigMode, handle)
        mig_enabled = bool(mode) and mode[0] == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)
        items.append(record(handle, i, mig_enabled=mig_enabled))
        if mig_enabled:
            number = 0
            for slot in range(get(nv.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
                mig = get(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)  # NotFound: empty slot
                if mig is not None:
                    items.append(record(mig, i, mig_index=number))
                    number += 1
    note = f"NVML could not open {', '.join(skipped)}." if skipped else None
    return Inventory(items, source="nvml", driver=driver, note=note)


def _nvml_processes(nv, handle) -> tuple:
    try:
        infos = nv.nvmlDeviceGetComputeRunningProcesses(handle)
    except nv.NVMLError:
        return ()
    out = []
    for info in infos:
        pid = int(info.pid)
        try:
            name = _text(nv.nvmlSystemGetProcessName(pid))
        except nv.NVMLError:
            name = None
        out.append(Process(pid=pid, name=_short_name(name) or _proc_name(pid),
                           used_memory=_int(getattr(info, "usedGpuMemory", None))))
    return tuple(out)


def _short_name(name: str | None) -> str | None:
    return os.path.basename(name.strip()) if name and name.strip() else None


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


# nvidia-smi -------------------------------------------------------------------------------------------------

def _smi(exe: str, *args: str) -> str:
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise _Unavailable(f"nvidia-smi did not answer within {SMI_TIMEOUT:.0f} s") from None
    except OSError as exc:
        raise _Unavailable(f"cannot run {exe}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        message = (proc.stdout.strip() or proc.stderr.strip() or f"exit status {proc.returncode}").splitlines()[0]
        raise _Unavailable(f"{message} (exit status {proc.returncode})")
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


def _from_smi(processes: bool) -> Inventory:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise _Unavailable("nvidia-smi is not on PATH")
    fields = SMI_FIELDS
    try:
        out = _smi(exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
    except _Unavailable as exc:
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
    except _Unavailable as exc:
        log.debug("nvidia-smi: no process list (%s)", exc)
        return items
    procs: dict[str, list] = {}
    for line in out.splitlines():
        row = _split_fields(line.rstrip("\r"), ("gpu_uuid", "pid", "process_name", "used_memory"), "process_name")
        if row is None or _smi_number(row["pid"]) is None:
            continue
        procs.setdefault(row["gpu_uuid"].strip(), []).append(Process(
            pid=_smi_number(row["pid"]), name=_short_name(_smi_value(row["process_name"])),
            used_memory=_smi_number(row["used_memory"], _MIB)))
    return [dataclasses.replace(g, processes=tuple(procs.get(g.uuid, ()))) if g.uuid in procs else g for g in items]


# ------------------------------------------------------------------------------------------------ selection

def parse_request(text: str):
    """The request in a magic or CLI argument: '2' is a count (as in `docker --gpus 2`); 'auto'/'all'; indices
    and UUIDs otherwise ('0,1', '1,' or 'device=1' for GPU 1 alone, 'GPU-8f3e...')."""
    text = str(text).strip()
    if text.lower() in ("auto", "all"):
        return "auto"
    if re.fullmatch(r"\d+", text):
        return int(text)
    if text.lower().startswith("device="):
        text = text[len("device="):].strip().strip('"')
    return text


def _request_text(request) -> str:
    return repr(request) if not isinstance(request, (list, tuple)) else repr(list(request))


def select_gpus(request="auto", *, min_free=None, max_util=None, strict: bool = True,
                inventory: Inventory | None = None, one_process: bool = True) -> Inventory:
    """Choose GPUs without applying the choice (see ``use_gpus`` for the forms of ``request``).

    Returns the chosen GPUs in the order CUDA will number them; empty for the CPU path (``note`` says why).
    one_process=False: each chosen device goes to a process of its own (`colabkit run`), so several MIG
    instances may be chosen (named, counted, or by "auto").
    """
    what = f"use_gpus({_request_text(request)})"
    min_free_bytes = None
    if min_free is not None:
        try:
            min_free_bytes = parse_size(min_free, name="min_free")
        except ValueError as exc:
            raise GPUSelectionError(f"{what}: {exc}") from None
    if max_util is not None:
        max_util = _percent(max_util, what)
    inv = gpus(processes=False) if inventory is None else inventory
    hidden_by, allowed = _inherited_restriction(inv)
    candidates = [g for g in inv if g.usable and (allowed is None or g.uuid in allowed)]
    if allowed is not None:
        candidates.sort(key=lambda g: allowed.index(g.uuid))

    kind, value = _classify(request, what)
    if kind == "count" and value == 0:
        return inv._derive([], note=f"{what}: no GPU chosen; CUDA_VISIBLE_DEVICES={NO_GPUS} hides them all.")
    if not candidates:
        if kind == "explicit":
            if inv:
                raise GPUSelectionError(f"{what}: {hidden_by} hides every GPU in this process; it has these:\n"
                                        f"{_listing(inv)}")
            raise GPUSelectionError(f"{what}: this machine has no NVIDIA GPU to choose from. {inv.note or ''}".strip())
        why = f"{hidden_by} hides every GPU in this process" if inv else (inv.note or "No NVIDIA GPU found.")
        return inv._derive([], note=f"{why.rstrip('.')}: running on the CPU.", leave_env=True)

    wanted = [f"at least {format_size(min_free_bytes)} free"] if min_free_bytes is not None else []
    wanted += [f"at most {max_util:g} % utilization"] if max_util is not None else []

    def failing(g: GPU) -> list:
        reasons = []
        if min_free_bytes is not None and (g.memory_free is None or g.memory_free < min_free_bytes):
            reasons.append(f"{format_size(g.memory_free)} free")
        if max_util is not None and (g.utilization is None or g.utilization > max_util):
            reasons.append(f"{NA if g.utilization is None else g.utilization} % busy")
        return reasons

    if kind == "explicit":
        chosen = _resolve(value, inv, candidates, allowed, hidden_by, what, one_process)
        bad = [(g, failing(g)) for g in chosen if failing(g)]
        if bad:
            message = (f"{what} asked for GPUs with {' and '.join(wanted)}, but "
                       + "; ".join(f"{g.describe()} has {', '.join(r)}" for g, r in bad) + ".")
            if strict:
                raise GPUSelectionError(message)
            warnings.warn(message + " Using them anyway (strict=False).", GPUSelectionWarning, stacklevel=3)
        return inv._derive(chosen)

    qualifying = sorted((g for g in candidates if not failing(g)), key=_rank)
    whole = [g for g in qualifying if not g.is_mig]
    if kind == "auto":  # every qualifying GPU; a MIG instance only alone (CUDA uses one per process)
        pool = qualifying if not one_process else whole or qualifying[:1]
        need, take = 1, len(pool)
    else:
        pool = whole if value > 1 and one_process else qualifying
        need = take = value
    if len(pool) < need:
        asked = "GPUs" if kind == "auto" else f"{value} GPU{'s' * (value != 1)}"
        condition = f" with {' and '.join(wanted)}" if wanted else ""
        n_have = len(candidates)
        scope = "in this process" if allowed is not None else "on this machine"
        if condition:
            have = (f"{len(pool)} of the {n_have} {'GPU' if n_have == 1 else 'GPUs'} {scope} "
                    f"{'qualifies' if len(pool) == 1 else 'qualify'}")
        else:
            have = f"there {'is' if n_have == 1 else 'are'} {n_have} {scope}"
        if kind == "count" and value > 1 and one_process and any(g.is_mig for g in candidates):
            have += " (MIG instances do not count: CUDA uses at most one per process)"
        message = f"{what} asked for {asked}{condition}; {have}:\n{_listing(inv, failing, allowed)}"
        if strict:
            raise GPUSelectionError(message)
        if not pool:
            warnings.warn(message + "\nRunning on the CPU (strict=False).", GPUSelectionWarning, stacklevel=3)
            return inv._derive([], note=f"{what}: nothing qualifies; running on the CPU.")
        warnings.warn(message + f"\nUsing the best {len(pool)} (strict=False).", GPUSelectionWarning, stacklevel=3)
        take = len(pool)
    chosen = sorted(pool[:take], key=lambda g: (g.index, -1 if g.mig_index is None else g.mig_index))
    return inv._derive(chosen)


def _rank(g: GPU):
    """Most free memory first, then least busy, then lowest index; unknown values last."""
    return (g.memory_free is None, -(g.memory_free or 0), g.utilization is None, g.utilization or 0,
            g.index, g.mig_index or 0)


def _percent(value, what: str) -> float:
    text = str(value).strip().rstrip("%").strip() if not isinstance(value, bool) else ""
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if not 0 <= number <= 100:
        raise GPUSelectionError(f"{what}: max_util={value!r} is not a utilization; expected a percentage from 0 "
                                f"to 100, such as 50 or \"50%\".")
    return number


def _classify(request, what: str):
    if isinstance(request, bool) or request is None:
        raise GPUSelectionError(f"{what}: expected a number of GPUs (2), indices (\"0,1\"), UUIDs or \"auto\".")
    if isinstance(request, int):
        if request < 0:
            raise GPUSelectionError(f"{what}: the number of GPUs must be 0 or more.")
        return "count", request
    if isinstance(request, GPU):
        return "explicit", [request.label]
    if isinstance(request, str):
        if request.strip().lower() in ("auto", "all"):
            return "auto", None
        tokens = [t.strip() for t in request.split(",")]
        if not any(tokens) or (any(not t for t in tokens[:-1])):
            raise GPUSelectionError(f"{what}: expected indices or UUIDs separated by commas, such as \"0,1\".")
        return "explicit", [t for t in tokens if t]
    if isinstance(request, (list, tuple)):
        tokens = []
        for item in request:
            if isinstance(item, GPU):
                tokens.append(item.label)
            elif isinstance(item, int) and not isinstance(item, bool):
                tokens.append(str(item))
            elif isinstance(item, str) and item.strip():
                tokens.append(item.strip())
            else:
                raise GPUSelectionError(f"{what}: {item!r} is neither a GPU index nor a UUID.")
        if not tokens:
            raise GPUSelectionError(f"{what}: the list names no GPU; use 0 for none.")
        return "explicit", tokens
    raise GPUSelectionError(f"{what}: expected a number of GPUs (2), indices (\"0,1\"), UUIDs or \"auto\", "
                            f"not a {type(request).__name__}.")


def _match(token: str, inv: Sequence[GPU]) -> list:
    """GPUs a token names: an index ('1'), a MIG label ('0:1'), a UUID or a unique UUID prefix."""
    if re.fullmatch(r"\d+(:\d+)?", token):
        return [g for g in inv if g.label == token]
    low = token.lower()
    exact = [g for g in inv if g.uuid.lower() == low]
    return exact or [g for g in inv if len(low) > 4 and g.uuid.lower().startswith(low)]


def _resolve(tokens: list, inv: Inventory, candidates: list, allowed, hidden_by, what: str,
             one_process: bool = True) -> list:
    chosen, named = [], {}
    for token in tokens:
        found = _match(token, inv)
        if not found:
            if re.fullmatch(r"\d+(:\d+)?", token):
                problem = f"there is no GPU {token}" if ":" not in token else f"there is no MIG instance {token}"
            elif re.fullmatch(r"(?i)(GPU|MIG)-.*", token):
                problem = f"no GPU or MIG instance has UUID {token!r}"
            else:
                problem = f"{token!r} is neither a GPU index (such as 0) nor a UUID (GPU-..., MIG-...)"
            raise GPUSelectionError(f"{what}: {problem}; this machine has:\n{_listing(inv)}")
        if len(found) > 1:
            raise GPUSelectionError(f"{what}: {token!r} matches several UUIDs ({', '.join(g.uuid for g in found)}); "
                                    f"give more of the UUID.")
        g = found[0]
        if g.uuid in named:
            same = "" if named[g.uuid] == token else f" (as {named[g.uuid]!r} and {token!r})"
            raise GPUSelectionError(f"{what}: {g.describe()} is named twice{same}; name each GPU once.")
        named[g.uuid] = token
        if g.mig_enabled:
            instances = [m.uuid for m in inv if m.is_mig and m.index == g.index]
            raise GPUSelectionError(f"{what}: GPU {g.index} is in MIG mode, so CUDA cannot use it as a whole; choose "
                                    f"one of its MIG instances by UUID: {', '.join(instances) or 'none configured'}.")
        if g not in candidates:
            raise GPUSelectionError(f"{what}: {g.describe()} is outside {hidden_by}, which was set before colabkit "
                                    f"chose GPUs (by `colabkit run`, a scheduler or you); available here:\n"
                                    f"{_listing([c for c in inv if c in candidates])}")
        chosen.append(g)
    if one_process and len(chosen) > 1 and any(g.is_mig for g in chosen):
        raise GPUSelectionError(f"{what}: CUDA uses at most one MIG instance per process, and not together with "
                                f"other GPUs; choose a single MIG instance per process (`colabkit run` with "
                                f"one GPU per job runs one process on each).")
    return chosen


def _listing(inv: Sequence[GPU], failing=None, allowed=None) -> str:
    if not inv:
        return "  (none)"
    lines = []
    for g in inv:
        extra = []
        if g.mig_enabled:
            extra.append("MIG mode: use its instances")
        elif allowed is not None and g.uuid not in allowed:
            extra.append(f"hidden by {VISIBLE_VAR}")
        elif failing is not None and failing(g):
            extra.append("does not qualify: " + ", ".join(failing(g)))
        lines.append(f"  {g.describe()}  {g.uuid}" + (f"  [{'; '.join(extra)}]" if extra else ""))
    return "\n".join(lines)


def _inherited_restriction(inv: Inventory):
    """(description, UUIDs in CUDA order) from a CUDA_VISIBLE_DEVICES set before colabkit chose GPUs here,
    e.g. by `colabkit run` or a cluster scheduler; (None, None) when there is none."""
    current = os.environ.get(VISIBLE_VAR)
    if _state.applied_value is not None and current == _state.applied_value:
        current = _state.inherited  # our own earlier choice is not a restriction
    if current is None:
        return None, None
    order = _cuda_order(inv, {VISIBLE_VAR: current, ORDER_VAR: "PCI_BUS_ID"})
    return f"{VISIBLE_VAR}={current!r}", [g.uuid for g in order or ()]


def _cuda_order(inv: Sequence[GPU], environ) -> list | None:
    """The GPUs CUDA enumerates under these CUDA_* values, in CUDA's order; None when that cannot be known."""
    usable = [g for g in inv if g.usable]
    order_known = environ.get(ORDER_VAR) == "PCI_BUS_ID" or len({g.name for g in usable if not g.is_mig}) <= 1
    visible = environ.get(VISIBLE_VAR)
    if visible is None:
        if any(g.is_mig for g in usable):
            return None
        return [g for g in usable if not g.is_mig] if order_known else None
    out = []
    for token in (t.strip() for t in visible.split(",")):
        if token.isdigit():
            if not order_known:
                return None
            found = [g for g in inv if not g.is_mig and g.index == int(token)]
            if found and found[0].mig_enabled:  # CUDA then enumerates that GPU's (first) MIG instance
                found = [g for g in inv if g.is_mig and g.index == int(token)][:1]
        else:
            low = token.lower()
            found = [g for g in usable if low and g.uuid.lower().startswith(low)]
            found = [g for g in found if g.uuid.lower() == low] or found
        if len(found) != 1 or found[0] in out:
            break  # CUDA stops at the first entry it cannot use
        out.append(found[0])
    return out


# ------------------------------------------------------------------------------------------------- applying

@dataclasses.dataclass
class _State:
    chosen: Inventory | None = None      # the latest choice applied by use_gpus
    applied_value: str | None = None     # the CUDA_VISIBLE_DEVICES value use_gpus set
    inherited: str | None = None         # CUDA_VISIBLE_DEVICES before colabkit first set it


_state = _State()


def chosen() -> Inventory | None:
    """The GPUs the latest ``use_gpus`` call chose (None before any call)."""
    return _state.chosen


def use_gpus(request="auto", *, min_free=None, max_util=None, strict: bool = True,
             memory_growth: bool | None = None) -> Inventory:
    """Choose GPUs and make this process (and the processes it starts) use exactly those.

    request: a count (``2``: the GPUs with most free memory, then least busy; ``0``: none, CPU only); indices in
    nvidia-smi numbering (``"0,1"``, ``[0, 1]``); UUIDs (``"GPU-8f3e..."``, ``"MIG-..."``, or unique prefixes);
    or ``"auto"``: every GPU that passes the filters. min_free: a size ("8GiB") each GPU must have free;
    max_util: the highest utilization in %. strict=False turns an unmet request into a warning and takes what is
    available. memory_growth: TensorFlow memory growth (default: the ``memory_growth`` setting, on).

    Sets CUDA_DEVICE_ORDER=PCI_BUS_ID and CUDA_VISIBLE_DEVICES (see the module docs). Returns the chosen GPUs
    in CUDA's order (device 0 first): empty for the CPU path. Raises GPUSelectionError for a request that cannot
    be met and DevicesAlreadyInitialized when TensorFlow or PyTorch already use their GPUs (strict=False: warns).
    """
    if memory_growth is None:
        from . import config
        memory_growth = config.load().memory_growth
    inventory = gpus(processes=False)
    choice = select_gpus(request, min_free=min_free, max_util=max_util, strict=strict, inventory=inventory)
    what = f"use_gpus({_request_text(request)})"
    if choice.leave_env:
        log.warning("colabkit: %s", choice.note)  # the CPU path: one line, environment left alone
        _state.chosen = choice
        return choice
    before = {k: os.environ.get(k) for k in (ORDER_VAR, VISIBLE_VAR, GROWTH_VAR)}
    value = ",".join(g.cuda_id for g in choice) or NO_GPUS
    if _state.applied_value is None or before[VISIBLE_VAR] != _state.applied_value:
        _state.inherited = before[VISIBLE_VAR]
    os.environ[ORDER_VAR] = "PCI_BUS_ID"
    os.environ[VISIBLE_VAR] = value
    if memory_growth and choice and GROWTH_VAR not in os.environ:
        os.environ[GROWTH_VAR] = "true"
    try:
        if before[VISIBLE_VAR] != value or before[ORDER_VAR] != "PCI_BUS_ID":
            _apply_to_frameworks(choice, inventory, before, memory_growth, what)
    except DevicesAlreadyInitialized as exc:
        if strict:
            for key, old in before.items():
                if old is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old
            raise
        warnings.warn(f"{exc} (strict=False: {VISIBLE_VAR}={value} is set for processes started from here.)",
                      GPUSelectionWarning, stacklevel=2)
    _state.chosen, _state.applied_value = choice, value
    log.info("colabkit: %s -> %s=%s", what, VISIBLE_VAR, value)
    return choice


def _apply_to_frameworks(choice: Inventory, inventory: Inventory, before: dict, memory_growth: bool,
                         what: str) -> None:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        torch_started = bool(cuda.is_initialized()) if cuda is not None else False
    except Exception:  # noqa: BLE001 - a broken torch install must not break GPU selection
        torch_started = False
    if torch_started:
        raise DevicesAlreadyInitialized(
            f"{what} chose {_names(choice)}, but PyTorch has already initialized CUDA in this process, so "
            f"{VISIBLE_VAR} no longer changes which GPUs it uses. Restart the kernel (on Colab: Runtime > Restart "
            f"session) and call colabkit.use_gpus(...) before anything uses torch.cuda.")
    tf = sys.modules.get("tensorflow")
    if tf is not None and hasattr(tf, "config"):
        _apply_to_tensorflow(tf, choice, inventory, before, memory_growth, what)


def _tf_state(tf):
    """(listed, initialized): whether TensorFlow has listed its physical devices / created its context.
    None where this TensorFlow does not tell (private attributes, checked defensively)."""
    try:
        from tensorflow.python.eager import context as tf_context
        ctx = tf_context.context()
        return ctx._physical_devices is not None, ctx._context_handle is not None  # noqa: SLF001
    except Exception:  # noqa: BLE001
        return None, None


def _apply_to_tensorflow(tf, choice: Inventory, inventory: Inventory, before: dict, memory_growth: bool,
                         what: str) -> None:
    listed, initialized = _tf_state(tf)
    if listed is False:
        return  # TensorFlow is imported but has not asked CUDA for GPUs yet: the variables will take effect
    physical = tf.config.list_physical_devices("GPU")
    if listed is None and len(physical) == len(choice):
        return  # cannot tell; what TensorFlow sees matches the choice
    order = _cuda_order(inventory, before)
    if order is not None and len(order) == len(physical):
        by_uuid = {g.uuid: d for g, d in zip(order, physical)}
        targets = [by_uuid[g.uuid] for g in choice if g.uuid in by_uuid]
        if len(targets) == len(choice):
            if [d.name for d in tf.config.get_visible_devices("GPU")] != [d.name for d in targets]:
                try:
                    tf.config.set_visible_devices(targets, "GPU")
                except RuntimeError:
                    targets = None
            if targets is not None:
                for d in targets if memory_growth else ():
                    with contextlib.suppress(RuntimeError, ValueError):
                        tf.config.experimental.set_memory_growth(d, True)
                return
    visible = tf.config.get_visible_devices("GPU") if physical else []
    seen = f"{len(visible)}: {', '.join(d.name for d in visible) or 'none'}"
    raise DevicesAlreadyInitialized(
        f"{what} chose {_names(choice)}, but TensorFlow has already "
        f"{'initialized' if initialized or initialized is None else 'listed'} its GPUs in this process "
        f"(it sees {seen}), so the choice cannot take effect here. Restart the kernel (on Colab: "
        f"Runtime > Restart session) and call colabkit.use_gpus(...) before any TensorFlow or Keras code touches a "
        f"device (strategy(), list_physical_devices, building a model). If TensorFlow sees no GPU even then, it is a "
        f"CPU-only build or cannot load CUDA (pip install \"tensorflow[and-cuda]\").")


def _names(choice: Sequence[GPU]) -> str:
    return ", ".join(f"{'MIG ' if g.is_mig else 'GPU '}{g.label} ({g.name})" for g in choice) or "no GPU"


# ----------------------------------------------------------------------------------------- TensorFlow side

_said: set = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.warning("colabkit: %s", message)


def _tensorflow(purpose: str):
    from .optional import require
    return require("tensorflow", "tf", purpose)


def _logical_gpus(tf) -> list:
    gpus_seen = tf.config.list_logical_devices("GPU")
    if _state.chosen is not None and len(_state.chosen) != len(gpus_seen) and _state.applied_value is not None:
        _say_once(f"use_gpus chose {len(_state.chosen)} GPU(s) but TensorFlow sees {len(gpus_seen)}; "
                  f"using what TensorFlow sees.")
    return gpus_seen


def strategy(workers=None, *, index=None, timeout=None):
    """A tf.distribute strategy for the chosen GPUs: the default strategy for 0 or 1 GPU (0: the CPU, with one
    log line), MirroredStrategy over all of them for 2 or more. Call ``use_gpus`` first to choose; without it,
    every GPU TensorFlow sees is used.

    workers: one training over several machines: ["gpu-a:12345", "gpu-b:12345"] (the first is the chief) writes
    TF_CONFIG, says which worker this is, and returns a MultiWorkerMirroredStrategy whose collectives time out
    after ``timeout`` (see colabkit.cluster.multiworker; index: this worker's position when the host names
    cannot tell)."""
    if workers is not None:
        from .cluster.multiworker import strategy as multi_worker_strategy
        return multi_worker_strategy(workers, index=index, timeout=timeout)
    if index is not None or timeout is not None:
        raise ValueError("strategy(index=..., timeout=...) go with workers=[...] (a multi-worker run).")
    tf = _tensorflow("colabkit.strategy()")
    seen = _logical_gpus(tf)
    if len(seen) >= 2:
        return tf.distribute.MirroredStrategy(devices=[d.name for d in seen])
    if not seen:
        _say_once("no GPU visible to TensorFlow: using the default strategy on the CPU.")
    return tf.distribute.get_strategy()


@contextlib.contextmanager
def device(i: int = 0, *, strict: bool = True):
    """Place what is built inside on the i-th chosen GPU (0-based, CUDA order): ``with colabkit.device(1): ...``.

    Without any GPU: the CPU, with one log line. An index beyond the chosen GPUs is an error; with
    strict=False, a warning and the last GPU (so a two-GPU notebook also runs on one GPU). Yields the
    TensorFlow device name.
    """
    if isinstance(i, bool) or not isinstance(i, int) or i < 0:
        raise GPUSelectionError(f"device({i!r}): expected the position of a chosen GPU: 0, 1, ...")
    tf = _tensorflow("colabkit.device()")
    seen = _logical_gpus(tf)
    if not seen:
        _say_once("no GPU visible to TensorFlow: colabkit.device() places on the CPU.")
        name = "/device:CPU:0"
    elif i < len(seen):
        name = seen[i].name
    else:
        chosen_text = _names(_state.chosen) if _state.chosen else ", ".join(d.name for d in seen)
        message = (f"device({i}) asks for GPU #{i} of the chosen ones, but {len(seen)} "
                   f"{'is' if len(seen) == 1 else 'are'} visible ({chosen_text}).")
        if strict:
            raise GPUSelectionError(message + f" Choose more with colabkit.use_gpus({i + 1}) before TensorFlow "
                                              f"starts, or pass strict=False to fall back to the last GPU.")
        warnings.warn(message + f" Using {seen[-1].name} (strict=False).", GPUSelectionWarning, stacklevel=3)
        name = seen[-1].name
    with tf.device(name):
        yield name
