#!/usr/bin/env python3
"""The fault campaign of campaign.py for ``gdrive://`` checkpoints: the Drive API stand-in (drive_api.py) fails
the k-th HTTP request of a save+retention cycle and of a restore, for every k, and a fresh process must then
restore the newest verified checkpoint, with nothing committed and kept gone.

Faults at request k: ``500`` / ``503`` (that request), ``drop`` (the connection closes before an answer),
``drop-mid`` (the request is applied, then its answer is cut off half way: ``http.client.IncompleteRead``),
``stale-list`` (the next listing omits its newest item, as Drive's eventually consistent listings do) and
``outage`` (503 from request k on).

    python tests/checkpoints/gdrive_campaign.py WORKDIR [--workers 2] [--stride 1]

Each worker starts its own Drive API server in a subprocess (driven through its stdin), prepares every trial's
folder on the server directly, and forks one child per trial: the children are the "VMs", with their own
empty local staging folders, talking HTTP to the server like the real client does. As in campaign.py, trials go
one at a time to whichever worker is free.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests" / "standins")]

from tests.checkpoints import campaign  # noqa: E402
from tests.checkpoints.campaign import (  # noqa: E402
    KEEP,
    NEVER,
    _content_ok,
    _in_child,
    _judge,
    _read,
    serve_trials,
    state,
)

CYCLES = {name: campaign.CYCLES[name] for name in ("save", "restore")}   # no local-disk mount through the API

KINDS = {"500": ("500", False), "503": ("503", False), "drop": ("drop", False), "drop-mid": ("drop-mid", False),
         "stale-list": ("stale-list", False), "outage": ("503", True), "hang": ("hang", False)}

SERVER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from drive_api import DriveServer, FOLDER
server = DriveServer().start()
print(json.dumps({"url": server.root_url}), flush=True)

def clone(src, title, parent):
    meta = server.state.files[src]
    copy = server.state.add(title, parent, mime=meta["mimeType"], data=server.state.content.get(src))
    for child in sorted(server.state.children(src), key=lambda m: m["_seq"]):
        clone(child["id"], child["title"], copy["id"])

for line in sys.stdin:
    cmd, *args = line.split()
    if cmd == "arm":
        (server.arm_from if args[2] == "from" else server.arm)(int(args[0]), args[1])
    elif cmd == "disarm":
        server.disarm()
    elif cmd == "clone":                      # clone RUNS_FOLDER/<src> RUNS_FOLDER/<dst>
        runs = server.state.find("runs")
        with server.state.lock:
            clone(server.state.find("runs/" + args[0])["id"], args[1], runs["id"])
    print(json.dumps({"count": server.count}), flush=True)
"""


class Server:
    """The Drive API stand-in in a process of its own (so the worker has no threads when it forks)."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(REPO / "tests" / "standins")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = json.loads(self.proc.stdout.readline())["url"]

    def send(self, *words) -> dict:
        self.proc.stdin.write(" ".join(map(str, words)) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(10)


def _service_account_key(url: str) -> dict:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return {"type": "service_account", "project_id": "campaign", "private_key_id": "k1", "private_key": pem,
            "client_email": "campaign@campaign.iam.gserviceaccount.com", "client_id": "1",
            "auth_uri": f"{url}/auth", "token_uri": f"{url}/token"}


def _quick_retries() -> None:
    import colabkit.gdrive as g
    from colabkit.checkpoints import drive_api, lease, uploader
    g.BACKOFF_START, g.BACKOFF_MAX, g.CREATE_CHECK_S, g.TIMEOUT_S = 0.005, 0.02, 0.01, 0.25
    uploader.BACKOFF_START, uploader.BACKOFF_MAX = 0.005, 0.05
    # the second look at a listing that may lag: the stand-in's listings lag only when a "stale-list" fault
    # says so, and then only the next one, however soon it comes
    drive_api.LISTING_LAG_S = lease.READ_BACK_LAG_S = 0.01


# -- the forked children ------------------------------------------------------------------------------------
def _prepare(location: str, steps: list[int], local: Path) -> None:
    import colabkit
    _quick_retries()
    with colabkit.Checkpoints(location, local_dir=local, keep=KEEP) as ckpt:
        for step in steps:
            ckpt.save(step, state(step), wait=True)


def _save_trial(location, local, arm, out, persistent):
    import colabkit
    _quick_retries()
    ckpt = colabkit.Checkpoints(location, local_dir=local, keep=KEEP, read_timeout=5)
    restored = ckpt.restore()
    out.write_text(json.dumps({"resumed": None if restored is None else restored.step}))
    arm()
    ckpt.save(4, state(4))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not ckpt.wait(0.02):
        if persistent and ckpt.status.state == "retrying":
            break
    ckpt.close(timeout=0.2 if persistent else 20)


def _restore_trial(location, local, arm, out, persistent):
    import colabkit
    _quick_retries()
    ckpt = colabkit.Checkpoints(location, local_dir=local, keep=KEEP, read_timeout=1)
    arm()
    try:
        restored = ckpt.restore()
    except colabkit.CheckpointError as exc:
        result = {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - an unclear error is an outcome too
        result = {"unclear": f"{type(exc).__name__}: {exc}"}
    else:
        result = {"restored": None if restored is None else restored.step,
                  "content_ok": restored is not None and _content_ok(restored)}
    out.write_text(json.dumps(result))
    ckpt.close(timeout=0.2)


def _check(location, local, out):
    """With the API healthy: what Drive holds (verified) and what a fresh VM restores."""
    from colabkit.checkpoints.drive_api import DriveApiFolder
    from tests.checkpoints.campaign import check_outcome
    _quick_retries()
    check_outcome(DriveApiFolder(location[len("gdrive://"):]), location, local, out)


def worker(workdir: Path, index: int, cycles: list[str]) -> None:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import shutil
    base = workdir / f"api{index}"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    server = Server()
    key = base / "sa-key.json"
    key.write_text(json.dumps(_service_account_key(server.url)))
    os.environ.update(COLABKIT_DRIVE_API_ROOT=server.url, COLABKIT_DRIVE_CREDENTIALS=str(key),
                      XDG_CACHE_HOME=str(base / "cache"), XDG_CONFIG_HOME=str(base / "config"))
    import colabkit.checkpoints.drive_api  # noqa: F401 - loaded once, before the forks
    import colabkit.gdrive.auth  # noqa: F401
    import googleapiclient.discovery  # noqa: F401 - the client libraries too: each child still signs in afresh
    import numpy  # noqa: F401
    import pydrive2.auth  # noqa: F401
    counter = 0

    def fresh(name):
        nonlocal counter
        counter += 1
        return base / f"{name}{counter}"

    try:
        for cycle, (steps, _) in CYCLES.items():
            assert _in_child(_prepare, f"gdrive://runs/template-{cycle}", steps, fresh("prep")) == 0

        def run(cycle, kind, k, persistent):
            name = f"t{fresh('n').name}"
            server.send("clone", f"template-{cycle}", name)
            location, out = f"gdrive://runs/{name}", fresh("out")
            arm = lambda: server.send("arm", k, kind, "from" if persistent else "once")  # noqa: E731
            trial = _save_trial if cycle == "save" else _restore_trial
            code = _in_child(trial, location, fresh("vm"), arm, out, persistent)
            ops = server.send("disarm")["count"]
            check_out = fresh("check")
            _in_child(_check, location, fresh("vm"), check_out)
            return _read(out), _read(check_out), code, ops

        for cycle in cycles:
            _, _, _, n = run(cycle, "500", NEVER, False)
            print(json.dumps({"cycle": cycle, "operations": n}), flush=True)

        def one(cycle: str, kind: str, k: int) -> dict:
            fault, persistent = KINDS[kind]
            started = time.monotonic()
            trial, check, code, _ = run(cycle, fault, k, persistent)
            outcome, detail = _judge(cycle, trial, check)
            if "unclear" in trial:
                outcome, detail = "wrong", f"restore raised {trial['unclear']} instead of CheckpointError"
            return {"cycle": cycle, "kind": kind, "k": k, "outcome": outcome, "detail": detail, "exit": code,
                    "seconds": round(time.monotonic() - started, 3)}

        serve_trials(one)
    finally:
        server.close()


def run_campaign(workdir: Path, *, workers: int = 2, stride: int = 1, cycles=tuple(CYCLES),
                 kinds=tuple(KINDS)) -> dict:
    """As campaign.run_campaign, on the Drive API stand-in."""
    return campaign.run_campaign(workdir, workers=workers, stride=stride, cycles=cycles, kinds=kinds,
                                 script=__file__)


def table(result: dict) -> str:
    return campaign.table(result, kinds=KINDS, unit="requests")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        workdir, index, cycles = argv[1:]
        worker(Path(workdir), int(index), cycles.split(","))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = run_campaign(args.workdir, workers=args.workers, stride=args.stride)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    from tests.checkpoints.campaign import report
    return report(result, table(result))


if __name__ == "__main__":
    sys.exit(main())
