"""Devices benchmark: GPU inventory latency (NVML vs the nvidia-smi subprocess) and the per-job overhead of
`colabkit run` over a bare subprocess.

    python bench/devices_bench.py                 # print the figures
    python bench/devices_bench.py --write         # also replace the "## Devices" section of bench/RESULTS.md

Without a GPU (and by default) it measures the stand-ins in tests/standins/gpu (2 GPUs, scenario home_rig):
a pure-Python NVML with no driver behind it, and an `nvidia-smi` that is a Python script. Their absolute
times are not the real tools' (real NVML calls go to the driver; the real nvidia-smi is a C program that
initializes NVML on every run), but the shape of the comparison is the same: a subprocess per query against
calls in the process. With --real on a GPU machine it measures the real nvidia-ml-py and nvidia-smi instead.
"""
from __future__ import annotations

import argparse
import datetime
import io
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STANDINS = ROOT / "tests" / "standins" / "gpu"
RESULTS = ROOT / "bench" / "RESULTS.md"


def use_standins(scenario: str) -> None:
    sys.path.insert(0, str(STANDINS))
    os.environ["PATH"] = f"{STANDINS / 'bin'}{os.pathsep}{os.environ['PATH']}"
    os.environ["PYTHONPATH"] = os.pathsep.join([str(STANDINS), str(ROOT), os.environ.get("PYTHONPATH", "")])
    os.environ["COLABKIT_TEST_GPUS"] = str(STANDINS / "scenarios" / f"{scenario}.json")
    os.environ["COLABKIT_TEST_PYTHON"] = sys.executable


def timed(fn, n: int) -> list:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def row(name: str, samples: list, baseline: float | None = None) -> tuple:
    med = statistics.median(samples)
    return (name, len(samples), min(samples), med, None if baseline is None else med / baseline)


def inventory(n: int) -> list:
    from colabkit import devices
    from colabkit.devices import nvml
    rows = []
    nvml._nvml_module = None
    first = timed(lambda: devices.gpus(source="nvml"), 1)
    assert devices.gpus(source="nvml").source == "nvml", "NVML unavailable"
    warm = timed(lambda: devices.gpus(source="nvml"), n)
    rows.append(row("NVML, first call (nvmlInit + queries)", first))
    base = statistics.median(warm)
    rows.append(row("NVML, initialized (gpus())", warm, base))
    rows.append(row("NVML, initialized, no processes", timed(lambda: devices.gpus(source="nvml", processes=False), n), base))
    smi = devices.gpus(source="nvidia-smi")
    assert smi.source == "nvidia-smi" and len(smi), smi.note
    rows.append(row("nvidia-smi subprocesses (gpus(): --query-gpu + --query-compute-apps)",
                    timed(lambda: devices.gpus(source="nvidia-smi"), n), base))
    rows.append(row("nvidia-smi subprocess, no processes (--query-gpu only)",
                    timed(lambda: devices.gpus(source="nvidia-smi", processes=False), n), base))
    return rows


def per_job(n_jobs: int, rounds: int) -> tuple:
    """Seconds per job: bare sequential subprocesses vs run_jobs with one slot (the same sequence)."""
    from colabkit.jobs import run_jobs
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        scripts = []
        for i in range(n_jobs):
            path = tmp / f"job{i}.py"
            path.write_text("pass\n")
            scripts.append(path)
        bare, queued, cli = [], [], []
        for r in range(rounds):
            t = time.perf_counter()
            for s in scripts:
                subprocess.run([sys.executable, "-u", str(s)], check=True, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            bare.append((time.perf_counter() - t) / n_jobs * 1000)
            t = time.perf_counter()
            report = run_jobs(scripts, gpus=1, run_dir=tmp / f"run{r}", out=io.StringIO(), progress=False)
            queued.append((time.perf_counter() - t) / n_jobs * 1000)
            assert report.exit_code == 0
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "colabkit", "run", "--gpus", "1", "--run-dir", str(tmp / f"cli{r}"),
                            *map(str, scripts)], check=True, stdout=subprocess.DEVNULL, cwd=tmp)
            cli.append((time.perf_counter() - t) * 1000)
        return bare, queued, cli


def fmt(rows: list) -> list:
    lines = ["| case | n | best ms | median ms | median / NVML initialized |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, n, best, med, ratio in rows:
        lines.append(f"| {name} | {n} | {best:.2f} | {med:.2f} | {'' if ratio is None else f'{ratio:.0f}x'} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=30, help="samples per inventory case (default 30)")
    parser.add_argument("--jobs", type=int, default=10, help="jobs per run for the per-job overhead (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the per-job comparison (default 3)")
    parser.add_argument("--real", action="store_true", help="measure the real NVML / nvidia-smi (GPU machine)")
    parser.add_argument("--write", action="store_true", help="replace the Devices section of bench/RESULTS.md")
    args = parser.parse_args(argv)
    if not args.real:
        use_standins("home_rig")
    sys.path.insert(0, str(ROOT))
    inv_rows = inventory(args.n)
    if not args.real:
        use_standins("colab_t4")  # one GPU: one slot, jobs one after another like the bare baseline
    bare, queued, cli = per_job(args.jobs, args.rounds)
    # deltas between best-of-rounds figures: other load only ever adds time (medians shown for spread)
    b, q, c = min(bare), min(queued), min(cli)
    bm, qm, cm = statistics.median(bare), statistics.median(queued), statistics.median(cli)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    what = "real NVML and nvidia-smi" if args.real else "the stand-ins in tests/standins/gpu (no GPU on this machine)"
    lines = [
        "## Devices", "",
        f"`python bench/devices_bench.py{' --real' if args.real else ''} -n {args.n} --jobs {args.jobs} --rounds "
        f"{args.rounds}` on {datetime.date.today().isoformat()}. Machine: {os.cpu_count()} cores "
        f"({platform.machine()}, {platform.system()}), Python {platform.python_version()}, load average "
        f"{load:.1f}. Inventory through {what}" + ("" if args.real else
        ": the fake NVML is pure Python with no driver behind it and the fake nvidia-smi is a Python script "
        "(`python -S`), so absolute times are not the real tools'; the real nvidia-smi also initializes NVML on "
        "every run, which makes the real gap larger, not smaller") + ".", "",
        "### Inventory latency (`colabkit.gpus()`, 2 GPUs)", "", *fmt(inv_rows), "",
        "### `colabkit run` overhead per job", "",
        f"{args.jobs} trivial jobs (`pass` scripts) one after another, {args.rounds} rounds interleaved: a bare "
        "`subprocess.run` loop against `run_jobs(..., gpus=1)` (one slot, so the same sequence, plus a log file, "
        "the job environment, a watcher thread and summary.json per event); the CLI adds its start-up once per run. "
        "Overheads are differences of best-of-rounds figures (load only adds time); medians show the spread.", "",
        "| case | best per job ms | median per job ms | overhead per job ms (best) | ratio (best) |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| bare subprocess | {b:.1f} | {bm:.1f} | +0.0 | 1.00 |",
        f"| `run_jobs` (in process) | {q:.1f} | {qm:.1f} | {q - b:+.1f} | {q / b:.2f} |",
        f"| `python -m colabkit run` ({args.jobs} jobs, whole command / job) | {c / args.jobs:.1f} | "
        f"{cm / args.jobs:.1f} | {c / args.jobs - b:+.1f} | {c / args.jobs / b:.2f} |", "",
        f"- The queue adds **{q - b:+.1f} ms per job** over a bare subprocess ({(q - b) / b * 100:+.0f} %; the "
        f"inventory is read once per run, not per job); `colabkit run` as a command adds "
        f"{c - q * args.jobs:.0f} ms once per run (interpreter, argparse, inventory).",
        "- tests/gpu/check.sh (inventory, selection, TensorFlow, 2-job run on a real GPU) was **not run**: no GPU "
        "machine was available to this session. It skips cleanly here (exit 0).", "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section(text)
    return 0


def write_section(section: str) -> None:
    """Replace the '## Devices' section of RESULTS.md (up to the next '## ' heading), or append it."""
    current = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    lines = current.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "## Devices"), None)
    if start is None:
        new = current.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        new = "\n".join(lines[:start] + section.rstrip("\n").splitlines() + [""] + lines[end:]).rstrip("\n") + "\n"
    RESULTS.write_text(new)


if __name__ == "__main__":
    sys.exit(main())
