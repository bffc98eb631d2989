"""The training process: started in a session of its own (the guard forwards signals to its whole process group,
so ``accelerate launch`` / ``torchrun`` workers get them too), its output passed through unchanged, stopped
with the user's signal, then SIGTERM, then SIGKILL.

Output: where the guard's own stdout/stderr are the process's (a terminal, a log file), the script inherits
them, so progress bars and colours behave as without the guard. Where they are not (a notebook cell), the
script writes to pipes that the guard copies to the cell as the bytes arrive (no line buffering: tqdm's ``\\r``
updates show), and PYTHONUNBUFFERED=1 keeps a Python script from holding its output back.
"""
from __future__ import annotations

import codecs
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

from ..proctree import descendants

__all__ = ["Child", "exit_status", "with_args"]


def with_args(command, extra: list[str]):
    """``command`` (a list, or a shell string) with ``extra`` arguments appended."""
    if isinstance(command, str):
        return command + "".join(" " + shlex.quote(a) for a in extra)
    return [*command, *extra]


def exit_status(returncode: int) -> int:
    """A shell's exit status for a process's return code (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def _inherits(stream, fd: int) -> bool:
    """Whether ``stream`` writes to file descriptor ``fd`` of this process (so a child can simply inherit it)."""
    if stream is None or stream is not getattr(sys, f"__{'stdout' if fd == 1 else 'stderr'}__", None):
        return False
    try:
        return stream.fileno() == fd
    except (OSError, ValueError, AttributeError):
        return False


class Child:
    """One attempt of the training command."""

    def __init__(self, command, *, env: dict | None = None, cwd=None):
        self.command = command
        pipe = not (_inherits(sys.stdout, 1) and _inherits(sys.stderr, 2))
        environment = dict(os.environ if env is None else env)
        if pipe:
            environment.setdefault("PYTHONUNBUFFERED", "1")
        out = subprocess.PIPE if pipe else None
        self.proc = subprocess.Popen(command, shell=isinstance(command, str), env=environment, cwd=cwd,
                                     stdout=out, stderr=out, start_new_session=hasattr(os, "setsid"))
        self._pumps = []
        if pipe:
            for src, dst in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr")):
                t = threading.Thread(target=_pump, args=(src, dst), name=f"colabkit-guard-{dst}", daemon=True)
                t.start()
                self._pumps.append(t)
        self.pids: set[int] = set()   # every process seen below it, for the final SIGKILL
        self.last_alive = time.monotonic()   # the last time it (or a process of its group) was seen running

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is None:
            self.last_alive = time.monotonic()
        return code

    def running(self) -> bool:
        return self.poll() is None

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        for t in self._pumps:
            t.join(timeout=2.0)
        return code

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process group and every process below it (workers that made a group of their own)."""
        if not hasattr(os, "killpg"):
            with contextlib.suppress(OSError):
                self.proc.send_signal(sig)
            return
        self.pids |= descendants(self.proc.pid)
        # once each: the group gets it from killpg; a process of the group signalled again would have its
        # ``except KeyboardInterrupt: save()`` interrupted by the second one
        outside = [pid for pid in self.pids if _group_of(pid) not in (None, self.proc.pid)]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
        for pid in outside:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; the return code."""
        if self.running():
            self.signal(signal.SIGTERM)
            if self.wait(timeout) is None:
                self.kill()
        code = self.wait()
        self.kill_leftovers()
        return code

    def kill(self) -> None:
        self.signal(getattr(signal, "SIGKILL", signal.SIGTERM))

    def kill_leftovers(self) -> None:
        """SIGKILL what is left of the tree after the main process ended (workers it did not reap)."""
        if not hasattr(os, "killpg"):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def tree_alive(self) -> bool:
        """Whether the process or anything of its group is still running (an exited main process can leave
        workers writing). ``last_alive`` keeps the last time it was."""
        if self.running() or self._group_alive():
            self.last_alive = time.monotonic()
            return True
        return False

    def _group_alive(self) -> bool:
        if not hasattr(os, "killpg"):
            return False
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True


def _pump(src, name: str) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    fd = src.fileno()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            chunk = b""
        text = decoder.decode(chunk, final=not chunk)
        dst = getattr(sys, name)
        if text:
            with contextlib.suppress(Exception):
                dst.write(text)
                dst.flush()
        if not chunk:
            break
    src.close()


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def sleep_until(condition, timeout: float, step: float = 0.1) -> bool:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= end:
            return False
        time.sleep(step)
    return True
