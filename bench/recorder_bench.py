"""What the flight recorder costs: per training step, and in disk writes per hour.

1. A tight loop of small numpy steps (a 128x128 matmul on one BLAS thread) for ``--round-seconds`` each round,
   without and with a recorder running at the default period (one sample per 2 s, fdatasync every 5 s), rounds
   alternating in the same run; per step: wall time and this process's CPU time (which includes the recorder's
   thread, and is less disturbed by other processes on a busy machine); the ratio of the medians. The recorder's
   thread takes the GIL for one sample every 2 s, so its cost per step is that sample's time spread over the
   steps of 2 s.
2. The CPU time of one sample (NVML reads, /sys and /proc reads, one record appended), over many samples.
3. Disk writes: record bytes per hour at the default period, and what the kernel wrote for this process
   (/proc/self/io write_bytes, which counts whole pages at each fdatasync) over a recording of ``--seconds``,
   scaled to an hour.

    python bench/recorder_bench.py [--rounds 12] [--round-seconds 4] [--seconds 60] [--gpus hot_rig]

``--gpus SCENARIO`` samples the GPU stand-in (tests/standins/gpu/scenarios/SCENARIO.json) where the machine has
no NVIDIA driver; ``--gpus real`` uses nvidia-ml-py and the machine's GPUs. Not a test: nothing fails on speed.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _io_written() -> int | None:
    try:
        with open("/proc/self/io") as fh:
            for line in fh:
                if line.startswith("write_bytes:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--round-seconds", type=float, default=4.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--gpus", default="hot_rig")
    args = parser.parse_args()
    if args.gpus != "real":
        sys.path.insert(0, str(REPO / "tests" / "standins" / "gpu"))
        os.environ["COLABKIT_TEST_GPUS"] = str(REPO / "tests" / "standins" / "gpu" / "scenarios" / f"{args.gpus}.json")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import numpy as np

    from colabkit.health.flight_ring import encode
    from colabkit.health.recorder import FlightRecorder, cpu_sensor, gpu_reading, host_reading
    from colabkit.health.sampler import Sampler

    folder = Path(tempfile.mkdtemp(prefix="flight-bench-"))
    a = np.random.default_rng(0).random((128, 128), dtype=np.float32)

    def loop() -> tuple[float, float]:
        t, c, steps = time.perf_counter(), time.process_time(), 0
        end = t + args.round_seconds
        while True:
            for _ in range(100):
                a @ a
            steps += 100
            if time.perf_counter() >= end:
                break
        return (time.perf_counter() - t) / steps, (time.process_time() - c) / steps

    loop()
    bare, recorded = [], []
    for r in range(args.rounds):
        bare.append(loop())
        rec = FlightRecorder(folder / f"round{r}.ring").start()
        while not rec.recording and rec.alive:
            time.sleep(0.01)
        recorded.append(loop())
        rec.stop()
    step_bare, step_rec = (statistics.median(w for w, _ in bare), statistics.median(w for w, _ in recorded))
    cpu_bare, cpu_rec = (statistics.median(c for _, c in bare), statistics.median(c for _, c in recorded))

    sampler, sensor = Sampler(history=2), cpu_sensor()
    n, c = 300, time.process_time()
    for i in range(n):
        sampler.sample()
        encode(i, {"k": "s", "t": time.time(), "g": [gpu_reading(q[-1]) for q in sampler.gpu_history.values()],
                   "h": host_reading(sensor)})
    sample_cpu = (time.process_time() - c) / n

    before = _io_written()
    rec = FlightRecorder(folder / "disk.ring").start()    # the defaults: 2 s samples, 5 s syncs
    time.sleep(args.seconds)
    rec.stop()
    after = _io_written()
    per_record = rec.bytes_written / max(1, args.seconds / 2.0)
    print(f"machine: {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}; GPUs: {args.gpus} ({len(sampler.gpus)} seen)")
    print(f"step without recorder: {step_bare * 1e6:.1f} us wall, {cpu_bare * 1e6:.1f} us CPU "
          f"(medians of {args.rounds} rounds of {args.round_seconds:g} s)")
    print(f"step with recorder:    {step_rec * 1e6:.1f} us wall, {cpu_rec * 1e6:.1f} us CPU -> ratio "
          f"{step_rec / step_bare:.4f} wall, {cpu_rec / cpu_bare:.4f} CPU")
    print(f"one sample (NVML reads, host reads, the record encoded), CPU: {sample_cpu * 1e3:.2f} ms -> "
          f"{sample_cpu / 2.0 * 100:.3f}% of one core at one sample per 2 s")
    print(f"record bytes: {per_record:.0f} per sample, {per_record * 1800 / 1024:.0f} KiB per hour")
    if before is not None and after is not None:
        print(f"kernel write_bytes over {args.seconds:.0f} s: {after - before} -> "
              f"{(after - before) * 3600 / args.seconds / 2 ** 20:.1f} MiB per hour ({rec.syncs} syncs)")


if __name__ == "__main__":
    main()
