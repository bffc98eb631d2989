"""A finding: one line of the doctor's report (status, what was found, the fix), and how the report is shown."""
from __future__ import annotations

import dataclasses
import json

STATUSES = ("ok", "warn", "fail", "skip")


@dataclasses.dataclass(frozen=True)
class Finding:
    check: str             # the check's name, e.g. "pcie"
    status: str            # ok / warn / fail / skip
    found: str             # what was found, one sentence
    fix: str = ""          # what to do about it (empty when nothing)
    gpu: int | None = None  # NVML's index of the GPU it is about, if one

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"finding status {self.status!r}: expected one of {', '.join(STATUSES)}")

    def as_dict(self) -> dict:
        out = {"check": self.check, "status": self.status}
        if self.gpu is not None:
            out["gpu"] = self.gpu
        out.update(found=self.found, fix=self.fix)
        return out


def exit_code(findings) -> int:
    """0 when nothing failed, 1 when something did."""
    return 1 if any(f.status == "fail" for f in findings) else 0


def _merged(findings) -> list:
    """Per-GPU findings that say the same thing become one line "GPU 0,1: ..." (an 8-GPU box stays readable)."""
    out, seen = [], {}
    for f in findings:
        key = (f.check, f.status, f.found, f.fix)
        if f.gpu is not None and key in seen:
            seen[key][1].append(f.gpu)
            continue
        entry = [f, [f.gpu] if f.gpu is not None else []]
        if f.gpu is not None:
            seen[key] = entry
        out.append(entry)
    return out


def render_text(findings, title: str | None = None) -> str:
    lines = [title] if title else []
    entries = _merged(findings)
    width = max([len(f.check) for f, _ in entries] + [5])
    for f, gpus in entries:
        where = f"GPU {','.join(map(str, gpus))}: " if gpus else ""
        line = f"{f.status.upper():<4}  {f.check:<{width}}  {where}{f.found}"
        if f.fix:
            line += f" -> {f.fix}"
        lines.append(line)
    counts = {s: sum(f.status == s for f in findings) for s in STATUSES}
    lines.append(", ".join(f"{counts[s]} {s}" for s in ("fail", "warn", "ok", "skip")) + " (counted per GPU)")
    return "\n".join(lines)


def render_json(findings) -> str:
    return json.dumps([f.as_dict() for f in findings], indent=1)
