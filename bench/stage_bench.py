"""Staging throughput: colabkit.stage vs `cp -r` of the same tree, between the same disks, in one run.

    python bench/stage_bench.py [--root DIR] [--large-mb 1024] [--small 20000] [--mount-small 2000]
                                [--open-latency 0.01] [--rounds 3] [--write-results]

Three trees: a few large files (4 files, --large-mb in total) and many small ones (--small files of 4 KiB in
100 folders) on the local disk, and --mount-small such files read through the Drive stand-in FUSE mount
(tests/standins/drivefs.py) with --open-latency seconds per open, a round trip per file as on a network
filesystem (skipped where FUSE is unavailable). Each round copies each tree with `cp -r` and with
colabkit.stage (a fresh destination each time, progress bar off, after a sync), alternating the order; the page cache is
warm for both (the source is read once first). Prints best-of-rounds times and the ratio stage throughput / cp
throughput (>= 0.9 is the target for large files). With --write-results, replaces the "Staging" section of
bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "standins"))


def make_large(folder: Path, large_mb: int) -> Path:
    folder.mkdir(parents=True)
    block = os.urandom(1 << 20)
    for i in range(4):
        with open(folder / f"shard-{i}.bin", "wb") as fh:
            for _ in range(large_mb // 4):
                fh.write(block)
    return folder


def make_small(folder: Path, count: int) -> Path:
    for i in range(count):
        d = folder / f"d{i % 100:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:06d}.jpg").write_bytes(os.urandom(4096))
    return folder


def size_of(tree: Path) -> int:
    return sum(p.stat().st_size for p in tree.rglob("*") if p.is_file())


def warm(tree: Path):
    for p in tree.rglob("*"):
        if p.is_file():
            with open(p, "rb") as fh:
                while fh.read(8 << 20):
                    pass


def run_cp(src: Path, dst: Path) -> float:
    t = time.perf_counter()
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    return time.perf_counter() - t


def run_stage(src: Path, dst: Path) -> float:
    from colabkit.gdrive.staging import stage
    t = time.perf_counter()
    stage(str(src), dst, quiet=True)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=None, help="folder on the disk to measure (default: the temp dir)")
    ap.add_argument("--large-mb", type=int, default=1024)
    ap.add_argument("--small", type=int, default=20000)
    ap.add_argument("--mount-small", type=int, default=2000)
    ap.add_argument("--open-latency", type=float, default=0.01)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--write-results", action="store_true")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="stage-bench-", dir=args.root))
    from drive_mount import fuse_unavailable_reason, mounted_drive
    try:
        trees = {"large": make_large(root / "large", args.large_mb), "small": make_small(root / "small", args.small)}
        reason = fuse_unavailable_reason()
        stack = contextlib.ExitStack()
        if reason:
            print(f"(no FUSE mount: {reason}; mount row skipped)")
        else:
            drive = stack.enter_context(mounted_drive(root / "fuse", rate=None,
                                                      extra_args=["--open-latency", str(args.open_latency)]))
            make_small(drive.backing / "MyDrive" / "small", args.mount_small)
            trees[f"small, mount {args.open_latency * 1000:g} ms/open"] = drive.my_drive / "small"
        rows = []
        for name, src in trees.items():
            nbytes, nfiles = size_of(src), sum(1 for p in src.rglob("*") if p.is_file())
            warm(src)
            cp_times, st_times = [], []
            for r in range(args.rounds):
                order = [("cp", run_cp), ("stage", run_stage)]
                if r % 2:
                    order.reverse()
                for label, fn in order:
                    os.sync()  # the last round's deletions are written back first, not during this one
                    dst = root / f"out-{name.split(',')[0]}-{len(rows)}-{label}-{r}"
                    (cp_times if label == "cp" else st_times).append(fn(src, dst))
                    shutil.rmtree(dst)
            cp_best, st_best = min(cp_times), min(st_times)
            rows.append((name, nfiles, nbytes, cp_best, st_best))
            # a second call on an unchanged source: the cache check alone
            dst = root / f"out-{len(rows)}-cached"
            run_stage(src, dst)
            hit = run_stage(src, dst)
            shutil.rmtree(dst)
            rows[-1] += (hit,)
        stack.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mb = 1 << 20
    lines = ["| tree | files | size | `cp -r` best s | stage best s | cp MB/s | stage MB/s | stage / cp | cached re-stage s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, nfiles, nbytes, cp_s, st_s, hit in rows:
        lines.append(f"| {name} | {nfiles} | {nbytes / mb:.0f} MiB | {cp_s:.3f} | {st_s:.3f} | {nbytes / mb / cp_s:.1f} | "
                     f"{nbytes / mb / st_s:.1f} | {cp_s / st_s:.2f} | {hit:.3f} |")
    table = "\n".join(lines)
    print(table)
    if args.write_results:
        from colabkit.gdrive.staging import NETWORK_WORKERS
        disk = Path(args.root or tempfile.gettempdir())
        fs = subprocess.run(["df", "-T", str(disk)], capture_output=True, text=True).stdout.splitlines()[-1].split()[1]
        section = (f"## Staging\n\n`python bench/stage_bench.py --rounds {args.rounds}` on {datetime.date.today()}. Machine: "
                   f"{os.cpu_count()} cores ({platform.machine()}, {platform.system()}), Python {platform.python_version()}; "
                   f"source and destination on the same {fs} disk ({disk}); page cache warm for both tools; a sync "
                   f"before each copy; best of {args.rounds} rounds, order alternating. stage / cp > 1 means stage is faster. The mount row "
                   f"reads through the Drive stand-in FUSE mount with {args.open_latency * 1000:g} ms spent in every "
                   f"open (an assumed round trip, not a measurement of Drive), where stage copies "
                   f"{NETWORK_WORKERS} files at a time and `cp -r` one. Small-file times are bound by the disk's "
                   f"file-creation latency, which varies several-fold between runs on a shared VM: compare the ratio "
                   f"within one run.\n\n{table}\n")
        results = Path(__file__).with_name("RESULTS.md")
        text = results.read_text()
        start = text.find("## Staging\n")
        if start >= 0:
            end = text.find("\n## ", start + 1)
            text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
        else:
            text = text.rstrip("\n") + "\n\n" + section
        results.write_text(text)


if __name__ == "__main__":
    main()
