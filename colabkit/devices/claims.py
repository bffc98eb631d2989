"""Machine-wide GPU claims with no daemon: files in one folder, each held with an OS lock by the process it
belongs to, so that a claim ends with its process (kill -9 included) and no two processes get the same GPU.

The folder (setting ``gpu_claims``: ``auto`` is /tmp/colabkit-gpu-claims, made with mode 1777 like /tmp itself;
``off``: no claims; on Colab and Kaggle, one user on one VM, ``auto`` means off) holds:

- ``table``: flock'ed (LOCK_EX) for the milliseconds a decision takes, so that deciding who gets which GPU and
  writing that down is one step: two processes started at the same moment see each other's claims.
- ``claim-<ns>-<pid>-<token>.json``: one per claim: the GPUs (UUID, index, share in bytes or the whole GPU),
  the holder's pid, what it runs (notebook name or command) and since when. Its holder keeps it flock'ed
  (LOCK_EX) for as long as the claim lasts; a file nobody holds is a claim that ended, whatever it says. The
  owner shown is the file's owner (fstat), not what the file claims.
- ``wait-<ticket>-<pid>-<token>.json``: one per process waiting in line, held the same way, saying what it waits
  for (the GPUs it could use, whole or a share). Tickets are drawn under the table lock from a clock that only
  goes forward, so their order is the order of arrival. First come, first served, GPU by GPU, across users: a
  GPU someone earlier in line could take now is kept for them; a request for other GPUs is served at once. (A
  place in line that does not say what it waits for, from an older colabkit, holds back every later request.)
- ``.new-*``: a claim or place in line being made: locked and written under this name, then renamed into
  place, so that readers never find a claim unlocked.

A claim belongs to the process that made it: a child made with fork() does not hold it (its descriptors are
closed in the child) and cannot release it; it works under it as any child does ($COLABKIT_GPU_CLAIM).

Safety against other users of the machine: the folder is opened without following links (O_NOFOLLOW |
O_DIRECTORY) and every file relative to it, without following links and non-blocking (a FIFO planted under
a claim's name cannot hang a reader); files that are not regular files are ignored. A folder that others may
write into must have the sticky bit (as /tmp), so that only a file's owner removes it: nobody can release
another user's claim, and a dead claim of another user is skipped, not removed. The folder's own owner can
still remove files in it: when it is not root and not you, colabkit says so once (``sudo chown root FOLDER``).
Holding a shared flock on the folder while claims are held keeps systemd-tmpfiles from ageing it away.

What a claim does not do: keep a program that ignores claims (one that never calls colabkit) off a GPU. Such
programs show up as compute processes in NVML's process list: a GPU where one uses more than
``gpu_foreign_memory`` (default 256 MiB) and belongs to no claim is left out of the pick.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import secrets
import stat
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from ..proctree import parents as process_parents
from ..units import format_size

try:
    import fcntl
except ImportError:  # Windows: no flock, so no claims (use_gpus chooses GPUs as it does on Colab)
    fcntl = None

log = logging.getLogger("colabkit")

DEFAULT_FOLDER = Path("/tmp/colabkit-gpu-claims")
HANDED_VAR = "COLABKIT_GPU_CLAIM"      # claims a parent holds for this process tree ("id,id")
SHARE_VAR = "COLABKIT_GPU_SHARE"       # the memory share (bytes per GPU) a parent's claim gives this process
TABLE_TIMEOUT_S = 30.0                 # how long a decision waits for the table lock
POLL_S = 0.25                          # how often a waiting process looks again
MAX_RECORD = 64 * 1024

_OPEN_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_warned: set = set()
_own: set = set()                      # ids of the claims this process made (not a parent's: see handed_down)
_held: weakref.WeakSet = weakref.WeakSet()   # Claims this process holds (a forked child lets go of them)


class ClaimFolderError(RuntimeError):
    """The claim folder cannot be used safely (a link, wrong permissions, not a folder); the message says why and
    what to do."""


# ------------------------------------------------------------------------------------------------- settings

def folder() -> Path | None:
    """The claim folder, or None when claims are off (setting ``gpu_claims``; Colab and Kaggle: off; where the
    platform has no flock, as on Windows: off)."""
    from .. import config
    setting = config.load().gpu_claims
    if setting == "off" or fcntl is None:
        return None
    if setting == config.AUTO:
        from ..runtime import detect_kind
        if detect_kind() in ("colab", "kaggle"):
            return None
        return DEFAULT_FOLDER
    return Path(setting)


def foreign_threshold() -> int:
    from .. import config
    return config.load().gpu_foreign_memory


# -------------------------------------------------------------------------------------------------- records

@dataclasses.dataclass
class Record:
    """A live claim or place in line, as any process reads it."""
    id: str                 # the file name
    kind: str               # "claim" or "wait"
    user: str               # the file's owner
    uid: int
    pid: int | None
    what: str
    since: float | None
    gpus: list              # [{"uuid", "index", "share"}] (share: bytes, None for the whole GPU)
    request: str = ""       # for a place in line: what it waits for
    want: dict | None = None   # for a place in line: {"gpus": [{"uuid", "total"}], "share", "fraction", "mine"}

    def who(self) -> str:
        """'alice (pid 4242, train.ipynb, since 10:02)'."""
        parts = [f"pid {self.pid}" if self.pid is not None else "pid ?"]
        if self.what:
            parts.append(self.what)
        if self.since is not None:
            parts.append(f"since {_clock(self.since)}")
        return f"{self.user} ({', '.join(parts)})"

    def share_on(self, uuid: str) -> tuple[bool, int | None]:
        """(holds this GPU, its share in bytes or None for the whole GPU)."""
        for g in self.gpus:
            if g.get("uuid") == uuid:
                return True, g.get("share")
        return False, None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _clock(t: float) -> str:
    if time.time() - t < 20 * 3600:
        return time.strftime("%H:%M", time.localtime(t))
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _user(uid: int) -> str:
    try:
        import pwd
        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


def describe_self() -> str:
    """What this process runs, as claims show it: the notebook's name, the `colabkit run` job, or the command."""
    session = os.environ.get("JPY_SESSION_NAME", "").strip()   # Jupyter Server 2, VS Code: the notebook's path
    if session:
        return os.path.basename(session)
    if os.environ.get("COLABKIT_JOB"):
        return f"colabkit run job {os.environ['COLABKIT_JOB']}"
    argv = [a for a in sys.argv if a]
    if "ipykernel_launcher" in " ".join(argv[:1]) or (argv and argv[0].endswith("ipykernel_launcher.py")):
        return "a Jupyter kernel"
    if not argv or argv[0] in ("-c", ""):
        return "python -c"
    text = " ".join([os.path.basename(argv[0])] + argv[1:])
    return text if len(text) <= 80 else text[:77] + "..."


# --------------------------------------------------------------------------------------------------- folder

class Folder:
    """The claim folder, opened once without following links; every file is reached relative to it."""

    def __init__(self, path: Path):
        self.path, self.fd = Path(path), None
        self.made: dict = {}   # {file name: pid of the process that made it}: only that process removes it
        self.fd = _open_folder(self.path)
        with contextlib.suppress(OSError):   # systemd-tmpfiles does not age a folder someone holds a flock on
            fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None

    def __del__(self):
        self.close()

    def names(self) -> list:
        try:
            return os.listdir(self.fd)
        except OSError:
            return []

    def read(self, name: str, *, clean: bool = False) -> Record | None:
        """The live record in ``name``, or None (ended, not a regular file, unreadable). clean: remove it when it
        ended and this process may (only under the table lock: nobody is writing it)."""
        try:
            fd = os.open(name, _OPEN_READ, dir_fd=self.fd)
        except OSError:
            return None   # gone, a link (ELOOP), not ours to read
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                pass      # held: the claim is alive
            except OSError:
                return None
            else:         # nobody holds it: the claim ended with its process
                fcntl.flock(fd, fcntl.LOCK_UN)
                if clean:
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=self.fd)   # sticky folder: another user's stays (and is skipped)
                return None
            data = os.read(fd, MAX_RECORD)
        finally:
            os.close(fd)
        try:
            body = json.loads(data.decode("utf-8")) if data else {}
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            body = {}   # a holder that has not written yet, or garbage: alive, but claims nothing known
        gpus = [g for g in body.get("gpus", []) if isinstance(g, dict) and isinstance(g.get("uuid"), str)]
        pid = body.get("pid") if isinstance(body.get("pid"), int) else None
        since = body.get("since") if isinstance(body.get("since"), (int, float)) else None
        return Record(id=name, kind="wait" if name.startswith("wait-") else "claim", user=_user(st.st_uid),
                      uid=st.st_uid, pid=pid, what=str(body.get("what", ""))[:200], since=since, gpus=gpus,
                      request=str(body.get("request", ""))[:200], want=_want(body.get("want")))

    def view(self, *, clean: bool = False) -> View:
        claims, line = [], []
        for name in sorted(self.names()):
            if clean and name.startswith(".new-"):
                self._drop_unfinished(name)
            if not name.endswith(".json") or not name.startswith(("claim-", "wait-")):
                continue
            record = self.read(name, clean=clean)
            if record is not None:
                (line if record.kind == "wait" else claims).append(record)
        return View(claims, line, self.path)

    def create(self, name: str, body: dict) -> int:
        """A new file, locked (LOCK_EX) and written; returns its descriptor (the lock lasts while it is open).
        It is made under a temporary name that readers skip and renamed into place once locked and written, so
        that no reader ever finds it unlocked (taken for a claim that ended) or holds a probe lock on it while
        this process locks it."""
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        tmp = f".new-{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, flags, 0o644, dir_fd=self.fd)
        except PermissionError:
            raise self._cannot_write() from None
        try:
            os.fchmod(fd, 0o644)   # readable by every user whatever the umask: claims are visible to all
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # nobody else knows the temporary name
            os.write(fd, json.dumps(body).encode())
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise
        self.made[name] = os.getpid()
        return fd

    def _cannot_write(self) -> ClaimFolderError:
        st = os.fstat(self.fd)
        return ClaimFolderError(
            f"cannot write GPU claims in {self.path} (owned by {_user(st.st_uid)}, mode "
            f"{stat.S_IMODE(st.st_mode):04o}). Ask its owner or root to run `chmod 1777 {self.path}`, or "
            f"set gpu_claims (COLABKIT_GPU_CLAIMS) to a folder every user can write.")

    def _drop_unfinished(self, name: str) -> None:
        """Remove a temporary file a process left when it died while making a claim (only under the table lock,
        which every maker holds: nobody is making one now)."""
        with contextlib.suppress(OSError):
            fd = os.open(name, _OPEN_READ, dir_fd=self.fd)
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    os.unlink(name, dir_fd=self.fd)
            finally:
                os.close(fd)

    def rewrite(self, fd: int, body: dict) -> None:
        """Replace what a file this process holds says (only under the table lock: deciders read it whole)."""
        data = json.dumps(body).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)

    def remove(self, name: str, fd: int | None) -> None:
        """Release a file this process holds: unlink, then close (which drops the lock). In a process forked
        from the one that made it, only the descriptor is closed: the file stays its maker's."""
        if self.made.get(name) == os.getpid():
            del self.made[name]
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self.fd)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    @contextlib.contextmanager
    def table(self, timeout: float = TABLE_TIMEOUT_S):
        """The table lock: one decision at a time on this machine."""
        fd = self._open_table()
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ClaimFolderError(f"{self.path / 'table'} is not a regular file; remove it.")
            deadline, pause = time.monotonic() + timeout, 0.002
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ClaimFolderError(
                            f"the GPU claim table {self.path / 'table'} stayed locked for {timeout:g} s; a process "
                            f"holding it is stuck (see /proc/locks for its pid).") from None
                    time.sleep(pause)
                    pause = min(pause * 2, 0.05)
            yield
        finally:
            os.close(fd)

    def _open_table(self) -> int:
        flags = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
        where = self.path / "table"
        if not os.path.lexists(where):   # made under a temporary name, 0644 whatever the umask, then linked in
            tmp = f".table-new-{secrets.token_hex(8)}"
            try:
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | flags, 0o644, dir_fd=self.fd)
            except PermissionError:
                raise self._cannot_write() from None
            except OSError as exc:
                raise ClaimFolderError(f"cannot make {where}: {exc.strerror or exc}.") from None
            try:
                os.fchmod(fd, 0o644)
                os.link(tmp, "table", src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)
                return fd
            except FileExistsError:
                os.close(fd)   # another process made it meanwhile: open theirs
            except BaseException:
                os.close(fd)
                raise
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=self.fd)
        for mode in (os.O_RDWR, os.O_RDONLY):   # another user's: reading is enough to flock it
            try:
                return os.open("table", mode | flags, dir_fd=self.fd)
            except PermissionError:
                continue
            except OSError as exc:
                raise ClaimFolderError(f"cannot open {where}: {exc.strerror or exc} (a link or something other "
                                       f"than a file is in its place; remove it: sudo rm {where}).") from None
        try:
            st = os.stat("table", dir_fd=self.fd, follow_symlinks=False)
            whose = f"it belongs to {_user(st.st_uid)} with mode {stat.S_IMODE(st.st_mode):04o}"
        except OSError:
            whose = "it cannot be read"
        raise ClaimFolderError(f"cannot open {where}: {whose}, so other users cannot use it. Remove it (it is "
                               f"made again, readable by all): sudo rm {where}")


def _make_folder(path: Path) -> bool:
    """Make the claim folder, already with mode 1777 when it appears under its name (other users never find it
    closed to them): made under a temporary name beside it and renamed into place where the system can rename
    without replacing (Linux renameat2). True: made here; raises FileExistsError when it exists."""
    if os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, "exists", str(path))
    rename = _rename_noreplace()
    if rename is None:
        os.mkdir(path, 0o700)   # opened and set to 1777 by the caller
        return True
    tmp = path.parent / f".{path.name}.new-{secrets.token_hex(4)}"
    os.mkdir(tmp, 0o700)
    try:
        fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
        try:
            os.fchmod(fd, 0o1777)
        finally:
            os.close(fd)
        rename(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.rmdir(tmp)
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        os.mkdir(path, 0o700)   # a file system that cannot rename without replacing: as above
    except BaseException:
        with contextlib.suppress(OSError):
            os.rmdir(tmp)
        raise
    return True


def _rename_noreplace():
    """rename(src, dst) that fails with FileExistsError where dst exists, or None where the system has none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError, ImportError):
        return None
    at_fdcwd, noreplace = -100, 1

    def rename(src, dst):
        if renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), noreplace) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(dst)) if err != errno.EEXIST else FileExistsError(
                err, os.strerror(err), str(dst))
    return rename


def _open_folder(path: Path) -> int:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    created = False
    try:
        created = _make_folder(path)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ClaimFolderError(f"cannot make the GPU claim folder {path}: {exc.strerror or exc}. Set gpu_claims "
                               f"(COLABKIT_GPU_CLAIMS) to a folder every user of this machine can write, or "
                               f"\"off\".") from None
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise OSError(errno.ELOOP, "a symbolic link")
        fd = os.open(path, flags)   # O_NOFOLLOW still: a link swapped in since lstat is refused too
    except OSError as exc:
        why = ("is a symbolic link, which colabkit does not follow there" if exc.errno in (errno.ELOOP, errno.EMLINK)
               else "is not a folder" if exc.errno == errno.ENOTDIR else (exc.strerror or str(exc)))
        raise ClaimFolderError(f"the GPU claim folder {path} {why}. Remove it (it is made again, safely), or set "
                               f"gpu_claims (COLABKIT_GPU_CLAIMS) to another folder.") from None
    st = os.fstat(fd)
    if created and st.st_uid == os.geteuid():
        os.fchmod(fd, 0o1777)   # every user's claims in one place; sticky: only a file's owner removes it
        st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022 and not mode & stat.S_ISVTX:
        os.close(fd)
        raise ClaimFolderError(f"the GPU claim folder {path} (mode {mode:04o}) lets other users remove and replace "
                               f"claims: it needs the sticky bit, as /tmp has. Run `chmod 1777 {path}` (as its "
                               f"owner, {_user(st.st_uid)}).")
    if st.st_uid not in (0, os.geteuid()) and str(path) not in _warned:
        _warned.add(str(path))
        log.warning("colabkit: the GPU claim folder %s belongs to %s, who can remove other users' claims in it; "
                    "to rule that out, make root its owner: sudo chown root %s", path, _user(st.st_uid), path)
    return fd


@dataclasses.dataclass
class View:
    """The live claims and the line, as read at one moment."""
    claims: list
    line: list
    path: Path | None = None
    reserved: dict = dataclasses.field(default_factory=dict)   # {uuid: why}: free now, kept for an earlier waiter

    def holders(self, uuid: str) -> list:
        """[(record, share bytes or None)] of the live claims on this GPU."""
        out = []
        for r in self.claims:
            held, share = r.share_on(uuid)
            if held:
                out.append((r, share))
        return out

    def as_dict(self) -> dict:
        return {"claims": [r.as_dict() for r in self.claims], "line": [r.as_dict() for r in self.line]}


def read_view(path: Path | None = None) -> View | None:
    """The claims and the line (for display; nothing is created or removed). None when claims are off or the
    folder does not exist yet."""
    path = folder() if path is None else path
    if path is None or not os.path.isdir(path):
        return None
    try:
        f = Folder(path)
    except ClaimFolderError as exc:
        log.warning("colabkit: %s", exc)
        return None
    try:
        return f.view()
    finally:
        f.close()


# ---------------------------------------------------------------------------------------------- the choice

def taken(inventory, view: View, *, mine: set, share: int | None, fraction: float | None = None,
          threshold: int | None = None) -> tuple[dict, dict]:
    """({uuid: why it is claimed}, {uuid: why a program without a claim keeps it busy}) for a request of the
    whole GPU (share None) or of ``share`` bytes / ``fraction`` of each GPU. Claims whose id is in ``mine`` are
    this process's own and do not count."""
    claimed, busy = {}, {}
    for g in inventory:
        everyone = view.holders(g.uuid)
        holders = [(r, s) for r, s in everyone if r.id not in mine]
        if g.uuid in view.reserved and len(holders) == len(everyone):   # not under a claim of this process's own
            claimed[g.uuid] = view.reserved[g.uuid]
            continue
        if holders:
            whole = [r for r, s in holders if s is None]
            want = share if share is not None else (None if fraction is None or g.memory_total is None
                                                     else int(fraction * g.memory_total))
            used = sum(s for _, s in holders if s is not None)
            room = None if g.memory_total is None else g.memory_total - used
            fits = not whole and want is not None and (room is None or want <= room)
            if not fits:
                who = "; ".join(r.who() + (f" with {format_size(s)}" if s is not None else "") for r, s in holders)
                claimed[g.uuid] = f"claimed by {who}"
    threshold = foreign_threshold() if threshold is None else threshold
    with_processes = [g for g in inventory if g.processes and g.uuid not in claimed]
    if with_processes:
        known = _known_pids(view)
        for g in with_processes:
            # a program whose memory use the driver does not report counts as busy: better not to pick its GPU
            strangers = [p for p in g.processes
                         if p.pid not in known and (p.used_memory is None or p.used_memory > threshold)]
            if strangers:
                busy[g.uuid] = ("busy with " + ", ".join(
                    f"{p.name or '?'} (pid {p.pid}, "
                    f"{'memory use unknown' if p.used_memory is None else format_size(p.used_memory)})"
                    for p in strangers) + ", which holds no GPU claim")
    return claimed, busy


def _known_pids(view: View) -> set:
    """Processes whose GPU use is accounted for: claim holders and their descendants, and this process with its
    ancestors and descendants. A claim's pid is what its file says: pids 0 and 1 (init, whose descendants are
    every process) are ignored."""
    parents = process_parents()
    roots = {r.pid for r in view.claims if r.pid is not None and r.pid > 1} | {os.getpid()}
    known, pid = set(roots), os.getpid()
    while pid in parents and pid not in (0, 1):
        pid = parents[pid]
        known.add(pid)
    children: dict = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in known:
                known.add(child)
                todo.append(child)
    return known


# --------------------------------------------------------------------------------------------- holding one

class Claim:
    """A claim this process holds: released by ``release()``, or when the process ends."""

    def __init__(self, where: Folder, name: str, fd: int, gpus: list, what: str):
        self.folder, self.id, self._fd, self.gpus, self.what = where, name, fd, gpus, what
        self.since = time.time()
        self.pid = os.getpid()   # the holder: a process forked from it neither holds nor releases it
        _own.add(name)
        _held.add(self)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def shares(self) -> dict:
        """{uuid: share in bytes, or None for the whole GPU}."""
        return {g["uuid"]: g.get("share") for g in self.gpus}

    def release(self) -> None:
        """End the claim (in the process that made it; elsewhere, as in a forked child, only let go of it)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            if self.pid == os.getpid():
                self.folder.remove(self.id, fd)
            else:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def __del__(self):
        with contextlib.suppress(Exception):
            self.release()

    def __repr__(self) -> str:
        state = "held" if self.held else "released"
        return f"<Claim {self.id} {state}: {', '.join(str(g.get('index')) for g in self.gpus)}>"


def _after_fork_in_child() -> None:
    """A forked child holds none of its parent's claims: it closes their descriptors (so that they end with the
    parent) and leaves the files alone; its use_gpus sees them as claims handed down, as for any child."""
    _own.clear()
    for claim in list(_held):
        fd, claim._fd = claim._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
    _held.clear()
    state = sys.modules.get(__package__ + ".state")
    if state is not None:
        state.current.claim = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _new_name(prefix: str, number: int) -> str:
    return f"{prefix}-{number:020d}-{os.getpid()}-{secrets.token_hex(4)}.json"


def _body(what: str, gpus: list, request: str = "", want: dict | None = None) -> dict:
    body = {"version": 1, "pid": os.getpid(), "what": what, "since": time.time(), "gpus": gpus, "request": request}
    if want is not None:
        body["want"] = want
    return body


def want_of(gpus, *, share: int | None = None, fraction: float | None = None, mine=()) -> dict:
    """What a process in line waits for, as its place in line says: the GPUs it could use (``gpus``: GPU records),
    the whole GPU or a share (bytes, or a fraction of each GPU), and the claims it works under."""
    return {"gpus": [{"uuid": g.uuid, "total": g.memory_total} for g in gpus], "share": share,
            "fraction": fraction, "mine": sorted(mine)}


def _want(raw) -> dict | None:
    """A place in line's ``want``, checked (None: it does not say, e.g. an older colabkit's)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("gpus"), list):
        return None
    gpus = [{"uuid": g["uuid"], "total": g.get("total") if isinstance(g.get("total"), int) else None}
            for g in raw["gpus"] if isinstance(g, dict) and isinstance(g.get("uuid"), str)]
    share = raw.get("share") if isinstance(raw.get("share"), int) else None
    fraction = raw.get("fraction") if isinstance(raw.get("fraction"), (int, float)) else None
    mine = [m for m in raw.get("mine", []) if isinstance(m, str)] if isinstance(raw.get("mine"), list) else []
    return {"gpus": gpus, "share": share, "fraction": fraction, "mine": mine}


def _reserved(ahead: list, view: View) -> dict | None:
    """{uuid: why} of the GPUs that someone earlier in line could take now: kept for them, so that a later
    request takes other GPUs or waits (first come, first served for the same GPUs; a later request for other
    GPUs goes ahead). None when an earlier place does not say what it waits for: everything waits behind it."""
    out: dict = {}
    for w in ahead:
        if w.want is None:
            return None
        mine = set(w.want["mine"])
        for g in w.want["gpus"]:
            if g["uuid"] in out:
                continue
            holders = [(r, s) for r, s in view.holders(g["uuid"]) if r.id not in mine]
            want = w.want["share"]
            if want is None and w.want["fraction"] is not None and g["total"] is not None:
                want = int(w.want["fraction"] * g["total"])
            free = not holders or (want is not None and all(s is not None for _, s in holders)
                                   and (g["total"] is None or sum(s for _, s in holders) + want <= g["total"]))
            if free:
                out[g["uuid"]] = (f"waited for by {w.who()}, who came earlier in line"
                                  + (f" for {w.request}" if w.request else ""))
    return out


def acquire(choose: Callable, *, path: Path, wait: float | None = None, what: str | None = None,
            request: str = "", retry: tuple = (), say: Callable | None = None, refresh: Callable | None = None,
            want: dict | None = None, on_join: Callable | None = None):
    """Claim what ``choose(view)`` picks: it returns (result, gpus) with gpus [{"uuid", "index", "share"}] to
    claim ([] claims nothing), or raises one of ``retry`` when what it needs is taken now. ``view.reserved``
    lists the GPUs kept for processes earlier in line (``taken`` counts them as claimed).

    wait: None (do not wait: the ``retry`` exception propagates), seconds, or inf. While waiting the process
    holds a place in line that says what it waits for (``want``, see ``want_of``; None: everything later waits
    behind it); ``on_join()`` is called once when it joins the line (under the table lock); ``say(text)`` is
    called when the reason to wait changes; ``refresh()`` is called before each look (a new inventory). Ctrl-C
    leaves the line (the place is removed) and propagates. Returns (result, Claim or None).
    """
    what = describe_self() if what is None else what
    where = Folder(path)
    ticket = None   # (name, fd) of our place in line
    said = None
    started = time.monotonic()
    try:
        while True:
            with where.table():
                view = where.view(clean=True)
                ahead = [r for r in view.line if ticket is None or r.id < ticket[0]]
                try:
                    reserved = _reserved(ahead, view)
                    view.reserved = reserved or {}
                    result, gpus = choose(view)
                    if reserved is None and gpus:   # nothing new to claim (all under a parent's claim): no line
                        raise _InLine([r for r in ahead if r.want is None])
                except (_InLine, *retry) as exc:
                    if not wait or time.monotonic() - started >= wait:
                        if isinstance(exc, _InLine):
                            raise _line_error(retry, exc, request, wait) from None
                        if wait:   # it waited: say for how long
                            exc.args = (f"{exc.args[0]}\nWaited {_seconds(wait)} in line; giving up.",) + exc.args[1:]
                        raise
                    if ticket is None:
                        last = max((int(r.id.split("-")[1]) for r in view.line if r.id.split("-")[1].isdigit()),
                                   default=0)
                        name = _new_name("wait", max(time.monotonic_ns(), last + 1))
                        ticket = (name, where.create(name, _body(what, [], request, want)))
                        ahead = [r for r in view.line if r.id < name]
                        if on_join is not None:
                            on_join()
                    if isinstance(exc, _InLine):
                        reason = (f"{len(exc.ahead)} ahead of you in line: "
                                  + "; ".join(r.who() for r in exc.ahead[:3]) + ("; ..." if len(exc.ahead) > 3 else ""))
                    else:
                        reason = getattr(exc, "short", "") or str(exc)
                else:
                    claim = None
                    if gpus:
                        name = _new_name("claim", time.monotonic_ns())
                        claim = Claim(where, name, where.create(name, _body(what, gpus, request)), gpus, what)
                    if ticket is not None:
                        where.remove(*ticket)
                        ticket = None
                    return result, claim
            if reason != said and say is not None:
                said = reason
                limit = "" if wait == float("inf") else f" (for at most {_seconds(wait)})"
                say(f"colabkit: waiting{limit} for {request or 'GPUs'}: {reason.rstrip('.')}. Ctrl-C leaves the line.")
            time.sleep(POLL_S)
            if refresh is not None:
                refresh()
    finally:
        if ticket is not None:
            where.remove(*ticket)


class _InLine(Exception):
    def __init__(self, ahead):
        super().__init__(ahead)
        self.ahead = ahead


def _line_error(retry: tuple, exc: _InLine, request: str, wait) -> Exception:
    cls = retry[0] if retry else RuntimeError
    who = "; ".join(r.who() + (f" waiting for {r.request}" if r.request else "") for r in exc.ahead[:5])
    text = (f"{request or 'the request'}: {len(exc.ahead)} process(es) came earlier and wait in line for GPUs: "
            f"{who}. First come, first served: pass wait=True (or wait=\"30min\") to queue behind them.")
    if wait:
        text += f" Waited {_seconds(wait)}; giving up."
    return cls(text)


def _seconds(seconds: float) -> str:
    from ..units import format_duration
    return format_duration(seconds)


# ---------------------------------------------------------------------------------------------- hand-downs

def working_under() -> set:
    """Ids of the claims this process works under ($COLABKIT_GPU_CLAIM, what its children inherit): those a
    parent holds for it and the one use_gpus made here."""
    return {t.strip() for t in os.environ.get(HANDED_VAR, "").split(",") if t.strip()}


def handed_down() -> set:
    """Ids of the claims a parent process holds for this one: $COLABKIT_GPU_CLAIM less the claims this process
    made itself (use_gpus puts its own there for the children)."""
    return working_under() - _own


def child_env(claim_ids, share: int | None = None) -> dict:
    """Variables that tell a child process the claims it works under (so its own use_gpus does not wait for its
    parent) and its memory share."""
    env = {HANDED_VAR: ",".join(sorted(set(claim_ids)))}
    if share is not None:
        env[SHARE_VAR] = str(int(share))
    return env


class Line:
    """A place in line kept across tries, for a queue of its own (`colabkit run`): ``try_claim`` claims now or
    returns None (and keeps a place in line); each claim it gets gives the place up (the next try that waits
    joins the line again, at its end); ``leave()`` gives it up too."""

    def __init__(self, path: Path, what: str, request: str = ""):
        self.folder, self.what, self.request = Folder(path), what, request
        self.ticket = None
        self.want = None
        self.reason = ""

    def try_claim(self, choose: Callable, retry: tuple = (), what: str | None = None,
                  want: dict | None = None) -> Claim | None:
        """Claim what ``choose(view)`` returns ([{"uuid", "index", "share"}]) if it is free and not kept for
        someone earlier in line (``view.reserved``); otherwise None, with ``reason`` saying why, and this queue
        keeps (or takes) a place in line that says it waits for ``want`` (see ``want_of``)."""
        with self.folder.table():
            view = self.folder.view(clean=True)
            ahead = [r for r in view.line if self.ticket is None or r.id < self.ticket[0]]
            try:
                reserved = _reserved(ahead, view)
                if reserved is None:
                    raise _InLine([r for r in ahead if r.want is None])
                view.reserved = reserved
                gpus = choose(view)
            except (_InLine, *retry) as exc:
                if isinstance(exc, _InLine):
                    self.reason = f"{len(exc.ahead)} ahead in line: " + "; ".join(r.who() for r in exc.ahead[:3])
                else:
                    self.reason = getattr(exc, "short", "") or str(exc)
                if self.ticket is None:
                    last = max((int(r.id.split("-")[1]) for r in view.line if r.id.split("-")[1].isdigit()), default=0)
                    name = _new_name("wait", max(time.monotonic_ns(), last + 1))
                    self.ticket = (name, self.folder.create(name, _body(self.what, [], self.request, want)))
                    self.want = want
                elif want != self.want:
                    self.folder.rewrite(self.ticket[1], _body(self.what, [], self.request, want))
                    self.want = want
                return None
            name = _new_name("claim", time.monotonic_ns())
            what = what or self.what
            claim = Claim(self.folder, name, self.folder.create(name, _body(what, gpus, self.request)), gpus, what)
            self.leave()   # served: a later try that waits goes to the end of the line
            return claim

    def leave(self) -> None:
        if self.ticket is not None:
            ticket, self.ticket = self.ticket, None
            self.folder.remove(*ticket)

    def close(self) -> None:
        self.leave()
        self.folder.close()
