"""Run inside the test cluster's namespaces: `python kill_node.py PID` SIGKILLs the Ray node that runs PID.

It climbs from PID to the raylet above it, then kills the raylet and every process below it (Ray's workers,
the job and its children) at once, the way a machine that loses power stops them all.
"""
from __future__ import annotations

import os
import signal
import sys

from colabkit.proctree import descendants


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        return int(fh.read().decode(errors="replace").rsplit(")", 1)[1].split()[1])


def comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as fh:
        return fh.read().strip()


def main() -> int:
    pid = int(sys.argv[1])
    raylet = pid
    while raylet > 1 and comm(raylet) != "raylet":
        raylet = parent(raylet)
    if raylet <= 1:
        print(f"no raylet above pid {pid}", file=sys.stderr)
        return 1
    victims = {raylet} | descendants(raylet)
    for victim in victims:  # stop them all first, so none reacts to another's death, then kill
        os.kill(victim, signal.SIGSTOP)
    for victim in victims:
        os.kill(victim, signal.SIGKILL)
    print(f"killed raylet {raylet} and {len(victims) - 1} process(es) below it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
