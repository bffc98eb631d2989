#!/usr/bin/env bash
# GPU checks for colabkit.devices and `colabkit run` on a machine with a real NVIDIA GPU and driver.
# Skips cleanly (exit 0, one line) where there is none. Run from anywhere: tests/gpu/check.sh
# Exercises: inventory (NVML and nvidia-smi agree), selection and its environment variables, TensorFlow seeing
# exactly the chosen GPU (when TensorFlow is installed), monitored fits (colabkit.keras.Monitor: real NVML
# samples, input share, verdicts), a 2-job `colabkit run` on the GPU(s), and `colabkit doctor`.
set -u -o pipefail

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "tests/gpu/check.sh: SKIPPED: nvidia-smi is not on PATH (no NVIDIA driver here)"
    exit 0
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "tests/gpu/check.sh: SKIPPED: nvidia-smi cannot reach a GPU: $(nvidia-smi 2>&1 | head -n 1)"
    exit 0
fi

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL=2
unset CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
FAILED=0
step() { echo; echo "== $*"; }
fail() { echo "FAIL: $*"; FAILED=1; }

step "nvidia-smi"
nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,pci.bus_id,mig.mode.current \
    --format=csv,noheader,nounits

step "inventory: colabkit gpus (NVML if nvidia-ml-py is installed), and NVML vs nvidia-smi"
"$PYTHON" -m colabkit gpus || fail "colabkit gpus"
"$PYTHON" - <<'EOF' || fail "inventory"
import time
from colabkit import devices
t = time.perf_counter(); smi = devices.gpus(source="nvidia-smi"); t_smi = time.perf_counter() - t
assert smi.source == "nvidia-smi" and len(smi) > 0, smi.note
t = time.perf_counter(); nvml = devices.gpus(source="nvml"); t_nvml = time.perf_counter() - t
print(f"nvidia-smi: {len(smi)} record(s) in {t_smi * 1000:.1f} ms; NVML: {nvml.source}, {len(nvml)} in {t_nvml * 1000:.1f} ms")
if nvml.source == "nvml":
    assert [(g.label, g.uuid, g.name, g.memory_total, g.pci_bus_id) for g in nvml] == \
           [(g.label, g.uuid, g.name, g.memory_total, g.pci_bus_id) for g in smi], (nvml, smi)
    t = time.perf_counter(); devices.gpus(source="nvml"); print(f"NVML again (initialized): {(time.perf_counter() - t) * 1000:.2f} ms")
else:
    print("nvidia-ml-py missing or unusable here:", nvml.note)
for g in smi:
    assert g.memory_total and g.memory_total > 0 and g.uuid.startswith(("GPU-", "MIG-")), g
print("OK inventory")
EOF

step "selection: use_gpus sets CUDA_DEVICE_ORDER and CUDA_VISIBLE_DEVICES; bad requests name what exists"
"$PYTHON" - <<'EOF' || fail "selection"
import os
import colabkit
from colabkit import devices
inv = devices.gpus()
usable = [g for g in inv if g.usable]
best = colabkit.use_gpus(1)
assert len(best) == 1 and os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID", best
assert os.environ["CUDA_VISIBLE_DEVICES"] == best[0].cuda_id, os.environ["CUDA_VISIBLE_DEVICES"]
by_uuid = colabkit.use_gpus(usable[-1].uuid)
assert os.environ["CUDA_VISIBLE_DEVICES"] == usable[-1].cuda_id
try:
    colabkit.use_gpus(len(usable) + 1)
    raise AssertionError("an impossible request was accepted")
except devices.GPUSelectionError as exc:
    assert f"there {'is' if len(usable) == 1 else 'are'} {len(usable)}" in str(exc), exc
    print("error as expected:", str(exc).splitlines()[0])
print("OK selection:", best[0].describe())
EOF

if "$PYTHON" -c "import tensorflow" >/dev/null 2>&1; then
    step "TensorFlow: use_gpus before TensorFlow starts; set_visible_devices while still possible"
    "$PYTHON" - <<'EOF' || fail "tensorflow: choice before start"
import colabkit
chosen = colabkit.use_gpus(1)
import tensorflow as tf
seen = tf.config.list_logical_devices("GPU")
assert len(seen) == 1, seen
strategy = colabkit.strategy()
with strategy.scope():
    v = tf.Variable(1.0)
with colabkit.device(0) as name:
    x = tf.reduce_sum(tf.ones((256, 256)))
assert "GPU" in x.device, x.device
print("OK TensorFlow sees exactly the chosen GPU:", seen[0].name, type(strategy).__name__, x.device)
EOF
    "$PYTHON" - <<'EOF' || fail "tensorflow: choice after listing"
import colabkit
import tensorflow as tf
physical = tf.config.list_physical_devices("GPU")      # TensorFlow has listed its GPUs, not created them
chosen = colabkit.use_gpus(1)
logical = tf.config.list_logical_devices("GPU")
assert len(logical) == 1, (physical, logical)
print(f"OK after listing {len(physical)} GPU(s), set_visible_devices left {len(logical)}")
from colabkit import devices
others = [g for g in devices.gpus() if g.usable and g.uuid != chosen[0].uuid]
if others:
    try:
        colabkit.use_gpus(others[0].uuid)
        raise AssertionError("a late choice was accepted")
    except devices.DevicesAlreadyInitialized as exc:
        print("OK late choice refused:", str(exc)[:120], "...")
EOF
else
    echo "(TensorFlow not installed: TensorFlow checks skipped)"
fi

if "$PYTHON" -c "import tensorflow" >/dev/null 2>&1; then
    step "health: monitored fits on the GPU (NVML samples, input share, verdicts, no false hang)"
    "$PYTHON" - <<'EOF' || fail "health: monitored fit"
import time
import numpy as np
import colabkit
colabkit.use_gpus(1)
import keras
import tensorflow as tf
rng = np.random.default_rng(0)
x, y = rng.random((8192, 256), dtype="float32"), rng.random((8192, 1), dtype="float32")
def model():
    m = keras.Sequential([keras.Input((256,)), keras.layers.Dense(4096, activation="relu"),
                          keras.layers.Dense(4096, activation="relu"), keras.layers.Dense(1)])
    m.compile("adam", "mse")
    return m
fast = tf.data.Dataset.from_tensor_slices((x, y)).batch(512).cache().repeat().prefetch(tf.data.AUTOTUNE)
mon = colabkit.keras.Monitor(sample_every="0.5s", hang_floor="30s")
t = time.perf_counter()
model().fit(fast, epochs=2, steps_per_epoch=150, validation_data=(x[:1024], y[:1024]), verbose=0, callbacks=[mon])
r = mon.report()
print(r["text"])
print(f"fit took {time.perf_counter() - t:.1f}s; verdicts: {[v['kind'] for v in r['verdicts']]}")
assert r["hangs"] == [], r["hangs"]
assert r["input_fraction"] is not None and r["step_time_s"] > 0, r
if r["gpu_utilization"] is None:
    print("NVML unusable here (nvidia-ml-py missing?):", r["gpu_note"])
else:
    g = r["gpus"][0]
    assert len(r["gpu_utilization"]) == 1 and g["utilization"] is not None and g["utilization"] > 0, g
    assert g["memory_used"] > 0 and g["temperature"] is not None, g
    print("thresholds:", g["thresholds"], "violation shares:", g["violation"], "reasons:", g["reasons"])

def slow(a, b):
    time.sleep(0.02)
    return a, b
def load(a, b):
    a, b = tf.numpy_function(slow, [a, b], [tf.float32, tf.float32])
    return tf.ensure_shape(a, [None, 256]), tf.ensure_shape(b, [None, 1])
starved = tf.data.Dataset.from_tensor_slices((x, y)).batch(512).repeat().map(load)
mon2 = colabkit.keras.Monitor(sample_every="0.5s")
model().fit(starved, epochs=1, steps_per_epoch=50, verbose=0, callbacks=[mon2])
r2 = mon2.report()
print(r2["text"])
assert r2["verdict"].startswith("highly input-bound"), r2["verdict"]
print("OK health: compute-bound share", f"{r['input_fraction']:.1%}", "vs starved", f"{r2['input_fraction']:.1%}")
EOF
fi

if "$PYTHON" -c "import tensorflow" >/dev/null 2>&1; then
    step "Keras restore onto GPU variables (restored arrays copied into each variable's memory), bit-exact"
    "$PYTHON" - "$WORK/keras_restore" <<'EOF' || fail "keras restore on the GPU"
import sys
import numpy as np
import colabkit
colabkit.use_gpus(1)
import keras
def model():
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1024), keras.layers.Dense(1024),
                          keras.layers.Dense(1)])
    m.compile("adam", "mse")
    return m
x = np.random.default_rng(0).random((256, 64), dtype="float32")
def fit(m):   # the second fit finds the first's final checkpoint: it restores, then has nothing left to train
    m.fit(x, x[:, :1], epochs=1, batch_size=32, verbose=0,
          callbacks=[colabkit.keras.AutoResume(sys.argv[1], deadline=None, verbose=0)])
a, b = model(), model()
fit(a)
fit(b)
device = b.layers[1].kernel.value.device
assert "GPU" in device, device
for va, vb in zip(a.variables + a.optimizer.variables, b.variables + b.optimizer.variables):
    assert np.array_equal(va.numpy(), vb.numpy()), va.path
print("OK keras restore on", device)
EOF
fi

step "colabkit run: 2 jobs on the GPU(s), --per-gpu 2"
cat >"$WORK/job.py" <<'EOF'
import os, time
print("job", os.environ["COLABKIT_JOB"], "CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"),
      "CUDA_DEVICE_ORDER", os.environ.get("CUDA_DEVICE_ORDER"))
try:
    import tensorflow as tf
    gpus = tf.config.list_logical_devices("GPU")
    x = tf.reduce_sum(tf.ones((512, 512)))
    print("tensorflow sees", len(gpus), "GPU(s); op ran on", x.device)
    assert len(gpus) == 1 and "GPU" in x.device
except ImportError:
    print("tensorflow not installed")
time.sleep(1)
EOF
cp "$WORK/job.py" "$WORK/job_b.py"
( cd "$WORK" && "$PYTHON" -m colabkit run --per-gpu 2 --run-dir run job.py job_b.py ) || fail "colabkit run"
"$PYTHON" - "$WORK/run/summary.json" <<'EOF' || fail "colabkit run summary"
import json, sys
s = json.load(open(sys.argv[1]))
assert [j["status"] for j in s["jobs"]] == ["ok", "ok"], s
assert all(j["device"].startswith(("GPU", "MIG")) for j in s["jobs"]), s
print("OK run:", [(j["name"], j["device"]) for j in s["jobs"]])
EOF
cat "$WORK"/run/*.log

N_GPUS=$("$PYTHON" -c "import colabkit; print(sum(g.usable and not g.is_mig for g in colabkit.gpus()))")
if [ "$N_GPUS" -ge 2 ]; then
    step "colabkit run: one job on 2 GPUs (--gpus-per-job 2) with a MirroredStrategy"
    cat >"$WORK/pair.py" <<'EOF'
import os
import colabkit
print("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
strategy = colabkit.strategy()
print("strategy", type(strategy).__name__, "replicas", strategy.num_replicas_in_sync)
assert strategy.num_replicas_in_sync == 2, strategy
EOF
    if "$PYTHON" -c "import tensorflow" 2>/dev/null; then
        ( cd "$WORK" && "$PYTHON" -m colabkit run --gpus 2 --gpus-per-job 2 --run-dir run2 pair.py ) \
            || fail "colabkit run --gpus-per-job 2"
        cat "$WORK"/run2/*.log
    else
        echo "(TensorFlow not installed: --gpus-per-job check skipped)"
    fi
else
    echo "(one GPU: --gpus-per-job 2 check skipped)"
fi

step "colabkit doctor: every check runs on a real driver (findings as the box has them)"
# Expect: "OK driver ... supports CUDA up to X.Y, N GPU(s)"; a cuda line per framework (torch / TensorFlow: ok,
# or skip where not installed); "gpus seen" ok in PCI order; pcie/persistence/power/ecc/temperature lines per
# GPU (data-center GPUs report ECC and remapped rows; GeForce: "not reported by this GPU"); with one GPU, p2p and
# nccl are skipped ("one GPU"); with 2+ GPUs and CUDA torch, "an NCCL all-reduce over N GPUs gave the right sum".
# A fail here is the box's (exit 1), not the script's; the step fails only when a check itself broke.
"$PYTHON" -m colabkit doctor --nccl-timeout 120
"$PYTHON" -m colabkit doctor --json --nccl-timeout 120 >"$WORK/doctor.json"
"$PYTHON" - "$WORK/doctor.json" <<'EOF' || fail "colabkit doctor"
import json, sys
findings = json.load(open(sys.argv[1]))
broken = [f for f in findings if "the check itself failed" in f["found"]]
assert not broken, broken
driver = [f for f in findings if f["check"] == "driver"]
assert driver and driver[0]["status"] == "ok", driver
import colabkit
n = sum(1 for g in colabkit.gpus() if not g.is_mig)
assert sorted({f["gpu"] for f in findings if f["check"] == "pcie"}) == list(range(n)), findings
print("OK doctor:", {s: sum(f["status"] == s for f in findings) for s in ("ok", "warn", "fail", "skip")})
EOF

echo
if [ "$FAILED" = 0 ]; then echo "tests/gpu/check.sh: PASSED"; else echo "tests/gpu/check.sh: FAILED"; fi
exit "$FAILED"
