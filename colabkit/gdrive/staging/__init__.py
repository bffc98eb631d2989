"""`colabkit.stage(src, dst=None)`: copy a dataset from Drive to fast local disk once, then reuse it.

Sources: a folder or a .zip/.tar/.tar.gz/.tgz archive (extracted after the copy) given as a path, a
"drive:" location (the mount), "gdrive://" (the Drive API) or a Google Drive share link.

* Cached: a second call with an unchanged source returns at once (size+mtime, or content with ``checksum=True``).
* Resumable: files are written as ``<name>.colabkit-part``, renamed when complete and journalled, so an
  interrupted staging (a dropped mount, a killed kernel) continues where it stopped.
* Checked first: the bytes still to copy must fit on the destination disk, else InsufficientSpace (an
  OSError, ENOSPC) names both sizes before anything is written.
* Parallel: several files at a time, many from a network source; zero-copy (sendfile) from mounted sources.

The destination is a mirror: it holds the source's files and nothing else, so ``dst`` must be a folder colabkit
staged before, or new/empty; the bookkeeping lives beside it in ``<dst>.colabkit-stage/``, private to this user.

One concern per module:
    mirror.py       stage(): unchanged or not, copy or download, extract, prune: dst becomes the source's mirror
    sources.py      what is copied: local files and gdrive:// files as entries that can write their bytes
    copying.py      how: parallel, part files, the journal, the free-space check, names a disk cannot hold
    bookkeeping.py  where the records live (state_dir), and that they and dst are this user's own (ownership
                    and permission checks; files written never through a link)
"""
from __future__ import annotations

from .bookkeeping import STATE_DIR, STATE_SUFFIX, state_dir
from .copying import PART, InsufficientSpace
from .mirror import NETWORK_WORKERS, stage

__all__ = ["stage", "state_dir", "InsufficientSpace", "NETWORK_WORKERS", "PART", "STATE_DIR", "STATE_SUFFIX"]
