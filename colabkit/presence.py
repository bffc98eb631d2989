"""Is a browser attached to this kernel? Asked of the notebook server from a background thread.

While a training cell runs, the kernel's shell channel is busy: messages from the browser (widget events,
``invokeFunction`` calls) wait until the cell ends, so the kernel cannot hear from the page itself. The
notebook server can tell: Jupyter Server's ``GET /api/kernels/<id>`` returns ``connections`` (open websocket
clients, i.e. browser tabs showing this kernel) and ``last_activity``. A daemon thread asks it every few
seconds and keeps the answer:

    colabkit.presence()          # Presence(state="attached" | "absent" | "unknown", since=..., ...)
    colabkit.presence.start()    # keep checking in the background (%keepalive does this)

Finding the server: this kernel's id from its connection file name (``kernel-<id>.json``); the server's URL
and token from the ``jpserver-*.json`` files in the Jupyter runtime directory (the one whose pid is this
kernel's JPY_PARENT_PID first); on Colab from its environment (COLAB_JUPYTER_IP, KMP_TARGET_PORT,
COLAB_JUPYTER_TOKEN). Where nothing answers, the state is "unknown" with one line saying why.

When an idle cutoff applies (``colabkit.env().idle_cutoff``: 90min on Colab, or configured), the monitor
registers an idle clock with ``colabkit.deadline``: while no browser is attached, ``AutoResume(deadline="auto")``
saves and uploads a checkpoint before the cutoff (and keeps training).

Where the time of the last browser contact is unknown (no browser seen since presence detection started), the
absence is dated from the earliest plausible moment: the kernel's start (``since_basis="kernel start"``), or
when presence detection started if the kernel's start cannot be read. The idle save can then come too early,
never too late. (The server's ``last_activity`` is no help: it is the kernel's own activity, "now" while
training runs.)

On Colab all of this is a guess: its notebook server sits behind Google's proxy, whose own websocket may be
counted in ``connections`` (then a closed tab still reads "attached" and no idle save happens), and Google
decides idleness on its side from what it hears, by rules it does not publish.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import glob
import json
import logging
import os
import re
import sys
import threading
import time
import types
import urllib.error
import urllib.request
from pathlib import Path

from .units import DURATION_FORMS, format_duration, parse_duration

log = logging.getLogger("colabkit")

ATTACHED, ABSENT, UNKNOWN = "attached", "absent", "unknown"
DEFAULT_POLL = 5.0
REQUEST_TIMEOUT = 2.0
_KERNEL_FILE = re.compile(r"kernel-(?P<id>[0-9A-Za-z_.\-]+?)\.json$")


@dataclasses.dataclass(frozen=True)
class Presence:
    """One answer about the browser.

    state: "attached" (at least one browser connection), "absent" (none) or "unknown" (no server answered).
    since: attached: when it was first seen attached; absent: the last time a browser was seen or, if none was
        ever seen, the earliest plausible moment (the kernel's start), i.e. the conservative start of the absence.
    since_basis: absent only: "last seen", "kernel start" or "presence start" (no browser seen and the kernel's
        start unknown): where ``since`` comes from; the last two are guesses that err early.
    last_seen: the last time a browser was seen attached (None if never).
    connections, last_activity, execution_state: what the server reported.
    server: the server's URL (no token). detail: one line saying why the state is "unknown".
    """
    state: str
    since: float | None = None
    last_seen: float | None = None
    connections: int | None = None
    last_activity: float | None = None
    execution_state: str | None = None
    server: str | None = None
    detail: str = ""
    checked_at: float = dataclasses.field(default_factory=time.time)
    since_basis: str = ""

    @property
    def absent_for(self) -> float | None:
        """Seconds without a browser (None unless absent)."""
        return None if self.state != ABSENT or self.since is None else max(0.0, self.checked_at - self.since)

    def text(self) -> str:
        """One line: "attached (1 connection)", "absent since 12:05:10 (3m 02s)", "unknown: <why>"."""
        if self.state == ATTACHED:
            n = self.connections or 0
            return f"attached ({n} browser connection{'s' if n != 1 else ''})"
        if self.state == ABSENT:
            if self.since is None:
                return "absent"
            text = f"absent since {_clock(self.since)} ({format_duration(self.absent_for)}"
            if self.since_basis == "kernel start":
                return text + "; no browser seen yet; counted from the kernel's start)"
            if self.since_basis == "presence start":
                return text + "; no browser seen yet; counted from when presence detection started)"
            return text + ")"
        return f"unknown: {self.detail}" if self.detail else "unknown"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


# -- finding this kernel and its server ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Server:
    url: str           # ends with "/", includes the base URL
    token: str
    source: str        # where we learned about it: a jpserver-*.json file, the Colab environment, an argument

    def __repr__(self):  # never show the token
        return f"Server(url={self.url!r}, source={self.source!r})"


def connection_file() -> str | None:
    """This kernel's connection file: from ipykernel (if running) or the ``-f`` argument of the launcher."""
    app_module = sys.modules.get("ipykernel.kernelapp")
    if app_module is not None:
        try:
            if app_module.IPKernelApp.initialized():
                path = app_module.IPKernelApp.instance().connection_file
                if path:
                    return path
        except Exception:  # noqa: BLE001 - a half-initialised app must not break presence
            pass
    argv = list(sys.argv)
    for i, arg in enumerate(argv):
        if arg in ("-f", "--f") and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--f=") or arg.startswith("-f="):
            return arg.split("=", 1)[1]
    return None


_started_at: float | None = None


def kernel_started_at() -> float | None:
    """When this (kernel) process started, as a wall-clock time; None where the system does not say.

    Linux: the process's start in clock ticks after boot (/proc/self/stat) against the uptime (/proc/uptime),
    both at 10 ms resolution; elsewhere psutil's create_time() (whose boot time is whole seconds, so it can read
    up to a second early). Never more than a few seconds before the kernel's connection file was written (the
    server writes it before it starts the kernel): in a container a virtualised /proc/uptime can put the /proc
    estimate hours early, and an idle clock started then would save at once."""
    global _started_at
    if _started_at is None:
        _started_at = _read_process_start()
    return _started_at


CONNECTION_FILE_SLACK_S = 5.0   # ipykernel may write its own connection file just after it started


def _read_process_start() -> float | None:
    started = _proc_start()
    if started is None:
        started = _psutil_start()
    floor = _connection_file_time()
    if started is None:
        return None if floor is None else min(floor, time.time())
    if floor is not None and started < floor - CONNECTION_FILE_SLACK_S:
        log.debug("colabkit: the process start read from the system (%s) lies before the kernel's connection file "
                  "was written (%s); using the file's time", started, floor)
        started = floor
    return min(started, time.time())


def _proc_start() -> float | None:
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])   # field 22, starttime, counted after "(comm)"
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _psutil_start() -> float | None:
    try:
        import psutil
        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - psutil missing or not allowed to ask: the other estimate still counts
        return None


def _connection_file_time() -> float | None:
    path = connection_file()
    if not path:
        return None
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _in_ipykernel() -> bool:
    app_module = sys.modules.get("ipykernel.kernelapp")
    try:
        return app_module is not None and app_module.IPKernelApp.initialized()
    except Exception:  # noqa: BLE001
        return False


def kernel_id(path: str | None = None) -> str | None:
    """The kernel id in a connection file name (``kernel-<id>.json``), or None."""
    path = connection_file() if path is None else path
    if not path:
        return None
    m = _KERNEL_FILE.search(os.path.basename(path))
    return m.group("id") if m else None


def _runtime_dirs(conn_file: str | None) -> list[Path]:
    dirs = []
    if conn_file:
        dirs.append(Path(conn_file).expanduser().resolve().parent)
    if os.environ.get("JUPYTER_RUNTIME_DIR"):
        dirs.append(Path(os.environ["JUPYTER_RUNTIME_DIR"]).expanduser())
    try:
        from jupyter_core.paths import jupyter_runtime_dir
        dirs.append(Path(jupyter_runtime_dir()))
    except Exception:  # noqa: BLE001 - jupyter_core missing or broken: the other places still count
        pass
    seen, out = set(), []
    for d in dirs:
        key = str(d)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def servers(conn_file: str | None = None) -> list[Server]:
    """Notebook servers that may own this kernel, most likely first."""
    conn_file = connection_file() if conn_file is None else conn_file
    found: list[Server] = []
    parent_pid = os.environ.get("JPY_PARENT_PID", "")
    files = []
    for d in _runtime_dirs(conn_file):
        files += [Path(p) for p in glob.glob(str(d / "jpserver-*.json")) + glob.glob(str(d / "nbserver-*.json"))]

    def rank(p: Path):
        own = p.stem.split("-", 1)[-1] == parent_pid
        try:
            mtime = p.stat().st_mtime
        except OSError:
            mtime = 0.0
        return (not own, -mtime)

    for p in sorted(dict.fromkeys(files), key=rank):
        try:
            info = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        url = info.get("url") or ""
        if not url:
            continue
        found.append(Server(url=url if url.endswith("/") else url + "/", token=info.get("token") or "",
                            source=str(p)))
    ip, port = os.environ.get("COLAB_JUPYTER_IP"), os.environ.get("KMP_TARGET_PORT")
    if ip and port:
        found.append(Server(url=f"http://{ip}:{port}/", token=os.environ.get("COLAB_JUPYTER_TOKEN", ""),
                            source="Colab environment (COLAB_JUPYTER_IP, KMP_TARGET_PORT)"))
    token = os.environ.get("JUPYTER_TOKEN")
    if token:
        found = [s if s.token else dataclasses.replace(s, token=token) for s in found]
    return found


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never route localhost via a proxy


def _get_json(server: Server, path: str, timeout: float):
    request = urllib.request.Request(server.url + path, headers={"Accept": "application/json"})
    if server.token:
        request.add_header("Authorization", f"token {server.token}")
    with _OPENER.open(request, timeout=timeout) as response:
        return json.loads(response.read().decode("utf-8"))


def _parse_time(value) -> float | None:
    if not value:
        return None
    try:
        return _dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        return getattr(reason, "strerror", None) or str(reason)
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


class PresenceMonitor:
    """Asks the notebook server about this kernel every ``poll`` seconds, from a daemon thread.

    ``current`` is the latest Presence. ``next_deadline()`` makes the monitor an idle clock for
    ``colabkit.deadline`` (registered by ``start()`` when an idle cutoff applies).
    """

    def __init__(self, *, poll=DEFAULT_POLL, server_url: str | None = None, token: str | None = None,
                 kernel: str | None = None, idle_cutoff: float | None = None, timeout: float = REQUEST_TIMEOUT):
        self.poll = _interval(poll, "poll")
        self.timeout = timeout
        self.idle_cutoff = idle_cutoff
        self._explicit = None if server_url is None else Server(
            url=server_url if server_url.endswith("/") else server_url + "/", token=token or "", source="argument")
        self._kernel = kernel
        self._server: Server | None = None          # the server that answered last
        self._last_seen: float | None = None
        self._attached_since: float | None = None
        self._absent_since: float | None = None
        self._absent_basis = ""
        self._created = time.time()
        self._last_unknown = None
        self.current = Presence(UNKNOWN, detail="not checked yet")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- one check ---------------------------------------------------------------------------------------
    def check(self) -> Presence:
        """Ask the server now (at most ``timeout`` seconds per server tried) and update ``current``."""
        with self._lock:
            presence = self._ask()
            self._log_transition(self.current, presence)
            self.current = presence
            return presence

    def _ask(self) -> Presence:
        kid = self._kernel or kernel_id()
        in_kernel = _in_ipykernel()
        if not kid and not in_kernel:
            return Presence(UNKNOWN, detail="this Python process is not a Jupyter kernel started by a notebook "
                                            "server (no kernel-<id>.json connection file)")
        candidates = [self._explicit] if self._explicit else (
            ([self._server] if self._server else []) + [s for s in servers() if s != self._server])
        if not candidates:
            return Presence(UNKNOWN, detail="no notebook server found (no jpserver-*.json in the Jupyter runtime "
                                            "directory, no Colab server in the environment)")
        if not kid:
            # A kernel whose connection file name does not carry its id: a server with exactly one kernel
            # (a Colab VM) can only be talking about this one.
            kid = self._kernel = self._only_kernel(candidates)
            if not kid:
                return Presence(UNKNOWN, detail="cannot tell this kernel's id (its connection file is not named "
                                                "kernel-<id>.json) and no notebook server has exactly one kernel")
        problems = []
        for server in candidates:
            try:
                model = _get_json(server, f"api/kernels/{kid}", self.timeout)
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    problems.append(f"{server.url} does not know kernel {kid}")
                else:
                    problems.append(f"the notebook server at {server.url} answered {_describe(exc)}"
                                    + (" (wrong or missing token)" if exc.code in (401, 403) else ""))
                continue
            except (OSError, ValueError) as exc:
                problems.append(f"cannot reach the notebook server at {server.url} ({_describe(exc)})")
                continue
            self._server = server
            return self._interpret(model, server)
        self._server = None
        return Presence(UNKNOWN, detail=problems[0] if len(problems) == 1 else "; ".join(problems[:3]))

    def _only_kernel(self, candidates) -> str | None:
        for server in candidates:
            try:
                kernels = _get_json(server, "api/kernels", self.timeout)
            except (OSError, ValueError):
                continue
            if isinstance(kernels, list) and len(kernels) == 1 and kernels[0].get("id"):
                return kernels[0]["id"]
        return None

    def _interpret(self, model: dict, server: Server) -> Presence:
        now = time.time()
        connections = model.get("connections")
        last_activity = _parse_time(model.get("last_activity"))
        common = dict(connections=connections, last_activity=last_activity, server=server.url,
                      execution_state=model.get("execution_state"), checked_at=now)
        if not isinstance(connections, int):
            return Presence(UNKNOWN, detail=f"the notebook server at {server.url} does not report browser "
                                            f"connections for kernels", **common)
        if connections > 0:
            if self._attached_since is None:
                self._attached_since = now
            self._absent_since = None
            self._last_seen = now
            return Presence(ATTACHED, since=self._attached_since, last_seen=now, **common)
        self._attached_since = None
        if self._absent_since is None:
            self._absent_since, self._absent_basis = self._absence_start()
        return Presence(ABSENT, since=self._absent_since, last_seen=self._last_seen, since_basis=self._absent_basis,
                        **common)

    def _absence_start(self) -> tuple[float, str]:
        """The browser left after the last time we saw it. Never seen: the earliest moment it can have left,
        so that a deadline counted from here comes early rather than late."""
        if self._last_seen is not None:
            return self._last_seen, "last seen"
        started = kernel_started_at()
        if started is not None and started <= self._created:
            return started, "kernel start"
        return self._created, "presence start"

    def _log_transition(self, old: Presence, new: Presence) -> None:
        if new.state == UNKNOWN:
            if new.detail != self._last_unknown:
                log.info("colabkit: browser presence unknown: %s", new.detail)
            self._last_unknown = new.detail
            return
        self._last_unknown = None
        if new.state != old.state:
            if new.state == ABSENT and self.idle_cutoff:
                log.info("colabkit: no browser attached since %s; the %s idle cutoff would be reached at %s",
                         _clock(new.since), idle_label(self.idle_cutoff), _clock(new.since + self.idle_cutoff))
            else:
                log.info("colabkit: browser %s", new.text())

    # -- the idle clock ------------------------------------------------------------------------------------
    def next_deadline(self):
        """colabkit.deadline clock: the idle cutoff counted from the start of the absence (None otherwise)."""
        p = self.current
        if self.idle_cutoff is None or p.state != ABSENT or p.since is None:
            return None
        from .deadline import Deadline
        return Deadline(at=p.since + self.idle_cutoff, reason=f"the {idle_label(self.idle_cutoff)} idle cutoff",
                        stop_training=False, key=f"idle@{p.since:.0f}")

    # -- the thread -------------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> PresenceMonitor:
        if self.running:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="colabkit-presence", daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.poll):
            try:
                self.check()
            except Exception:
                log.exception("colabkit: presence check failed")

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._thread = None


def idle_label(seconds: float) -> str:
    """'90min' for 5400, '20s' for 20, '1.5h' style avoided: minutes when whole, else seconds."""
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}min"
    return f"{seconds:g}s"


def _interval(value, name: str) -> float:
    try:
        seconds = parse_duration(value, name=name)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a valid interval; expected {DURATION_FORMS}.") from None
    if seconds < 0.2:
        raise ValueError(f"{name}={value!r} is too short; use at least 0.2s.")
    return seconds


# -- the module-level monitor ----------------------------------------------------------------------------
_monitor: PresenceMonitor | None = None
_module_lock = threading.Lock()


def running_monitor() -> PresenceMonitor | None:
    """The running monitor started by ``start()`` (or %keepalive), or None."""
    m = _monitor
    return m if m is not None and m.running else None


def start(poll=DEFAULT_POLL, *, server_url: str | None = None, token: str | None = None,
          idle_cutoff="auto", register_idle_clock: bool = True) -> PresenceMonitor:
    """Start (or restart with new settings) the background presence monitor; returns it after a first check.

    idle_cutoff: "auto" takes ``colabkit.env().idle_cutoff``; None disables the idle clock.
    register_idle_clock: register the monitor with colabkit.deadline when an idle cutoff applies.
    """
    global _monitor
    seconds = _interval(poll, "poll")
    if isinstance(idle_cutoff, str) and idle_cutoff == "auto":
        from .runtime import env
        cutoff = env().idle_cutoff
    else:
        cutoff = None if idle_cutoff is None else parse_duration(idle_cutoff, name="idle_cutoff")
    new = PresenceMonitor(poll=seconds, server_url=server_url, token=token, idle_cutoff=cutoff)
    new.check()
    with _module_lock:
        old, _monitor = _monitor, new
    if old is not None:
        _retire(old)
    new.start()
    if register_idle_clock and cutoff is not None:
        from . import deadline
        deadline.register(new)
    return new


def _retire(m: PresenceMonitor) -> None:
    m.stop()
    from . import deadline
    deadline.unregister(m)


def stop() -> bool:
    """Stop the background monitor and remove its idle clock. True if one was running."""
    global _monitor
    with _module_lock:
        old, _monitor = _monitor, None
    if old is None:
        return False
    _retire(old)
    return True


_last_oneshot: Presence | None = None


def current(max_age: float = DEFAULT_POLL) -> Presence:
    """The latest Presence: the monitor's if one runs, else a one-shot check (cached ``max_age`` seconds)."""
    global _last_oneshot
    m = running_monitor()
    if m is not None:
        return m.current
    cached = _last_oneshot
    if cached is not None and time.time() - cached.checked_at < max_age:
        return cached
    _last_oneshot = PresenceMonitor().check()
    return _last_oneshot


class _CallableModule(types.ModuleType):
    """``colabkit.presence()`` calls ``current()``; ``colabkit.presence.start()`` etc. stay module attributes.

    (The package attribute ``colabkit.presence`` is this module once it is imported, so the module itself is
    made callable rather than binding a function of the same name.)"""

    def __call__(self, max_age: float = DEFAULT_POLL) -> Presence:
        return current(max_age)


sys.modules[__name__].__class__ = _CallableModule
