"""The committing thread: polls the watched folder (watch.py) and hands each complete new checkpoint to the store
(``Checkpoints.save_folder``), which hashes, commits and uploads it in its own background thread, with its
retention. Folders are hard-linked (a checkpoint folder is written once). A file such as last.pt is rewritten in
place: it is first copied consistently into a folder of the guard's own, and that copy, once it looks whole in
its format (patterns.whole_state), is what the store takes (hard-linked: the copy is the guard's own). Each
checkpoint's place under the watched folder is recorded in its ``info`` (``{"guard": {"path": ...}}``), where
the restore puts it back.

Steps: the number in the checkpoint's name when it has one (checkpoint-1500), else one more than the highest
step committed or restored so far (last.pt), so the newest checkpoint is always the one written last.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
import warnings
from pathlib import Path

from ..checkpoints.files import SourceChanged, copy_consistently
from ..checkpoints.folder import CheckpointError
from .patterns import whole_state
from .watch import Candidate, Watcher

__all__ = ["Committer", "INFO_KEY"]

log = logging.getLogger("colabkit")
INFO_KEY = "guard"


class Committer:
    """Commits what ``watcher`` finds to ``checkpoints``, every ``every`` seconds on a thread of its own
    (``start``/``stop``), or now (``commit_ready``). ``on_commit(candidate, step)`` is told of each one."""

    def __init__(self, watcher: Watcher, checkpoints, *, every: float, say, on_commit=None, staging=None):
        self.watcher, self.checkpoints, self.every, self.say = watcher, checkpoints, every, say
        self.staging = staging   # where file checkpoints are copied first (default: the system's temporary folder)
        self.on_commit = on_commit
        self.highest_step: int | None = None   # of what was committed or restored
        self.last: tuple | None = None         # (step, rel) of the newest checkpoint handed to the store
        self.commits = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refused: dict[str, str] = {}     # rel -> why the store refused it (said once)
        self._unchecked: set = set()           # rels said to be committed without a format check
        self.committed_rels: list[str] = []    # rel of each checkpoint handed to the store, in order

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="colabkit-guard-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.commit_ready()
            except Exception as exc:  # noqa: BLE001 - the watch must outlive any one bad poll
                log.warning("colabkit guard: watching failed this round: %s", exc)

    def commit_ready(self, *, writers_gone: bool = False, alive_until: float | None = None,
                     clean: bool = False) -> list:
        """Hand every complete new checkpoint to the store now; the steps handed over. ``writers_gone``,
        ``alive_until``, ``clean``: the training has exited (see Watcher.complete)."""
        with self._lock:
            done = []
            for candidate in self.watcher.complete(writers_gone=writers_gone, alive_until=alive_until,
                                                   clean=clean):
                step = self._step_for(candidate)
                if self._save(candidate, step):
                    done.append(step)
            return done

    def _step_for(self, c: Candidate) -> int:
        if c.step is not None:
            return c.step
        return 0 if self.highest_step is None else self.highest_step + 1

    def _save(self, c: Candidate, step: int) -> bool:
        private = None
        try:
            source = c.path
            if not c.is_dir:   # a copy of our own, checked whole, is what the store takes
                private = Path(tempfile.mkdtemp(prefix="colabkit-guard-", dir=self.staging))
                source = private / c.path.name
                copy_consistently(c.path, source)
                state = whole_state(source)
                if state == "partial":
                    raise SourceChanged(f"{c.rel} was not whole when it was copied")
                if state == "unchecked" and _starts_as_pickle(source) and c.rel not in self._unchecked:
                    self._unchecked.add(c.rel)
                    self.say(f"{c.rel} is a pickle (such as torch.save(..., _use_new_zipfile_serialization="
                             f"False)) whose end cannot be checked: it is committed once unchanged for the "
                             f"settle time")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")   # the store also logs what it warns about
                # a file: the private copy is ours alone and never rewritten, so the store links it rather than
                # copying it a second time
                self.checkpoints.save_folder(step, source, link=True,
                                             info={"reason": "guard", INFO_KEY: {"path": c.rel}})
        except (SourceChanged, FileNotFoundError) as exc:
            log.info("colabkit guard: %s changed while it was taken (%s); taken again once it settles", c.rel, exc)
            return False
        except (CheckpointError, ValueError, OSError) as exc:
            if self._refused.get(c.rel) != str(exc):
                self._refused[c.rel] = str(exc)
                self.say(f"not committed: {c.rel}: {exc}")
            self.watcher.mark_done(c.rel, c.fingerprint)   # until it changes again
            return False
        finally:
            if private is not None:
                shutil.rmtree(private, ignore_errors=True)
        self.watcher.mark_done(c.rel, c.fingerprint)
        self.highest_step = step if self.highest_step is None else max(self.highest_step, step)
        self.last, self.commits = (step, c.rel), self.commits + 1
        self.committed_rels.append(c.rel)
        if self.on_commit is not None:
            self.on_commit(c, step)
        return True

    def wait_uploaded(self, timeout: float) -> bool:
        """Whether everything handed to the store is on the destination within ``timeout`` seconds."""
        return self.checkpoints.wait(timeout)

    def settled_after(self, existing: set, timeout: float, *, done, alive_until, clean) -> bool:
        """After the stop signal: poll quickly until a checkpoint that was not there when the signal was sent
        (``existing``: the entries then) is committed, ``done()`` is true (the training has exited), or
        ``timeout`` passes; True when such a checkpoint was committed. A periodic checkpoint that was already
        being written or settling at the signal does not end the wait: the script may be writing its final one.
        ``alive_until()``, ``clean()``: for commit_ready once the training has exited."""
        since = len(self.committed_rels)
        end = time.monotonic() + timeout

        def new() -> bool:
            return any(rel not in existing for rel in self.committed_rels[since:])
        while time.monotonic() < end:
            gone = done()
            if gone:
                self.commit_ready(writers_gone=True, alive_until=alive_until(), clean=clean())
            else:
                self.commit_ready()
            if new() or gone:
                return new()
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))
        return new()


def _starts_as_pickle(path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(1) == b"\x80"
    except OSError:
        return False
