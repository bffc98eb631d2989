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


def forget_module(monkeypatch, name: str) -> None:
    """Remove ``sys.modules[name]`` for this test; monkeypatch's undo puts back exactly what was there before,
    or nothing, whatever the test imports under that name meanwhile (a stand-in)."""
    monkeypatch.setitem(sys.modules, name, sys.modules.get(name))   # records the entry as it is now (or absent)
    monkeypatch.delitem(sys.modules, name)


@pytest.fixture
def fake_gpus(monkeypatch, tmp_path):
    """Install the stand-ins and return ``use(scenario, **overrides)``, which points both at a scenario.

    ``scenario`` is a file name in tests/standins/gpu/scenarios (without .json) or None for "no driver";
    GPU claims live in ``<tmp>/gpu-claims`` (COLABKIT_GPU_CLAIMS, also for subprocesses);
    overrides replace top-level scenario keys. The stand-in `pynvml` shadows nvidia-ml-py here (sys.path) and in
    subprocesses (PYTHONPATH); `nvidia-smi` is first on PATH. CUDA_* variables, colabkit's NVML handle and
    choice, and `tensorflow` / `torch` in sys.modules (loaded by other tests) are put back afterwards.
    """
    from colabkit.devices import distribute, nvml, state

    for k in CUDA_VARS:   # unset, and put back as they were afterwards, also when use_gpus() set them meanwhile
        monkeypatch.setenv(k, "")   # (recorded first, so that the undo also removes one that was not set)
        monkeypatch.delenv(k)
    # through monkeypatch, so that its undo (last, in reverse order) also unwinds a stand-in module a test
    # installs on top, such as torch_standin's, instead of deleting the real module put back here (a real
    # TensorFlow or PyTorch a test imports stays: neither can be imported twice in one process)
    for k in ("tensorflow", "torch"):
        monkeypatch.delitem(sys.modules, k, raising=False)
    forget_module(monkeypatch, "pynvml")   # the stand-in pynvml a test imports goes; a real one comes back
    monkeypatch.syspath_prepend(str(GPU_STANDINS))
    monkeypatch.setenv("PATH", f"{GPU_STANDINS / 'bin'}{os.pathsep}{os.environ['PATH']}")
    parts = [str(GPU_STANDINS), str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(dict.fromkeys(parts)))
    monkeypatch.setenv("COLABKIT_TEST_PYTHON", sys.executable)
    smi_log = tmp_path / "nvidia-smi-calls.jsonl"
    monkeypatch.setenv("COLABKIT_TEST_NVIDIA_SMI_LOG", str(smi_log))
    monkeypatch.delenv("COLABKIT_TEST_GPUS", raising=False)
    monkeypatch.setattr(nvml, "_nvml_module", None)
    monkeypatch.setattr(state, "current", state.State())
    # GPU claims in a folder of this test's own (here and in subprocesses), none handed down from outside
    monkeypatch.setenv("COLABKIT_GPU_CLAIMS", str(tmp_path / "gpu-claims"))
    for k in ("COLABKIT_GPU_CLAIM", "COLABKIT_GPU_SHARE", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)
    monkeypatch.setattr(distribute, "_said", set())

    def use(scenario: str | None, **overrides):
        monkeypatch.setattr(nvml, "_nvml_module", None)
        monkeypatch.delitem(sys.modules, "pynvml", raising=False)
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
    return use


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


class _TFStandin:
    """The slice of TensorFlow's device API colabkit.devices touches, with TensorFlow's rules: physical devices
    are enumerated once, on the first list_physical_devices, from the CUDA_* variables in force then (CUDA's
    default order, FASTEST_FIRST, is modelled as most memory first); logical devices (the context) are created
    on the first list_logical_devices; after that set_visible_devices / set_memory_growth raise RuntimeError."""

    def __init__(self, scenario: dict):
        self.scenario_gpus = scenario["gpus"]
        self.physical = None
        self.visible = None
        self.initialized = False
        self.growth = {}
        self.context_module = types.SimpleNamespace(context=lambda: types.SimpleNamespace(
            _physical_devices=None if self.physical is None else list(self.physical),
            _context_handle=object() if self.initialized else None))
        config = types.SimpleNamespace(
            list_physical_devices=self.list_physical_devices, get_visible_devices=self.get_visible_devices,
            set_visible_devices=self.set_visible_devices, list_logical_devices=self.list_logical_devices,
            experimental=types.SimpleNamespace(set_memory_growth=self.set_memory_growth))
        self.module = types.ModuleType("tensorflow")
        self.module.config = config

    def _enumerate(self):
        gpus = list(enumerate(self.scenario_gpus))
        if os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
            gpus.sort(key=lambda ig: (-ig[1]["memory_total"], ig[1]["pci_bus_id"]))
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            picked = []
            for token in visible.split(","):
                token = token.strip()
                match = [ig for n, ig in enumerate(gpus) if token == str(n) or ig[1]["uuid"] == token]
                if not match:
                    break
                picked.append(match[0])
            gpus = picked
        self.physical = [types.SimpleNamespace(name=f"/physical_device:GPU:{n}", device_type="GPU", nvidia_index=i)
                         for n, (i, _) in enumerate(gpus)]
        self.visible = list(self.physical)

    def list_physical_devices(self, kind=None):
        if self.physical is None:
            self._enumerate()
        return list(self.physical)

    def get_visible_devices(self, kind=None):
        self.list_physical_devices()
        return list(self.visible)

    def set_visible_devices(self, devices, kind=None):
        self.list_physical_devices()
        if [d.name for d in devices] == [d.name for d in self.visible]:
            return
        if self.initialized:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self.visible = list(devices)

    def set_memory_growth(self, device, enable):
        if self.initialized:
            raise RuntimeError("Physical devices cannot be modified after being initialized")
        self.growth[device.name] = enable

    def list_logical_devices(self, kind=None):
        self.list_physical_devices()
        self.initialized = True
        return [types.SimpleNamespace(name=f"/device:GPU:{n}", device_type="GPU") for n in range(len(self.visible))]


@pytest.fixture
def tf_standin(fake_gpus, monkeypatch):
    """Returns ``make(scenario_data)``: installs a TensorFlow stand-in (see _TFStandin) as `tensorflow` and
    `tensorflow.python.eager.context` in sys.modules, for the paths a CPU-only TensorFlow cannot take."""
    names = ("tensorflow", "tensorflow.python", "tensorflow.python.eager", "tensorflow.python.eager.context")

    def make(data: dict) -> _TFStandin:
        tf = _TFStandin(data)
        python, eager = types.ModuleType("tensorflow.python"), types.ModuleType("tensorflow.python.eager")
        context = types.ModuleType("tensorflow.python.eager.context")
        context.context = tf.context_module.context
        tf.module.python, python.eager, eager.context = python, eager, context
        for name, module in zip(names, (tf.module, python, eager, context)):
            monkeypatch.setitem(sys.modules, name, module)
        return tf

    return make
