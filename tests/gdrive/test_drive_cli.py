"""`colabkit drive login / whoami`: service-account and OAuth console flows, 0600 files, secrets never printed."""
import json
import stat
import subprocess
import sys
import urllib.parse


import colabkit.gdrive as g
from colabkit.cli import main


def test_login_with_service_account_saves_0600_and_never_prints_the_key(drive_server, make_key, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLABKIT_DRIVE_API_ROOT", drive_server.root_url)
    key = make_key()
    src = tmp_path / "downloaded-key.json"
    src.write_text(json.dumps(key))
    assert main(["drive", "login", "--service-account", str(src)]) == 0
    saved = g.credentials_path()
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600 and json.loads(saved.read_text()) == key
    assert main(["drive", "whoami"]) == 0
    out = capsys.readouterr()
    assert "tester@example.com" in out.out
    assert "PRIVATE KEY" not in out.out + out.err and key["private_key"][40:80] not in out.out + out.err


def test_login_with_oauth_client_console_flow(drive_server, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLABKIT_DRIVE_API_ROOT", drive_server.root_url)
    client = tmp_path / "client_secrets.json"
    client.write_text(json.dumps({"installed": {
        "client_id": "cid.apps.googleusercontent.com", "client_secret": "s3cr3t-client",
        "auth_uri": f"{drive_server.root_url}/auth", "token_uri": f"{drive_server.root_url}/token",
        "redirect_uris": ["http://localhost"]}}))

    def browser(prompt):   # the user opens the printed URL elsewhere and pastes where the browser ended up
        printed = capsys.readouterr().out
        url = [w for w in printed.split() if w.startswith(drive_server.root_url + "/auth")][0]
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
        assert query["access_type"] == ["offline"] and "drive" in query["scope"][0]
        code = drive_server.issue_code(query["client_id"][0])
        return f"{query['redirect_uri'][0]}/?code={urllib.parse.quote(code)}&scope=drive"

    who = g.login(client_secrets=str(client), code_input=browser)
    assert "tester@example.com" in who
    saved = g.credentials_path()
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600 and "refresh_token" in saved.read_text()
    # a new process signs in from the saved refresh token alone
    env = {"COLABKIT_DRIVE_API_ROOT": drive_server.root_url}
    import os
    res = subprocess.run([sys.executable, "-m", "colabkit", "drive", "whoami"], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=60)
    assert res.returncode == 0 and "tester@example.com" in res.stdout, res.stderr
    assert "refresh_token" not in res.stdout and "s3cr3t" not in res.stdout + res.stderr
    # revoked: one clear line, exit 1
    drive_server.revoked.add("cid.apps.googleusercontent.com")
    res = subprocess.run([sys.executable, "-m", "colabkit", "drive", "whoami"], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=60)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "refused the credentials" in res.stderr and "colabkit drive login" in res.stderr


def test_bad_login_input_keeps_previous_credentials(drive_server, make_key, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLABKIT_DRIVE_API_ROOT", drive_server.root_url)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(make_key()))
    assert main(["drive", "login", "--service-account", str(good)]) == 0
    before = g.credentials_path().read_bytes()
    revoked = make_key(email="gone@test-project.iam.gserviceaccount.com")
    drive_server.revoked.add(revoked["client_email"])
    (tmp_path / "revoked.json").write_text(json.dumps(revoked))
    (tmp_path / "client.json").write_text(json.dumps({"installed": {"client_id": "x"}}))
    for args, message in [(["--service-account", str(tmp_path / "missing.json")], "does not exist"),
                          (["--service-account", str(tmp_path / "client.json")], "not a service-account key"),
                          (["--service-account", str(tmp_path / "revoked.json")], "refused the credentials"),
                          ([], "exactly one of")]:
        assert main(["drive", "login", *args]) == 1
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        assert g.credentials_path().read_bytes() == before
