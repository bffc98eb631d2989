"""What `colabkit guard` costs a training run and how fast it commits, each figure against a baseline measured
in the same run:

(a) CPU share: a CPU-bound training script (pure Python, writing a checkpoint-N folder every few seconds) runs
    for a fixed number of steps bare and under the guard; the guard process's own CPU time (/proc, without the
    script's) / wall time, and the script's steps/s under the guard / bare;
(b) commit latency: a checkpoint folder completed in the watched folder (marker written) -> committed at the
    destination on the Drive mount stand-in (throttled like Drive), against `cp -r` of the same folder to the
    same mount; the guard's settle time is part of its latency and is shown apart.

    python bench/guard_commit.py [--mb 64] [--rate 50e6] [--settle 1] [--steps 3000000]

Needs /dev/fuse + fusermount3 + mfusepy for (b). Not a test: nothing fails on speed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests" / "standins")]

TRAIN = r'''
import json, os, sys, time
out, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(out, exist_ok=True)
x, t0 = 1, time.perf_counter()
for step in range(1, steps + 1):
    x = (x * 1103515245 + 12345) % 2147483648
    if step % every == 0:
        d = os.path.join(out, f"checkpoint-{step}")
        os.makedirs(d)
        with open(os.path.join(d, "model.bin"), "wb") as fh:
            fh.write(os.urandom(4 << 20))
        with open(os.path.join(d, "trainer_state.json"), "w") as fh:
            json.dump({"global_step": step}, fh)
print(json.dumps({"steps_per_s": steps / (time.perf_counter() - t0)}))
'''


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_share(tmp: Path, steps: int, every: int, settle: float) -> dict:
    script = tmp / "train.py"
    script.write_text(TRAIN)
    bare = subprocess.run([sys.executable, str(script), str(tmp / "bare"), str(steps), str(every)],
                          capture_output=True, text=True, check=True)
    bare_speed = json.loads(bare.stdout)["steps_per_s"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(tmp / "cache")}
    watch = tmp / "guarded"
    guard = subprocess.Popen([sys.executable, "-m", "colabkit", "guard", "--watch", str(watch), "--to",
                              str(tmp / "dest"), "--settle", str(settle), "--deadline", "off", "--",
                              sys.executable, str(script), str(watch), str(steps), str(every)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    started, cpu = time.monotonic(), 0.0
    while guard.poll() is None:
        try:
            cpu = cpu_seconds(guard.pid)
        except (OSError, IndexError):
            pass
        time.sleep(0.05)
    wall = time.monotonic() - started
    out = guard.stdout.read()
    speed = json.loads(out.strip().splitlines()[-1])["steps_per_s"]
    from colabkit.checkpoints.folder import CheckpointFolder
    commits = len(CheckpointFolder(tmp / "dest").committed())
    return {"guard_cpu_s": cpu, "wall_s": wall, "guard_cpu_share": cpu / wall, "bare_steps_per_s": bare_speed,
            "guarded_steps_per_s": speed, "speed_ratio": speed / bare_speed, "checkpoints_seen": steps // every,
            "committed_kept": commits}


def commit_latency(tmp: Path, mb: int, rate: float, settle: float, rounds: int) -> dict:
    from drive_mount import mounted_drive
    from colabkit.checkpoints.folder import CheckpointFolder
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CACHE_HOME": str(tmp / "cache2")}
    results = {"guard_s": [], "cp_s": []}
    with mounted_drive(tmp / "m", rate=rate) as drive:
        dest = drive.my_drive / "runs" / "bench"
        watch = tmp / "watch"
        watch.mkdir()
        guard = subprocess.Popen([sys.executable, "-m", "colabkit", "guard", "--watch", str(watch), "--to",
                                  str(dest), "--settle", str(settle), "--every", "0.1", "--deadline", "off",
                                  "--keep", "2", "--", "sleep", "100000"], env=env, stderr=subprocess.DEVNULL)
        try:
            for r in range(1, rounds + 1):
                src = tmp / f"src-{r}"
                src.mkdir()
                for i in range(4):
                    (src / f"part{i}.bin").write_bytes(os.urandom(mb << 18))
                (src / "trainer_state.json").write_text(json.dumps({"global_step": r}))
                t0 = time.monotonic()
                subprocess.run(["cp", "-r", str(src), str(drive.my_drive / f"cp-{r}")], check=True)
                subprocess.run(["sync", "-f", str(drive.my_drive / f"cp-{r}")], check=False)
                results["cp_s"].append(time.monotonic() - t0)
                shutil.move(str(src), str(watch / f"checkpoint-{r}"))   # complete: appears at once, marker in
                t0 = time.monotonic()
                while not any(c.step == r for c in CheckpointFolder(dest).committed()):
                    time.sleep(0.02)
                results["guard_s"].append(time.monotonic() - t0)
        finally:
            guard.terminate()
            guard.wait(60)
    g, c = min(results["guard_s"]), min(results["cp_s"])
    return {"mb": mb, "rate_mb_s": rate / 1e6, "settle_s": settle, "guard_latency_s": g,
            "guard_minus_settle_s": g - settle, "cp_r_s": c, "ratio_without_settle": (g - settle) / c,
            "all": results}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--rate", type=float, default=50e6)
    ap.add_argument("--settle", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=3_000_000)
    ap.add_argument("--every", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-a", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "a").mkdir()
        if args.skip_a:
            a = None
        else:
            a = cpu_share(Path(d) / "a", args.steps, args.every, args.settle)
        if a is not None:
            print(f"(a) guard CPU {a['guard_cpu_s']:.2f}s over {a['wall_s']:.1f}s wall = "
                  f"{100 * a['guard_cpu_share']:.2f}% of one core; training {a['guarded_steps_per_s']:.0f} steps/s "
                  f"guarded vs {a['bare_steps_per_s']:.0f} bare (x{a['speed_ratio']:.3f}); "
                  f"{a['checkpoints_seen']} checkpoints of 4 MB written", flush=True)
        from drive_mount import fuse_unavailable_reason
        reason = fuse_unavailable_reason()
        if reason:
            print(f"(b) skipped: {reason}")
            return 0
        (Path(d) / "b").mkdir()
        b = commit_latency(Path(d) / "b", args.mb, args.rate, args.settle, args.rounds)
        print(f"(b) {b['mb']} MB folder to a {b['rate_mb_s']:.0f} MB/s Drive-like mount: guard complete -> committed "
              f"{b['guard_latency_s']:.2f}s (settle {b['settle_s']:.1f}s included; {b['guard_minus_settle_s']:.2f}s "
              f"without) vs cp -r {b['cp_r_s']:.2f}s: x{b['ratio_without_settle']:.2f} without the settle time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
