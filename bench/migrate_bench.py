"""colabkit migrate: throughput over a folder of notebooks, and the end-to-end cost of one `--check`.

    python bench/migrate_bench.py [-n 200] [--runs 15] [--rounds 3]

1. Throughput: N Colab-style notebooks (the golden inputs of tests/migrate, padded with ordinary code cells and
   image outputs to realistic sizes) migrated with migrate_paths() into a folder, and checked with check=True.
   Baseline in the same run: nbformat.read + nbformat.write of every notebook (what a tool that re-serialises
   with nbformat does at least, before any rewriting).
2. Pre-commit cost: wall time of `python -m colabkit migrate --check NOTEBOOK` in a fresh interpreter, against a
   bare `python -c pass` in the same run (the interpreter's own start-up), round-robin. Target: < 300 ms.

Prints a Markdown table; copy the figures into bench/RESULTS.md (section "Migrate").
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
GOLDEN = REPO / "tests" / "migrate" / "golden"

FILLER = [
    "import numpy as np\nx = np.linspace(0, 1, 100)\ny = np.sin(x)\nprint(y.mean())",
    "def train_step(model, batch):\n    loss = model(batch)\n    return loss\n\nfor epoch in range(10):\n"
    "    for batch in range(100):\n        train_step(lambda b: b * 2, batch)",
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 5, 6])\nplt.title('loss')\nplt.show()",
    "config = {'lr': 1e-3, 'batch_size': 64, 'epochs': 20, 'optimizer': 'adam'}\nprint(config)",
    "%matplotlib inline\n%load_ext autoreload\n%autoreload 2",
]


def make_corpus(folder: Path, count: int, seed: int = 6) -> list:
    """``count`` notebooks: a golden Colab notebook each, with 10-40 more code cells, some with PNG outputs."""
    rng = random.Random(seed)
    bases = [p for p in sorted(GOLDEN.glob("*.ipynb")) if not p.name.endswith(".expected.ipynb")]
    image = base64.b64encode(os.urandom(30_000)).decode()  # ~40 KB of base64, like a small matplotlib figure
    paths = []
    for i in range(count):
        notebook = json.loads(bases[i % len(bases)].read_text(encoding="utf-8"))
        for _ in range(rng.randint(10, 40)):
            outputs = []
            if rng.random() < 0.15:
                outputs = [{"output_type": "display_data", "data": {"image/png": image, "text/plain": ["<Figure>"]},
                            "metadata": {}}]
            notebook["cells"].append({"cell_type": "code", "source": rng.choice(FILLER).splitlines(True),
                                      "metadata": {"id": f"c{rng.getrandbits(40):x}"}, "execution_count": None,
                                      "outputs": outputs})
        path = folder / f"nb{i:03d}.ipynb"
        path.write_text(json.dumps(notebook, indent=2), encoding="utf-8")
        paths.append(path)
    return paths


def best_and_median(samples):
    return min(samples), statistics.median(samples)


def throughput(paths, rounds: int):
    import warnings
    from colabkit.migrate import migrate_paths
    import nbformat
    warnings.filterwarnings("ignore", message="Cell is missing an id field")  # Colab keeps ids in metadata
    total_bytes = sum(p.stat().st_size for p in paths)
    results = {"migrate (write)": [], "migrate --check": [], "baseline: nbformat read + write": []}
    for _ in range(rounds):
        out = Path(tempfile.mkdtemp(prefix="ck-migrate-out-"))
        start = time.perf_counter()
        reports = migrate_paths(paths, out)
        results["migrate (write)"].append(time.perf_counter() - start)
        assert not [r for r in reports if r.failed], [r.error for r in reports if r.failed]
        shutil.rmtree(out)
        start = time.perf_counter()
        migrate_paths(paths, check=True)
        results["migrate --check"].append(time.perf_counter() - start)
        out = Path(tempfile.mkdtemp(prefix="ck-nbformat-out-"))
        start = time.perf_counter()
        for path in paths:
            nbformat.write(nbformat.read(path, as_version=4), out / path.name)
        results["baseline: nbformat read + write"].append(time.perf_counter() - start)
        shutil.rmtree(out)
    changed = sum(r.changed for r in reports)
    return results, total_bytes, changed


def check_latency(notebook: Path, runs: int):
    cases = {
        "bare: python -c pass": [sys.executable, "-c", "pass"],
        "colabkit migrate --check (1 notebook)": [sys.executable, "-m", "colabkit", "migrate", "--check", "-q",
                                                 str(notebook)],
    }
    samples = {name: [] for name in cases}
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for _ in range(runs):
        for name, argv in cases.items():
            start = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, env=env)
            samples[name].append(time.perf_counter() - start)
            assert done.returncode in (0, 1), done.stderr
    return samples


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=200, help="notebooks in the throughput corpus (default 200)")
    parser.add_argument("--runs", type=int, default=15, help="--check runs per case (default 15)")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds (default 3)")
    args = parser.parse_args(argv)

    folder = Path(tempfile.mkdtemp(prefix="ck-migrate-bench-"))
    try:
        paths = make_corpus(folder, args.n)
        results, total_bytes, changed = throughput(paths, args.rounds)
        one = folder / "one.ipynb"
        shutil.copy(GOLDEN / "colab_drive_training.ipynb", one)
        latency = check_latency(one, args.runs)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"Machine: {os.cpu_count()} cores ({platform.machine()}, {platform.system()}), Python "
          f"{platform.python_version()}, load average {load:.1f}\n")
    mb = total_bytes / 1e6
    print(f"### Throughput: {args.n} notebooks, {mb:.1f} MB, {changed} need changes; best of {args.rounds} rounds\n")
    print("| case | best s | median s | notebooks/s (best) | MB/s (best) | time / baseline (best) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    base_best = min(results["baseline: nbformat read + write"])
    for name, samples in results.items():
        best, median = best_and_median(samples)
        print(f"| {name} | {best:.3f} | {median:.3f} | {args.n / best:.0f} | {mb / best:.1f} | {best / base_best:.2f} |")
    print(f"\n### One `--check` end to end: fresh interpreter, {args.runs} runs each, round-robin\n")
    print("| case | best ms | median ms | median - bare ms |")
    print("| --- | ---: | ---: | ---: |")
    bare = statistics.median(latency["bare: python -c pass"])
    for name, samples in latency.items():
        best, median = best_and_median(samples)
        print(f"| {name} | {best * 1000:.0f} | {median * 1000:.0f} | {(median - bare) * 1000:+.0f} |")
    check_median = statistics.median(latency["colabkit migrate --check (1 notebook)"])
    verdict = "met" if check_median < 0.300 else "NOT met"
    print(f"\nTarget `--check` < 300 ms end to end: {verdict} (median {check_median * 1000:.0f} ms).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
