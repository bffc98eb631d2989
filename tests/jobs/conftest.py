"""Fixtures for the `colabkit run` tests: the GPU stand-ins (tests/standins/gpu) and the CLI runner."""
from tests.devices.conftest import fake_gpus, run_cli  # noqa: F401 - shared fixtures: NVML stand-in, CLI
