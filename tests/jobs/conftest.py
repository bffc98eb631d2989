"""Fixtures for the `colabkit run` tests: the GPU stand-ins (tests/standins/gpu) and the CLI runner."""
import pytest

from tests.devices.conftest import fake_gpus, run_cli  # noqa: F401 - shared fixtures: NVML stand-in, CLI


@pytest.fixture(autouse=True)
def no_claims(fake_gpus, monkeypatch):  # noqa: F811 - the shared fixture above
    """These tests pin the queue itself (home_rig's GPU 0 runs another user's python3 that holds no GPU claim,
    which a claiming queue leaves out): `colabkit run` with claims is tests/devices/test_claims.py's."""
    monkeypatch.setenv("COLABKIT_GPU_CLAIMS", "off")
