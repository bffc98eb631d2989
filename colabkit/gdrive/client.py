"""DriveClient: an authorised pydrive2 client and the requests colabkit makes (paths, listings, transfers)."""
from __future__ import annotations

import collections
import logging
import re
import time
from pathlib import Path

from .. import gdrive as _gdrive   # PAGE_SIZE, CHUNK, CREATE_CHECK_S: settable there
from ..optional import require
from .errors import DriveError, DriveNotFound, retrying

log = logging.getLogger("colabkit")

FOLDER_MIME = "application/vnd.google-apps.folder"
SHORTCUT_MIME = "application/vnd.google-apps.shortcut"
GOOGLE_APPS = "application/vnd.google-apps."    # Google-native types (Docs, Sheets, ...): no bytes to download
_NATIVE = {GOOGLE_APPS + k: v for k, v in {
    "document": "Google Docs document", "spreadsheet": "Google Sheets spreadsheet",
    "presentation": "Google Slides presentation", "form": "Google Form", "drawing": "Google Drawing",
    "script": "Apps Script project", "site": "Google Site", "jam": "Jamboard", "map": "My Maps map"}.items()}
NAME_MAX = 255                  # bytes in a file name on Linux's, macOS's and Windows' usual file systems


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
            params = {"q": q, "maxResults": _gdrive.PAGE_SIZE, "supportsAllDrives": True,
                      "includeItemsFromAllDrives": True}
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
                raise DriveError(f"Google Drive sent the same page token twice while {what} (page {pages}); "
                                 f"stopped rather than loop forever (a transient Drive fault: try again)")
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

    def trashed_children(self, parent_id: str) -> list[dict]:
        """The items in Drive's Trash whose folder is ``parent_id`` (trashed there, or with their folder)."""
        return self.list(f"'{_q(parent_id)}' in parents and trashed = true", f"listing Trash of folder {parent_id}")

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
        if _gdrive.CREATE_CHECK_S <= 0:
            return mine
        time.sleep(_gdrive.CREATE_CHECK_S)
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
        media = http_mod.MediaFileUpload(str(local), mimetype="application/octet-stream", chunksize=_gdrive.CHUNK,
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
        downloader = http_mod.MediaIoBaseDownload(out, request, chunksize=_gdrive.CHUNK)
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


# Drive ids: files and folders (28-44 characters), shared drives ("0A...")
_ID = re.compile(r"[-\w]{25,}|0A[-\w]{14,}")


def _is_folder_like(item: dict) -> bool:
    return item.get("mimeType") == FOLDER_MIME or (
        item.get("mimeType") == SHORTCUT_MIME
        and (item.get("shortcutDetails") or {}).get("targetMimeType") == FOLDER_MIME)


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
