"""Time to claim: use_gpus(1) with machine-wide claims against the same call without them (gpus_claims off, as
before claims existed), in one run, on the NVML stand-in's 3-GPU box (tests/standins/gpu, no GPU needed).
Also the import cost: `import colabkit` must load neither NVML bindings nor frameworks.

    python bench/gpu_claims.py [ROUNDS]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STANDINS = REPO / "tests" / "standins" / "gpu"
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 200


def main():
    folder = tempfile.mkdtemp(prefix="colabkit-claims-bench-")
    os.environ["COLABKIT_TEST_GPUS"] = str(STANDINS / "scenarios" / "shared_box.json")
    sys.path[:0] = [str(STANDINS), str(REPO)]
    import colabkit
    from colabkit.devices import state

    def timed(setting):
        os.environ["COLABKIT_GPU_CLAIMS"] = setting
        samples = []
        for _ in range(ROUNDS):
            state.current = state.State()   # a fresh process's view: no earlier choice, no claim
            for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "COLABKIT_GPU_CLAIM"):
                os.environ.pop(k, None)
            t = time.perf_counter()
            colabkit.use_gpus(1)
            samples.append(time.perf_counter() - t)
        state.current = state.State()
        return statistics.median(samples)

    timed("off"), timed(os.path.join(folder, "claims"))   # warm-up (imports, NVML init)
    before = timed("off")
    after = timed(os.path.join(folder, "claims"))
    probe = subprocess.run([sys.executable, "-c", "import sys, time; t = time.perf_counter(); import colabkit; "
                            "d = time.perf_counter() - t; bad = [m for m in sys.modules if m.split('.')[0] in "
                            "('pynvml', 'tensorflow', 'torch', 'jax')]; print(d, bad)"],
                           capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    seconds, bad = probe.stdout.split(" ", 1)
    print(json.dumps({"rounds": ROUNDS, "use_gpus_without_claims_ms": round(before * 1e3, 3),
                      "use_gpus_with_claims_ms": round(after * 1e3, 3), "ratio": round(after / before, 2),
                      "import_colabkit_ms": round(float(seconds) * 1e3, 1), "import_loads": bad.strip()}))


if __name__ == "__main__":
    main()
