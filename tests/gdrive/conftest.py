"""Fixtures: a local Drive API server (tests/standins/drive_api.py) with the real pydrive2 client pointed at it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.standins.drive_api import DriveServer

HERE = Path(__file__).parent
REPO = HERE.parent.parent

_KEY = None


def _private_key_pem() -> str:
    global _KEY
    if _KEY is None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _KEY = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()).decode()
    return _KEY


def service_account_key(server: DriveServer, email="ci-bot@test-project.iam.gserviceaccount.com") -> dict:
    return {"type": "service_account", "project_id": "test-project", "private_key_id": "k1",
            "private_key": _private_key_pem(), "client_email": email, "client_id": "1234",
            "auth_uri": f"{server.root_url}/auth", "token_uri": f"{server.root_url}/token"}


@pytest.fixture
def drive_server():
    server = DriveServer().start()
    yield server
    server.stop()


@pytest.fixture
def gdrive(drive_server, tmp_path, monkeypatch):
    """The server, with this process (and subprocesses, through the returned env) signed in to it as a
    service account: COLABKIT_DRIVE_API_ROOT, COLABKIT_DRIVE_CREDENTIALS, short back-off."""
    import colabkit.gdrive as g
    key = tmp_path / "sa-key.json"
    key.write_text(json.dumps(service_account_key(drive_server)))
    key.chmod(0o600)                       # as a key should be kept (colabkit warns about, and fixes, any other mode)
    monkeypatch.setenv("COLABKIT_DRIVE_API_ROOT", drive_server.root_url)
    monkeypatch.setenv("COLABKIT_DRIVE_CREDENTIALS", str(key))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(g, "BACKOFF_START", 0.01)
    monkeypatch.setattr(g, "BACKOFF_MAX", 0.05)
    monkeypatch.setattr(g, "CREATE_CHECK_S", 0.01, raising=False)
    g.forget_clients()
    drive_server.key = key
    drive_server.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    yield drive_server
    g.forget_clients()


@pytest.fixture
def links(drive_server, monkeypatch):
    """Route requests' traffic for drive.google.com (what gdown fetches) to the local server, at the transport
    level (requests' HTTPAdapter), and return a helper to publish local files and folders as shared links."""
    import urllib.parse

    import requests.adapters

    original = requests.adapters.HTTPAdapter.send
    target = urllib.parse.urlsplit(drive_server.root_url)

    def send(self, request, *args, **kwargs):
        parts = urllib.parse.urlsplit(request.url)
        if parts.hostname in ("drive.google.com", "drive.usercontent.google.com", "docs.google.com"):
            request.url = urllib.parse.urlunsplit(("http", target.netloc, parts.path, parts.query, ""))
        return original(self, request, *args, **kwargs)

    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", send)

    class Publisher:
        server = drive_server

        def folder(self, local: Path, title=None, parent=None) -> str:
            """Upload a local folder tree into the fake Drive, shared by link; returns its id."""
            from tests.standins.drive_api import FOLDER, ROOT_ID
            state = drive_server.state
            meta = state.add(title or local.name, parent or ROOT_ID, mime=FOLDER)
            state.public.add(meta["id"])
            for child in sorted(local.iterdir()):
                if child.is_dir():
                    self.folder(child, parent=meta["id"])
                else:
                    state.public.add(state.add(child.name, meta["id"], data=child.read_bytes())["id"])
            return meta["id"]

        def file(self, local: Path, title=None) -> str:
            meta = drive_server.state.add(title or local.name, data=local.read_bytes())
            drive_server.state.public.add(meta["id"])
            return meta["id"]

    return Publisher()


@pytest.fixture
def ck_env_local(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def make_key(drive_server):
    """service_account_key(server, email=...) bound to the running server."""
    return lambda **kw: service_account_key(drive_server, **kw)
