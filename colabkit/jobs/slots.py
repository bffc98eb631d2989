"""Slot planning for `colabkit run`: which GPUs (or the CPU) each job gets: ``--per-gpu``, ``--gpus-per-job``."""
from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from .spec import JobError

if TYPE_CHECKING:
    from .spec import JobState


@dataclasses.dataclass
class Slot:
    label: str   # "GPU 0", "MIG 0:1", "CPU"
    env: dict    # CUDA_* variables for a job in this slot
    job: JobState | None = None
    gpus: list = dataclasses.field(default_factory=list)   # the GPU records a job here claims
    share: float | None = None   # the fraction of each GPU a job here claims (--per-gpu N: 1/N); None: whole
    claim: object | None = None  # the claims.Claim the job running here holds
    pick: bool = True            # GPUs chosen by count or "auto": one a program without a claim keeps busy waits


def claim_request(slot: Slot, view, *, mine: set = frozenset()) -> list:
    """What a job in ``slot`` claims ([{"uuid", "index", "share"}]); raises devices.GPUsTaken when another process
    holds one of its GPUs (or its share does not fit), or, for GPUs picked by count or "auto", a program without
    a claim keeps one busy."""
    from .. import devices
    from ..devices import claims
    inventory = devices.gpus(processes=slot.pick, claims=False)
    mine_gpus = {g.uuid: g for g in inventory}
    records = [mine_gpus.get(g.uuid, g) for g in slot.gpus]
    taken, busy = claims.taken(records, view, mine=set(mine), share=None, fraction=slot.share)
    problems = {**({} if not slot.pick else busy), **taken}
    if problems:
        short = "; ".join(f"GPU {g.label} {problems[g.uuid]}" for g in records if g.uuid in problems)
        raise devices.GPUsTaken.with_short(short, short)
    covered = {g["uuid"] for r in view.claims if r.id in mine for g in r.gpus}
    return [{"uuid": g.uuid, "index": g.index, "label": g.label,
             "share": None if slot.share is None or g.memory_total is None else int(slot.share * g.memory_total)}
            for g in records if g.uuid not in covered]


def plan_slots(gpus="auto", *, per_gpu: int = 1, gpus_per_job: int = 1, min_free=None, max_util=None,
               memory_growth=None):
    """(slots, note): `per_gpu` slots per chosen GPU (per group of `gpus_per_job` GPUs), or CPU slots where the
    machine has none."""
    from .. import devices
    for flag, value in (("--per-gpu", per_gpu), ("--gpus-per-job", gpus_per_job)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise JobError(f"{flag} {value!r}: expected a whole number of at least 1.")
    if memory_growth is None:
        from .. import config
        memory_growth = config.load().memory_growth
    request = devices.parse_request(gpus) if isinstance(gpus, str) else gpus
    chosen = devices.select_gpus(request, min_free=min_free, max_util=max_util, one_process=gpus_per_job > 1)
    if not chosen:
        env = {} if chosen.leave_env else {devices.ORDER_VAR: "PCI_BUS_ID", devices.VISIBLE_VAR: devices.NO_GPUS}
        return [Slot("CPU", dict(env)) for _ in range(per_gpu)], chosen.note
    groups, note = _group(list(chosen), gpus_per_job)
    slots = []
    for _ in range(per_gpu):  # round robin: a second job goes to another GPU before doubling up
        for group in groups:
            env = {devices.ORDER_VAR: "PCI_BUS_ID", devices.VISIBLE_VAR: ",".join(g.cuda_id for g in group)}
            if memory_growth and devices.GROWTH_VAR not in os.environ:
                env[devices.GROWTH_VAR] = "true"
            kind = "MIG" if group[0].is_mig else "GPU" if len(group) == 1 else "GPUs"
            slots.append(Slot(f"{kind} {','.join(g.label for g in group)}", env, gpus=list(group),
                              share=None if per_gpu == 1 else 1.0 / per_gpu, pick=request == "auto"
                              or (isinstance(request, int) and not isinstance(request, bool))))
    return slots, note


def _group(chosen: list, size: int) -> tuple[list, str | None]:
    """The chosen GPUs in groups of `size`: neighbours in PCI order among them (these tend to share a PCIe switch)."""
    if size == 1:
        return [[g] for g in chosen], None
    if any(g.is_mig for g in chosen):
        raise JobError(f"--gpus-per-job {size}: the chosen devices are MIG instances "
                       f"({', '.join(g.label for g in chosen if g.is_mig)}), and CUDA gives a process at most one; "
                       f"MIG instances cannot be grouped. Use --gpus-per-job 1, or whole GPUs.")
    if len(chosen) < size:
        raise JobError(f"--gpus-per-job {size}: only {len(chosen)} GPU(s) chosen "
                       f"({', '.join(g.label for g in chosen)}). Ask for at most {len(chosen)}, or choose more "
                       f"GPUs with --gpus.")
    ordered = sorted(chosen, key=lambda g: g.index)
    usable = len(ordered) - len(ordered) % size
    groups = [ordered[i:i + size] for i in range(0, usable, size)]
    spare = ordered[usable:]
    note = None
    if spare:
        note = (f"{len(ordered)} GPUs do not split into groups of {size}; "
                f"{'GPU' if len(spare) == 1 else 'GPUs'} {', '.join(g.label for g in spare)} left idle.")
    return groups, note
