"""Signing in to Drive's API: credentials files (0600), service-account keys and OAuth tokens, cached clients."""
from __future__ import annotations

import json
import logging
import os
import stat
import threading
from pathlib import Path

from .. import config as _config
from .. import gdrive as _gdrive   # TIMEOUT_S: settable there
from ..optional import require
from .client import DriveClient
from .errors import NO_STORAGE_HELP, DriveAuthError, DriveError, retrying

log = logging.getLogger("colabkit")

SCOPES = ["https://www.googleapis.com/auth/drive"]


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
                           http_timeout=_gdrive.TIMEOUT_S)
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
                           http_timeout=_gdrive.TIMEOUT_S)
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
                                     "oauth_scope": SCOPES, "get_refresh_token": True},
                           http_timeout=_gdrive.TIMEOUT_S)
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
