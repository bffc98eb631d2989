"""The checkpoint store's fault campaign, as a table for bench/RESULTS.md: fault kind x operations covered x
trials -> lost commits, wrong resumes, silent restarts (the target is zero in every cell), and how long it takes.

    python bench/fault_campaign.py [--workers 2] [--stride 1]

Runs tests/checkpoints/campaign.py on the Drive mount stand-in (needs /dev/fuse, fusermount3 and mfusepy) and on
the Drive API stand-in (needs pydrive2). CI runs the same campaigns as tests; this prints their figures.
"""
from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests" / "standins")]

from tests.checkpoints import campaign  # noqa: E402
from tests.checkpoints import gdrive_campaign  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--stride", type=int, default=1)
    args = parser.parse_args()
    print(f"# {time.strftime('%Y-%m-%d')}, {platform.machine()}, Python {platform.python_version()}")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        fuse = campaign.run_campaign(Path(tmp) / "fuse", workers=args.workers, stride=args.stride)
        print(f"\n## Drive mount stand-in (FUSE), {len(fuse['trials'])} trials in {fuse['seconds']:.0f} s "
              f"({args.workers} workers)\n")
        print(campaign.table(fuse))
        bad += sum(t["outcome"] != "ok" for t in fuse["trials"])
        api = gdrive_campaign.run_campaign(Path(tmp) / "api", workers=args.workers, stride=args.stride)
        print(f"\n## Drive API stand-in (gdrive://), {len(api['trials'])} trials in {api['seconds']:.0f} s "
              f"({args.workers} workers)\n")
        print(gdrive_campaign.table(api))
        bad += sum(t["outcome"] != "ok" for t in api["trials"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
