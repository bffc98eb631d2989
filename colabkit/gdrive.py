"""Google Drive through its API (pydrive2): credentials, folder paths, resumable transfers with retries.

Credentials (``drive_credentials`` setting, default ``<config dir>/drive-credentials.json``) are either a
service-account key (JSON with ``"type": "service_account"``) or OAuth tokens saved by
``colabkit drive login``. They are written with 0600 permissions and never printed.

Every failure surfaces as an OSError subclass (DriveError), so the checkpoint uploader's retry path applies.
Transient answers (5xx, 429, 403 rateLimitExceeded/userRateLimitExceeded, dropped connections, a request
unanswered for TIMEOUT_S) are retried with exponential back-off; large uploads use Drive's resumable
protocol and continue from the last byte the server acknowledged. pydrive2 is imported on first use only.

``COLABKIT_DRIVE_API_ROOT`` points the client at a Drive-compatible endpoint (the test suite's local server).
"""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import random
import re
import stat
import threading
import time
from pathlib import Path

from . import config as _config
from .optional import require

log = logging.getLogger("colabkit")

FOLDER_MIME = "application/vnd.google-apps.folder"
SHORTCUT_MIME = "application/vnd.google-apps.shortcut"
GOOGLE_APPS = "application/vnd.google-apps."    # Google-native types (Docs, Sheets, ...): no bytes to download
_NATIVE = {GOOGLE_APPS + k: v for k, v in {
    "document": "Google Docs document", "spreadsheet": "Google Sheets spreadsheet",
    "presentation": "Google Slides presentation", "form": "Google Form", "drawing": "Google Drawing",
    "script": "Apps Script project", "site": "Google Site", "jam": "Jamboard", "map": "My Maps map"}.items()}
SCOPES = ["https://www.googleapis.com/auth/drive"]
PAGE_SIZE = 1000                # files.list maxResults: Drive's largest page (it may send shorter ones)
CHUNK = 8 << 20                 # resumable upload chunk (a multiple of 256 KiB)
TIMEOUT_S = 60.0                # every Drive request: a socket that stays silent this long fails (and is retried)
TRIES = 6                       # attempts per request before giving up (the uploader retries again later)
BACKOFF_START, BACKOFF_MAX = 0.5, 32.0
# Drive's quotas are counted per minute (queries per minute per user and per project): a rate-limit answer
# (429, 403 rateLimitExceeded/userRateLimitExceeded) is retried, with jittered exponential back-off, for as
# long as this window even past TRIES attempts, so that many threads sharing one quota all get through
RATE_WINDOW_S = 150.0
# Drive's listings lag behind creates: two processes can each miss the other's new folder and make their own.
# After making a folder of a path, colabkit looks again this much later and, when a twin shows up, uses the one
# that every process picks (see DriveClient.choose_folder). Twins are never deleted (0: no second look)
CREATE_CHECK_S = 2.0
NAME_MAX = 255                  # bytes in a file name on Linux's, macOS's and Windows' usual file systems
_RATE_REASONS = {"rateLimitExceeded", "userRateLimitExceeded"}
_RETRY_REASONS = _RATE_REASONS | {"backendError", "internalError"}


class DriveError(OSError):
    """A Drive API request failed (after retries, when the failure was transient)."""


class DriveAuthError(DriveError, PermissionError):
    """Missing, invalid or revoked Drive credentials."""


class DriveNotFound(DriveError, FileNotFoundError):
    """A Drive file or folder (by id or path) does not exist or is not visible to this account."""


class DriveStorageFull(DriveError):
    """Drive refused to store a file (403 storageQuotaExceeded): the account has no storage of its own (every
    service account) or its storage is full. Not transient: retrying does not help."""


NO_STORAGE_HELP = ("A service account has no Drive storage of its own: it can write only into a shared drive it is a "
                   "member of (gdrive://shared:<drive name>/<path>, or gdrive://<folder id>/<path> for a folder in "
                   "one). Add the service account to a shared drive as Content manager, or sign in as yourself "
                   "with `colabkit drive login --client-secrets client_secrets.json`.")


def credentials_path(settings: _config.Settings | None = None) -> Path:
    settings = settings or _config.load()
    if settings.drive_credentials != _config.AUTO:
        return Path(settings.drive_credentials)
    return settings.config_file.parent / "drive-credentials.json"


def write_private(path: Path, data: bytes) -> None:
    """Write a secret: 0600 from the first byte (no window where others can read it), replaced atomically."""
    import tempfile
    path.parent.mkdir(parents=True, exist_ok=True)
    # a fresh, unpredictable name, created 0600 with O_EXCL|O_NOFOLLOW (never through a link planted at a
    # guessable name, never readable by others, not even before a chmod)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _status_reason(exc) -> tuple[int | None, str]:
    """(HTTP status, first error reason) of a googleapiclient HttpError or pydrive2 ApiRequestError."""
    resp = getattr(exc, "resp", None)
    if resp is None and exc.args and hasattr(exc.args[0], "resp"):
        return _status_reason(exc.args[0])
    status = getattr(resp, "status", None)
    reason = ""
    try:
        content = json.loads(getattr(exc, "content", b"") or b"{}")
        reason = content.get("error", {}).get("errors", [{}])[0].get("reason", "")
    except (ValueError, AttributeError):
        pass
    return (int(status) if status is not None else None), reason


def _error_message(exc) -> str:
    try:
        return json.loads(getattr(exc, "content", b"") or b"{}").get("error", {}).get("message", "")
    except (ValueError, AttributeError):
        inner = exc.args[0] if exc.args else None
        return _error_message(inner) if inner is not None and hasattr(inner, "content") else ""


def _classify(exc, what: str) -> tuple[bool, OSError]:
    """(retryable, the OSError to raise) for an exception from the Drive client."""
    errors = require("googleapiclient.errors", "drive", "Google Drive access")
    oauth2 = require("oauth2client.client", "drive", "Google Drive access")
    httplib2 = require("httplib2", "drive", "Google Drive access")
    status = getattr(exc, "status", None)   # HttpAccessTokenRefreshError: the token endpoint's HTTP status
    if isinstance(exc, oauth2.AccessTokenRefreshError) and isinstance(status, int) and (status >= 500 or status == 429):
        return True, DriveError(f"Google's sign-in service answered {status} while {what}")
    if isinstance(exc, oauth2.AccessTokenRefreshError) or isinstance(exc, oauth2.AccessTokenCredentialsError):
        return False, DriveAuthError(
            f"Google Drive refused the credentials while {what} ({exc}). They may be revoked or expired: run "
            f"`colabkit drive login` again (or point drive_credentials at a valid service-account key).")
    if isinstance(exc, errors.HttpError) or type(exc).__name__ == "ApiRequestError":
        status, reason = _status_reason(exc)
        if status == 401:
            return False, DriveAuthError(f"Google Drive rejected the credentials while {what} (401). "
                                         f"Run `colabkit drive login` again.")
        if status == 403 and reason == "storageQuotaExceeded":
            return False, DriveStorageFull(f"Google Drive refused to store a file while {what} (403 "
                                           f"storageQuotaExceeded: {_error_message(exc)}). {NO_STORAGE_HELP} For a "
                                           f"user account: Drive's storage is full; free some space.")
        if status == 404:
            return False, DriveNotFound(f"Google Drive has no such file or folder while {what} (404), or it "
                                        f"is not shared with this account.")
        retry = status is not None and (status >= 500 or status == 429 or
                                        (status == 403 and reason in _RETRY_REASONS))
        error = DriveError(f"Google Drive answered {status} {reason} while {what}")
        error.rate_limited = status == 429 or (status == 403 and reason in _RATE_REASONS)
        return retry, error
    import http.client
    # IncompleteRead (a connection dropped mid-answer) is an HTTPException, neither an OSError nor httplib2's
    if isinstance(exc, (httplib2.HttpLib2Error, http.client.HTTPException, ConnectionError, TimeoutError)):
        return True, DriveError(f"cannot reach Google Drive while {what} ({type(exc).__name__}: {exc})")
    if isinstance(exc, DriveError):
        return False, exc
    if isinstance(exc, OSError):
        return True, DriveError(f"network error while {what} ({exc})")
    raise exc


def retrying(fn, what: str, *, already=None):
    """Call ``fn()`` with retries on transient Drive errors; raises DriveError (an OSError) otherwise.

    Up to TRIES attempts; rate-limit answers are retried for RATE_WINDOW_S seconds however many attempts
    that takes. Back-off doubles from BACKOFF_START to BACKOFF_MAX, each wait jittered (half to all of it) so
    threads that failed together do not retry together. ``already``: for a request that is not idempotent (a
    create): called before each retry, and its answer, when not None, is returned instead of trying again
    (the failed attempt may have been applied, its answer lost)."""
    delay = BACKOFF_START
    start = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified below
            retry, error = _classify(exc, what)
            in_window = getattr(error, "rate_limited", False) and time.monotonic() - start < RATE_WINDOW_S
            if not retry or (attempt >= TRIES and not in_window):
                raise error from exc
            log.debug("colabkit: %s; retrying in %.1fs", error, delay)
        time.sleep(delay * (0.5 + random.random() / 2))
        delay = min(delay * 2, BACKOFF_MAX)
        if already is not None:
            found = already()
            if found is not None:
                return found


class DriveClient:
    """An authorised pydrive2 client with the few operations colabkit needs."""

    def __init__(self, gauth, source: str, kind: str = "oauth"):
        pydrive_drive = require("pydrive2.drive", "drive", "Google Drive access")
        self.auth = gauth
        self.source = source
        self.kind = kind                     # "service_account" or "oauth"
        self.drive = pydrive_drive.GoogleDrive(gauth)
        self._about = None
        self._reported: set = set()

    # -- basics ----------------------------------------------------------------------------------------
    def http(self):
        """This thread's authorised HTTP object (httplib2 is not thread-safe)."""
        local = self.auth.thread_local
        if getattr(local, "http", None) is None:
            local.http = self.auth.Get_Http_Object()
        return local.http

    def about(self) -> dict:
        if self._about is None:
            self._about = retrying(lambda: self.drive.GetAbout(), "reading the account")
        return self._about

    def has_no_storage(self) -> bool:
        """A service account whose Drive reports no storage quota of its own (0 bytes): it can write only into
        shared drives."""
        about = self.about()
        return self.kind == "service_account" and str(about.get("quotaBytesTotal", "")) == "0" and \
            about.get("quotaType") != "UNLIMITED"

    def locate(self, location: str) -> tuple[str, str, str]:
        """(id of the top folder, folder path below it, the top as written) of a gdrive:// location:

        * ``shared:<drive name>/<path>``: a shared drive by its name (as the account sees it);
        * ``<id>/<path>`` or ``id:<id>/<path>``: a folder (or shared drive) by its Drive id, as in its web
          address (drive.google.com/drive/folders/<id>); a shortcut's id stands for its target. A bare first
          part that looks like an id but is not one is read as a folder name below My Drive;
        * ``<path>``: a path below My Drive."""
        text = location.strip().strip("/")
        first, _, rest = text.partition("/")
        if first.startswith("shared:"):
            name = first[len("shared:"):]
            answer = retrying(lambda: self.auth.service.drives().list(q=f"name = '{_q(name)}'", maxResults=100)
                              .execute(http=self.http()), f"looking for the shared drive {name!r}")
            found = [d for d in answer.get("items") or [] if d.get("name") == name]
            if not found:
                raise DriveNotFound(f"No shared drive named {name!r} is visible to {self.whoami()}. Check the name "
                                    f"(case included) and that this account is a member of it.")
            return found[0]["id"], rest, first
        explicit = first.startswith("id:")
        if explicit or _ID.fullmatch(first):
            fid = first[3:] if explicit else first
            why = None
            try:
                item = self.get(fid)
            except DriveNotFound:
                item, why = None, "Drive answers that it does not exist (404)"
            meta = None
            if item is not None:
                meta = self.resolve(item, "gdrive:/")
                if meta is None:
                    why = "it is a shortcut whose target is gone, trashed or not shared with this account"
            if meta is not None:
                if meta.get("mimeType") != FOLDER_MIME:
                    raise DriveNotFound(f"The Drive item {fid} is not a folder; gdrive://<id>/... needs a folder id.")
                return meta["id"], rest, first
            cause = (f"No Drive folder with id {fid} can be used by {self.whoami()}: {why}. Most likely the id "
                     f"belongs to another Google account or the folder is not shared with this one (share it, or "
                     f"sign in as its owner with `colabkit drive login`), or the id is mistyped.")
            if explicit:
                raise DriveNotFound(cause)
            # a bare first part that looks like an id: a My Drive folder of that name only when one already exists
            if self.folder(first, create=False) is None:
                raise DriveNotFound(cause + f" Nothing was created. (For a My Drive folder literally named "
                                            f"{first!r}, make it in Drive first.)")
        return "root", text, ""

    def whoami(self) -> str:
        user = self.about().get("user", {})
        return f"{user.get('displayName', '?')} <{user.get('emailAddress', '?')}>"

    def list(self, q: str, what: str) -> list[dict]:
        """Every item matching ``q``: all pages, following ``nextPageToken`` until Drive gives none (a page
        may be short, even empty, before the end). Each page is retried on its own; an item on two pages is
        kept once. A page token Drive sends a second time would loop forever: that raises a DriveError (an
        OSError, which callers retry later)."""
        items: dict[str, dict] = {}
        token, pages, seen = None, 0, set()
        while True:
            params = {"q": q, "maxResults": PAGE_SIZE, "supportsAllDrives": True, "includeItemsFromAllDrives": True}
            if token:
                params["pageToken"] = token
            page = retrying(lambda params=params: self.auth.service.files().list(**params).execute(http=self.http()),
                            what if not pages else f"{what} (page {pages + 1})")
            for item in page.get("items") or []:
                items.setdefault(item.get("id"), item)
            pages += 1
            token = page.get("nextPageToken")
            if not token:
                return list(items.values())
            if token in seen:
                error = DriveError(f"Google Drive sent the same page token twice while {what} (page {pages}); "
                                   f"stopped rather than loop forever (a transient Drive fault: try again)")
                error.retryable = True
                raise error
            seen.add(token)

    def children(self, parent_id: str, *, title: str | None = None, folders: bool | None = None,
                 case_blind: list | None = None) -> list[dict]:
        """Non-trashed children, oldest first (createdDate, then id: deterministic); ``title``: exactly that
        name, case included (``case_blind``, a list: filled with the items Drive matched whose name differs
        in case)."""
        q = f"'{_q(parent_id)}' in parents and trashed = false"
        if title is not None:
            q += f" and title = '{_q(title)}'"
        if folders is not None:
            q += f" and mimeType {'=' if folders else '!='} '{FOLDER_MIME}'"
        items = self.list(q, f"listing folder {parent_id}")
        if title is not None:   # Drive's `title =` ignores case ('runs' finds "Runs"): names are case-sensitive here
            if case_blind is not None:
                case_blind[:] = [i for i in items if i.get("title") != title]
            items = [i for i in items if i.get("title") == title]
        return sorted(items, key=lambda f: (f.get("createdDate", ""), f["id"]))

    def pick(self, items: list[dict], where: str) -> dict | None:
        """One of same-named items (Drive allows duplicates); duplicates are reported once. Files: the newest.
        Folders (and shortcuts to folders): choose_folder's rule, the same in every process and every lookup."""
        if not items:
            return None
        if len(items) > 1 and all(_is_folder_like(i) for i in items):
            return self.choose_folder(items, where)
        if len(items) > 1:
            key = (where, tuple(i["id"] for i in items))
            if key not in self._reported:
                self._reported.add(key)
                log.warning("colabkit: %d items named %r in %s on Google Drive; using the newest (%s)",
                            len(items), items[-1]["title"], where, items[-1]["id"])
        return items[-1]

    def choose_folder(self, twins: list[dict], where: str) -> dict:
        """Of same-named folders (twins ``children`` listed oldest first): the oldest one that holds committed
        checkpoints (a ``ckpt-`` folder), else the oldest that holds anything, else the oldest. Every process
        and every later lookup applies this rule, so all of them use one folder. Twins are never deleted: the
        others are left as they are, with one warning naming every id."""
        if len(twins) == 1:
            return twins[0]

        def rank(item):
            target = item
            if item.get("mimeType") == SHORTCUT_MIME:
                target_id = (item.get("shortcutDetails") or {}).get("targetId")
                target = {"id": target_id} if target_id else None
            if target is None:
                return 2
            try:
                inside = self.children(target["id"])
            except DriveNotFound:
                return 2
            if any(str(i.get("title", "")).startswith("ckpt-") for i in inside):
                return 0
            return 1 if inside else 2
        ranks = [rank(t) for t in twins]
        chosen = twins[ranks.index(min(ranks))]
        key = (where, tuple(sorted(t["id"] for t in twins)))
        if key not in self._reported:
            self._reported.add(key)
            log.warning("colabkit: %d folders named %r in %s on Google Drive (ids %s); using %s (%s). The others "
                        "are left untouched: move anything you need out of them, then remove them in Drive",
                        len(twins), chosen.get("title"), where, ", ".join(t["id"] for t in twins), chosen["id"],
                        "it holds checkpoints" if ranks[twins.index(chosen)] == 0 else
                        "it holds files" if ranks[twins.index(chosen)] == 1 else "the oldest")
        return chosen

    def get(self, file_id: str) -> dict:
        f = self.drive.CreateFile({"id": file_id})
        retrying(lambda: f.FetchMetadata(), f"reading Drive item {file_id}")
        return dict(f)

    def resolve(self, item: dict, where: str) -> dict | None:
        """A shortcut's target (its metadata under the shortcut's name); any other item as it is. None, with
        a warning, when the target is gone, trashed or not visible to this account."""
        if item.get("mimeType") != SHORTCUT_MIME:
            return item
        target_id = (item.get("shortcutDetails") or {}).get("targetId")
        target = None
        if target_id:
            try:
                target = self.get(target_id)
            except DriveNotFound:
                target = None
        if target is None or (target.get("labels") or {}).get("trashed"):
            log.warning("colabkit: the shortcut %s/%s (Drive id %s) points to an item that is gone or not shared "
                        "with %s; skipped", where, item.get("title"), item.get("id"), self.whoami())
            return None
        return {**target, "title": item["title"], "shortcutId": item["id"]}

    def folder(self, path: str, *, create: bool, root: str = "root") -> str | None:
        """The id of a folder path below ``root``; None when missing and not ``create``. A shortcut to a
        folder (how a folder someone shared shows in My Drive) stands for that folder."""
        parent, where = root, "My Drive" if root == "root" else root
        for part in [p for p in path.split("/") if p]:
            others: list = []
            found = self.pick([i for i in self.children(parent, title=part, case_blind=others)
                               if _is_folder_like(i)], where)
            if found is not None and found.get("mimeType") == SHORTCUT_MIME:
                target = self.resolve(found, where)
                if target is None or target.get("mimeType") != FOLDER_MIME:
                    raise DriveNotFound(f"{where}/{part} on Google Drive is a shortcut to a folder that is gone or "
                                        f"not shared with {self.whoami()}; remove the shortcut or ask for access.")
                found = target
            if found is None:
                other = next((i["title"] for i in others if _is_folder_like(i)), None)
                if other is not None:
                    raise DriveNotFound(
                        f"{where}/{part} does not exist on Google Drive, but {where}/{other} does: names are "
                        f"case-sensitive in colabkit (Drive's own search is not). Use the exact name, "
                        f"gdrive://.../{other}, to use that folder; nothing was created.")
                if not create:
                    return None
                found = self._settle(parent, part, self.mkdir(parent, part), where)
            parent, where = found["id"], f"{where}/{part}"
        return parent

    def _settle(self, parent_id: str, title: str, mine: dict, where: str) -> dict:
        """After making the folder ``mine``: when another process made a same-named one at the same time (a
        lagging listing hid it from both), use the twin choose_folder picks, as every process does. Nothing is
        ever deleted here: a listing that shows a twin empty may be lagging behind what was written into it."""
        if CREATE_CHECK_S <= 0:
            return mine
        time.sleep(CREATE_CHECK_S)
        twins = [i for i in self.children(parent_id, title=title) if _is_folder_like(i)]
        if mine["id"] not in {t["id"] for t in twins}:
            twins.append(mine)
        chosen = self.choose_folder(twins, where)
        if chosen["id"] != mine["id"] and chosen.get("mimeType") == SHORTCUT_MIME:
            target = self.resolve(chosen, where)
            return target if target is not None and target.get("mimeType") == FOLDER_MIME else mine
        return chosen

    def mkdir(self, parent_id: str, title: str) -> dict:
        """A new folder. A create is not idempotent: after a failed attempt (whose answer may be all that was
        lost) the folder is looked for before it is made again, so a retry does not make a second one."""
        def create():
            f = self.drive.CreateFile({"title": title, "mimeType": FOLDER_MIME, "parents": [{"id": parent_id}]})
            f.Upload()
            return dict(f)

        def made():
            try:
                return self.pick(self.children(parent_id, title=title, folders=True), f"Drive folder {parent_id}")
            except DriveError:
                return None
        return retrying(create, f"creating folder {title!r}", already=made)

    def delete(self, file_id: str) -> None:
        f = self.drive.CreateFile({"id": file_id})
        try:
            retrying(lambda: f.Delete(), f"deleting Drive item {file_id}")
        except DriveNotFound:
            pass

    # -- transfers -------------------------------------------------------------------------------------
    def upload(self, local: Path, parent_id: str, title: str, *, progress=None) -> dict:
        """Upload a file with Drive's resumable protocol: chunk failures resume at the acknowledged byte."""
        http_mod = require("googleapiclient.http", "drive", "Google Drive uploads")
        media = http_mod.MediaFileUpload(str(local), mimetype="application/octet-stream", chunksize=CHUNK,
                                         resumable=True)
        try:
            request = self.auth.service.files().insert(
                body={"title": title, "parents": [{"id": parent_id}], "mimeType": "application/octet-stream"},
                media_body=media, supportsAllDrives=True)
            response, sent = None, 0
            while response is None:
                status, response = retrying(lambda: request.next_chunk(http=self.http()),
                                            f"uploading {local.name}")
                if progress is not None and status is not None:
                    progress(status.resumable_progress - sent)
                    sent = status.resumable_progress
            if progress is not None:
                progress(int(response.get("fileSize", sent)) - sent)
            return response
        finally:
            media.stream().close()

    def download(self, file_id: str, out, *, what: str, progress=None) -> None:
        """Write a file's bytes into the binary file object ``out`` (chunked; resumes after errors)."""
        http_mod = require("googleapiclient.http", "drive", "Google Drive downloads")
        request = self.auth.service.files().get_media(fileId=file_id, supportsAllDrives=True)
        request.http = self.http()           # this thread's connection
        downloader = http_mod.MediaIoBaseDownload(out, request, chunksize=CHUNK)
        done, got = False, 0
        while not done:
            status, done = retrying(lambda: downloader.next_chunk(), what)
            if progress is not None and status is not None:
                progress(status.resumable_progress - got)
                got = status.resumable_progress

    def read_bytes(self, file_id: str, what: str) -> bytes:
        import io
        buf = io.BytesIO()
        self.download(file_id, buf, what=what)
        return buf.getvalue()

    def walk(self, folder_id: str, *, where: str | None = None) -> dict[str, dict]:
        """rel path -> newest file metadata, for every file below a folder. Items whose Drive name is not a
        safe local file name (see unsafe_name) are left out, each with a warning naming it. Shortcuts stand
        for their targets (a folder's files, or a file's bytes under the shortcut's name). Each folder is
        listed once, breadth first, and its files are under the shortest path that reaches it: a shortcut to a
        folder reached already (one above it, or one a lattice of shortcuts reaches by 2**depth paths) is
        skipped with a warning naming where that folder's files are. A file that shares its name with a folder
        beside it (Drive allows it) is renamed as Drive numbers duplicates ("labels (1).csv"), with a warning."""
        where = where or f"Drive folder {folder_id}"
        walked = {folder_id: ""}               # every folder listed so far -> the rel path of its files
        queue = collections.deque([(folder_id, "")])
        found: dict[str, list] = {}
        while queue:
            parent, prefix = queue.popleft()
            listed = []
            for item in self.children(parent):
                why = unsafe_name(item["title"])
                if why:
                    kind = "folder" if item.get("mimeType") == FOLDER_MIME else "file"
                    log.warning("colabkit: skipped the %s %s/%s%s (Drive id %s): %s", kind, where, prefix,
                                item["title"], item["id"], why)
                    continue
                item = self.resolve(item, f"{where}/{prefix}".rstrip("/"))
                if item is not None:
                    listed.append(item)
            # Drive lets a file and a folder share a name, a local disk does not: the folder keeps it
            folder_names = {i["title"] for i in listed if i.get("mimeType") == FOLDER_MIME}
            taken = {i["title"] for i in listed}
            renamed: dict[str, str] = {}
            for item in listed:
                rel = f"{prefix}{item['title']}"
                if item.get("mimeType") == FOLDER_MIME:
                    if item["id"] in walked:
                        there = walked[item["id"]]
                        log.warning("colabkit: skipped %s/%s: it leads to %s, %s", where, rel,
                                    f"{where}/{there}".rstrip("/"),
                                    "a folder above it" if not there or rel.startswith(there + "/") else
                                    "a folder already staged there (each folder is copied once, however many "
                                    "shortcuts lead to it)")
                        continue
                    walked[item["id"]] = rel
                    queue.append((item["id"], rel + "/"))
                elif str(item.get("mimeType", "")).startswith(GOOGLE_APPS):
                    kind = _NATIVE.get(item["mimeType"], item["mimeType"])
                    log.warning("colabkit: skipped %s/%s: it is a %s, which has no file to download (Drive answers "
                                "fileNotDownloadable); download it from Drive as a file into the folder to include "
                                "it", where, rel, kind)
                else:
                    if item["title"] in folder_names:
                        if item["title"] not in renamed:
                            renamed[item["title"]] = name = _free_name(item["title"], taken)
                            taken.add(name)
                            log.warning("colabkit: %s/%s is both a folder and a file on Google Drive; the folder "
                                        "keeps the name, the file is staged as %r", where, rel, prefix + name)
                        rel = f"{prefix}{renamed[item['title']]}"
                    found.setdefault(rel, []).append(item)
        return {rel: self.pick(items, folder_id) for rel, items in found.items()}


_ID = re.compile(r"[-\w]{25,}|0A[-\w]{14,}")   # Drive ids: files and folders (28-44 characters), shared drives ("0A...")


def _is_folder_like(item: dict) -> bool:
    return item.get("mimeType") == FOLDER_MIME or (
        item.get("mimeType") == SHORTCUT_MIME and (item.get("shortcutDetails") or {}).get("targetMimeType") == FOLDER_MIME)


def unsafe_name(title) -> str | None:
    """Why a Drive name cannot be one local path component (None when it can). Drive allows any title, "/",
    "..", "." and "" included (joined onto a local folder those would nest or escape it), and titles far longer
    than a local file system's names (NAME_MAX bytes)."""
    if not isinstance(title, str) or title in ("", ".", ".."):
        return f"{title!r} is not a usable file name"
    if "/" in title or "\\" in title:
        return "its name contains a slash, which a local path would read as a folder"
    if "\0" in title:
        return "its name contains a NUL character"
    size = len(title.encode("utf-8", errors="surrogatepass"))
    if size > NAME_MAX:
        return f"its name is {size} bytes long (UTF-8), and a local file name holds at most {NAME_MAX}"
    return None


def _free_name(title: str, taken: set) -> str:
    """``title`` numbered as Drive numbers a duplicate when it downloads one ("a (1).csv"), unused in ``taken``."""
    stem, dot, ext = title.rpartition(".") if "." in title.lstrip(".") else (title, "", "")
    n = 1
    while f"{stem} ({n}){dot}{ext}" in taken:
        n += 1
    return f"{stem} ({n}){dot}{ext}"


def _q(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


# -- authentication -------------------------------------------------------------------------------------
_CLIENTS: dict = {}
_LOCK = threading.Lock()


def _api_root() -> str | None:
    root = os.environ.get("COLABKIT_DRIVE_API_ROOT", "").strip()
    return root.rstrip("/") or None


def _build_service(gauth) -> None:
    root = _api_root()
    if root:  # a Drive-compatible endpoint: the bundled discovery document with its rootUrl replaced
        discovery = require("googleapiclient.discovery", "drive", "Google Drive access")
        from googleapiclient.discovery_cache import get_static_doc
        doc = json.loads(get_static_doc("drive", "v2"))
        doc["rootUrl"] = root + "/"
        doc["baseUrl"] = root + "/" + doc["servicePath"]
        gauth.service = discovery.build_from_document(doc, http=gauth.http)


def _read_private(path: Path) -> bytes:
    """The bytes of a credentials file. One that other users can read (or change) is made 0600 first, with a
    warning naming it and its mode: a Drive key or token in a file others can read is a key they may have."""
    with open(path, "rb") as fh:
        mode = stat.S_IMODE(os.fstat(fh.fileno()).st_mode)
        if os.name == "posix" and mode & 0o077:
            try:
                os.fchmod(fh.fileno(), 0o600)
                done = "colabkit changed it to 0600"
            except OSError as exc:
                done = f"colabkit could not change that ({exc.strerror}): run chmod 600 {path}"
            log.warning("colabkit: the Drive credentials file %s could be read by other users (mode %04o); %s. "
                        "If other people use this machine, treat it as leaked: revoke it (delete the service-account "
                        "key, or remove colabkit's access in your Google account) and sign in again with "
                        "`colabkit drive login`.", path, mode, done)
        return fh.read()


def _load_credentials(path: Path):
    """(pydrive2 GoogleAuth, kind) from a service-account key or saved OAuth tokens; nothing is printed."""
    require("pydrive2", "drive", "Google Drive access")
    from pydrive2.auth import GoogleAuth
    try:
        raw = _read_private(path)
    except FileNotFoundError:
        raise DriveAuthError(
            f"No Google Drive credentials at {path}. Run `colabkit drive login --service-account KEY.json` or "
            f"`colabkit drive login --client-secrets client_secrets.json`, or set drive_credentials "
            f"(COLABKIT_DRIVE_CREDENTIALS) to a service-account key.") from None
    try:
        data = json.loads(raw)
        kind = "service_account" if data.get("type") == "service_account" else "oauth"
    except (ValueError, AttributeError):
        raise DriveAuthError(f"{path} is not a Google credentials JSON file; run `colabkit drive login`.") from None
    if kind == "service_account":
        gauth = GoogleAuth(settings={"client_config_backend": "service", "oauth_scope": SCOPES,
                                     "service_config": {"client_json_dict": data, "client_user_email": None}},
                           http_timeout=TIMEOUT_S)
        try:
            gauth.ServiceAuth()
        except Exception as exc:  # noqa: BLE001 - malformed keys raise many kinds
            raise DriveAuthError(f"The service-account key {path} cannot be used ({type(exc).__name__}: "
                                 f"{exc}). Download a fresh JSON key from the Google Cloud console.") from None
    else:
        from oauth2client.client import Credentials
        try:
            creds = Credentials.new_from_json(raw.decode())
        except Exception:  # noqa: BLE001
            raise DriveAuthError(f"{path} does not hold saved Drive credentials; run `colabkit drive login`.") from None
        gauth = GoogleAuth(settings={"client_config_backend": "settings", "oauth_scope": SCOPES,
                                     "client_config": {"client_id": getattr(creds, "client_id", ""),
                                                       "client_secret": getattr(creds, "client_secret", "")}},
                           http_timeout=TIMEOUT_S)
        gauth.credentials = creds
    return gauth, kind


def connect(settings: _config.Settings | None = None, *, fresh: bool = False) -> DriveClient:
    """An authorised client for the configured credentials; the token is checked now (fails fast)."""
    path = credentials_path(settings)
    key = (str(path), _api_root())
    with _LOCK:
        if not fresh and key in _CLIENTS:
            return _CLIENTS[key]
        gauth, kind = _load_credentials(path)

        def authorize():
            if gauth.access_token_expired and kind == "oauth":
                gauth.Refresh()
            gauth.Authorize()
            _build_service(gauth)
            gauth.credentials.get_access_token(gauth.Get_Http_Object())
        try:
            retrying(authorize, f"signing in with {path.name}")
        except DriveError:
            raise
        except Exception as exc:  # noqa: BLE001 - pydrive2's own auth errors
            raise DriveAuthError(f"Google Drive sign-in with {path} failed ({exc}). Run `colabkit drive login` "
                                 f"again.") from None
        client = DriveClient(gauth, str(path), kind)
        _CLIENTS[key] = client
        return client


def forget_clients() -> None:
    """Drop cached clients (after a new login)."""
    with _LOCK:
        _CLIENTS.clear()


def login(*, service_account=None, client_secrets=None, code_input=input, out=print,
          settings: _config.Settings | None = None) -> str:
    """Set up Drive credentials; returns who is signed in. The secret itself is never printed.

    service_account: a service-account key JSON: copied to the credentials path (0600).
    client_secrets: an OAuth client ("installed app") JSON: prints a consent URL, then reads the code (or
    the whole redirected URL, from a browser on another machine) and saves the tokens (0600).
    """
    path = credentials_path(settings)
    if (service_account is None) == (client_secrets is None):
        raise ValueError("Pass exactly one of --service-account KEY.json or --client-secrets CLIENT.json.")
    if service_account is not None:
        src = Path(service_account).expanduser()
        try:
            data = json.loads(src.read_bytes())
        except FileNotFoundError:
            raise FileNotFoundError(f"The service-account key {src} does not exist.") from None
        except ValueError:
            raise ValueError(f"{src} is not JSON; expected a service-account key file from the Google Cloud "
                             f"console.") from None
        if not isinstance(data, dict) or data.get("type") != "service_account" or "private_key" not in data:
            raise ValueError(f"{src} is not a service-account key (no \"type\": \"service_account\" / "
                             f"private_key). For a user account pass --client-secrets.")
        old = path.read_bytes() if path.exists() else None
        write_private(path, json.dumps(data).encode())
    else:
        require("pydrive2", "drive", "Google Drive sign-in")
        from pydrive2.auth import GoogleAuth
        src = Path(client_secrets).expanduser()
        if not src.is_file():
            raise FileNotFoundError(f"The OAuth client file {src} does not exist.")
        try:
            kinds = set(json.loads(src.read_bytes()))
        except (ValueError, TypeError):
            kinds = set()
        if "web" in kinds and "installed" not in kinds:   # Google would answer redirect_uri_mismatch
            raise ValueError(f"{src} is an OAuth client of type \"Web application\"; sign-in from a notebook or a "
                             f"terminal needs one of type \"Desktop app\" (Google would refuse the sign-in with "
                             f"redirect_uri_mismatch). In the Google Cloud console: APIs & Services > Credentials > "
                             f"Create credentials > OAuth client ID > Desktop app, then download its JSON.")
        gauth = GoogleAuth(settings={"client_config_backend": "file", "client_config_file": str(src),
                                     "oauth_scope": SCOPES, "get_refresh_token": True}, http_timeout=TIMEOUT_S)
        try:
            gauth.GetFlow()
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"{src} is not a usable OAuth client file ({exc}).") from None
        gauth.flow.redirect_uri = "http://localhost:1"
        out("Open this URL in a browser (any machine), allow access, then paste the code or the whole address "
            "the browser was sent to (it may show an error page; the address holds the code):")
        out("    " + gauth.GetAuthUrl())
        answer = code_input("Code or redirected URL: ").strip()
        if "code=" in answer:
            import urllib.parse
            answer = urllib.parse.parse_qs(urllib.parse.urlsplit(answer).query).get("code", [""])[0]
        if not answer:
            raise ValueError("No authorization code was entered.")
        try:
            gauth.credentials = gauth.flow.step2_exchange(answer)
        except Exception as exc:  # noqa: BLE001
            raise DriveAuthError(f"Google refused the authorization code ({exc}); start `colabkit drive login` "
                                 f"again and paste a fresh code.") from None
        old = path.read_bytes() if path.exists() else None
        write_private(path, gauth.credentials.to_json().encode())
    forget_clients()
    try:
        client = connect(settings)
        if client.has_no_storage():
            out(f"Note: {client.whoami()} is a service account without Drive storage of its own. {NO_STORAGE_HELP}")
        return client.whoami()
    except DriveError:
        if old is not None:
            write_private(path, old)
        else:
            path.unlink(missing_ok=True)
        forget_clients()
        raise


def fingerprint(path: Path) -> str:
    """A short non-secret id of a credentials file (for messages), never its contents."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:8]
