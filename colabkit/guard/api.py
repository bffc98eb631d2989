"""``colabkit.guard.run``: run a training command you do not edit, commit each checkpoint it writes to a safe
place, stop it before the runtime's deadline, and on a fresh machine put the newest checkpoint back and resume."""
from __future__ import annotations

import logging
import os
import posixpath
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

from .. import config as _config
from ..checkpoints.api import Checkpoints
from ..deadline import MARGIN_FLOOR_S, watch_for
from ..resume.run import Run
from ..resume.schedule import final_wait_s
from ..units import format_duration, parse_duration
from .commit import INFO_KEY, Committer
from .launch import Child, exit_status, with_args
from .patterns import patterns_from
from .watch import Watcher, fingerprint

__all__ = ["DEFAULT_GRACE", "DEFAULT_SETTLE", "DEFAULT_EVERY", "Guard", "run"]

log = logging.getLogger("colabkit")

DEFAULT_GRACE = "2min"     # after the stop signal: time for the script to write its checkpoint and exit
DEFAULT_SETTLE = "5s"      # a checkpoint is complete once unchanged this long (and its marker exists)
DEFAULT_EVERY = "2s"       # how often the watched folder is looked at
KILL_TIMEOUT_S = 10.0      # SIGTERM, then SIGKILL after this long
LATEST = "{latest}"


def _signal_number(value) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return int(signal.Signals(value))
    text = str(value).strip().upper()
    if text.isdigit():
        return int(signal.Signals(int(text)))
    try:
        return int(getattr(signal, text if text.startswith("SIG") else f"SIG{text}"))
    except AttributeError:
        raise ValueError(f"stop_signal={value!r} is not a signal; pass a name such as \"SIGINT\" (Ctrl-C, the "
                         f"default), \"SIGTERM\" or \"SIGUSR1\", or its number.") from None


def _seconds(value, name: str, *, zero: bool = False) -> float:
    if zero and not isinstance(value, bool) and str(value).strip() in ("0", "0.0", "0s"):
        return 0.0
    return parse_duration(value, name=name)


def _resume_tokens(template: str | None, latest: str | None, name: str) -> list[str]:
    if not template:
        return []
    try:
        tokens = shlex.split(template)
    except ValueError as exc:
        raise ValueError(f"{name}={template!r} cannot be split into arguments ({exc}); quote it as one "
                         f"argument, such as \"--resume_from_checkpoint={{latest}}\".") from None
    return [t.replace(LATEST, latest) for t in tokens] if latest is not None else tokens


class Guard:
    """One guarded run (``run()`` builds it; kept for the status panel's record of it)."""

    def __init__(self, command, *, watch, to, resume_arg=None, fresh_arg=None, patterns=None, markers=(),
                 keep=None, every=DEFAULT_EVERY, settle=DEFAULT_SETTLE, deadline="auto", margin=None,
                 stop_signal="SIGINT", grace=DEFAULT_GRACE, retries=0, local_dir=None, verbose=True):
        if isinstance(command, (list, tuple)):
            if not command or not all(isinstance(a, str) for a in command):
                raise ValueError(f"command={command!r} is invalid: pass the training command as a list of strings, "
                                 f"such as [\"accelerate\", \"launch\", \"train.py\"], or as one shell string.")
            command = list(command)
        elif not isinstance(command, str) or not command.strip():
            raise ValueError(f"command={command!r} is empty: pass the training command, such as "
                             f"\"python train.py --epochs 10\".")
        if watch is None or not str(watch).strip():
            raise ValueError(f"watch={watch!r} is empty: pass the folder the training writes its checkpoints in, "
                             f"such as \"outputs/\".")
        if os.path.isfile(watch):
            raise ValueError(f"watch={str(watch)!r} is a file: pass the folder the training writes its checkpoints "
                             f"in (the checkpoint files or folders are found inside it).")
        for name, value in (("resume_arg", resume_arg), ("fresh_arg", fresh_arg)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name}={value!r} is invalid: pass a string such as "
                                 f"\"--resume_from_checkpoint={{latest}}\".")
        if resume_arg is not None and LATEST not in resume_arg:
            raise ValueError(f"resume_arg={resume_arg!r} does not hold {LATEST}: write where the restored checkpoint's "
                             f"path goes, such as \"--resume_from_checkpoint={LATEST}\" or \"--resume {LATEST}\".")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries={retries!r} is invalid: pass a whole number of relaunches after a crash, "
                             f"at least 0.")
        self.command, self.watch, self.to = command, Path(watch), to
        self.resume_arg, self.fresh_arg = resume_arg, fresh_arg
        self.patterns = patterns_from(patterns, markers)
        self.every = _seconds(every, "every")
        self.settle = _seconds(settle, "settle", zero=True)
        self.grace = _seconds(grace, "grace", zero=True)
        self.stop_signal = _signal_number(stop_signal)
        self.retries, self.verbose = retries, verbose
        self.started = time.time()
        floor = MARGIN_FLOOR_S + self.grace if margin is None else _seconds(margin, "margin", zero=True)
        self.deadlines = watch_for(deadline, started_at=self.started, margin_floor=floor)
        self.checkpoints = Checkpoints(to, keep=keep, local_dir=local_dir)
        self.record = Run(self, "colabkit guard", checkpoints=self.checkpoints, deadline=deadline,
                          margin_floor=floor, verbose=verbose)
        self.watcher = Watcher(self.watch, self.patterns, settle=self.settle)
        staging = _config.load().resolved_cache_dir() / "guard"
        staging.mkdir(parents=True, exist_ok=True)
        self.committer = Committer(self.watcher, self.checkpoints, every=self.every, say=self.say,
                                   on_commit=self._committed, staging=staging)
        self.latest: str | None = None      # the restored checkpoint's path, as {latest} gets it
        self._received: list[int] = []      # signals sent to the guard itself

    # -- messages ----------------------------------------------------------------------------------------
    def say(self, message: str) -> None:
        log.info("colabkit guard: %s", message)
        if self.verbose:
            print(f"colabkit guard: {message}", file=sys.stderr, flush=True)

    def _committed(self, candidate, step) -> None:
        self.record.event("save", f"step {step} ({candidate.rel})")
        log.info("colabkit guard: committing step %s (%s)", step, candidate.rel)

    # -- restore -----------------------------------------------------------------------------------------
    def restore(self) -> str | None:
        """Put the newest verified checkpoint back where it was under the watched folder; its path, or None."""
        placed = {}

        def into(restored):
            rel = _recorded_path(restored.manifest.get("info", {}), restored.path.name)
            folder = self.watch / posixpath.dirname(rel) if posixpath.dirname(rel) else self.watch
            placed["rel"], placed["folder"] = rel, folder
            placed["aside"] = _moved_aside(folder, restored.path.name)
            return folder

        restored = self.checkpoints.restore_folder(into=into)
        if restored is None:
            return None
        rel = placed["rel"]
        aside = sorted(_moved_aside(placed["folder"], restored.path.name) - placed["aside"])
        fp = fingerprint(restored.path, restored.path.is_dir())
        if fp is not None:
            self.watcher.mark_done(rel, fp)
        c = self.committer
        c.highest_step = restored.step if c.highest_step is None else max(c.highest_step, restored.step)
        self.latest = os.path.join(str(self.watch), *rel.split("/"))
        self.record.event("restore", f"step {restored.step} ({rel}) from {restored.source}")
        self.say(f"restored step {restored.step} ({rel}) from {self.to} into {self.watch}")
        for name in aside:
            moved = posixpath.join(posixpath.dirname(rel), name)
            self.say(f"{rel} in {self.watch} differed from the committed checkpoint: it was moved aside to "
                     f"{moved} (not deleted), and the verified step {restored.step} is resumed")
        return self.latest

    def arguments(self) -> list[str]:
        if self.latest is None:
            return _resume_tokens(self.fresh_arg, None, "fresh_arg")
        return _resume_tokens(self.resume_arg, self.latest, "resume_arg")

    # -- the run -----------------------------------------------------------------------------------------
    def run(self) -> int:
        close_timeout = 60.0
        try:
            self.restore()
            self.watcher.baseline()
            attempt = 0
            while True:
                code, stopped = self._attempt(attempt)
                if stopped or code == 0 or attempt >= self.retries:
                    if not stopped:   # as after a stop: its upload waited for, and where it is said
                        uploaded = self.checkpoints.wait(final_wait_s(self._estimate()))
                        self.say(self._resume_line(f"the training ended with {_describe(code)}", uploaded,
                                                   stopped=False))
                        if not uploaded:   # waited for already: said where it is, not waited for again
                            close_timeout = 1.0
                    return exit_status(code)
                attempt += 1
                self.say(f"the training ended with {_describe(code)}; relaunching ({attempt} of {self.retries})")
                self.checkpoints.wait(final_wait_s(self._estimate()))
                self.restore()
        finally:
            self.checkpoints.close(timeout=close_timeout)

    def _attempt(self, attempt: int) -> tuple[int, bool]:
        """One launch: (return code, whether the guard stopped it)."""
        command = with_args(self.command, self.arguments())
        if self.latest is None and self.resume_arg and attempt == 0:
            self.say(f"nothing to restore in {self.to}: starting without {self.resume_arg!r}")
        env = dict(os.environ, COLABKIT_GUARD_ATTEMPT=str(attempt))
        previous = self._install_handlers()
        try:
            child = Child(command, env=env)
            self.committer.start()
            try:
                return self._supervise(child)
            except BaseException:
                child.kill()
                child.wait()
                raise
            finally:
                self.committer.stop()
        finally:
            self._restore_handlers(previous)

    def _supervise(self, child: Child) -> tuple[int, bool]:
        last_deadline_check = 0.0
        while True:
            code = child.poll()   # a plain sleep between looks: Popen.wait(timeout) wakes up every 50 ms
            if code is None:
                time.sleep(0.25)
                code = child.poll()
            if code is not None:
                code = child.wait()   # and its output copied through
                gone = not child.tree_alive()
                if gone:
                    self.committer.commit_ready(writers_gone=True, alive_until=child.last_alive, clean=code == 0)
                else:
                    self.committer.commit_ready()
                    child.kill_leftovers()   # workers it left: what they finished before is taken, not more
                    self.committer.commit_ready(writers_gone=True, alive_until=child.last_alive)
                child.kill_leftovers()
                return code, False
            if self._received:
                sig = self._received[0]
                return self._stop(child, sig, f"{signal.Signals(sig).name} sent to the guard"), True
            now = time.monotonic()
            if now - last_deadline_check >= 1.0:
                last_deadline_check = now
                due = self.deadlines.due(self._estimate())
                if due is not None:
                    self.deadlines.mark_handled(due)
                    if due.stop_training:
                        return self._stop(child, self.stop_signal, due.reason), True
                    self.say(f"{due.reason} is near: making sure the newest checkpoint is uploaded")
                    self.record.event("deadline-save", due.reason)
                    self.committer.commit_ready()

    def _stop(self, child: Child, sig: int, reason: str) -> int:
        """Signal the script, wait for its checkpoint (or its exit) up to the grace time, commit and upload it,
        then end the script; its return code."""
        existing = {entry[0] for entry in self.watcher.entries()}   # what its final checkpoint is not
        self.say(f"{reason}: sending {signal.Signals(sig).name} to the training and waiting up to "
                 f"{format_duration(self.grace)} for its checkpoint")
        child.signal(sig)
        self.committer.settled_after(existing, self.grace, done=lambda: not child.tree_alive(),
                                     alive_until=lambda: child.last_alive, clean=lambda: child.poll() == 0)
        uploaded = self.checkpoints.wait(final_wait_s(self._estimate()))
        code = child.terminate(KILL_TIMEOUT_S) if child.tree_alive() else child.wait()
        self.committer.commit_ready(writers_gone=True, alive_until=child.last_alive, clean=code == 0)
        uploaded = self.checkpoints.wait(final_wait_s(self._estimate())) and uploaded
        self.record.event("stop", reason)
        self.say(self._resume_line(reason, uploaded))
        return code

    def _resume_line(self, reason: str, uploaded: bool, *, stopped: bool = True) -> str:
        last = self.committer.last
        head = f"stopped ({reason})" if stopped else reason
        if last is None and self.latest is None:
            return (f"{head}; the training wrote no complete checkpoint, so nothing is in {self.to}: "
                    f"a new run starts from the beginning.")
        step, rel = last if last is not None else (self.committer.highest_step, os.path.relpath(self.latest,
                                                                                              self.watch))
        where = "is in" if uploaded else "is committed locally and NOT yet uploaded to"
        passes = " ".join(_resume_tokens(self.resume_arg, os.path.join(str(self.watch), rel), "resume_arg"))
        return (f"{head}; step {step} ({rel}) {where} {self.to}. To resume, run the same command "
                f"again: it restores {rel} into {self.watch} and passes {passes or 'no resume argument'}.")

    def _estimate(self) -> float:
        return self.checkpoints.estimated_save_seconds() or 0.0

    # -- signals to the guard itself ---------------------------------------------------------------------
    def _install_handlers(self):
        if threading.current_thread() is not threading.main_thread():
            return None
        previous = {}

        def handle(signum, frame):
            if self._received:   # the second one: stop waiting
                raise KeyboardInterrupt
            self._received.append(signum)
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                previous[sig] = signal.signal(sig, handle)
            except (ValueError, OSError):
                pass
        return previous

    def _restore_handlers(self, previous) -> None:
        for sig, handler in (previous or {}).items():
            signal.signal(sig, handler)


def _moved_aside(folder: Path, name: str) -> set:
    """Names in ``folder`` that a restore moved a differing ``name`` aside to (NAME.colabkit-replaced-N)."""
    try:
        return {n for n in os.listdir(folder) if n.startswith(f"{name}.colabkit-replaced-")}
    except OSError:
        return set()


def _recorded_path(info: dict, name: str) -> str:
    """The checkpoint's place under the watched folder, as recorded when it was committed; just its name when
    the record is missing or points outside the folder."""
    rel = (info.get(INFO_KEY) or {}).get("path") if isinstance(info, dict) else None
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel:
        return name
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts) or parts[-1] != name:
        return name
    return rel


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


def run(command, *, watch, to, resume_arg=None, fresh_arg=None, patterns=None, markers=(), keep=None,
        every=DEFAULT_EVERY, settle=DEFAULT_SETTLE, deadline="auto", margin=None, stop_signal="SIGINT",
        grace=DEFAULT_GRACE, retries=0, local_dir=None, verbose=True) -> int:
    """Run ``command`` (a list, or a shell string) and keep its checkpoints safe; returns its exit status.

    Before launch, the newest verified checkpoint in ``to`` ("drive:runs/lora", or any folder) is put back where
    it was under ``watch`` and ``resume_arg`` (such as "--resume_from_checkpoint={latest}") is appended with
    ``{latest}`` replaced by its path; with nothing to restore, ``fresh_arg`` is appended instead (default:
    nothing). While the command runs, each complete new checkpoint it writes under ``watch`` (``patterns``,
    default patterns.DEFAULT_PATTERNS; ``markers`` for the folders your patterns match) is committed to ``to``
    in the background, ``keep`` at most. A checkpoint is complete once unchanged for ``settle``, with its marker
    file, and held open for writing by no process. ``every``: how often ``watch`` is looked at.
    ``deadline``: "auto" (the runtime cap and idle cutoff colabkit knows of), a budget such as "11h30m", or
    None; ``margin`` seconds before it (default 60 s + ``grace``) the command gets ``stop_signal``, then
    ``grace`` to write its checkpoint and exit, which is committed and uploaded; then SIGTERM, and SIGKILL 10 s
    later. SIGINT/SIGTERM to the guard: the same, with that signal. ``retries``: relaunches after a non-zero
    exit the guard did not cause, from the newest committed checkpoint.
    """
    return Guard(command, watch=watch, to=to, resume_arg=resume_arg, fresh_arg=fresh_arg, patterns=patterns,
                 markers=markers, keep=keep, every=every, settle=settle, deadline=deadline, margin=margin,
                 stop_signal=stop_signal, grace=grace, retries=retries, local_dir=local_dir, verbose=verbose).run()
