"""The status summary shown by `%colabkit` and `colabkit status`: environment, clock, Drive root, GPUs.

(Not named status.py: importing a submodule ``colabkit.status`` would make the import system overwrite the
public function ``colabkit.status`` with the module.)
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from . import config as _config
from .runtime import Environment, env
from .units import format_duration

NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")


def gpu_count() -> int | None:
    """Number of NVIDIA GPUs the driver exposes, read from /proc without starting NVML (cheap); None if unknown."""
    try:
        return sum(1 for _ in NVIDIA_PROC.iterdir())
    except OSError:
        return None


@dataclasses.dataclass(frozen=True)
class Status:
    environment: Environment
    drive_root: str
    gpus: int | None

    def as_dict(self) -> dict:
        e = self.environment
        return {"kind": e.kind, "vm_age_s": round(e.uptime, 1), "uptime_source": e.uptime_source,
                "runtime_cap_s": e.runtime_cap, "time_left_s": None if e.time_left is None else round(e.time_left, 1),
                "idle_cutoff_s": e.idle_cutoff, "drive_root": self.drive_root, "gpus": self.gpus}

    def text(self) -> str:
        e = self.environment
        idle = "none" if e.idle_cutoff is None else format_duration(e.idle_cutoff)
        gpus = "unknown (no NVIDIA driver found)" if self.gpus is None else str(self.gpus)
        return "\n".join([
            f"colabkit: running on {e.kind}",
            f"  VM age      {format_duration(e.uptime)}  (from {e.uptime_source})",
            f"  runtime     {e.cap_phrase()}",
            f"  idle cutoff {idle}",
            f"  drive root  {self.drive_root}",
            f"  GPUs        {gpus}",
        ])

    def json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


def status() -> Status:
    """Collect the status summary. Never mounts Drive: on Colab an unmounted Drive is shown as such."""
    settings = _config.load()
    environment = env()
    if settings.drive_root != _config.AUTO:
        root = str(settings.drive_root)
    elif environment.kind == "colab":
        from .locations import COLAB_MOUNTPOINT, mounted_colab_drive
        mounted = mounted_colab_drive()
        root = str(mounted) if mounted else f"{COLAB_MOUNTPOINT / 'MyDrive'} (not mounted yet; mounted on first use)"
    else:
        from .locations import drive_root
        root = str(drive_root(settings))
    return Status(environment=environment, drive_root=root, gpus=gpu_count())


def config_report(settings: _config.Settings | None = None) -> str:
    """The effective settings and where each came from (for `colabkit config`)."""
    settings = settings or _config.load()
    lines = [f"config file: {settings.config_file}" + ("" if settings.config_file.exists() else " (not present)")]
    width = max(len(f.name) for f in _config.FIELDS)
    for field in _config.FIELDS:
        value = getattr(settings, field.name)
        # durations as durations; other numbers (a price, megabytes) as they are
        durations = (_config._duration, _config._duration_or_auto, _config._duration_or_zero)
        shown = format_duration(value) if isinstance(value, float) and field.parse in durations else value
        shown = "none" if value is None else shown
        lines.append(f"  {field.name:<{width}}  {shown!s:<24} ({settings.sources[field.name]})")
    return "\n".join(lines)
