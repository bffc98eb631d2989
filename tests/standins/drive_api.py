"""A local stand-in for Google Drive's v2 REST API and its shared-link pages, for the real pydrive2/gdown clients.

One threaded HTTP server on 127.0.0.1 speaks:

* OAuth token endpoint ``POST /token``: JWT-bearer grants (service accounts, the key's ``token_uri`` points
  here), ``authorization_code`` and ``refresh_token`` grants (OAuth clients). Revoked clients get the real
  ``400 invalid_grant`` answer.
* Drive v2 (``/drive/v2/...``, reached through googleapiclient's ``api_endpoint`` client option):
  ``files.list`` with a ``q`` subset (``'<id>' in parents``, ``title = '...'`` (case-insensitive, as on
  Drive), ``mimeType = / != '...'``,
  ``trashed = false|true`` joined by ``and``), paging (``maxResults``/``pageToken``, opaque tokens; at most
  1000 items a page, ``server.page_cap`` lowers that; ``server.short_pages`` sends short and empty pages with a
  ``nextPageToken`` before the end, as Drive may; ``server.pages_served`` counts answers); ``files.get`` (metadata,
  or bytes with ``alt=media`` and ``Range``); ``files.insert`` metadata-only, ``uploadType=multipart`` and
  ``uploadType=resumable`` (session URI, chunked ``PUT`` with ``Content-Range``, ``308`` + ``Range``, status
  queries ``bytes */N``); ``files.update``/``patch``; ``files.trash`` (or ``labels.trashed`` set by an update)
  moves to Trash, ``files.delete`` deletes for good (recursive for folders, trashed descendants too),
  ``files.emptyTrash`` (``DELETE /drive/v2/files/trash``) deletes everything in Trash; ``about.get`` counts
  the bytes stored, Trash included (``quotaBytesUsed``), and those in Trash (``quotaBytesUsedInTrash``).
  Duplicate titles in a folder are allowed, as on Drive.
* A linked Drive mount (``server.link_mount(drive.backing / "MyDrive", drive.trash)``, a ``drive_mount`` made
  with ``trash=True``): before each Drive request the server takes in what the mount holds, as Drive's sync
  does: files and folders there appear in My Drive, what the mount deleted into its Trash appears trashed under
  its old folder (also when the server never saw it before: Drive had it uploaded by then), what vanished
  otherwise (a rename's old name) is gone for good. Deleting a trashed item for good through the API takes it
  out of the mount's Trash too. Not modelled: changes through the API showing on the mount.
* Shared links as gdown fetches them: ``GET /uc?id=...`` (the file, with ``Content-Disposition``; an HTML
  "not found" page otherwise) and ``GET /embeddedfolderview?id=...`` (the folder listing page).

Faults: ``server.fail(status, method=None, path=None, reason=None, times=1)`` injects errors (500/503, 403
``rateLimitExceeded``, 429) on the next matching requests. ``server.requests`` logs ``(method, path)``;
``server.upload_bytes`` counts chunk bytes received, to tell a resumed upload from a restarted one.

Request-granular faults, for a campaign that fails the k-th request of a whole operation, for every k. The
*counted* requests are the Drive API ones: ``/token``, ``/drive/v2/...`` and ``/upload/drive/v2/...`` (not the
shared-link pages, not unknown paths); each HTTP request counts once, in the order the server takes them (a
client library's own silent re-send is a request of its own). Thread-safe: counting and taking the fault are
one step under a lock.

* ``server.count``: counted requests since the last ``arm``/``arm_from``/``reset_count()``; ``server.counted``
  lists their ``(method, path)``, so ``server.counted[k - 1]`` is the k-th.
* ``server.arm(k, kind)``: the k-th request counted from now (k >= 1; ``count`` restarts at 0) gets the fault
  ``kind``, once; every other request is served normally. ``server.arm_from(k, kind)``: the k-th and every
  later request get it (an outage), until ``server.disarm()``. One plan at a time: arming replaces the last.
* ``server.disarm()`` clears the plan (``count`` goes on). ``server.reset_count()`` restarts the count; an
  armed k then counts from there. ``server.injected`` lists the faults that fired as
  ``(n, kind, method, path[, what])``; ``server.abandoned`` the requests whose body never came (below).

Kinds (``FAULT_KINDS``); what the real clients (httplib2 0.2x/0.3x, googleapiclient, pydrive2) see:

* ``"500"``, ``"503"``: that status with Drive's error JSON (``backendError`` / ``Backend Error``), as
  ``fail()`` sends, also on ``/token``; the request is not applied. googleapiclient raises ``HttpError``,
  pydrive2 ``ApiRequestError``, oauth2client (``/token``) ``HttpAccessTokenRefreshError``.
* ``"drop"``: the request is read but not applied, and the connection is closed before any byte of an answer.
  http.client raises ``RemoteDisconnected`` (a ``ConnectionResetError``); httplib2 re-sends such a request
  once by itself, so a single drop costs one extra request and the client sees nothing; two in a row (an
  ``arm_from``) raise ``RemoteDisconnected`` through googleapiclient and pydrive2 unwrapped.
* ``"drop-mid"``: the request *is applied* (a folder made, a chunk stored, a file deleted), then the status
  line and headers go out with the full ``Content-Length`` and ``Connection: close``, then half the body,
  and the connection closes. httplib2 raises ``http.client.IncompleteRead`` (an ``HTTPException``, not an
  ``OSError``), which googleapiclient, oauth2client and pydrive2 pass through unwrapped and which nothing
  re-sends. An answer without a body (``204`` of a delete, ``200`` that opens an upload session, ``308`` of
  a chunk) has no body to cut: it is closed before its first byte instead, after the request was applied
  (``RemoteDisconnected``, so httplib2 re-sends the applied request once). ``Connection: close`` keeps the
  client from re-using the broken connection, so the next request is not hit too.
* ``"stale-list"``: a ``files.list`` answer omits the most recently created item that matches its ``q`` (Drive
  listings are eventually consistent). When the k-th request is not a ``files.list`` the next ``files.list``
  gets it (with ``arm_from``: every ``files.list`` from the k-th request on). A listing with nothing to omit
  still spends the fault (``injected`` says ``omitted: None``).

* ``"hang"`` (in ``ARM_KINDS``, not in ``FAULT_KINDS``): the request is read and never answered; the connection
  closes when the server stops. ``server.stall(method=, path=, times=)`` does the same to matching requests of
  any path (shared-link pages included), listed in ``server.stalled``.

Drive's own behaviour (tests/standins/README.md says where each is documented): pages of at most 1000 items
(``page_cap``, ``short_pages``); case-insensitive ``title =``; shortcuts (``state.add_shortcut``); Google-native
files without bytes; a per-user quota (``server.quota(n, per_s)`` -> 403 ``userRateLimitExceeded``); listings
that lag behind creates (``server.listing_lag_s``); shared drives (``state.add_drive``, ``supportsAllDrives``);
accounts without storage (``server.no_quota``: 403 ``storageQuotaExceeded``); throttled share links
(``state.throttled``).

Order on one request: counting, then the armed fault, then ``fail()``'s faults, then authorisation.

A request whose body stops arriving for ``server.body_timeout_s`` (5 s) is abandoned: no answer, connection
closed, as a front end gives up on a stalled upload (``server.abandoned``). That is what follows a ``"drop"``
(or a bodiless ``"drop-mid"``) of an upload chunk ``PUT``: httplib2's re-send reuses the body stream
googleapiclient already read, so it announces ``Content-Length`` and sends nothing; without the timeout the
client would wait forever. The client then sees ``RemoteDisconnected``. Such a request is counted; a fault
armed for it fires (and is listed) without changing anything.
"""
from __future__ import annotations

import base64
import datetime as _dt
import email.parser
import email.policy
import hashlib
import html
import io
import itertools
import json
import os
import re
import secrets
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FOLDER = "application/vnd.google-apps.folder"
GOOGLE_APPS = "application/vnd.google-apps."      # Google-native types: no binary content (alt=media refuses)
SHORTCUT = "application/vnd.google-apps.shortcut"
DOCUMENT = "application/vnd.google-apps.document"
SPREADSHEET = "application/vnd.google-apps.spreadsheet"
ROOT_ID = "0AROOTFOLDER" + "r" * 20
FAULT_KINDS = ("500", "503", "drop", "drop-mid", "stale-list")
ARM_KINDS = FAULT_KINDS + ("hang",)   # "hang": read, never answered (a client without a timeout waits forever)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


MAX_PAGE = 1000      # files.list never returns more items per page (v2 maxResults / v3 pageSize)


def _page_token(start: int, page_no: int) -> str:
    """An opaque page token (Drive's are opaque too: a client may only hand them back)."""
    return base64.urlsafe_b64encode(f"p{start}:{page_no}".encode()).decode().rstrip("=")


def _read_page_token(token: str | None) -> tuple[int, int]:
    if not token:
        return 0, 0
    text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    if not text.startswith("p"):
        raise ValueError(token)
    start, page_no = text[1:].split(":")
    return int(start), int(page_no)


def _error_body(code: int, reason: str, message: str) -> bytes:
    domain = "usageLimits" if "ate" in reason and "imit" in reason else "global"
    return json.dumps({"error": {"errors": [{"domain": domain, "reason": reason, "message": message}],
                                 "code": code, "message": message}}).encode()


class DriveState:
    """The files of the fake Drive. Ids are 33 characters like Drive's, so gdown's link patterns accept them."""

    def __init__(self):
        self.lock = threading.RLock()
        self.files: dict[str, dict] = {}
        self.content: dict[str, bytes] = {}
        self.sessions: dict[str, dict] = {}
        self._clock = itertools.count(1)
        self.public: set[str] = set()          # ids shared "anyone with the link"
        self.drives: dict[str, dict] = {}      # shared drives: id -> {"id", "name"}
        self.throttled: set[str] = set()       # shared ids whose link answers "Too many users have viewed..."
        self.mount: dict | None = None         # a linked Drive mount stand-in (link_mount)

    def new_id(self) -> str:
        return "1" + secrets.token_urlsafe(24).replace("-", "x").replace("_", "y")[:32]

    def add(self, title: str, parent: str = ROOT_ID, *, mime: str = "application/octet-stream",
            data: bytes | None = None, file_id: str | None = None) -> dict:
        with self.lock:
            fid = file_id or self.new_id()
            stamp = _now()
            meta = {"kind": "drive#file", "id": fid, "title": title, "mimeType": mime,
                    "parents": [{"id": parent, "isRoot": parent == ROOT_ID}], "labels": {"trashed": False},
                    "createdDate": stamp, "modifiedDate": stamp, "_seq": next(self._clock),
                    "_t": time.monotonic()}
            drive_id = self.files[parent].get("driveId") if parent in self.files else None
            if drive_id:                                  # an item in a shared drive belongs to that drive
                meta["driveId"] = drive_id
            self.files[fid] = meta
            if not mime.startswith(GOOGLE_APPS):      # Docs, Sheets, shortcuts, folders: no bytes, no size/md5
                self.set_content(fid, data or b"")
            return self.public_meta(fid)

    def add_drive(self, name: str) -> str:
        """A shared drive (Workspace): its id (19 characters from "0A", like Drive's) is also the id of its top
        folder, which has no parent; everything made below it carries ``driveId`` and belongs to the drive."""
        with self.lock:
            did = "0A" + secrets.token_urlsafe(12).replace("-", "x").replace("_", "y")[:11] + "Uk9PVA"
            self.drives[did] = {"kind": "drive#drive", "id": did, "name": name}
            stamp = _now()
            self.files[did] = {"kind": "drive#file", "id": did, "title": name, "mimeType": FOLDER, "parents": [],
                               "labels": {"trashed": False}, "createdDate": stamp, "modifiedDate": stamp,
                               "driveId": did, "_seq": next(self._clock), "_t": time.monotonic()}
            return did

    def add_shortcut(self, title: str, target: str, parent: str = ROOT_ID) -> dict:
        """A shortcut (what "Add shortcut to Drive" on a shared folder makes): no content, its own id, and
        ``shortcutDetails`` naming the target; the target's type is captured when the shortcut is made."""
        with self.lock:
            meta = self.add(title, parent, mime=SHORTCUT)
            target_mime = self.files[target]["mimeType"] if target in self.files else "application/octet-stream"
            self.files[meta["id"]]["shortcutDetails"] = {"targetId": target, "targetMimeType": target_mime}
            return self.public_meta(meta["id"])

    def set_content(self, fid: str, data: bytes) -> None:
        self.content[fid] = data
        meta = self.files[fid]
        meta.update(fileSize=str(len(data)), md5Checksum=hashlib.md5(data).hexdigest(), modifiedDate=_now())

    def public_meta(self, fid: str) -> dict:
        return {k: v for k, v in self.files[fid].items() if not k.startswith("_")}

    def children(self, parent: str, *, trashed: bool | None = False) -> list[dict]:
        return [m for m in self.files.values() if any(p["id"] == parent for p in m["parents"])
                and (trashed is None or m["labels"]["trashed"] == trashed)]

    def find(self, path: str, parent: str = ROOT_ID) -> dict | None:
        """The newest non-trashed file at a '/'-separated path (test helper)."""
        meta = None
        for part in [p for p in path.split("/") if p]:
            found = sorted((m for m in self.children(parent) if m["title"] == part), key=lambda m: m["_seq"])
            if not found:
                return None
            meta = found[-1]
            parent = meta["id"]
        return meta

    def delete(self, fid: str) -> None:
        """Delete for good (a folder with everything below it, trashed or not)."""
        for child in self.children(fid, trashed=None):
            self.delete(child["id"])
        self.files.pop(fid, None)
        self.content.pop(fid, None)
        if self.mount is not None and fid in self.mount["trashed"]:   # out of the mount's Trash too
            stored = os.path.join(self.mount["trash"], str(self.mount["trashed"].pop(fid)))
            if os.path.isdir(stored):
                os.rmdir(stored)
            elif os.path.lexists(stored):
                os.unlink(stored)

    def in_trash(self, fid: str) -> bool:
        """Trashed itself or below a trashed folder (Drive trashes a folder's contents with it)."""
        while fid in self.files:
            meta = self.files[fid]
            if meta["labels"]["trashed"]:
                return True
            fid = meta["parents"][0]["id"] if meta["parents"] else None
        return False

    def bytes_used(self) -> tuple[int, int]:
        """(bytes stored, Trash included; bytes in Trash): what counts against the storage quota."""
        sizes = [(len(data), self.in_trash(fid)) for fid, data in self.content.items()]
        return sum(n for n, _ in sizes), sum(n for n, trashed in sizes if trashed)

    def empty_trash(self) -> None:
        for fid in [fid for fid, meta in self.files.items() if meta["labels"]["trashed"]]:
            if fid in self.files:
                self.delete(fid)

    # -- a linked Drive mount stand-in (tests/standins/drivefs.py with --trash) ----------------------------
    def link_mount(self, my_drive, trash) -> None:
        self.mount = {"root": os.fspath(my_drive), "trash": os.fspath(trash), "ids": {}, "stamps": {},
                      "trashed": {}, "taken": set()}

    def sync_mount(self) -> None:
        """Take in the linked mount's files and its Trash, as Drive's sync does (see the module docstring)."""
        if self.mount is None:
            return
        try:
            from .drivefs import read_trash
        except ImportError:   # loaded as a top-level module (its folder on sys.path)
            from drivefs import read_trash  # type: ignore[no-redef]
        with self.lock:
            mount, present = self.mount, set()
            for folder, dirs, names in os.walk(mount["root"]):
                rel = os.path.relpath(folder, mount["root"]).replace(os.sep, "/")
                rel = "" if rel == "." else rel + "/"
                for name in sorted(dirs) + sorted(names):
                    path, full = rel + name, os.path.join(folder, name)
                    present.add(path)
                    self._take_in(path, full, folder=name in dirs)
            for entry in read_trash(mount["trash"]):
                if entry["n"] in mount["taken"] or not entry["path"].startswith("/MyDrive/"):
                    continue
                mount["taken"].add(entry["n"])
                path = entry["path"][len("/MyDrive/"):]
                fid = mount["ids"].get(path)
                if fid not in self.files or path in present or self.files[fid]["labels"]["trashed"]:
                    stored = os.path.join(mount["trash"], str(entry["n"]))
                    fid = self._take_in(path, stored, folder=entry["kind"] == "folder", new=True)
                self.files[fid]["labels"]["trashed"] = True
                mount["trashed"][fid] = entry["n"]
            for path, fid in list(mount["ids"].items()):   # gone from the mount, not to its Trash: renamed away
                if path not in present and fid in self.files and not self.files[fid]["labels"]["trashed"]:
                    self.delete(fid)

    def _take_in(self, path: str, full: str, *, folder: bool, new: bool = False) -> str:
        """The id of the mount's item at ``path`` (its bytes from ``full``), made (or updated) as needed."""
        mount = self.mount
        fid = mount["ids"].get(path)
        if not new and fid in self.files and not self.files[fid]["labels"]["trashed"]:
            st = os.stat(full)
            if not folder and mount["stamps"].get(fid) != (st.st_size, st.st_mtime_ns):
                with open(full, "rb") as fh:
                    self.set_content(fid, fh.read())
                mount["stamps"][fid] = (st.st_size, st.st_mtime_ns)
            return fid
        parent_path, _, title = path.rpartition("/")
        parent = ROOT_ID if not parent_path else self._mount_folder(parent_path)
        if folder:
            fid = self.add(title, parent, mime=FOLDER)["id"]
        else:
            with open(full, "rb") as fh:
                fid = self.add(title, parent, data=fh.read())["id"]
            st = os.stat(full)
            mount["stamps"][fid] = (st.st_size, st.st_mtime_ns)
        if not new or mount["ids"].get(path) not in self.files:
            mount["ids"][path] = fid
        return fid

    def _mount_folder(self, path: str) -> str:
        fid = self.mount["ids"].get(path)
        if fid in self.files:
            return fid
        return self._take_in(path, "", folder=True, new=True)


# -- the q language subset -------------------------------------------------------------------------------
_CLAUSE = re.compile(r"""\s*(?:'((?:[^'\\]|\\.)*)'\s+in\s+parents|(title|mimeType|trashed)\s*(=|!=)\s*"""
                     r"""(?:'((?:[^'\\]|\\.)*)'|(true|false)))\s*$""")


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def parse_q(q: str):
    """A predicate for the q subset; raises ValueError (-> 400 invalid query) on anything else."""
    tests = []
    for clause in re.split(r"\s+and\s+(?=(?:[^']*'[^']*')*[^']*$)", q.strip()) if q.strip() else []:
        m = _CLAUSE.match(clause)
        if not m:
            raise ValueError(clause)
        parent, field, op, text, boolean = m.groups()
        if parent is not None:
            pid = _unquote(parent)
            tests.append(lambda f, pid=pid: any(p["id"] == pid or (pid == "root" and p["id"] == ROOT_ID)
                                                for p in f["parents"]))
        elif field == "trashed":
            want = (boolean or text) == "true"
            tests.append(lambda f, want=want, op=op: (f["labels"]["trashed"] == want) == (op == "="))
        elif field == "title":   # Drive compares names without regard to case: 'runs' finds "Runs"
            value = _unquote(text).casefold()
            tests.append(lambda f, value=value, op=op: (f["title"].casefold() == value) == (op == "="))
        else:
            value = _unquote(text)
            tests.append(lambda f, field=field, value=value, op=op: (f[field] == value) == (op == "="))
    return lambda f: all(t(f) for t in tests)


class DriveServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = DriveState()
        self.tokens: dict[str, str] = {}      # access token -> who it was issued to
        self.revoked: set[str] = set()        # client emails / client ids whose grants are refused
        self.codes: dict[str, str] = {}       # authorization code -> client id
        self.refresh_tokens: dict[str, str] = {}
        self.user = {"emailAddress": "tester@example.com", "displayName": "Test User"}
        self.faults: list[dict] = []
        self.requests: list[tuple[str, str]] = []
        self.upload_bytes = 0
        self.slow_chunk_s = 0.0
        self.page_cap: int | None = None   # files.list pages hold at most this many items (Drive: 1000)
        self.short_pages = False        # every other page short or empty, with a nextPageToken (Drive may)
        self.pages_served = 0           # files.list answers sent
        self.body_timeout_s = 5.0       # a request body that stops arriving this long is abandoned (see _body)
        self._lock = threading.Lock()
        self.count = 0                               # counted (Drive API) requests since arm/reset_count
        self.counted: list[tuple[str, str]] = []     # their (method, path), in order
        self.injected: list[tuple] = []              # armed faults that fired: (n, kind, method, path[, what])
        self.abandoned: list[tuple] = []             # (n or None, method, path) of requests whose body never came
        self._armed: dict | None = None              # {"k", "kind", "from": bool}
        self.no_quota: set[str] = set()   # accounts (service-account emails) without storage of their own
        self.listing_lag_s = 0.0        # files.list leaves out items created less than this long ago (files.get sees them)
        self.quota_requests: int | None = None   # quota(): Drive API requests allowed per quota_window_s
        self.quota_window_s = 60.0
        self._quota_times: list[float] = []
        self.rate_limited = 0                     # requests answered 403 userRateLimitExceeded by the quota
        self.stalls: list[dict] = []     # stall(): requests read and never answered
        self.stalled: list[tuple[str, str]] = []
        self._stopping = threading.Event()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self):
        self.thread.start()
        return self

    def link_mount(self, my_drive, trash) -> None:
        """Let this Drive see a drive_mount stand-in's files and Trash (``drive.backing / "MyDrive"``,
        ``drive.trash``): see the module docstring."""
        self.state.link_mount(my_drive, trash)

    def stop(self):
        self._stopping.set()            # stalled requests end (their connections close unanswered)
        self.shutdown()
        self.server_close()

    def fail(self, status: int, *, method: str | None = None, path: str | None = None,
             reason: str | None = None, times: int = 1) -> None:
        reason = reason or {403: "rateLimitExceeded", 429: "rateLimitExceeded"}.get(status, "backendError")
        with self._lock:
            self.faults.append({"status": status, "method": method, "path": path, "reason": reason, "times": times})

    def quota(self, requests: int | None, per_s: float = 60.0) -> None:
        """Drive's per-user quota: at most ``requests`` Drive API requests in any ``per_s`` seconds (Drive's
        window is a minute); the others get 403 ``userRateLimitExceeded`` and are not counted. None: no quota."""
        with self._lock:
            self.quota_requests, self.quota_window_s, self._quota_times = requests, per_s, []

    def take_quota(self) -> bool:
        """True when this request fits in the quota (and is counted against it)."""
        import time
        with self._lock:
            if self.quota_requests is None:
                return True
            now = time.monotonic()
            self._quota_times = [t for t in self._quota_times if now - t < self.quota_window_s]
            if len(self._quota_times) >= self.quota_requests:
                self.rate_limited += 1
                return False
            self._quota_times.append(now)
            return True

    def stall(self, *, method: str | None = None, path: str | None = None, times: int = 1) -> None:
        """The next ``times`` matching requests (any path, shared-link pages included: ``path`` is a substring)
        are read and never answered, as a half-open connection or a hung front end: the client waits until
        its own timeout. The connection closes when the server stops."""
        with self._lock:
            self.stalls.append({"method": method, "path": path, "times": times})

    def take_stall(self, method: str, path: str) -> bool:
        with self._lock:
            for stall in self.stalls:
                if stall["method"] in (None, method) and (stall["path"] is None or stall["path"] in path):
                    stall["times"] -= 1
                    if stall["times"] <= 0:
                        self.stalls.remove(stall)
                    self.stalled.append((method, path))
                    return True
        return False

    def take_fault(self, method: str, path: str):
        with self._lock:
            for fault in self.faults:
                if (fault["method"] in (None, method)) and (fault["path"] is None or fault["path"] in path):
                    fault["times"] -= 1
                    if fault["times"] <= 0:
                        self.faults.remove(fault)
                    return fault
        return None

    # -- request-granular faults (see the module docstring) ------------------------------------------------
    def arm(self, k: int, kind: str) -> None:
        """The k-th counted request from now gets ``kind``, once; ``count`` restarts at 0."""
        self._arm(k, kind, outage=False)

    def arm_from(self, k: int, kind: str) -> None:
        """The k-th counted request from now and every later one get ``kind``, until ``disarm()``."""
        self._arm(k, kind, outage=True)

    def _arm(self, k: int, kind: str, *, outage: bool) -> None:
        if kind not in ARM_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; one of {ARM_KINDS}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k={k!r}: the first request counted from now is k=1")
        with self._lock:
            self.count, self.counted = 0, []
            self._armed = {"k": k, "kind": kind, "from": outage}

    def disarm(self) -> None:
        with self._lock:
            self._armed = None

    def reset_count(self) -> None:
        """Restart ``count`` (and ``counted``) at 0; an armed fault's k then counts from here too."""
        with self._lock:
            self.count, self.counted = 0, []

    def count_request(self, method: str, path: str, *, is_list: bool) -> tuple[int, str | None]:
        """Count one Drive API request: (its number, the armed fault kind it gets or None), atomically."""
        with self._lock:
            self.count += 1
            n = self.count
            self.counted.append((method, path))
            armed = self._armed
            if armed is None or n < armed["k"]:
                return n, None
            if armed["kind"] == "stale-list" and not is_list:
                return n, None    # the fault waits for the next files.list
            if not armed["from"]:
                self._armed = None
            return n, armed["kind"]

    def issue_token(self, who: str) -> str:
        token = "ya29." + secrets.token_urlsafe(16)
        self.tokens[token] = who
        return token

    def issue_code(self, client_id: str) -> str:
        code = "4/" + secrets.token_urlsafe(12)
        self.codes[code] = client_id
        return code


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True   # headers and body go out in two writes: no 40 ms delayed-ACK stall
    _stale: int | None = None        # the request number of an armed "stale-list" this request is
    _who: str | None = None          # the account the request's token was issued to
    _query: dict = {}                # this request's query parameters (read only)  # noqa: RUF012
    server: DriveServer

    def log_message(self, *args):  # quiet
        pass

    # -- plumbing --------------------------------------------------------------------------------------
    def _body(self) -> bytes | None:
        """The request body; None when it stops arriving for ``server.body_timeout_s`` (the request is then
        abandoned: no answer, connection closed). A body cut short by the client closing is returned short."""
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return b""
        self.connection.settimeout(self.server.body_timeout_s)
        try:
            return self.rfile.read(length)
        except TimeoutError:
            return None
        finally:
            self.connection.settimeout(None)

    def _send(self, status: int, body: bytes = b"", ctype: str = "application/json; charset=UTF-8",
              headers: dict | None = None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj):
        self._send(status, json.dumps(obj).encode())

    def _error(self, status: int, reason: str, message: str):
        self._send(status, _error_body(status, reason, message))

    def _dispatch(self):
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        body = self._body()
        self._query = query
        self.server.requests.append((self.command, url.path))
        path = url.path
        n, kind = 0, None
        if path == "/token" or path.startswith(("/drive/v2/", "/upload/drive/v2/")):
            n, kind = self.server.count_request(self.command, path,
                                                is_list=self.command == "GET" and path == "/drive/v2/files")
        if body is None:      # the body never came (a client re-sent a request whose body stream it had used up)
            self.server.abandoned.append((n if n else None, self.command, path))
            if kind is not None:
                self.server.injected.append((n, kind, self.command, path, "body incomplete: no answer anyway"))
            self.close_connection = True
            return None
        if kind == "hang" or self.server.take_stall(self.command, path):
            if kind == "hang":
                self.server.injected.append((n, kind, self.command, path))
            self.server._stopping.wait()               # never answers; closed when the server stops
            self.close_connection = True
            return None
        if kind in ("500", "503"):
            self.server.injected.append((n, kind, self.command, path))
            return self._error(int(kind), "backendError", "Backend Error")
        if kind == "drop":
            self.server.injected.append((n, kind, self.command, path))
            self.close_connection = True           # nothing is written: the client reads EOF
            return None
        if kind == "drop-mid":
            return self._cut_short(n, path, query, body)
        self._stale = n if kind == "stale-list" else None     # the request number, for _list
        try:
            return self._serve(path, query, body)
        finally:
            if self._stale is not None:   # armed for this files.list, but fail(), a 401 or a bad q answered it
                self._stale = None
                self.server.injected.append((n, kind, self.command, path, "answered otherwise: nothing omitted"))

    def _cut_short(self, n: int, path: str, query: dict, body: bytes):
        """Apply the request, then send its answer's head and half its body, and close the connection."""
        real, self.wfile = self.wfile, io.BytesIO()
        try:
            self._stale = None
            self._serve(path, query, body)
            raw = self.wfile.getvalue()
        finally:
            self.wfile = real
        self.close_connection = True
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if not sep or not rest or self.command == "HEAD":   # no body to cut: drop before the first byte
            self.server.injected.append((n, "drop-mid", self.command, path, "no body: nothing sent"))
            return None
        self.server.injected.append((n, "drop-mid", self.command, path, f"{len(rest) // 2} of {len(rest)} bytes"))
        self.wfile.write(head + b"\r\nConnection: close\r\n\r\n" + rest[:len(rest) // 2])
        self.wfile.flush()
        return None

    def _serve(self, path: str, query: dict, body: bytes):
        if path == "/token":
            return self._token(body)
        if path in ("/uc", "/embeddedfolderview"):
            return self._shared(path, query)
        if path.startswith(("/drive/v2/", "/upload/drive/v2/")):
            if not self.server.take_quota():
                return self._error(403, "userRateLimitExceeded", "User Rate Limit Exceeded")
            fault = self.server.take_fault(self.command, path)
            if fault:
                return self._error(fault["status"], fault["reason"], f"injected {fault['status']}")
            auth = self.headers.get("Authorization", "")
            who = self.server.tokens.get(auth[7:]) if auth.startswith("Bearer ") else None
            if who is None or who in self.server.revoked:     # revoking also voids issued access tokens
                return self._error(401, "authError", "Invalid Credentials")
            self._who = who
            with self.server.state.lock:
                return self._drive(path, query, body)
        return self._send(404, b"<html><title>Not Found</title></html>", "text/html")

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _dispatch

    # -- OAuth -----------------------------------------------------------------------------------------
    def _token(self, body: bytes):
        form = {k: v[-1] for k, v in urllib.parse.parse_qs(body.decode()).items()}
        grant = form.get("grant_type", "")
        who = None
        if grant == "urn:ietf:params:oauth:grant-type:jwt-bearer":
            try:
                payload = form["assertion"].split(".")[1]
                claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
                who = claims["iss"]
            except (KeyError, IndexError, ValueError):
                return self._json(400, {"error": "invalid_grant", "error_description": "Invalid JWT."})
            if who in self.server.revoked:
                return self._json(400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
            return self._json(200, {"access_token": self.server.issue_token(who), "expires_in": 3600,
                                    "token_type": "Bearer"})
        if grant == "authorization_code":
            who = self.server.codes.pop(form.get("code", ""), None)
            if who is None or who in self.server.revoked:
                return self._json(400, {"error": "invalid_grant", "error_description": "Malformed auth code."})
            refresh = "1//" + secrets.token_urlsafe(16)
            self.server.refresh_tokens[refresh] = who
            return self._json(200, {"access_token": self.server.issue_token(who), "expires_in": 3600,
                                    "refresh_token": refresh, "token_type": "Bearer"})
        if grant == "refresh_token":
            who = self.server.refresh_tokens.get(form.get("refresh_token", ""))
            if who is None or who in self.server.revoked:
                return self._json(400, {"error": "invalid_grant",
                                        "error_description": "Token has been expired or revoked."})
            return self._json(200, {"access_token": self.server.issue_token(who), "expires_in": 3600,
                                    "token_type": "Bearer"})
        return self._json(400, {"error": "unsupported_grant_type"})

    # -- shared links (what gdown reads) -----------------------------------------------------------------
    def _shared(self, path: str, query: dict):
        state = self.server.state
        fid = query.get("id", "")
        with state.lock:
            meta = state.files.get(fid)
            visible = meta is not None and fid in state.public and not meta["labels"]["trashed"]
            if path == "/uc":
                if visible and fid in state.throttled:     # Google's download quota for a popular shared file
                    page = (b"<html><head><title>Google Drive - Quota exceeded</title></head><body>"
                            b"<p class=\"uc-error-caption\">Sorry, you can't view or download this file at this time."
                            b"</p>\n<p class=\"uc-error-subcaption\">Too many users have viewed or downloaded this "
                            b"file recently. Please try accessing the file again later. If the file you are trying "
                            b"to access is particularly large or is shared with many people, it may take up to 24 "
                            b"hours to be able to view or download the file.</p></body></html>")
                    return self._send(200, page, "text/html; charset=utf-8")
                if not visible or meta["mimeType"] == FOLDER:
                    page = b"<html><head><title>Google Drive - Page Not Found</title></head><body>" \
                           b"<p class=\"uc-error-subcaption\">Sorry, the file you have requested does not " \
                           b"exist.</p></body></html>"
                    return self._send(404, page, "text/html; charset=utf-8")
                data = state.content[fid]
                title = urllib.parse.quote(meta["title"])
                return self._send(200, data, "application/octet-stream",
                                  {"Content-Disposition": f"attachment; filename=\"{meta['title']}\"; "
                                                          f"filename*=UTF-8''{title}"})
            if not visible or meta["mimeType"] != FOLDER:
                return self._send(404, b"<html><head><title>Error 404 (Not Found)</title></head></html>",
                                  "text/html; charset=utf-8")
            links = []
            for child in sorted(state.children(fid), key=lambda m: m["_seq"]):
                name = html.escape(child["title"])
                href = (f"https://drive.google.com/drive/folders/{child['id']}" if child["mimeType"] == FOLDER
                        else f"https://drive.google.com/file/d/{child['id']}/view?usp=drive_web")
                links.append(f'<div class="flip-entry"><a href="{href}" target="_blank">'
                             f'<div class="flip-entry-title">{name}</div></a></div>')
            page = (f"<!DOCTYPE html><html><head><title>{html.escape(meta['title'])}</title></head><body>"
                    f"<div class=\"flip-entries\">{''.join(links)}</div></body></html>").encode()
            return self._send(200, page, "text/html; charset=utf-8")

    # -- Drive v2 --------------------------------------------------------------------------------------
    def _drive(self, path: str, query: dict, body: bytes):
        state = self.server.state
        state.sync_mount()
        if path == "/drive/v2/about":
            own = self._who not in self.server.no_quota     # a service account's storage quota is 0 bytes
            used, in_trash = state.bytes_used()
            return self._json(200, {"kind": "drive#about", "name": self.server.user["displayName"],
                                    "user": {"kind": "drive#user", **self.server.user},
                                    "rootFolderId": ROOT_ID, "quotaType": "LIMITED",
                                    "quotaBytesTotal": str(15 << 30) if own else "0", "quotaBytesUsed": str(used),
                                    "quotaBytesUsedAggregate": str(used), "quotaBytesUsedInTrash": str(in_trash)})
        if path == "/drive/v2/drives" and self.command == "GET":
            m = re.fullmatch(r"\s*name\s*=\s*'((?:[^'\\]|\\.)*)'\s*", query.get("q", "")) if query.get("q") else None
            items = [d for d in state.drives.values()
                     if m is None or d["name"].casefold() == _unquote(m.group(1)).casefold()]
            return self._json(200, {"kind": "drive#driveList", "items": items})
        if path.startswith("/upload/drive/v2/files"):
            return self._upload(path, query, body)
        m = re.match(r"^/drive/v2/files(?:/([^/]+))?(?:/(trash|untrash))?$", path)
        if not m:
            return self._error(404, "notFound", f"no route {path}")
        fid, action = m.groups()
        if fid == "trash" and action is None and self.command == "DELETE":   # files.emptyTrash: all of it
            with state.lock:
                state.empty_trash()
            return self._send(204)
        if fid == "root":
            fid = ROOT_ID
        if fid is None:
            if self.command == "GET":
                return self._list(query)
            if self.command == "POST":
                return self._insert(json.loads(body or b"{}"), None)
            return self._error(405, "badMethod", self.command)
        if fid != ROOT_ID and fid not in state.files:
            return self._error(404, "notFound", f"File not found: {fid}")
        if fid != ROOT_ID and state.files[fid].get("driveId") and query.get("supportsAllDrives") != "true":
            return self._error(404, "notFound", f"File not found: {fid}")   # shared-drive items need the flag
        if fid == ROOT_ID:
            return self._json(200, {"kind": "drive#file", "id": ROOT_ID, "title": "My Drive", "mimeType": FOLDER,
                                    "parents": [], "labels": {"trashed": False}})
        if action == "trash" or action == "untrash":
            state.files[fid]["labels"]["trashed"] = action == "trash"
            return self._json(200, state.public_meta(fid))
        if self.command == "GET":
            if query.get("alt") == "media":
                return self._media(fid)
            return self._json(200, state.public_meta(fid))
        if self.command == "DELETE":
            state.delete(fid)
            return self._send(204)
        if self.command in ("PUT", "PATCH"):
            self._apply_metadata(fid, json.loads(body or b"{}"))
            return self._json(200, state.public_meta(fid))
        return self._error(405, "badMethod", self.command)

    def _list(self, query: dict):
        state = self.server.state
        try:
            match = parse_q(query.get("q", ""))
        except ValueError as exc:
            return self._error(400, "invalid", f"Invalid query: {exc}")
        lag, now = self.server.listing_lag_s, time.monotonic()
        all_drives = query.get("supportsAllDrives") == "true" and query.get("includeItemsFromAllDrives") == "true"
        items = sorted((m for m in state.files.values() if match(m) and now - m["_t"] >= lag
                        and (all_drives or not m.get("driveId"))),
                       key=lambda m: m["_seq"])   # items younger than listing_lag_s are not listed yet
        if self._stale is not None:          # an armed "stale-list": the newest match is not listed yet
            n, self._stale = self._stale, None
            omitted = items.pop()["id"] if items else None
            self.server.injected.append((n, "stale-list", self.command, "/drive/v2/files", f"omitted: {omitted}"))
        # Drive caps a page at 1000 items whatever maxResults asks for, and "partial or empty result pages are
        # possible even before the end of the files list has been reached" (maxResults in the v2 discovery
        # document): page_cap lowers the cap, short_pages makes every other page short or empty
        size = min(int(query.get("maxResults") or 100), MAX_PAGE, self.server.page_cap or MAX_PAGE)
        try:
            start, page_no = _read_page_token(query.get("pageToken"))
        except ValueError:
            return self._error(400, "invalid", "Invalid Value")
        if self.server.short_pages and page_no % 2 == 1:
            size = (page_no // 2) % 2 * max(1, size // 3)      # 0 items, then a third of a page, ...
        page = [state.public_meta(m["id"]) for m in items[start:start + size]]
        result = {"kind": "drive#fileList", "items": page}
        if start + size < len(items) or (self.server.short_pages and page_no % 2 == 0 and start < len(items)):
            result["nextPageToken"] = _page_token(start + size, page_no + 1)
        self.server.pages_served += 1
        return self._json(200, result)

    def _media(self, fid: str):
        data = self.server.state.content.get(fid)
        if data is None:
            return self._error(403, "fileNotDownloadable", "Only files with binary content can be downloaded.")
        rng = self.headers.get("Range")
        if rng and data:
            m = re.match(r"bytes=(\d+)-(\d*)", rng)
            start = int(m.group(1))
            end = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
            if start >= len(data) and data:
                return self._send(416, b"")
            chunk = data[start:end + 1]
            return self._send(206, chunk, "application/octet-stream",
                              {"Content-Range": f"bytes {start}-{start + len(chunk) - 1}/{len(data)}"})
        return self._send(200, data, "application/octet-stream")

    def _apply_metadata(self, fid: str, meta: dict):
        target = self.server.state.files[fid]
        for key in ("title", "mimeType", "description"):
            if key in meta:
                target[key] = meta[key]
        if "parents" in meta:
            target["parents"] = [{"id": p["id"], "isRoot": p["id"] in (ROOT_ID, "root")} for p in meta["parents"]]
        if "labels" in meta and "trashed" in meta["labels"]:
            target["labels"]["trashed"] = bool(meta["labels"]["trashed"])
        target["modifiedDate"] = _now()

    def _refuse_create(self, meta: dict):
        """The error answer for a create Drive refuses (None: allowed): a parent in a shared drive without
        supportsAllDrives=true (404), a file (not a folder) that an account without storage would own (403)."""
        state = self.server.state
        parent = ((meta.get("parents") or [{"id": ROOT_ID}])[0]["id"])
        parent = ROOT_ID if parent == "root" else parent
        in_drive = parent in state.files and state.files[parent].get("driveId")
        if in_drive and self._query.get("supportsAllDrives") != "true":
            return self._error(404, "notFound", f"File not found: {parent}")
        if meta.get("mimeType") != FOLDER and not in_drive and self._who in self.server.no_quota:
            return self._error(403, "storageQuotaExceeded", "Service Accounts do not have storage quota. Leverage "
                               "shared drives (https://developers.google.com/workspace/drive/api/guides/about-"
                               "shareddrives), or use OAuth delegation (http://support.google.com/a/answer/7281227) "
                               "instead.")
        return None

    def _insert(self, meta: dict, data: bytes | None):
        state = self.server.state
        parents = meta.get("parents") or [{"id": ROOT_ID}]
        parent = parents[0]["id"]
        parent = ROOT_ID if parent == "root" else parent
        if parent != ROOT_ID and parent not in state.files:
            return self._error(404, "notFound", f"File not found: {parent}")
        mime = meta.get("mimeType") or "application/octet-stream"
        refused = self._refuse_create(meta)
        if refused:
            return refused
        if mime == SHORTCUT:
            target = (meta.get("shortcutDetails") or {}).get("targetId")
            if target not in state.files:
                return self._error(400, "shortcutTargetInvalid", "The shortcut target is invalid.")
            return self._json(200, state.add_shortcut(meta.get("title") or "Untitled", target, parent))
        created = state.add(meta.get("title") or "Untitled", parent, mime=mime, data=data)
        return self._json(200, created)

    def _upload(self, path: str, query: dict, body: bytes):
        state = self.server.state
        m = re.match(r"^/upload/drive/v2/files(?:/([^/]+))?$", path)
        fid = m.group(1) if m else None
        kind = query.get("uploadType")
        if "upload_id" in query:
            return self._upload_chunk(query["upload_id"], body)
        if kind == "multipart":
            ctype = self.headers.get("Content-Type", "")
            msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + body)
            parts = list(msg.iter_parts())
            meta = json.loads(parts[0].get_payload(decode=True) or b"{}")
            data = parts[1].get_payload(decode=True) if len(parts) > 1 else b""
            if fid:
                self._apply_metadata(fid, meta)
                state.set_content(fid, data)
                return self._json(200, state.public_meta(fid))
            return self._insert(meta, data)
        if kind == "resumable":
            meta = json.loads(body or b"{}")
            refused = None if fid else self._refuse_create(meta)
            if refused:
                return refused
            upload_id = secrets.token_urlsafe(12)
            total = self.headers.get("X-Upload-Content-Length")
            state.sessions[upload_id] = {"meta": meta, "fid": fid, "data": bytearray(), "query": dict(query),
                                         "total": int(total) if total else None}
            location = f"{self.server.root_url}/upload/drive/v2/files?uploadType=resumable&upload_id={upload_id}"
            return self._send(200, b"", headers={"Location": location})
        if kind == "media" and fid:
            state.set_content(fid, body)
            return self._json(200, state.public_meta(fid))
        return self._error(400, "badRequest", f"unsupported uploadType {kind!r}")

    def _upload_chunk(self, upload_id: str, body: bytes):
        state = self.server.state
        session = state.sessions.get(upload_id)
        if session is None:
            return self._error(404, "notFound", "upload session expired")
        crange = self.headers.get("Content-Range", "")
        m = re.match(r"bytes (\*|(\d+)-(\d+))/(\*|\d+)", crange)
        data = session["data"]
        if m and m.group(4) != "*":
            session["total"] = int(m.group(4))
        if m and m.group(1) != "*":
            start = int(m.group(2))
            if start != len(data):
                return self._error(400, "badRequest", f"chunk starts at {start}, have {len(data)}")
            data.extend(body)
            self.server.upload_bytes += len(body)
            if self.server.slow_chunk_s:
                import time
                time.sleep(self.server.slow_chunk_s)
        elif not m and body:   # a single request with the whole body
            data.extend(body)
            self.server.upload_bytes += len(body)
            session["total"] = len(data)
        if session["total"] is not None and len(data) >= session["total"]:
            del state.sessions[upload_id]
            if session["fid"]:
                self._apply_metadata(session["fid"], session["meta"])
                state.set_content(session["fid"], bytes(data))
                return self._json(200, state.public_meta(session["fid"]))
            self._query = session["query"]          # the flags the session was opened with
            return self._insert(session["meta"], bytes(data))
        headers = {"Range": f"bytes=0-{len(data) - 1}"} if data else {}
        return self._send(308, b"", headers=headers)
