"""What stage copies from: a local folder or file (a path, or "drive:" through the mount), or a gdrive:// path
read through the Drive API. Each file becomes an Entry: its relative path, size, an identity stamp (size+mtime,
or Drive's modifiedDate), how to write its bytes into an open descriptor, and its content digest for
``checksum=True``. Local files are copied with sendfile (zero-copy from a mount) where the pair of files allows it.
"""
from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .bookkeeping import O_BINARY, STATE_DIR

_SENDFILE_CHUNK = 64 << 20
_NO_SENDFILE = {errno.EINVAL, errno.ENOSYS, errno.ENOTSOCK, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EINVAL)}


@dataclass
class Entry:
    rel: str
    size: int
    stamp: str                  # size+mtime identity: mtime_ns (local) or modifiedDate (Drive)
    fetch: Callable             # fetch(out_fd, progress) -> None: writes the bytes into the open descriptor
    digest: Callable | None = None  # content identity for checksum mode


def _local_copy(src: str, size: int, mtime_ns: int):
    def fetch(fout: int, progress):
        # raw descriptors: for many small files the per-file cost is what counts
        fin = os.open(src, os.O_RDONLY | O_BINARY)
        try:
            _copy_fd(fin, fout, size, progress)
            st = os.fstat(fin)
            if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):  # rewritten or replaced since it was listed
                raise OSError(errno.EIO, f"{src} changed during the copy ({size} -> {st.st_size} bytes); run stage "
                                         f"again to copy its new version.")
        finally:
            os.close(fin)
    return fetch


def _copy_fd(fin: int, fout: int, size: int, progress) -> None:
    """Copy up to ``size`` bytes (the listed size; the caller checks the source did not change meanwhile)."""
    offset = 0
    if hasattr(os, "sendfile"):
        try:
            while offset < size:
                sent = os.sendfile(fout, fin, offset, min(_SENDFILE_CHUNK, size - offset))
                if sent == 0:
                    return
                offset += sent
                progress(sent)
            return
        except OSError as exc:
            if exc.errno not in _NO_SENDFILE or offset:
                raise
    # no sendfile for this pair of files (macOS sends only to sockets, Windows has none)
    while offset < size and (chunk := os.read(fin, min(8 << 20, size - offset))):
        view = memoryview(chunk)
        while view:
            view = view[os.write(fout, view):]
        offset += len(chunk)
        progress(len(chunk))


def _sha256(path: Path):
    def digest():
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(8 << 20):
                h.update(chunk)
        return h.hexdigest()
    return digest


def local_entries(src: Path) -> list[Entry]:
    if src.is_file():
        st = src.stat()
        return [Entry(src.name, st.st_size, str(st.st_mtime_ns), _local_copy(str(src), st.st_size, st.st_mtime_ns),
                      _sha256(src))]
    entries = []
    base = len(str(src).rstrip(os.sep)) + 1
    for root, dirs, files in os.walk(src):
        if root == str(src):                   # the bookkeeping of a copy staged by an older version is not data
            dirs[:] = [d for d in dirs if d != STATE_DIR]
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            st = os.stat(path)
            entries.append(Entry(path[base:].replace(os.sep, "/"), st.st_size, str(st.st_mtime_ns),
                                 _local_copy(path, st.st_size, st.st_mtime_ns), _sha256(path)))
    return entries


def drive_entries(folder: str) -> tuple[list[Entry], bool]:
    """(entries, is_single_file) of a gdrive:// folder or file path."""
    from ..auth import connect
    from ..client import FOLDER_MIME
    client = connect()
    top, below, top_text = client.locate(folder)      # My Drive, a shared drive, or a folder by id
    parent_path, _, last = below.strip("/").rpartition("/")
    where = f"gdrive://{'/'.join(p for p in (top_text, parent_path) if p)}"
    if not below.strip("/"):                    # the location is the shared drive or the folder id itself
        item = client.get(top)
    else:
        parent = client.folder(parent_path, create=False, root=top) if parent_path else top
        item = client.pick(client.children(parent, title=last), where) if parent else None
    if item is not None:                        # a shortcut (a folder or file shared with you) stands for its target
        item = client.resolve(item, where)
    if item is None:
        raise FileNotFoundError(f"gdrive://{folder} does not exist on Google Drive (or is not visible to "
                                f"{client.whoami()}).")

    def entry(rel, meta):
        def fetch(out: int, progress, fid=meta["id"]):
            with os.fdopen(out, "wb", closefd=False) as fh:
                client.download(fid, fh, what=f"downloading gdrive://{folder}/{rel}", progress=progress)
        return Entry(rel, int(meta.get("fileSize", 0)), meta.get("modifiedDate", ""), fetch,
                     lambda m=meta: m.get("md5Checksum", ""))
    if item.get("mimeType") != FOLDER_MIME:
        return [entry(item["title"], item)], True
    found = client.walk(item["id"], where=f"gdrive://{folder}")
    return [entry(rel, meta) for rel, meta in sorted(found.items())], False
