"""A process that claims GPUs, for tests/devices/test_claims.py: a notebook, a script or another user.

    python claim_child.py FOLDER NAME REQUEST [wait] [share]

REQUEST "FIRST>THEN": use_gpus(FIRST) at once (written to FOLDER/NAME.first.json), then, once FOLDER/next-NAME
exists, use_gpus(THEN, wait=..., share=...) as below.

Waits for FOLDER/go (when FOLDER/barrier exists: processes started together), calls colabkit.use_gpus(REQUEST,
wait=..., share=...), writes what it got to FOLDER/NAME.json ({"gpus": [indices], "claim": id} or {"error": text}),
then holds its claim until FOLDER/release-NAME or FOLDER/release-all exists. Exit status 0.
"""
import json
import os
import sys
import time

folder, name, request = sys.argv[1], sys.argv[2], sys.argv[3]
wait = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else False
wait = True if wait == "true" else wait
share = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] != "-" else None
share = float(share) if share and share.replace(".", "").isdigit() else share

import colabkit  # noqa: E402
from colabkit import devices  # noqa: E402 - imported before the barrier: the claims race, not imports


def write(data):
    tmp = os.path.join(folder, f"{name}.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, os.path.join(folder, f"{name}.json"))


def until(path, timeout=60):
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            sys.exit(f"{name}: {path} never appeared")
        time.sleep(0.002)


if os.path.exists(os.path.join(folder, "barrier")):
    open(os.path.join(folder, f"ready-{name}"), "w").close()
    until(os.path.join(folder, "go"))
def parse(text):
    return int(text) if text.isdigit() and "," not in text else text


if ">" in request:   # "FIRST>THEN": use_gpus(FIRST) at once, then use_gpus(THEN, wait=...) once FOLDER/next-NAME exists
    first, request = request.split(">", 1)
    got = colabkit.use_gpus(parse(first))
    with open(os.path.join(folder, f"{name}.first.json.tmp"), "w") as fh:
        json.dump({"gpus": [g.index for g in got], "claim": got.claim.id if got.claim else None}, fh)
    os.replace(os.path.join(folder, f"{name}.first.json.tmp"), os.path.join(folder, f"{name}.first.json"))
    until(os.path.join(folder, f"next-{name}"))
try:
    chosen = colabkit.use_gpus(parse(request), wait=wait, share=share)
except devices.GPUSelectionError as exc:
    write({"error": str(exc), "type": type(exc).__name__})
    sys.exit(0)
write({"gpus": [g.index for g in chosen], "claim": chosen.claim.id if chosen.claim else None, "pid": os.getpid(),
       "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "time": time.monotonic()})
while not (os.path.exists(os.path.join(folder, f"release-{name}"))
           or os.path.exists(os.path.join(folder, "release-all"))):
    time.sleep(0.01)
