"""`colabkit doctor` against the GPU stand-ins: the real CLI in a subprocess, and run_checks() in Python."""
from __future__ import annotations

import json

import pytest

from colabkit.doctor import run_checks


def lines_of(output: str, check: str) -> list:
    return [ln for ln in output.splitlines() if ln.split()[1:2] == [check] or f"  {check}  " in ln]


def test_a_healthy_box_has_no_fail_and_exits_0(box, run_cli):
    box("doctor_healthy")
    done = run_cli("doctor", "--nccl-timeout", "30")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout and "Traceback" not in done.stderr
    assert "an NCCL all-reduce over 2 GPUs gave the right sum" in done.stdout
    assert "torch sees all 2 GPUs in PCI order" in done.stdout
    assert done.stdout.splitlines()[-1].startswith("0 fail, 0 warn, 17 ok, 0 skip")


def test_json_is_a_list_of_findings(box, run_cli):
    box("doctor_healthy")
    done = run_cli("doctor", "--json", "--skip", "nccl")
    assert done.returncode == 0, done.stderr
    findings = json.loads(done.stdout)
    assert {f["check"] for f in findings} >= {"driver", "cuda", "gpus seen", "pcie", "persistence", "power", "p2p",
                                              "nccl", "ecc", "temperature"}
    assert all(set(f) <= {"check", "status", "gpu", "found", "fix"} and f["status"] in ("ok", "warn", "fail", "skip")
               for f in findings)
    assert sorted(f["gpu"] for f in findings if f["check"] == "pcie") == [0, 1]


def test_a_broken_box_names_the_narrow_link_and_the_hung_all_reduce(box, run_cli):
    box("doctor_broken")
    done = run_cli("doctor", "--nccl-timeout", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    (pcie_line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("WARN") and "pcie" in ln]
    assert "GPU 1: PCIe gen 1 x8 (max gen 4 x16): the link is narrowed to x8 of x16" in pcie_line
    assert "reseat the card" in pcie_line
    (nccl_line,) = [ln for ln in done.stdout.splitlines() if "nccl" in ln.split()[:2]]
    assert nccl_line.startswith("FAIL") and "hung (no result in 2 s)" in nccl_line
    assert "NCCL_P2P_DISABLE=1" in nccl_line
    assert "sudo nvidia-smi -pm 1" in done.stdout
    findings = json.loads(run_cli("doctor", "--json", "--nccl-timeout", "2").stdout)
    assert [f["check"] for f in findings if f["status"] == "fail"] == ["nccl"]


def test_the_suggested_nccl_fix_makes_the_all_reduce_pass(box, run_cli, monkeypatch):
    box("doctor_broken")
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    done = run_cli("doctor", "--nccl-timeout", "30")
    assert done.returncode == 0, done.stdout
    assert "gave the right sum" in done.stdout


def test_no_driver_is_one_clear_fail_line_not_a_traceback(box, run_cli):
    box(None)
    done = run_cli("doctor")
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("FAIL") and "cannot read the GPUs through NVML" in first
    assert "install the NVIDIA driver" in first
    assert all(ln.startswith("SKIP") for ln in done.stdout.splitlines()[1:-1])


def by_check(findings, check):
    return [f for f in findings if f.check == check]


def test_a_framework_built_for_a_newer_cuda_major_fails_with_both_fixes(box):
    box("doctor_healthy", cuda_driver_version=11080, torch={"version": "2.3.1+cu121", "cuda": "12.1"},
        tensorflow={"version": "2.16.1", "cuda_version": "12.3"})
    torch_line, tf_line = by_check(run_checks(skip=("nccl",)), "cuda")
    assert torch_line.status == "fail" and "newer than the driver supports (11.8)" in torch_line.found
    assert "upgrade the driver to >= 525.60.13" in torch_line.fix
    assert "https://download.pytorch.org/whl/cu118" in torch_line.fix
    assert tf_line.status == "fail" and "CUDA <= 11.8" in tf_line.fix


def test_a_newer_cuda_minor_is_a_warning_and_a_cpu_build_says_which_wheel(box):
    box("doctor_healthy", cuda_driver_version=12020, torch={"version": "2.3.1+cpu", "cuda": None},
        tensorflow={"version": "2.16.1", "cuda_version": "12.3"})
    findings = run_checks(skip=("nccl",))
    torch_line, tf_line = by_check(findings, "cuda")
    assert torch_line.status == "warn" and "torch 2.3.1+cpu is a CPU-only build" in torch_line.found
    assert torch_line.fix == "pip install torch --index-url https://download.pytorch.org/whl/cu121"
    assert tf_line.status == "warn" and "minor-version compatibility" in tf_line.found
    assert [f.status for f in by_check(findings, "gpus seen")] == ["skip", "ok"]


def test_frameworks_not_installed_are_skipped(box):
    box("doctor_healthy", torch=None, tensorflow=None)   # null: the stand-ins fail to import, as when not installed
    findings = run_checks()
    assert [(f.status, f.found) for f in by_check(findings, "cuda")] == [
        ("skip", "torch is not installed"), ("skip", "tensorflow is not installed")]
    (nccl,) = by_check(findings, "nccl")
    assert nccl.status == "skip" and "(torch: not installed)" in nccl.found


def test_cuda_order_other_than_pci_is_a_warning_with_the_variable_to_set(box, monkeypatch):
    # GPU 1 has more memory: CUDA's default (fastest first) puts it first
    box("doctor_healthy", gpu_changes={1: {"memory_total": 49140, "name": "NVIDIA RTX A6000"}})
    lines = by_check(run_checks(skip=("nccl",)), "gpus seen")
    assert [f.status for f in lines] == ["warn", "warn"]
    assert "not in PCI order: its cuda:0.. are 0000:3b:00.0, 0000:18:00.0" in lines[0].found
    assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID" in lines[0].fix
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert [f.status for f in by_check(run_checks(skip=("nccl",)), "gpus seen")] == ["ok", "ok"]


def test_ecc_errors_power_cap_and_a_hot_idle_gpu(box):
    box("doctor_healthy", gpu_changes={
        0: {"ecc": {"volatile_uncorrected": 2, "aggregate_uncorrected": 5}, "power_limit": 180, "temperature": 67},
        1: {"ecc": {"remapped_rows": {"correctable": 1, "uncorrectable": 1, "pending": True}}}})
    findings = run_checks(skip=("nccl",))
    ecc0 = [f for f in by_check(findings, "ecc") if f.gpu == 0]
    assert [f.status for f in ecc0] == ["fail"] and "2 uncorrected ECC error(s)" in ecc0[0].found
    assert "sudo nvidia-smi -r -i 0" in ecc0[0].fix
    (ecc1,) = [f for f in by_check(findings, "ecc") if f.gpu == 1]
    assert ecc1.status == "warn" and "remapped rows pending" in ecc1.found
    (power0,) = [f for f in by_check(findings, "power") if f.gpu == 0]
    assert power0.status == "warn" and "180 W, below the default 230 W" in power0.found
    assert "sudo nvidia-smi -i 0 -pl 230" in power0.fix
    (temp0,) = [f for f in by_check(findings, "temperature") if f.gpu == 0]
    assert temp0.status == "warn" and "67 C while idle" in temp0.found


def test_a_geforce_box_skips_what_it_does_not_report(box):
    box("workstation")   # no ECC, PCIe, persistence or power keys: NotSupported, as on GeForce boards
    findings = run_checks(skip=("nccl",))
    assert {f.status for f in by_check(findings, "ecc")} == {"skip"}
    assert "not reported by this GPU" in by_check(findings, "ecc")[0].found
    assert {f.status for f in by_check(findings, "pcie")} == {"skip"}
    (busy,) = [f for f in by_check(findings, "temperature") if f.gpu == 1]
    assert busy.status == "skip" and "busy" in busy.found


def test_an_unknown_check_to_skip_is_named():
    with pytest.raises(ValueError, match="to skip: 'bogus'; the checks are driver, cuda"):
        run_checks(skip=("bogus",))


def test_a_failing_nccl_all_reduce_names_its_error_and_the_fix(box):
    box("doctor_healthy", torch={"version": "2.3.1+cu121", "cuda": "12.1", "nccl": "fail"})
    (nccl,) = by_check(run_checks(nccl_timeout=30), "nccl")
    assert nccl.status == "fail" and "all-reduce over 2 GPUs failed: " in nccl.found
    assert "unhandled system error" in nccl.found
    assert nccl.fix.startswith("try NCCL_P2P_DISABLE=1") and "NCCL_DEBUG=INFO" in nccl.fix


def test_pcie_generation_is_judged_under_load_and_against_the_slot(box):
    box("doctor_healthy", gpu_changes={
        0: {"utilization": 95, "processes": [{"pid": 4242, "name": "python", "used_memory": 9000}]},
        1: {"pcie": {"gen": 3, "max_gen": 3, "gpu_max_gen": 4, "width": 16, "max_width": 16}}})
    pcie = {f.gpu: f for f in by_check(run_checks(skip=("nccl",)), "pcie")}
    assert pcie[0].status == "warn" and "below its maximum generation while 95% busy" in pcie[0].found
    assert pcie[1].status == "warn" and "caps the link at gen 3; the GPU supports gen 4" in pcie[1].found


def test_a_lost_gpu_is_a_driver_fail_and_the_rest_is_still_checked(box):
    box("doctor_healthy", gpu_changes={1: {"lost": True}})
    findings = run_checks(skip=("nccl",))
    driver = by_check(findings, "driver")
    assert [f.status for f in driver] == ["ok", "fail"]
    assert "NVML cannot open GPU 1: GPU is lost" in driver[1].found and "Xid" in driver[1].fix
    assert [f.gpu for f in by_check(findings, "pcie")] == [0]
    assert by_check(findings, "p2p")[0].found == "one GPU: no peer-to-peer to check"
    assert [f.found for f in by_check(findings, "gpus seen")] == [
        "torch sees 2 GPUs, NVML could open only 1", "tensorflow sees 2 GPUs, NVML could open only 1"]


@pytest.mark.slow
def test_the_probe_reads_the_real_pytorch_here():
    """The probe script against the PyTorch installed here (a CPU build in CI): the real attribute names."""
    torch = pytest.importorskip("torch")
    from colabkit.doctor.probes import probe_framework
    found = probe_framework("torch")
    assert found["installed"] and found["version"] == torch.__version__ and found["cuda"] == torch.version.cuda
    assert found["devices"] == [] or all("name" in d and "pci" in d for d in found["devices"])
