"""Where we run (colab / kaggle / jupyter / script) and the session clock (VM age, cap, time left).

The 12 h Colab clock is the VM's uptime, not the kernel's age: a kernel restart keeps the VM and its disk.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

from . import config as _config
from .units import format_duration

PROC_UPTIME = Path("/proc/uptime")
COLAB_MARKER = Path("/var/colab/hostname")

# Platform defaults used when runtime_cap / idle_cutoff are "auto". Google and Kaggle publish no hard
# guarantee; these are the documented/community-measured figures and can be overridden in the config.
_DEFAULT_CAP = {"colab": 12 * 3600.0, "kaggle": 12 * 3600.0}
_DEFAULT_IDLE = {"colab": 90 * 60.0}

_PROCESS_START = time.time()


@dataclasses.dataclass(frozen=True)
class Environment:
    """A snapshot of where we run and how much time the runtime has left.

    kind: "colab", "kaggle", "jupyter" (a Jupyter kernel elsewhere) or "script" (plain Python, terminal IPython).
    uptime: seconds since the machine booted, read from ``uptime_source``.
    runtime_cap / idle_cutoff: seconds, or None where no limit applies.
    """
    kind: str
    uptime: float
    uptime_source: str
    runtime_cap: float | None
    idle_cutoff: float | None
    taken_at: float

    @property
    def time_left(self) -> float | None:
        """Seconds until the runtime cap at ``taken_at`` (None without a cap)."""
        return None if self.runtime_cap is None else self.runtime_cap - self.uptime

    @property
    def cap_at(self) -> float | None:
        """Wall-clock time (time.time()) at which the cap is reached."""
        return None if self.runtime_cap is None else self.taken_at + self.time_left

    def cap_phrase(self) -> str:
        """How the runtime cap stands: "3h 10m left of a 12h 00m cap" or "past the 12h 00m cap by 5m"."""
        if self.runtime_cap is None:
            return "no runtime cap"
        if self.time_left > 0:
            return f"{format_duration(self.time_left)} left of a {format_duration(self.runtime_cap)} cap"
        return f"past the {format_duration(self.runtime_cap)} cap by {format_duration(-self.time_left)}"

    @property
    def is_hosted(self) -> bool:
        """True on a hosted notebook service whose VM is reclaimed (Colab, Kaggle)."""
        return self.kind in ("colab", "kaggle")


def detect_kind() -> str:
    """colab / kaggle / jupyter / script, without importing google.colab.

    Kaggle first: its image derives from Colab's and also sets COLAB_RELEASE_TAG.
    """
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE") or os.environ.get("KAGGLE_URL_BASE"):
        return "kaggle"
    if "google.colab" in sys.modules or COLAB_MARKER.exists():
        return "colab"
    shell = _ipython()
    if shell is not None and "google.colab" in str(type(shell)):
        return "colab"
    if shell is not None and getattr(shell, "kernel", None) is not None:
        return "jupyter"
    if "ipykernel" in sys.modules and "ipykernel_launcher" in " ".join(sys.argv):
        return "jupyter"
    return "script"


def _ipython():
    if "IPython" not in sys.modules:
        return None
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return None
    return get_ipython()


def read_uptime(proc_uptime: Path = None) -> tuple[float, str]:
    """(seconds since boot, where that figure came from). Never raises.

    Linux: /proc/uptime (else CLOCK_BOOTTIME). macOS/BSD: sysctl kern.boottime. Windows: GetTickCount64.
    Last resort: the age of this Python process, labelled as such.
    """
    path = Path(proc_uptime) if proc_uptime is not None else PROC_UPTIME
    try:
        seconds = float(path.read_text().split()[0])
        if 0 <= seconds < float("inf"):  # "nan", "inf" or a negative figure is no uptime
            return seconds, str(path)
    except (OSError, ValueError, IndexError):
        pass
    if sys.platform == "darwin" or "bsd" in sys.platform:
        try:
            out = subprocess.run(["sysctl", "-n", "kern.boottime"], capture_output=True, text=True, timeout=2).stdout
            # "{ sec = 1700000000, usec = 12345 } Tue Nov 14 ..."
            boot = float(out.split("sec =")[1].split(",")[0])
            return time.time() - boot, "sysctl kern.boottime"
        except (OSError, IndexError, ValueError, subprocess.SubprocessError):
            pass
    if sys.platform == "win32":
        try:
            import ctypes
            return ctypes.windll.kernel32.GetTickCount64() / 1000.0, "GetTickCount64"
        except (AttributeError, OSError):
            pass
    if hasattr(time, "CLOCK_BOOTTIME"):  # Linux without a readable /proc (sandboxes, some containers)
        try:
            return time.clock_gettime(time.CLOCK_BOOTTIME), "clock_gettime(CLOCK_BOOTTIME)"
        except OSError:
            pass
    return time.time() - _PROCESS_START, "process age (no system uptime source found)"


def env(*, runtime_cap=None, idle_cutoff=None, proc_uptime: Path = None) -> Environment:
    """The current environment and session clock.

    ``runtime_cap`` / ``idle_cutoff`` override the configured values ("auto", "none", or a duration).
    """
    settings = _config.load(runtime_cap=runtime_cap, idle_cutoff=idle_cutoff)
    kind = detect_kind()
    uptime, source = read_uptime(proc_uptime)
    cap = _DEFAULT_CAP.get(kind) if settings.runtime_cap == _config.AUTO else settings.runtime_cap
    idle = _DEFAULT_IDLE.get(kind) if settings.idle_cutoff == _config.AUTO else settings.idle_cutoff
    return Environment(kind=kind, uptime=uptime, uptime_source=source, runtime_cap=cap, idle_cutoff=idle,
                       taken_at=time.time())
