"""Fixtures for the keep-alive tests: a real Jupyter server on 127.0.0.1 with its own runtime, config and
settings folders (the browser is tests/conftest.py's session-wide `chromium`)."""
from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterServer:
    """A Jupyter Server (or Notebook 7) process; ``api(path)`` speaks its REST API with the token."""

    def __init__(self, base: Path, *, app: str = "jupyter_server", env: dict | None = None):
        self.base = base
        self.root = base / "root"
        self.runtime = base / "runtime"
        for folder in (self.root, self.runtime, base / "jconfig", base / "lab-settings", base / "workspaces"):
            folder.mkdir(parents=True, exist_ok=True)
        # No news / update toasts over the notebook in screenshots.
        notification = base / "lab-settings" / "@jupyterlab" / "apputils-extension"
        notification.mkdir(parents=True)
        (notification / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}/"
        self.env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(self.runtime), "JUPYTER_CONFIG_DIR": str(base / "jconfig"),
                    "JUPYTERLAB_SETTINGS_DIR": str(base / "lab-settings"),
                    "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"), "PYTHONUNBUFFERED": "1",
                    **(env or {})}
        for name in ("JUPYTER_TOKEN", "JPY_PARENT_PID", "COLAB_JUPYTER_IP", "KMP_TARGET_PORT"):
            self.env.pop(name, None)
        args = [sys.executable, "-m", app, "--no-browser", "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.append("--allow-root")  # CI containers run as root
        if app == "notebook":
            args.append("--JupyterNotebookApp.expose_app_in_browser=True")
        elif app == "jupyterlab":
            args.append("--LabApp.expose_app_in_browser=True")
        self.log = open(base / "server.log", "w")
        self.proc = subprocess.Popen(args, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.root)
        deadline = time.time() + 60
        while True:
            try:
                self.api("api/status")
                break
            except OSError:
                if self.proc.poll() is not None or time.time() > deadline:
                    self.stop()
                    raise RuntimeError(f"Jupyter server did not start:\n{(base / 'server.log').read_text()}")
                time.sleep(0.2)

    def api(self, path: str, method: str = "GET", body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Authorization": f"token {self.token}",
                                                  "Content-Type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=10) as response:
            raw = response.read()
            return json.loads(raw) if raw else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


@pytest.fixture
def start_server(tmp_path):
    """start_server(app="jupyter_server" | "notebook" | "jupyterlab", env={...}) -> JupyterServer; stopped
    afterwards."""
    started = []

    def start(app="jupyter_server", env=None):
        pytest.importorskip("jupyter_server")
        pytest.importorskip(app)
        server = JupyterServer(tmp_path / f"server{len(started)}", app=app, env=env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def kernel_client():
    """kernel_client(server, kernel_id) -> a jupyter_client BlockingKernelClient over the kernel's ZMQ ports.

    It talks to the kernel directly, not through the server's websocket, so the server sees no browser."""
    clients = []

    def connect(server, kernel_id):
        BlockingKernelClient = pytest.importorskip("jupyter_client").BlockingKernelClient
        path = server.runtime / f"kernel-{kernel_id}.json"
        deadline = time.time() + 30
        while not path.exists() and time.time() < deadline:
            time.sleep(0.1)
        client = BlockingKernelClient(connection_file=str(path))
        client.load_connection_file()
        # No heartbeat channel: a client that its kernel's manager did not create judges the kernel dead when one
        # heartbeat takes over a second, which a loaded machine's starting kernel can; kernel_info replies decide.
        client.start_channels(hb=False)
        client.wait_for_ready(timeout=60)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.stop_channels()


@pytest.fixture
def run_code():
    """run_code(client, code, timeout=180) -> {"stdout", "stderr", "error", "displays"}."""
    return _run_code


def _run_code(client, code: str, timeout: float = 180) -> dict:
    """Execute ``code``; returns {"stdout", "stderr", "error", "displays"} collected from IOPub."""
    out = {"stdout": "", "stderr": "", "error": None, "displays": []}

    def hook(msg):
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            out[content["name"]] += content["text"]
        elif kind in ("display_data", "execute_result"):
            out["displays"].append(content["data"])
        elif kind == "error":
            out["error"] = f"{content['ename']}: {content['evalue']}\n" + "\n".join(content["traceback"])

    client.execute_interactive(code, timeout=timeout, output_hook=hook)
    return out
