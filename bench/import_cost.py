"""Import cost of colabkit: `import colabkit` and `%load_ext colabkit`, against baselines measured in the same run.

Each sample is a fresh interpreter (a subprocess); the cases are run round-robin so that drift in machine load
hits all of them alike. Reports the best and the median wall time per case and the deltas that matter (taken
between best-of-N figures: load on the machine only ever adds time, so the minimum is the least noisy
estimate; the in-process timing of the %load_ext call itself is printed as a cross-check), and checks
that no framework (TensorFlow, Keras, PyTorch, JAX), Drive client, NVML or google.colab got imported.

    python bench/import_cost.py            # 20 samples per case
    python bench/import_cost.py -n 50 --scale   # also time `import tensorflow` once, for scale

Target (issue 2): loading the extension adds under 150 ms over a bare interpreter. Exit status 1 when a
forbidden module was imported; speed never fails the run (benchmarks are not timed tests).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FORBIDDEN = ("tensorflow", "keras", "torch", "jax", "pydrive2", "gdown", "pynvml", "google.colab")
TARGET_MS = 150.0

SHELL = "from IPython.core.interactiveshell import InteractiveShell; s = InteractiveShell.instance()"
CASES = {
    "bare": "pass",
    "import colabkit": "import colabkit",
    "IPython shell": SHELL,
    "IPython shell + %load_ext colabkit": SHELL + "; s.run_line_magic('load_ext', 'colabkit')",
    "IPython shell + %load_ext + %colabkit": SHELL + "; s.run_line_magic('load_ext', 'colabkit')"
                                             "; s.run_line_magic('colabkit', '')",
}

# In one process: the time of the %load_ext call itself (no interpreter start-up noise around it).
IN_PROCESS = SHELL + """
import time, io, contextlib
t0 = time.perf_counter(); s.run_line_magic('load_ext', 'colabkit'); t1 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    s.run_line_magic('colabkit', '')
t2 = time.perf_counter()
print((t1 - t0) * 1000, (t2 - t1) * 1000)
"""

PROBE = SHELL + """
import io, contextlib, json, sys
import colabkit
with contextlib.redirect_stdout(io.StringIO()):
    s.run_line_magic('load_ext', 'colabkit'); s.run_line_magic('colabkit', ''); s.run_line_magic('colabkit', 'config')
forbidden = %r
print(json.dumps(sorted(m for m in sys.modules if any(m == f or m.startswith(f + '.') for f in forbidden))))
""" % (FORBIDDEN,)


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("PYTHONSTARTUP", None)
    return env


def run(code: str, env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return (time.perf_counter() - t0) * 1000.0


def measure(n: int, env: dict) -> dict:
    for code in CASES.values():  # warm the OS file cache and __pycache__ once, untimed
        run(code, env)
    samples = {name: [] for name in CASES}
    for _ in range(n):
        for name, code in CASES.items():
            samples[name].append(run(code, env))
    return samples


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=20, help="samples per case (default 20)")
    parser.add_argument("--scale", action="store_true", help="also time `import tensorflow` (one sample)")
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    args = parser.parse_args(argv)
    env = _env()

    samples = measure(args.n, env)
    best = {k: min(v) for k, v in samples.items()}
    median = {k: statistics.median(v) for k, v in samples.items()}

    in_process = []
    for _ in range(args.n):
        out = subprocess.run([sys.executable, "-c", IN_PROCESS], check=True, env=env, cwd=REPO,
                             capture_output=True, text=True).stdout.split()
        in_process.append(tuple(float(x) for x in out))
    load_ext_ms = statistics.median(x[0] for x in in_process)
    first_status_ms = statistics.median(x[1] for x in in_process)

    probe = subprocess.run([sys.executable, "-c", PROBE], check=True, env=env, cwd=REPO, capture_output=True,
                           text=True)
    leaked = json.loads(probe.stdout.strip().splitlines()[-1])

    tf_ms = None
    if args.scale:
        tf_ms = run("import tensorflow", env)

    if args.json:
        print(json.dumps({"samples_ms": samples, "load_ext_in_process_ms": load_ext_ms,
                          "first_status_in_process_ms": first_status_ms, "forbidden_imported": leaked,
                          "import_tensorflow_ms": tf_ms}, indent=2))
        return 1 if leaked else 0

    print(f"colabkit import cost: {args.n} fresh interpreters per case, round-robin")
    print(f"python {platform.python_version()} on {platform.system()} {platform.machine()}, "
          f"{os.cpu_count()} CPUs\n")
    print(f"{'case':<40}{'best ms':>9}{'median ms':>11}{'best-bare':>11}{'ratio':>7}{'best-shell':>12}"
          f"{'median-shell':>14}")
    for name in CASES:
        extension = name.startswith("IPython shell +")
        vs_shell = f"{best[name] - best['IPython shell']:>+12.1f}" if extension else f"{'':>12}"
        vs_shell_median = f"{median[name] - median['IPython shell']:>+14.1f}" if extension else ""
        print(f"{name:<40}{best[name]:>9.1f}{median[name]:>11.1f}{best[name] - best['bare']:>+11.1f}"
              f"{best[name] / best['bare']:>7.2f}{vs_shell}{vs_shell_median}")
    if tf_ms is not None:
        print(f"{'import tensorflow (1 sample, for scale)':<40}{tf_ms:>9.1f}{'':>11}{tf_ms - best['bare']:>+11.1f}"
              f"{tf_ms / best['bare']:>7.2f}")

    import_delta = best["import colabkit"] - best["bare"]
    ext_delta = best["IPython shell + %load_ext colabkit"] - best["IPython shell"]
    print()
    print(f"import colabkit adds            {import_delta:7.1f} ms over a bare interpreter (best of {args.n})")
    print(f"%load_ext colabkit adds         {ext_delta:7.1f} ms over the same IPython shell without it "
          f"(best of {args.n})")
    print(f"  measured inside the process:  {load_ext_ms:7.1f} ms for %load_ext, {first_status_ms:.1f} ms for "
          f"the first %colabkit (median)")
    verdict = "meets" if max(ext_delta, load_ext_ms) < TARGET_MS else "MISSES"
    print(f"target: extension adds < {TARGET_MS:.0f} ms: {verdict}")
    print(f"frameworks imported after %load_ext + %colabkit: {', '.join(leaked) if leaked else 'none'}")
    return 1 if leaked else 0


if __name__ == "__main__":
    sys.exit(main())
