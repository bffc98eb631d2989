"""Fixtures for the GPU tests: the NVML and nvidia-smi stand-ins (tests/standins/gpu) over a JSON scenario."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
REPO_ROOT = TESTS.parent
GPU_STANDINS = TESTS / "standins" / "gpu"
SCENARIOS = GPU_STANDINS / "scenarios"
CUDA_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TF_FORCE_GPU_ALLOW_GROWTH")


@pytest.fixture
def fake_gpus(monkeypatch, tmp_path):
    """Install the stand-ins and return ``use(scenario, **overrides)``, which points both at a scenario.

    ``scenario`` is a file name in tests/standins/gpu/scenarios (without .json) or None for "no driver";
    overrides replace top-level scenario keys. The stand-in `pynvml` shadows nvidia-ml-py here (sys.path) and in
    subprocesses (PYTHONPATH); `nvidia-smi` is first on PATH. CUDA_* variables, colabkit's NVML handle and
    choice, and `tensorflow` / `torch` in sys.modules (loaded by other tests) are put back afterwards.
    """
    import colabkit.devices as devices

    saved_env = {k: os.environ.get(k) for k in CUDA_VARS}
    saved_modules = {k: sys.modules.get(k) for k in ("pynvml", "tensorflow", "torch")}
    for k in CUDA_VARS:
        os.environ.pop(k, None)
    for k in saved_modules:
        sys.modules.pop(k, None)
    monkeypatch.syspath_prepend(str(GPU_STANDINS))
    monkeypatch.setenv("PATH", f"{GPU_STANDINS / 'bin'}{os.pathsep}{os.environ['PATH']}")
    parts = [str(GPU_STANDINS), str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(dict.fromkeys(parts)))
    monkeypatch.setenv("COLABKIT_TEST_PYTHON", sys.executable)
    smi_log = tmp_path / "nvidia-smi-calls.jsonl"
    monkeypatch.setenv("COLABKIT_TEST_NVIDIA_SMI_LOG", str(smi_log))
    monkeypatch.delenv("COLABKIT_TEST_GPUS", raising=False)
    monkeypatch.setattr(devices, "_nvml_module", None)
    monkeypatch.setattr(devices, "_state", devices._State())
    monkeypatch.setattr(devices, "_said", set())

    def use(scenario: str | None, **overrides):
        devices._nvml_module = None
        sys.modules.pop("pynvml", None)
        if scenario is None:
            monkeypatch.delenv("COLABKIT_TEST_GPUS", raising=False)
            return None
        data = json.loads((SCENARIOS / f"{scenario}.json").read_text())
        data.update(overrides)
        path = tmp_path / f"scenario-{scenario}-{len(list(tmp_path.glob('scenario-*')))}.json"
        path.write_text(json.dumps(data))
        monkeypatch.setenv("COLABKIT_TEST_GPUS", str(path))
        return data

    use.smi_calls = lambda: [json.loads(line) for line in smi_log.read_text().splitlines()] if smi_log.exists() else []
    yield use
    for k, v in saved_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    sys.modules.pop("pynvml", None)
    for k, v in saved_modules.items():
        if v is not None:
            sys.modules[k] = v


@pytest.fixture
def run_cli(tmp_path):
    """Run `python -m colabkit ARGS` in a subprocess (cwd: tmp_path unless given); returns CompletedProcess."""
    def run(*args, cwd=None, timeout=120, **kwargs):
        return subprocess.run([sys.executable, "-m", "colabkit", *map(str, args)], cwd=cwd or tmp_path,
                              capture_output=True, text=True, timeout=timeout, **kwargs)
    return run


@pytest.fixture
def torch_standin(monkeypatch):
    """A `torch` module with the one call colabkit makes (torch.cuda.is_initialized), reporting CUDA started."""
    cuda = types.SimpleNamespace(is_initialized=lambda: True)
    module = types.ModuleType("torch")
    module.cuda = cuda
    monkeypatch.setitem(sys.modules, "torch", module)
    return module
