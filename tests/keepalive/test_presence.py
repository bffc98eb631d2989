"""Presence detection against a real Jupyter Server: a kernel started through its REST API, code run over
the kernel's own ZMQ ports (which the server does not count as a browser), and a websocket client playing
the browser tab. Plus the "unknown" answers: no kernel, an unreachable server, a wrong token."""
from __future__ import annotations

import json
import os
import socket
import sys
import time

import pytest

from colabkit import presence

pytestmark = pytest.mark.slow


def kernel_state(client, run_code) -> dict:
    out = run_code(client, "import colabkit, json, dataclasses\n"
                           "print('STATE' + json.dumps(dataclasses.asdict(colabkit.presence())))")
    assert out["error"] is None, out["error"]
    line = [ln for ln in out["stdout"].splitlines() if ln.startswith("STATE")][-1]
    return json.loads(line[len("STATE"):])


def wait_state(client, run_code, state, timeout=15.0) -> tuple[dict, float]:
    started = time.monotonic()
    while True:
        seen = kernel_state(client, run_code)
        if seen["state"] == state or time.monotonic() - started > timeout:
            return seen, time.monotonic() - started
        time.sleep(0.2)


def test_attached_and_absent_from_a_real_server(start_server, kernel_client, run_code):
    websocket = pytest.importorskip("websocket")  # websocket-client, a jupyter_server dependency

    server = start_server(env={"COLABKIT_IDLE_CUTOFF": "90min"})
    requested_at = time.time()
    kid = server.api("api/kernels", "POST", {"name": "python3"})["id"]
    client = kernel_client(server, kid)
    # The kernel is busy for a while before presence detection starts: its last activity is not its start.
    assert run_code(client, f"import time\ntime.sleep(max(0, {requested_at} + 6 - time.time()))")["error"] is None

    out = run_code(client, "import colabkit\ncolabkit.keepalive('60s', poll='0.5s')\n"
                           "from colabkit import deadline, presence\n"
                           "print('REGISTERED', presence.running_monitor() in deadline.registered())")
    assert out["error"] is None, out["error"]
    # One line: an idle cutoff applies here, and what presence detection sees (no browser yet).
    lines = out["stdout"].strip().splitlines()
    assert lines[0].startswith("colabkit: an idle cutoff of 90min applies here (jupyter)")
    assert "Presence detection started (every 0.5s): absent since" in lines[0]
    assert lines[1] == "REGISTERED True"

    seen = kernel_state(client, run_code)
    assert seen["state"] == "absent" and seen["connections"] == 0 and seen["server"] == server.url
    assert seen["last_seen"] is None
    # Never seen: the absence is dated from the kernel's start (the earliest moment a browser can have left),
    # not from the kernel's last activity, so the idle clock can only run early.
    assert requested_at <= seen["since"] < requested_at + 4, (seen["since"] - requested_at)
    assert seen["since_basis"] == "kernel start"
    text = run_code(client, "print('TEXT', presence().text())")["stdout"]
    assert "no browser seen yet; counted from the kernel's start" in text, text

    # A kernel whose connection file name does not carry its id (as may be on Colab): the server's only
    # kernel is this one.
    out = run_code(client, "from unittest import mock\n"
                           "with mock.patch.object(presence, 'kernel_id', lambda path=None: None):\n"
                           "    m = presence.PresenceMonitor()\n"
                           "    print('ONLY', m.check().state, m._kernel == %r)" % kid)
    assert "ONLY absent True" in out["stdout"], out

    # A browser tab: a websocket on the kernel's channels, as JupyterLab opens it.
    ws = websocket.create_connection(f"ws://127.0.0.1:{server.port}/api/kernels/{kid}/channels",
                                     header=[f"Authorization: token {server.token}"], timeout=10)
    try:
        seen, _ = wait_state(client, run_code, "attached")
        assert seen["state"] == "attached" and seen["connections"] >= 1
        assert server.api(f"api/kernels/{kid}")["connections"] >= 1
        deadline_while_attached = run_code(
            client, "print('DEADLINE', presence.running_monitor().next_deadline())")["stdout"]
        assert "DEADLINE None" in deadline_while_attached
    finally:
        ws.close()
    # The tab is gone once the server stops counting it (its close is handled after ws.close() returns); a check
    # answered before that still saw it attached.
    started = time.monotonic()
    while server.api(f"api/kernels/{kid}")["connections"] and time.monotonic() - started < 10:
        time.sleep(0.05)
    closed_at = time.time()
    seen, took = wait_state(client, run_code, "absent")
    assert seen["state"] == "absent", seen
    assert took < 10, f"absence noticed after {took:.1f} s"
    # The absence counts from the last time the browser was seen, which is before the tab closed.
    assert seen["since"] == seen["last_seen"] and seen["since"] <= closed_at + 0.1
    out = run_code(client, "m = presence.running_monitor()\nd = m.next_deadline()\n"
                           "print('DEADLINE', d.reason, '|', d.stop_training, '|', round(d.at - m.current.since))")
    assert "DEADLINE the 90min idle cutoff | False | 5400" in out["stdout"], out

    out = run_code(client, "colabkit.keepalive(False)\n"
                           "print('AFTER', presence.running_monitor(), deadline.registered())")
    assert "colabkit: keep-alive off" in out["stdout"]
    assert "AFTER None []" in out["stdout"]


def test_wrong_token_and_colab_style_discovery(start_server, monkeypatch):
    server = start_server()
    kid = server.api("api/kernels", "POST", {"name": "python3"})["id"]

    wrong = presence.PresenceMonitor(kernel=kid, server_url=server.url, token="not-the-token").check()
    assert wrong.state == "unknown"
    assert wrong.detail == f"the notebook server at {server.url} answered HTTP 403 Forbidden (wrong or missing token)"

    # Colab: no runtime files; the server's address and token come from the environment.
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(server.base / "empty-runtime"))
    monkeypatch.setenv("COLAB_JUPYTER_IP", "127.0.0.1")
    monkeypatch.setenv("KMP_TARGET_PORT", str(server.port))
    monkeypatch.setenv("COLAB_JUPYTER_TOKEN", server.token)
    found = [s for s in presence.servers(conn_file=f"/nonexistent/kernel-{kid}.json")
             if s.source.startswith("Colab environment")]
    assert [s.url for s in found] == [server.url]
    p = presence.PresenceMonitor(kernel=kid).check()
    assert p.state == "absent" and p.server == server.url
    assert server.token not in repr(found[0])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the with-block ends


def test_unreachable_server_is_unknown_with_one_clear_line(tmp_path, monkeypatch):
    port = _closed_port()
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    (runtime / "jpserver-4242.json").write_text(json.dumps({"url": f"http://127.0.0.1:{port}/", "token": "t",
                                                            "pid": 4242}))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    monkeypatch.setattr(sys, "argv", ["ipykernel_launcher", "-f", str(runtime / "kernel-abc-123.json")])
    assert presence.kernel_id() == "abc-123"
    p = presence.PresenceMonitor().check()
    assert p.state == "unknown"
    assert p.detail == f"cannot reach the notebook server at http://127.0.0.1:{port}/ (Connection refused)"
    assert p.text() == f"unknown: {p.detail}" and "\n" not in p.text()


def test_not_a_kernel_is_unknown(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["python", "train.py"])
    p = presence.PresenceMonitor().check()
    assert p.state == "unknown" and "not a Jupyter kernel" in p.detail
    assert presence.PresenceMonitor().next_deadline() is None


def test_own_server_file_is_tried_first(tmp_path, monkeypatch):
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    for pid, port in ((111, 1111), (222, 2222)):
        (runtime / f"jpserver-{pid}.json").write_text(json.dumps({"url": f"http://127.0.0.1:{port}/", "token": ""}))
        os.utime(runtime / f"jpserver-{pid}.json", (time.time() - pid, time.time() - pid))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("JPY_PARENT_PID", "222")
    urls = [s.url for s in presence.servers(conn_file=str(runtime / "kernel-x.json"))]
    assert urls[:2] == ["http://127.0.0.1:2222/", "http://127.0.0.1:1111/"]


def test_presence_module_is_callable_and_stays_so():
    import colabkit
    import colabkit.presence  # noqa: F401 - the import sets the package attribute to the module
    assert callable(colabkit.presence) and colabkit.presence().state in ("attached", "absent", "unknown")
    assert colabkit.presence.start is presence.start


@pytest.mark.parametrize("system_says, expected", [
    (-5 * 3600, -120),   # a virtualised /proc/uptime puts the start hours early: the connection file bounds it
    (-100, -100),        # a start after the connection file was written: taken as it is
    (-123, -123),        # a few seconds before it (ipykernel writes its own file once started): still taken
])
def test_kernel_start_is_never_long_before_its_connection_file(tmp_path, monkeypatch, system_says, expected):
    now = time.time()
    conn = tmp_path / "kernel-0f0e0d0c-0000-4000-8000-000000000000.json"
    conn.write_text("{}")
    os.utime(conn, (now - 120, now - 120))
    monkeypatch.setattr(presence, "connection_file", lambda: str(conn))
    monkeypatch.setattr(presence, "_proc_start", lambda: now + system_says)
    monkeypatch.setattr(presence, "_psutil_start", lambda: None)
    monkeypatch.setattr(presence, "_started_at", None)
    assert presence.kernel_started_at() == pytest.approx(now + expected, abs=0.5)


def test_kernel_start_falls_back_to_psutil_and_is_never_in_the_future(monkeypatch):
    now = time.time()
    monkeypatch.setattr(presence, "connection_file", lambda: None)
    monkeypatch.setattr(presence, "_proc_start", lambda: None)   # no /proc (macOS, Windows)
    monkeypatch.setattr(presence, "_psutil_start", lambda: now - 30)
    monkeypatch.setattr(presence, "_started_at", None)
    assert presence.kernel_started_at() == pytest.approx(now - 30, abs=0.5)
    monkeypatch.setattr(presence, "_proc_start", lambda: now + 3600)   # a virtualised uptime can also err late
    monkeypatch.setattr(presence, "_started_at", None)
    assert presence.kernel_started_at() <= time.time()


def test_the_real_process_start_is_read_and_plausible():
    started = presence._read_process_start()
    assert started is not None and started <= time.time()
    counted = presence._psutil_start()   # psutil counts from the boot time in /proc/stat
    if counted is not None:
        assert abs(started - counted) < 2, (started, counted)
