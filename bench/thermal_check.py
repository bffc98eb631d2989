"""What the thermal guard costs a training loop: one ``wait_if_hot()`` between steps while no GPU is hot, and one
NVML read of every watched GPU (what the guard's thread does every 5 s), on the NVML stand-in or a real driver.

    python bench/thermal_check.py [--calls 1000000]

Without COLABKIT_TEST_GPUS the real nvidia-ml-py is used (a GPU box); with it, the stand-in over that scenario.
Prints the figures; copy them into bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
if os.environ.get("COLABKIT_TEST_GPUS"):
    sys.path.insert(0, str(REPO / "tests" / "standins" / "gpu"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    args = parser.parse_args()
    from colabkit.health import ThermalGuard
    guard = ThermalGuard(poll_s=600)   # the thread reads once at start(), then this script alone
    if not guard.start():
        sys.exit(f"nothing to watch: {guard.note}")
    try:
        assert not guard.paused, "a GPU is too hot now: the between-steps figure would be a pause"
        t0 = time.perf_counter()
        for _ in range(args.calls):
            guard.wait_if_hot()
        per_call = (time.perf_counter() - t0) / args.calls
        reads = 200
        t0 = time.perf_counter()
        for _ in range(reads):
            guard.check()
        per_read = (time.perf_counter() - t0) / reads
    finally:
        guard.stop()
    print(f"wait_if_hot() with no GPU hot: {per_call * 1e9:.0f} ns per call ({args.calls} calls)")
    print(f"one NVML read of {len(guard._gpus)} GPU(s) (the guard's thread, every 5 s): {per_read * 1e6:.0f} us")


if __name__ == "__main__":
    main()
