"""What a GPU inventory is made of: the GPU and Process records, the Inventory list and the CUDA_* names it shows."""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Sequence

from ..units import format_size

NA = "n/a"
ORDER_VAR, VISIBLE_VAR, GROWTH_VAR = "CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH"
NO_GPUS = "-1"  # CUDA_VISIBLE_DEVICES value that hides every GPU (CUDA stops at the first invalid entry)


class SourceUnavailable(Exception):
    """An inventory source cannot be used here (no driver, no library, no nvidia-smi)."""


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


def short_name(name: str | None) -> str | None:
    """A process name as a driver reports it (a path, maybe padded) -> its last component; None when blank."""
    return os.path.basename(name.strip()) if name and name.strip() else None


def gpu_names(choice: Sequence[GPU]) -> str:
    """'GPU 0 (NVIDIA GeForce GTX 1080), MIG 1:0 (...)', or 'no GPU': the chosen devices in one line."""
    return ", ".join(f"{'MIG ' if g.is_mig else 'GPU '}{g.label} ({g.name})" for g in choice) or "no GPU"


class Inventory(list):
    """A list of GPU records plus where they came from. ``str()`` / notebook display: a table.

    source: "nvml", "nvidia-smi" or "none". note: one line on why it is empty or how the choice was made.
    """

    def __init__(self, items: Iterable[GPU] = (), *, source: str = "none", driver: str | None = None,
                 note: str | None = None):
        super().__init__(items)
        self.source, self.driver, self.note = source, driver, note
        self.leave_env = False  # a choice of nothing because nothing is there: CUDA_* stay as they are
        self.claim = None       # the claims.Claim that holds these GPUs for this process (use_gpus)
        self.claims = None      # the claims.View shown with the table (gpus()); None: claims off or none yet

    def _derive(self, items, note=None, leave_env=False) -> Inventory:
        derived = Inventory(items, source=self.source, driver=self.driver, note=note)
        derived.leave_env = leave_env
        return derived

    def find(self, label: str) -> GPU | None:
        return next((g for g in self if g.label == label), None)

    def as_dict(self) -> dict:
        return {"source": self.source, "driver": self.driver, "note": self.note,
                "cuda_device_order": os.environ.get(ORDER_VAR), "cuda_visible_devices": os.environ.get(VISIBLE_VAR),
                "gpus": [g.as_dict() for g in self],
                "claims": None if self.claims is None else {
                    "folder": str(self.claims.path),
                    "gpus": {g.uuid: [dict(r.as_dict(), share_on_this_gpu=s) for r, s in self.claims.holders(g.uuid)]
                             for g in self},
                    "line": [r.as_dict() for r in self.claims.line]}}

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
        if self.claims is not None and self:
            lines.extend(self._claim_lines())
        if self.note:
            lines.append(self.note)
        if os.environ.get(VISIBLE_VAR) is not None:
            lines.append(f"{VISIBLE_VAR}={os.environ[VISIBLE_VAR]!s}"
                         + (f" ({ORDER_VAR}={os.environ[ORDER_VAR]})" if os.environ.get(ORDER_VAR) else ""))
        return "\n".join(lines) if lines else "no GPUs"

    def _claim_lines(self) -> list:
        lines = [f"Claims ({self.claims.path}):"]
        for g in self:
            if g.mig_enabled:
                continue
            holders = self.claims.holders(g.uuid)
            text = "; ".join(r.who() + ("" if share is None else f", {format_size(share)} share")
                             for r, share in holders) or "free"
            lines.append(f"  {'MIG' if g.is_mig else 'GPU'} {g.label}  {text}")
        for r in self.claims.line:
            lines.append(f"Waiting in line: {r.who()}" + (f" for {r.request}" if r.request else ""))
        return lines

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(self.table() if not cycle else "Inventory(...)")
