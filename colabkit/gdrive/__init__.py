"""Google Drive through its API (pydrive2): sign-in, folder paths, resumable transfers with retries; share links
and dataset staging beside it.

Credentials (``drive_credentials`` setting, default ``<config dir>/drive-credentials.json``) are either a
service-account key (JSON with ``"type": "service_account"``) or OAuth tokens saved by
``colabkit drive login``. They are written with 0600 permissions and never printed.

Every failure surfaces as an OSError subclass (DriveError), so the checkpoint uploader's retry path applies.
Transient answers (5xx, 429, 403 rateLimitExceeded/userRateLimitExceeded, dropped connections, a request
unanswered for TIMEOUT_S) are retried with exponential back-off; large uploads use Drive's resumable
protocol and continue from the last byte the server acknowledged. pydrive2 is imported on first use only.

``COLABKIT_DRIVE_API_ROOT`` points the client at a Drive-compatible endpoint (the test suite's local server).

The settings below live here and nowhere else: errors.py, client.py and auth.py read them from this package
each time they use them, so setting ``colabkit.gdrive.RATE_WINDOW_S`` (or TRIES, BACKOFF_*, PAGE_SIZE, CHUNK,
CREATE_CHECK_S) affects the next request, and ``colabkit.gdrive.TIMEOUT_S`` every client signed in after it
(``connect(fresh=True)``, or after ``forget_clients()``). The public names of errors.py, client.py and auth.py
are importable from here; they load on first use.
"""
from __future__ import annotations

import importlib

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

# public name -> the submodule that defines it; imported on first access (PEP 562), so that the submodules
# can read the settings above from this package without an import cycle
_LAZY = {
    **dict.fromkeys(("DriveError", "DriveAuthError", "DriveNotFound", "DriveStorageFull", "NO_STORAGE_HELP",
                     "retrying"), "errors"),
    **dict.fromkeys(("DriveClient", "FOLDER_MIME", "SHORTCUT_MIME", "GOOGLE_APPS", "NAME_MAX", "unsafe_name"),
                    "client"),
    **dict.fromkeys(("SCOPES", "credentials_path", "write_private", "connect", "forget_clients", "login"), "auth"),
}

__all__ = ["PAGE_SIZE", "CHUNK", "TIMEOUT_S", "TRIES", "BACKOFF_START", "BACKOFF_MAX", "RATE_WINDOW_S",
           "CREATE_CHECK_S", *_LAZY]


def __getattr__(name):
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'colabkit.gdrive' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
