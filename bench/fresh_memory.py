"""What it costs to read a checkpoint's bytes into new memory, by how that memory is asked for.

A restore reads the checkpoint into new memory before it verifies it (checkpoints/npz.py); the first touch of
new pages can cost more than the read. Each measure runs in a fresh process that first fills the same amount of
memory as the file with live data (the model it restores into), then reads the file with 8 MB reads into one
buffer of the file's size, allocated as:

  numpy      np.empty (NumPy asks the kernel for transparent huge pages for large arrays: MADV_HUGEPAGE)
  lazy       an anonymous mmap, faulted in page by page as the read touches it (what malloc gives torch.load)
  populate   an anonymous mmap with MAP_POPULATE: the kernel faults every page in at mmap (checkpoints/memory.py)

    python bench/fresh_memory.py [--sizes-mb 200 2000] [--rounds 3]

The file is page-cached (read once before). Not a test: nothing fails on speed.
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODES = ("numpy", "lazy", "populate")


def worker(mode: str, path: str) -> float:
    import numpy as np
    size = os.path.getsize(path)
    held = np.ones(size, np.uint8)   # the live model's memory, touched  # noqa: F841
    started = time.perf_counter()
    if mode == "numpy":
        buffer = np.empty(size, np.uint8)
    elif mode == "lazy":
        buffer = np.frombuffer(mmap.mmap(-1, size), np.uint8)
    else:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE
        buffer = np.frombuffer(mmap.mmap(-1, size, flags=flags), np.uint8)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as fh:
        got = 0
        while got < size:
            got += fh.readinto(view[got:got + (8 << 20)])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[200, 2000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    if not hasattr(mmap, "MAP_POPULATE"):
        sys.exit("this system has no MAP_POPULATE")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores; load average "
          f"{os.getloadavg()[0]:.1f}")
    for size_mb in args.sizes_mb:
        with tempfile.NamedTemporaryFile(dir=os.environ.get("TMPDIR", "/var/tmp")) as fh:
            block = os.urandom(1 << 20)
            for _ in range(int(size_mb * 1e6) >> 20):
                fh.write(block)
            fh.flush()
            with open(fh.name, "rb") as warm:
                while warm.read(8 << 20):
                    pass
            times = {mode: [] for mode in MODES}
            for _ in range(args.rounds):
                for mode in MODES:
                    out = subprocess.run([sys.executable, __file__, "--worker", mode, fh.name], check=True,
                                         capture_output=True, text=True).stdout
                    times[mode].append(json.loads(out))
        print(f"\n{size_mb:.0f} MB, {args.rounds} rounds: read into new memory, best / median s")
        for mode in MODES:
            print(f"  {mode:9s} {min(times[mode]):.3f} / {statistics.median(times[mode]):.3f}")


if __name__ == "__main__":
    main()
