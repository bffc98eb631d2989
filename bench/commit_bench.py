"""What committing a checkpoint of a big state costs on local disk, against writing its bytes once, in one run.

For each size (default 0.2 GB and 6 GB of float32 arrays of 256 MB at most, as a model's variables are):

1. baseline: write the arrays' bytes once to a file on the same disk and fsync it (what any durable save pays);
2. commit: ``Checkpoints.save_snapshot`` to a folder on that disk (the path every adapter saves through: one
   copy into host buffers, then the background write straight into the folder, hashed and synced on the way,
   then the manifest) until ``wait()`` says the checkpoint is committed; its stall (the copy the loop waits
   for) is reported apart. The second save of the process is timed, as in training (the first one's buffers
   are fresh memory: its page faults are reported apart, as the first save's commit);
3. the hash alone over the same bytes in memory (BLAKE3, the manifest's; sha256 for the checkpoints written
   before), to show it is no longer what a commit waits for.

Each measure runs in a fresh process (so its peak resident memory, VmHWM, is its own), alternating between
baseline and commit for ``--repeats`` rounds; best and median are printed, with the machine's load average.

With ``--stream``, each process runs in a cgroup v1 memory cgroup (root, Linux) whose limit is the state plus
1 GB: the snapshot buffers do not fit, so the commit is the streamed one (variable by variable, the caller
waiting; see colabkit/checkpoints/streaming.py), timed from the call until the checkpoint is committed, against
one write + fsync of the same bytes in the same kind of cgroup. Sizes of at least 1.5 GB.

    python bench/commit_bench.py [--sizes-gb 0.2 6] [--repeats 3] [--dir DIR] [--stream]

Not a test: nothing fails on speed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PIECE = 256 << 20


def arrays_of(nbytes: int):
    import numpy as np
    sizes = [PIECE] * (nbytes // PIECE) + ([nbytes % PIECE] if nbytes % PIECE else [])
    return [np.full(size // 4, i + 1, dtype=np.float32) for i, size in enumerate(sizes)]


def peak_rss() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))


def child(kind: str, nbytes: int, where: Path) -> dict:
    """One measure in this (fresh) process: {"s": seconds, "stall_s": ..., "peak": bytes, "state": bytes}."""
    arrays = arrays_of(nbytes)
    state_peak = peak_rss()
    out = {"state_peak": state_peak}
    if kind == "write":
        t0 = time.perf_counter()
        with open(where / "bytes.bin", "wb", buffering=0) as fh:
            for a in arrays:
                view = memoryview(a).cast("B")
                while view.nbytes:
                    view = view[fh.write(view):]
            os.fsync(fh.fileno())
        out["s"] = time.perf_counter() - t0
    elif kind == "commit":
        os.environ["XDG_CACHE_HOME"] = str(where / "cache")
        sys.path.insert(0, str(REPO))
        import colabkit

        def fill(buffers):
            for b, a in zip(buffers, arrays):
                b[...] = a
            return {f"v{i}": b for i, b in enumerate(buffers)}

        with colabkit.Checkpoints(where / "run") as ckpt:
            ckpt.prepare_snapshot(arrays)
            for step in (1, 2):
                t0 = time.perf_counter()
                ckpt.save_snapshot(step, arrays, fill)
                out["stall_s"] = time.perf_counter() - t0
                assert ckpt.wait(), "not committed"
                out["s"] = time.perf_counter() - t0
                out.setdefault("first_s", out["s"])
    elif kind == "stream":
        os.environ["XDG_CACHE_HOME"] = str(where / "cache")
        sys.path.insert(0, str(REPO))
        import numpy as np

        import colabkit

        def place(buffers):
            return {f"v{i}": b for i, b in enumerate(buffers)}

        def copy(index, buffer):
            np.copyto(buffer, arrays[index])

        with colabkit.Checkpoints(where / "run") as ckpt:
            for step in (1, 2):
                t0 = time.perf_counter()
                ckpt.save_snapshot(step, arrays, place, copy=copy)
                out["stall_s"] = time.perf_counter() - t0
                assert ckpt.wait(), "not committed"
                out["s"] = time.perf_counter() - t0
            out["streamed"] = ckpt.snapshot_buffer_sets == 0
    elif kind in ("blake3", "sha256"):
        sys.path.insert(0, str(REPO))
        from colabkit.checkpoints.digest import hasher
        t0 = time.perf_counter()
        h = hasher(kind)
        for a in arrays:
            h.update(memoryview(a).cast("B"))
        h.hexdigest()
        out["s"] = time.perf_counter() - t0
    out["peak"] = peak_rss()
    return out


def run_child(kind: str, nbytes: int, root: Path, limit: int | None = None) -> dict:
    """One measure in a fresh process; with ``limit``, in a fresh memory cgroup of that many bytes."""
    with tempfile.TemporaryDirectory(dir=root, prefix=f"{kind}-") as where:
        command = [sys.executable, __file__, "--child", kind, str(nbytes), where]
        cgroup = None
        if limit is not None:
            cgroup = Path("/sys/fs/cgroup/memory") / f"colabkit-bench-{os.getpid()}-{time.monotonic_ns()}"
            cgroup.mkdir()
            (cgroup / "memory.limit_in_bytes").write_text(str(limit))
            command = ["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$@"', "sh", *command]
        try:
            done = subprocess.run(command, capture_output=True, text=True)
        finally:
            if cgroup is not None:
                for _ in range(50):
                    try:
                        cgroup.rmdir()
                        break
                    except OSError:
                        time.sleep(0.1)
        if done.returncode != 0:
            raise SystemExit(f"{kind} at {nbytes} bytes failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def main_stream(args, root: Path) -> None:
    print("| state | cgroup limit | one write + fsync (best / median) | streamed commit (best / median) | "
          "commit / write (best, median) | peak memory above the state |")
    print("|---|---:|---:|---:|---:|---:|")
    for gb in args.sizes_gb:
        nbytes = int(gb * 1e9) // 4 * 4
        limit = nbytes + (1 << 30)
        runs = {"write": [], "stream": []}
        for _ in range(args.repeats):
            for kind in runs:
                runs[kind].append(run_child(kind, nbytes, root, limit))
        assert all(r["streamed"] for r in runs["stream"]), "a save took snapshot buffers: the limit is too loose"
        w = sorted(r["s"] for r in runs["write"])
        c = sorted(r["s"] for r in runs["stream"])
        extra = max(r["peak"] - r["state_peak"] for r in runs["stream"])
        print(f"| {nbytes / 1e9:.1f} GB | {limit / 1e9:.1f} GB | {w[0]:.2f} / {statistics.median(w):.2f} s | "
              f"{c[0]:.2f} / {statistics.median(c):.2f} s | {c[0] / w[0]:.2f}x, "
              f"{statistics.median(c) / statistics.median(w):.2f}x | +{extra / nbytes:.2f}x the state "
              f"({extra / 1e6:.0f} MB) |", flush=True)


def main():
    parser = argparse.ArgumentParser(prog="python bench/commit_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-gb", type=float, nargs="+", default=[0.2, 6.0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="a folder on the disk to measure (default: TMPDIR)")
    parser.add_argument("--stream", action="store_true",
                        help="measure the streamed commit, in a memory cgroup too small for snapshot buffers")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), Path(args.child[2]))))
        return
    root = args.dir or Path(tempfile.gettempdir())
    print(f"machine: {os.cpu_count()} CPUs, load average at start {os.getloadavg()}, disk of {root}")
    if args.stream:
        main_stream(args, root)
        print(f"load average at end {os.getloadavg()}")
        return
    print("| state | one write of the bytes + fsync (best / median) | commit (best / median) | commit / write "
          "(best, median) | stall | first save's commit | blake3 alone | sha256 alone | peak RSS commit / state |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for gb in args.sizes_gb:
        nbytes = int(gb * 1e9) // 4 * 4
        runs = {"write": [], "commit": []}
        for _ in range(args.repeats):
            for kind in runs:
                runs[kind].append(run_child(kind, nbytes, root))
        hashes = {kind: run_child(kind, nbytes, root)["s"] for kind in ("blake3", "sha256")}
        w = sorted(r["s"] for r in runs["write"])
        c = sorted(r["s"] for r in runs["commit"])
        stall = statistics.median(r["stall_s"] for r in runs["commit"])
        first = statistics.median(r["first_s"] for r in runs["commit"])
        extra = max(r["peak"] - r["state_peak"] for r in runs["commit"])
        print(f"| {nbytes / 1e9:.1f} GB | {w[0]:.2f} / {statistics.median(w):.2f} s | {c[0]:.2f} / "
              f"{statistics.median(c):.2f} s | {c[0] / w[0]:.2f}x, {statistics.median(c) / statistics.median(w):.2f}x"
              f" | {stall:.2f} s | {first:.2f} s | {hashes['blake3']:.2f} s | {hashes['sha256']:.2f} s | "
              f"+{extra / nbytes:.2f}x the state |")
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
