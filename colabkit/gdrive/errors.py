"""Drive API errors: which answers are transient, the OSError each one surfaces as, and the retry loop."""
from __future__ import annotations

import json
import logging
import random
import time

from .. import gdrive as _gdrive   # TRIES, BACKOFF_START, BACKOFF_MAX, RATE_WINDOW_S: settable there
from ..optional import require

log = logging.getLogger("colabkit")

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
    delay = _gdrive.BACKOFF_START
    start = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:
            retry, error = _classify(exc, what)
            in_window = getattr(error, "rate_limited", False) and time.monotonic() - start < _gdrive.RATE_WINDOW_S
            if not retry or (attempt >= _gdrive.TRIES and not in_window):
                raise error from exc
            log.debug("colabkit: %s; retrying in %.1fs", error, delay)
        time.sleep(delay * (0.5 + random.random() / 2))
        delay = min(delay * 2, _gdrive.BACKOFF_MAX)
        if already is not None:
            found = already()
            if found is not None:
                return found
