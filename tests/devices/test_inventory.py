"""GPU inventory through the NVML stand-in and the nvidia-smi stand-in (tests/standins/gpu)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from colabkit import devices

MIB = 2 ** 20


def test_home_rig_through_nvml(fake_gpus):
    fake_gpus("home_rig")
    inv = devices.gpus()
    assert inv.source == "nvml" and inv.driver == "535.183.01"
    assert [g.index for g in inv] == [0, 1]
    busy, idle = inv
    assert busy.name == "NVIDIA GeForce GTX 1080" and idle.name == "NVIDIA GeForce GTX 1080 Ti"
    assert busy.uuid == "GPU-1c3e5a7f-0b2d-4e6f-8a9b-0c1d2e3f4a5b"
    assert (busy.memory_total, busy.memory_used, busy.memory_free) == (8192 * MIB, 7811 * MIB, 381 * MIB)
    assert (busy.utilization, busy.temperature, busy.pci_bus_id) == (97, 83, "00000000:01:00.0")
    assert busy.processes == (devices.Process(pid=4242, name="python3", used_memory=7680 * MIB),)
    assert idle.processes == () and idle.utilization == 0
    assert fake_gpus.smi_calls() == []  # NVML answered; nvidia-smi was not run


def test_nvidia_smi_fallback_when_nvml_cannot_load(fake_gpus):
    fake_gpus("home_rig", nvml=False)
    inv = devices.gpus()
    assert inv.source == "nvidia-smi" and inv.driver == "535.183.01"
    assert [g.name for g in inv] == ["NVIDIA GeForce GTX 1080", "NVIDIA GeForce GTX 1080 Ti"]
    assert inv[0].memory_free == 381 * MIB and inv[0].processes[0].pid == 4242
    queried = [c for c in fake_gpus.smi_calls() if c[0].startswith("--query-gpu=")]
    assert len(queried) == 1 and queried[0][1] == "--format=csv,noheader,nounits"


@pytest.mark.parametrize("scenario", ["home_rig", "odd_fields", "colab_t4"])
def test_both_sources_agree(fake_gpus, scenario):
    fake_gpus(scenario)
    through_nvml = devices.gpus(source="nvml")
    through_smi = devices.gpus(source="nvidia-smi")
    assert (through_nvml.source, through_smi.source) == ("nvml", "nvidia-smi")
    assert [g.as_dict() for g in through_nvml] == [g.as_dict() for g in through_smi]


def test_na_fields_commas_and_old_bindings(fake_gpus):
    fake_gpus("odd_fields")  # NVML returns bytes here, as bindings before 11.515 did
    for source in ("nvml", "nvidia-smi"):
        sample, vgpu, k80 = devices.gpus(source=source)
        assert sample.name == "NVIDIA Graphics Device, Engineering Sample"
        assert (sample.utilization, sample.temperature) == (None, None)     # [Not Supported], [N/A]
        assert (vgpu.utilization, vgpu.temperature) == (None, None)         # [N/A], [Not Supported]
        assert (k80.memory_total, k80.memory_used, k80.memory_free) == (None, None, None)
        assert k80.utilization == 12 and sample.uuid == "GPU-0a0b0c0d-1111-2222-3333-444455556666"
        assert sample.processes == (devices.Process(pid=777, name="trainer", used_memory=None),)
    table = devices.gpus().table()
    assert "NVIDIA Graphics Device, Engineering Sample" in table and "n/a / n/a" in table
    assert "trainer:777 n/a" in table


def test_mig_instances_listed_after_their_gpu(fake_gpus):
    fake_gpus("mig")
    for source in ("nvml", "nvidia-smi"):
        inv = devices.gpus(source=source)
        assert [g.label for g in inv] == ["0", "0:0", "0:1", "1"]
        parent, first, second, plain = inv
        assert parent.mig_enabled and not parent.usable and parent.utilization is None
        assert not plain.mig_enabled and plain.usable
        assert (first.uuid, second.uuid) == ("MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f",
                                             "MIG-cba663e8-9bed-5b7c-aa45-b0b4ed1ea2a3")
        assert first.is_mig and first.index == 0 and first.cuda_id == first.uuid
        assert second.name == "NVIDIA A100-SXM4-40GB MIG 2g.10gb"
    nvml = devices.gpus(source="nvml")
    assert nvml[1].memory_total == 19968 * MIB and nvml[2].memory_used == 11 * MIB  # per-instance memory via NVML
    assert "MIG mode: use its instances" in nvml.table() and "2 GPUs, 2 MIG instances" in nvml.table()


def test_old_driver_rejecting_newer_query_fields(fake_gpus):
    fake_gpus("old_driver", nvml=False)
    inv = devices.gpus()
    assert [g.name for g in inv] == ["Tesla P100-PCIE-16GB"] and inv[0].memory_total == 16280 * MIB
    queries = [c[0] for c in fake_gpus.smi_calls() if c[0].startswith("--query-gpu=")]
    assert len(queries) == 2 and "mig.mode.current" in queries[0] and "mig.mode.current" not in queries[1]


def test_no_driver_is_an_empty_inventory_with_one_line(fake_gpus):
    fake_gpus(None)
    inv = devices.gpus()
    assert list(inv) == [] and inv.source == "none"
    assert inv.note.startswith("No NVIDIA GPU found (NVML: ")
    assert "couldn't communicate with the NVIDIA driver" in inv.note
    assert inv.table() == inv.note and "\n" not in inv.note


def test_lost_gpu_is_reported_not_fatal(fake_gpus):
    data = fake_gpus("home_rig")
    data["gpus"][0]["lost"] = True
    fake_gpus("home_rig", gpus=data["gpus"])
    inv = devices.gpus()
    assert [g.index for g in inv] == [1] and "GPU 0: GPU is lost" in inv.note


def test_cli_gpus_table_and_json(fake_gpus, run_cli):
    fake_gpus("home_rig")
    table = run_cli("gpus")
    assert table.returncode == 0, table.stderr
    assert "NVIDIA GeForce GTX 1080 Ti" in table.stdout and "2 GPUs (via NVML, driver 535.183.01)" in table.stdout
    as_json = run_cli("gpus", "--json")
    data = json.loads(as_json.stdout)
    assert data["source"] == "nvml" and [g["label"] for g in data["gpus"]] == ["0", "1"]
    assert data["gpus"][0]["utilization"] == 97 and data["gpus"][0]["processes"][0]["pid"] == 4242
    fake_gpus(None)
    none = run_cli("gpus", "--json")
    assert none.returncode == 0 and json.loads(none.stdout)["gpus"] == []


def test_import_costs_nothing(fake_gpus):
    fake_gpus("home_rig")
    code = ("import sys, colabkit; colabkit.gpus; colabkit.use_gpus; colabkit.strategy; colabkit.device; "
            "print(sorted(m for m in ('pynvml', 'tensorflow', 'torch', 'papermill') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
