"""Request-granular faults of the Drive API stand-in (tests/standins/drive_api.py): ``arm(k, kind)`` fails the
k-th counted request and only that one, ``arm_from(k, kind)`` every one from the k-th on, until ``disarm()``.
Observed where a client sees them: http.client on one keep-alive connection, the real pydrive2 client, and
colabkit's DriveClient; and the request count of a whole checkpoint save/restore cycle must repeat."""
from __future__ import annotations

import http.client
import json
import re
import shutil
import threading

import pytest

import colabkit.gdrive as g
from tests.standins.drive_api import FAULT_KINDS, FOLDER

ANSWERING_KINDS = ["500", "503", "drop", "drop-mid"]


class Raw:
    """Plain http.client requests on one keep-alive connection, with a valid access token."""

    def __init__(self, server):
        self.server = server
        self.token = server.issue_token("raw-client@example.com")
        self.conn = http.client.HTTPConnection(*server.server_address, timeout=30)

    def request(self, method, path, body=None):
        """("ok", status, the body: parsed when JSON) or ("raise", exception)."""
        headers = {"Authorization": f"Bearer {self.token}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
            body = json.dumps(body).encode()
        try:
            self.conn.request(method, path, body=body, headers=headers)
            resp = self.conn.getresponse()
            data = resp.read()
        except (http.client.HTTPException, ConnectionError) as exc:
            self.conn.close()
            return ("raise", exc)
        if resp.getheader("Content-Type", "").startswith("application/json") and data:
            data = json.loads(data)
        return ("ok", resp.status, data)

    def close(self):
        self.conn.close()


@pytest.fixture
def raw(drive_server):
    client = Raw(drive_server)
    yield client
    client.close()


def expect_fault(kind, outcome, full_body):
    """Assert that ``outcome`` is what the client sees of ``kind`` for an answer whose JSON is ``full_body``."""
    if kind in ("500", "503"):
        assert outcome[0] == "ok" and outcome[1] == int(kind), outcome
        error = outcome[2]["error"]
        assert error["code"] == int(kind) and error["errors"][0]["reason"] == "backendError"
        assert error["message"] == "Backend Error"
    elif kind == "drop":
        assert outcome[0] == "raise" and type(outcome[1]) is http.client.RemoteDisconnected, outcome
    else:
        assert outcome[0] == "raise" and type(outcome[1]) is http.client.IncompleteRead, outcome
        whole = json.dumps(full_body).encode()
        assert outcome[1].partial == whole[:len(whole) // 2], "half the real answer, then the connection closed"
        assert outcome[1].expected == len(whole) - len(whole) // 2


def file_path(server, title="x.bin"):
    meta = server.state.add(title, data=b"0123456789" * 20)
    return meta, f"/drive/v2/files/{meta['id']}"


@pytest.mark.parametrize("kind", ANSWERING_KINDS)
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_arm_fails_exactly_the_kth_request_and_only_it(drive_server, raw, kind, k):
    meta, path = file_path(drive_server)
    drive_server.arm(k, kind)
    outcomes = [raw.request("GET", path) for _ in range(5)]
    for n, outcome in enumerate(outcomes, 1):
        if n == k:
            expect_fault(kind, outcome, meta)
        else:
            assert outcome == ("ok", 200, meta), f"request {n} (armed: {k})"
    assert drive_server.count == 5 and drive_server.counted == [("GET", path)] * 5
    assert [i[:4] for i in drive_server.injected] == [(k, kind, "GET", path)]


@pytest.mark.parametrize("kind", ANSWERING_KINDS)
def test_arm_from_fails_every_request_from_k_until_disarmed(drive_server, raw, kind):
    meta, path = file_path(drive_server)
    drive_server.arm_from(3, kind)
    outcomes = [raw.request("GET", path) for _ in range(6)]
    assert outcomes[:2] == [("ok", 200, meta)] * 2
    for outcome in outcomes[2:]:
        expect_fault(kind, outcome, meta)
    drive_server.disarm()
    assert raw.request("GET", path) == ("ok", 200, meta)
    assert drive_server.count == 7, "disarm keeps counting"
    assert [i[0] for i in drive_server.injected] == [3, 4, 5, 6]


def test_token_requests_are_counted_and_faulted(drive_server, make_key):
    import httplib2
    from oauth2client.client import HttpAccessTokenRefreshError
    from oauth2client.service_account import ServiceAccountCredentials
    key = make_key()
    creds = ServiceAccountCredentials.from_json_keyfile_dict(key, scopes=g.SCOPES, token_uri=key["token_uri"])
    drive_server.arm(2, "503")
    creds.get_access_token(httplib2.Http())                      # request 1
    creds.access_token = None
    with pytest.raises(HttpAccessTokenRefreshError) as caught:   # request 2
        creds.get_access_token(httplib2.Http())
    assert caught.value.status == 503
    creds.get_access_token(httplib2.Http())                      # request 3
    assert drive_server.counted == [("POST", "/token")] * 3


def test_drop_is_not_applied_drop_mid_is(drive_server, raw):
    folder = {"title": "made", "mimeType": FOLDER, "parents": [{"id": "root"}]}
    drive_server.arm(1, "drop")
    assert raw.request("POST", "/drive/v2/files", folder)[0] == "raise"
    assert drive_server.state.find("made") is None, "a dropped request never reached Drive"
    drive_server.arm(1, "drop-mid")
    outcome = raw.request("POST", "/drive/v2/files", folder)
    assert outcome[0] == "raise" and isinstance(outcome[1], http.client.IncompleteRead)
    assert drive_server.state.find("made") is not None, "the answer was cut, the folder was made"
    # an answer without a body (204 of a delete) cannot be cut in its body: applied, closed before any byte
    meta, path = file_path(drive_server)
    drive_server.arm(1, "drop-mid")
    outcome = raw.request("DELETE", path)
    assert outcome[0] == "raise" and type(outcome[1]) is http.client.RemoteDisconnected
    assert meta["id"] not in drive_server.state.files
    assert drive_server.injected[-1][4] == "no body: nothing sent"
    assert raw.request("GET", path)[1] == 404


def test_a_cut_answer_does_not_break_the_next_request_on_the_connection(drive_server):
    # httplib2 keeps the connection after an IncompleteRead; the cut answer says "Connection: close", so the
    # next request opens a new one instead of writing into the closed socket (BrokenPipeError).
    import httplib2
    client = httplib2.Http(timeout=30)
    drive_server.arm(1, "drop-mid")
    with pytest.raises(http.client.IncompleteRead):
        client.request(f"{drive_server.root_url}/token", "POST", body="grant_type=none")
    resp, content = client.request(f"{drive_server.root_url}/token", "POST", body="grant_type=none")
    assert resp.status == 400 and json.loads(content) == {"error": "unsupported_grant_type"}
    assert drive_server.count == 2


def test_counting_rules_reset_and_disarm(drive_server, raw):
    meta, path = file_path(drive_server)
    drive_server.state.public.add(meta["id"])
    raw.request("GET", f"/uc?id={meta['id']}")        # a shared-link page: not a Drive API request
    raw.request("GET", "/nowhere")                     # not one either
    raw.request("GET", path)
    raw.request("GET", "/drive/v2/about")
    assert drive_server.count == 2
    drive_server.arm(2, "500")
    assert drive_server.count == 0 and drive_server.counted == [], "arming starts counting afresh"
    raw.request("GET", "/uc?id=" + meta["id"])
    assert raw.request("GET", path)[1] == 200
    assert raw.request("GET", path)[1] == 500
    assert raw.request("GET", path)[1] == 200, "once"
    drive_server.arm(3, "503")
    raw.request("GET", path)
    drive_server.reset_count()                         # k now counts from here
    assert [raw.request("GET", path)[1] for _ in range(4)] == [200, 200, 503, 200]
    drive_server.arm(2, "500")
    drive_server.disarm()
    assert [raw.request("GET", path)[1] for _ in range(3)] == [200, 200, 200]
    assert drive_server.count == 3
    drive_server.arm(1, "500")
    drive_server.arm(2, "503")                         # one plan at a time: the last one
    assert [raw.request("GET", path)[1] for _ in range(3)] == [200, 503, 200]
    with pytest.raises(ValueError, match="kind"):
        drive_server.arm(1, "404")
    with pytest.raises(ValueError, match="k=0"):
        drive_server.arm_from(0, "500")
    assert set(FAULT_KINDS) == {"500", "503", "drop", "drop-mid", "stale-list"}


def test_count_and_the_armed_fault_are_exact_under_concurrent_clients(drive_server):
    meta, path = file_path(drive_server)
    drive_server.arm(57, "500")
    statuses, lock = [], threading.Lock()

    def client():
        raw = Raw(drive_server)
        try:
            for _ in range(20):
                outcome = raw.request("GET", path)
                with lock:
                    statuses.append(outcome[1])
        finally:
            raw.close()

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert drive_server.count == 160 == len(statuses)
    assert sorted(statuses) == [200] * 159 + [500]
    assert [i[0] for i in drive_server.injected] == [57]


# -- through the real clients ------------------------------------------------------------------------------
@pytest.fixture
def folder(gdrive):
    """A Drive folder with three files (c the newest) and a newer file elsewhere, and a signed-in client."""
    state = gdrive.state
    made = state.add("f", mime=FOLDER)
    items = [state.add(t, made["id"], data=t.encode()) for t in ("a", "b", "c")]
    state.add("elsewhere")                                      # newest of all, but matches no listing below
    client = g.connect()
    return made["id"], [i["id"] for i in items], client


def titles(client, folder_id):
    return sorted(f["title"] for f in client.children(folder_id))


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_pydrive2_sees_each_kind_on_the_kth_call_only(gdrive, folder, k):
    from pydrive2.files import ApiRequestError
    folder_id, _, client = folder
    q = {"q": f"'{folder_id}' in parents and trashed = false"}

    def calls():
        out = []
        for _ in range(4):
            try:
                out.append(sorted(f["title"] for f in client.drive.ListFile(q).GetList()))
            except Exception as exc:  # noqa: BLE001 - the test looks at which
                out.append(exc)
        return out

    full = ["a", "b", "c"]
    for kind in FAULT_KINDS:
        gdrive.arm(k, kind)
        got = calls()
        others = [r for n, r in enumerate(got, 1) if n != k]
        assert others == [full] * 3, (kind, got)
        hit = got[k - 1]
        if kind in ("500", "503"):
            assert isinstance(hit, ApiRequestError) and hit.error["code"] == int(kind)
            assert hit.GetField("reason") == "backendError"
            assert gdrive.count == 4
        elif kind == "drop":        # httplib2 re-sends a request that got no byte back: one more request
            assert hit == full and gdrive.count == 5 and gdrive.counted[k - 1] == gdrive.counted[k]
        elif kind == "drop-mid":
            assert type(hit) is http.client.IncompleteRead and gdrive.count == 4
        else:
            assert hit == ["a", "b"], "the newest matching item is not listed yet"
        assert [i[:2] for i in gdrive.injected] == [(k, kind)]
        gdrive.injected.clear()


def test_stale_list_waits_for_the_next_listing_and_omits_the_newest_match(gdrive, folder):
    folder_id, (a, b, c), client = folder
    gdrive.arm(1, "stale-list")
    assert client.get(a)["title"] == "a" and client.get(b)["title"] == "b"   # requests 1, 2: not listings
    assert titles(client, folder_id) == ["a", "b"]                           # request 3
    assert titles(client, folder_id) == ["a", "b", "c"]
    assert gdrive.injected == [(3, "stale-list", "GET", "/drive/v2/files", f"omitted: {c}")]
    gdrive.arm_from(2, "stale-list")
    assert titles(client, folder_id) == ["a", "b", "c"]
    assert client.get(c)["title"] == "c"
    assert [titles(client, folder_id) for _ in range(3)] == [["a", "b"]] * 3
    gdrive.disarm()
    assert titles(client, folder_id) == ["a", "b", "c"]
    gdrive.arm(1, "stale-list")
    assert client.children(folder_id, title="zzz") == []        # nothing to omit: spent all the same
    assert titles(client, folder_id) == ["a", "b", "c"]
    assert gdrive.injected[-1][4] == "omitted: None"


def test_drive_client_retries_5xx_and_reports_an_outage(gdrive, folder):
    folder_id, _, client = folder
    gdrive.arm(1, "503")
    assert titles(client, folder_id) == ["a", "b", "c"]
    assert gdrive.count == 2, "one 503, then the retry"
    gdrive.arm_from(1, "500")
    with pytest.raises(g.DriveError, match="500 backendError"):
        client.children(folder_id)
    assert gdrive.count == g.TRIES
    gdrive.disarm()
    assert titles(client, folder_id) == ["a", "b", "c"]


def test_a_dropped_chunk_put_is_resent_without_its_body_and_the_upload_recovers(gdrive, folder, tmp_path):
    folder_id, _, client = folder
    gdrive.body_timeout_s = 1.0
    local = tmp_path / "u.bin"
    local.write_bytes(b"hello" * 1000)
    gdrive.arm(2, "drop")                     # 1: POST opens the session, 2: the PUT of the one chunk
    uploaded = client.upload(local, folder_id, "u.bin")
    assert gdrive.state.content[uploaded["id"]] == local.read_bytes()
    assert [i[:4] for i in gdrive.injected] == [(2, "drop", "PUT", "/upload/drive/v2/files")]
    assert gdrive.abandoned == [(3, "PUT", "/upload/drive/v2/files")], "httplib2's re-send, with no body"
    assert gdrive.count > 3 and set(gdrive.counted[1:]) == {("PUT", "/upload/drive/v2/files")}


# -- the request count of a whole checkpoint cycle repeats ---------------------------------------------------
def _normalized(counted):
    return [(method, re.sub(r"/files/[^/]+", "/files/<id>", path)) for method, path in counted]


def _cycle(server, tmp_path, name):
    """(requests of save+close with 3 earlier checkpoints and keep=3, requests of a fresh VM's restore)."""
    import numpy as np

    import colabkit
    location, local = f"gdrive://runs/{name}", tmp_path / name
    with colabkit.Checkpoints(location, local_dir=local / "vm1", keep=3) as ckpt:
        for step in (1, 2, 3):
            assert ckpt.save(step, {"w": np.full(10, float(step))}, wait=True)
    g.forget_clients()                                  # a new process: sign-in included
    server.reset_count()
    ckpt = colabkit.Checkpoints(location, local_dir=local / "vm1", keep=3)
    assert ckpt.save(4, {"w": np.arange(1000, dtype=np.float32)}, wait=True)
    ckpt.close()
    saved = _normalized(server.counted)
    g.forget_clients()
    server.reset_count()
    restored = colabkit.Checkpoints(location, local_dir=local / "vm2").restore()
    assert restored.step == 4 and restored.source == "destination"
    shutil.rmtree(local)
    return saved, _normalized(server.counted)


def test_a_checkpoint_cycle_makes_the_same_requests_every_time(gdrive, tmp_path, monkeypatch):
    # colabkit keeps one lease object per destination path for the whole process, bound to the client that
    # made it: a path used before in this process (another test, another server) would send its lease
    # traffic elsewhere, so each cycle gets a folder of its own. No lease renewal may fall inside a cycle.
    try:
        from colabkit.checkpoints import lease
    except ImportError:
        lease = None
    if lease is not None:
        monkeypatch.setattr(lease, "RENEW_S", 3600.0, raising=False)
    first = _cycle(gdrive, tmp_path, f"{tmp_path.name}-1")
    second = _cycle(gdrive, tmp_path, f"{tmp_path.name}-2")
    assert first == second
    assert ("PUT", "/upload/drive/v2/files") in first[0] and ("POST", "/token") in first[1]
    assert not gdrive.injected and not gdrive.abandoned
