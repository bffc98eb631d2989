"""Fixtures for the doctor tests: the GPU stand-ins (NVML, nvidia-smi) plus the `torch` and `tensorflow`
stand-ins (tests/standins/frameworks) the doctor's subprocess probes import."""
from __future__ import annotations

import copy
import os

import pytest

from tests.devices.conftest import GPU_STANDINS, fake_gpus, run_cli  # noqa: F401 - shared fixtures

FRAMEWORK_STANDINS = GPU_STANDINS.parent / "frameworks"


@pytest.fixture
def box(fake_gpus, monkeypatch):  # noqa: F811 - the shared fixture, used here
    """``box(scenario, gpu_changes={index: {key: value}}, **top_level)``: the stand-ins over that scenario, with
    the framework stand-ins first on PYTHONPATH (for the probes' subprocesses); returns the scenario data."""
    monkeypatch.setenv("PYTHONPATH", f"{FRAMEWORK_STANDINS}{os.pathsep}{os.environ['PYTHONPATH']}")
    for k in ("NCCL_P2P_DISABLE",):
        monkeypatch.delenv(k, raising=False)

    def use(scenario, gpu_changes=None, **overrides):
        if scenario is None:
            return fake_gpus(None)
        from tests.devices.conftest import SCENARIOS
        import json
        data = json.loads((SCENARIOS / f"{scenario}.json").read_text())
        gpus = copy.deepcopy(data["gpus"])
        for index, changes in (gpu_changes or {}).items():
            gpus[index].update(changes)
        return fake_gpus(scenario, gpus=gpus, **overrides)
    return use
