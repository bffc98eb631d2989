"""strategy(), device() and the "TensorFlow already initialized" path with real TensorFlow (one subprocess)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import colabkit
from colabkit.devices import DevicesAlreadyInitialized

PROBE = Path(__file__).with_name("tf_probe.py")


def test_tensorflow_paths(fake_gpus):
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed")
    fake_gpus("home_rig")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", COLABKIT_GPU_CLAIMS="off")   # claims: test_claims.py
    out = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, timeout=300, env=env)
    lines = [line for line in out.stdout.splitlines() if line.startswith("REPORT ")]
    assert out.returncode == 0 and lines, out.stdout + out.stderr
    r = json.loads(lines[0][len("REPORT "):])

    # imported but untouched: the choice goes through the environment only, TensorFlow still untouched after it
    assert r["state_at_import"] == [False, False] and r["state_after_choice"] == [False, False]
    assert r["chosen"] == [1] and r["env_after_choice"] == "1"

    # TensorFlow sees no GPU here: default strategy on the CPU, device() places on the CPU, one line each
    assert r["strategy"] == "_DefaultDistributionStrategy" and r["default_strategy"] and r["replicas"] == 1
    assert r["device0"][0] == "/device:CPU:0" and r["device0"][1].endswith("CPU:0")
    assert r["device1"] == "/device:CPU:0"
    assert "device(-1)" in r["device_negative"]
    assert "no GPU visible to TensorFlow: using the default strategy on the CPU." in " ".join(r["log"])
    assert sum("colabkit.device() places on the CPU" in line for line in r["log"]) == 1
    assert r["state_after_strategy"] == [True, True]

    # after TensorFlow initialized its devices, a different choice is refused with what happened and what to do
    message = r["late_choice"]
    assert message.startswith("use_gpus('0') chose GPU 0 (NVIDIA GeForce GTX 1080), but TensorFlow has already "
                              "initialized its GPUs in this process (it sees 0: none)")
    assert "Restart the kernel" in message and "before any TensorFlow or Keras code touches a device" in message
    assert r["env_after_late_choice"] == "1"     # the failed choice left the environment as it was
    assert len(r["late_choice_lenient"]) == 1 and "strict=False" in r["late_choice_lenient"][0]
    assert r["env_after_lenient"] == "0"


# TensorFlow has listed its GPUs but not created them: only a TensorFlow that sees GPUs can take this path, so it
# runs against the stand-in in conftest.py (tests/gpu/check.sh takes it with real TensorFlow on a GPU machine).

def test_listed_not_initialized_uses_set_visible_devices(fake_gpus, tf_standin, monkeypatch):
    tf = tf_standin(fake_gpus("home_rig"))
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")   # as when TensorFlow listed its GPUs
    assert len(tf.module.config.list_physical_devices("GPU")) == 2
    chosen = colabkit.use_gpus(1)
    assert [g.index for g in chosen] == [1]
    assert [d.nvidia_index for d in tf.visible] == [1] and tf.growth == {"/physical_device:GPU:1": True}
    assert len(tf.module.config.list_logical_devices("GPU")) == 1
    with pytest.raises(DevicesAlreadyInitialized, match=r"already initialized its GPUs in this process \(it sees 1"):
        colabkit.use_gpus("0")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    colabkit.use_gpus("1")   # the choice already in force: nothing to change


def test_listed_in_cuda_default_order_is_mapped_only_when_known(fake_gpus, tf_standin):
    data = fake_gpus("home_rig")   # a GTX 1080 and a GTX 1080 Ti: CUDA's default order differs from nvidia-smi's
    tf = tf_standin(data)
    assert [d.nvidia_index for d in tf.module.config.list_physical_devices("GPU")] == [1, 0]
    with pytest.raises(DevicesAlreadyInitialized, match=r"already listed its GPUs in this process \(it sees 2"):
        colabkit.use_gpus("0")
    assert "CUDA_VISIBLE_DEVICES" not in os.environ and tf.visible == tf.physical

    same = [dict(g, name="NVIDIA GeForce RTX 3090", memory_total=24576) for g in data["gpus"]]
    tf = tf_standin(fake_gpus("home_rig", gpus=same))    # identical cards: CUDA's order is the PCI order
    tf.module.config.list_physical_devices("GPU")
    colabkit.use_gpus("0")
    assert [d.nvidia_index for d in tf.visible] == [0]
