"""Choosing GPUs and applying the choice (CUDA_* variables), over the GPU stand-ins."""
from __future__ import annotations

import logging
import os

import pytest

import colabkit
from colabkit import devices
from colabkit.devices import DevicesAlreadyInitialized, GPUSelectionError, GPUSelectionWarning

BUSY_UUID = "GPU-1c3e5a7f-0b2d-4e6f-8a9b-0c1d2e3f4a5b"   # home_rig GPU 0: GTX 1080, 381 MiB free, 97 %
IDLE_UUID = "GPU-9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"   # home_rig GPU 1: GTX 1080 Ti, 11 GiB free, 0 %
MIG_SMALL = "MIG-cba663e8-9bed-5b7c-aa45-b0b4ed1ea2a3"


@pytest.fixture(autouse=True)
def no_claims(fake_gpus, monkeypatch):
    """These tests pin the choice itself, as on Colab or with the setting gpu_claims = "off" (home_rig's GPU 0
    runs another user's python3 that holds no claim, which a claiming pick would leave out): claims are
    tests/devices/test_claims.py's."""
    monkeypatch.setenv("COLABKIT_GPU_CLAIMS", "off")


def env():
    return {k: os.environ.get(k) for k in ("CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH")}


def test_count_picks_most_free_memory_and_applies(fake_gpus):
    fake_gpus("home_rig")
    chosen = colabkit.use_gpus(1)
    assert [g.index for g in chosen] == [1]
    assert env() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert devices.chosen() == chosen
    assert [g.index for g in colabkit.use_gpus(2)] == [0, 1] and os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_equal_free_memory_then_least_busy(fake_gpus):
    data = fake_gpus("home_rig")
    for gpu, util in zip(data["gpus"], (5, 60)):
        gpu.update(memory_total=11264, memory_used=100, utilization=util)
    fake_gpus("home_rig", gpus=data["gpus"])
    assert [g.index for g in colabkit.use_gpus(1)] == [0]
    data["gpus"][0]["utilization"] = 90
    fake_gpus("home_rig", gpus=data["gpus"])
    assert [g.index for g in colabkit.use_gpus(1)] == [1]


@pytest.mark.parametrize("request_, expected, visible", [
    ("0,1", [0, 1], "0,1"),
    ("1,0", [1, 0], "1,0"),            # explicit order is kept: CUDA device 0 is GPU 1
    ([1], [1], "1"),
    ("1", [1], "1"),                   # a string names indices, as CUDA_VISIBLE_DEVICES does
    (IDLE_UUID, [1], "1"),
    ("gpu-1c3e5a7f", [0], "0"),        # a unique UUID prefix, any case
    (f"{IDLE_UUID}, 0", [1, 0], "1,0"),
])
def test_explicit_indices_and_uuids(fake_gpus, request_, expected, visible):
    fake_gpus("home_rig")
    assert [g.index for g in colabkit.use_gpus(request_)] == expected
    assert os.environ["CUDA_VISIBLE_DEVICES"] == visible and os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_auto_with_filters(fake_gpus):
    fake_gpus("home_rig")
    assert [g.index for g in colabkit.use_gpus("auto")] == [0, 1]
    assert [g.index for g in colabkit.use_gpus("auto", min_free="8GiB")] == [1]
    assert [g.index for g in colabkit.use_gpus("auto", max_util=50)] == [1]
    assert [g.index for g in colabkit.use_gpus("auto", min_free=300 * 2 ** 20, max_util="100%")] == [0, 1]


@pytest.mark.parametrize("request_, kwargs, needles", [
    ("2", {}, ["use_gpus('2')", "there is no GPU 2", "GPU 0 (NVIDIA GeForce GTX 1080,", "GPU 1 (NVIDIA GeForce GTX 1080 Ti,"]),
    ("7,0", {}, ["there is no GPU 7", BUSY_UUID, IDLE_UUID]),
    ("1,1", {}, ["GPU 1 (NVIDIA GeForce GTX 1080 Ti", "named twice"]),
    ([1, IDLE_UUID[:12]], {}, ["named twice (as '1' and 'GPU-9f8e7d6c')"]),
    ("GPU-deadbeef-0000", {}, ["no GPU or MIG instance has UUID 'GPU-deadbeef-0000'", BUSY_UUID, IDLE_UUID]),
    ("fastest", {}, ["'fastest' is neither a GPU index", "GPU 0 (NVIDIA GeForce GTX 1080,"]),
    ("auto", {"min_free": "lots"}, ["min_free='lots' is not a size", '"8GiB"']),
    (1, {"max_util": 150}, ["max_util=150", "from 0 to 100"]),
    (3, {}, ["use_gpus(3) asked for 3 GPUs; there are 2 on this machine", "GPU 0 (", "GPU 1 ("]),
    (2, {"min_free": "8GiB"}, ["asked for 2 GPUs with at least 8.0 GiB free; 1 of the 2 GPUs on this machine "
                               "qualifies", "does not qualify: 381.0 MiB free"]),
    ("auto", {"min_free": "20GiB"}, ["asked for GPUs with at least 20.0 GiB free; 0 of the 2 GPUs"]),
    ("0", {"max_util": 50}, ["GPU 0 (NVIDIA GeForce GTX 1080", "has 97 % busy"]),
    (-1, {}, ["use_gpus(-1)", "0 or more"]),
    (True, {}, ["use_gpus(True)", "expected a number of GPUs"]),
    ("", {}, ["expected indices or UUIDs"]),
    (2.5, {}, ["not a float"]),
])
def test_bad_requests_name_what_was_asked_and_what_exists(fake_gpus, request_, kwargs, needles):
    fake_gpus("home_rig")
    with pytest.raises(GPUSelectionError) as info:
        colabkit.use_gpus(request_, **kwargs)
    for needle in needles:
        assert needle in str(info.value)
    assert env() == {"CUDA_DEVICE_ORDER": None, "CUDA_VISIBLE_DEVICES": None, "TF_FORCE_GPU_ALLOW_GROWTH": None}


def test_colab_single_gpu(fake_gpus):
    fake_gpus("colab_t4")
    assert [g.name for g in colabkit.use_gpus(1)] == ["Tesla T4"]
    with pytest.raises(GPUSelectionError, match=r"asked for 2 GPUs; there is 1 on this machine:\n  GPU 0 \(Tesla T4"):
        colabkit.use_gpus(2)
    with pytest.warns(GPUSelectionWarning, match=r"(?s)there is 1 on this machine.*Using the best 1 \(strict=False\)"):
        chosen = colabkit.use_gpus(2, strict=False)
    assert [g.index for g in chosen] == [0] and os.environ["CUDA_VISIBLE_DEVICES"] == "0"


def test_strict_false_with_nothing_qualifying_hides_the_gpus(fake_gpus):
    fake_gpus("home_rig")
    with pytest.warns(GPUSelectionWarning, match="Running on the CPU"):
        chosen = colabkit.use_gpus("auto", min_free="64GiB", strict=False)
    assert list(chosen) == [] and os.environ["CUDA_VISIBLE_DEVICES"] == "-1"


def test_zero_gpus_hides_them(fake_gpus):
    fake_gpus("home_rig")
    assert list(colabkit.use_gpus(0)) == [] and os.environ["CUDA_VISIBLE_DEVICES"] == "-1"
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in os.environ


def test_no_gpu_machine_takes_the_cpu_path_with_one_line(fake_gpus, caplog):
    fake_gpus(None)
    with caplog.at_level(logging.WARNING, logger="colabkit"):
        chosen = colabkit.use_gpus(2)
        assert list(colabkit.use_gpus("auto")) == []
    assert list(chosen) == [] and "running on the CPU" in chosen.note
    lines = [r.getMessage() for r in caplog.records if r.name == "colabkit"]
    assert len(lines) == 2 and all("No NVIDIA GPU found" in line and "\n" not in line for line in lines)
    assert env() == {"CUDA_DEVICE_ORDER": None, "CUDA_VISIBLE_DEVICES": None, "TF_FORCE_GPU_ALLOW_GROWTH": None}
    with pytest.raises(GPUSelectionError, match=r"use_gpus\('0'\): this machine has no NVIDIA GPU"):
        colabkit.use_gpus("0")


def test_mig_instances_are_selectable_by_uuid(fake_gpus):
    fake_gpus("mig")
    chosen = colabkit.use_gpus(MIG_SMALL)
    assert [g.label for g in chosen] == ["0:1"] and os.environ["CUDA_VISIBLE_DEVICES"] == MIG_SMALL
    assert [g.label for g in colabkit.use_gpus("MIG-c6d4f1ef")] == ["0:0"]
    assert [g.label for g in colabkit.use_gpus("0:1")] == ["0:1"]
    assert [g.label for g in colabkit.use_gpus(1)] == ["1"]             # the whole A100 has most free memory
    assert [g.label for g in colabkit.use_gpus("auto")] == ["1"]        # whole GPUs; the MIG one is not usable whole
    with pytest.raises(GPUSelectionError, match="(?s)GPU 0 is in MIG mode.*" + MIG_SMALL):
        colabkit.use_gpus("0")
    with pytest.raises(GPUSelectionError, match="at most one MIG instance per process"):
        colabkit.use_gpus(f"{MIG_SMALL},1")
    with pytest.raises(GPUSelectionError, match="MIG instances do not count"):
        colabkit.use_gpus(2)


def test_inherited_cuda_visible_devices_is_respected(fake_gpus, monkeypatch):
    fake_gpus("home_rig")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")      # e.g. set by `colabkit run` or a scheduler
    assert [g.index for g in colabkit.use_gpus(1)] == [0]  # GPU 1 has more free memory but is not ours
    with pytest.raises(GPUSelectionError, match=r"outside CUDA_VISIBLE_DEVICES='0'.*\n  GPU 0"):
        colabkit.use_gpus("1")
    with pytest.raises(GPUSelectionError, match=r"(?s)there is 1 in this process.*hidden by CUDA_VISIBLE_DEVICES"):
        colabkit.use_gpus(2)
    # our own earlier choice is not a restriction: choosing again may widen it back to the inherited one only
    assert [g.index for g in colabkit.use_gpus("0")] == [0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert list(colabkit.use_gpus("auto")) == [] and os.environ["CUDA_VISIBLE_DEVICES"] == "-1"


def test_choice_is_not_a_restriction_for_the_next_choice(fake_gpus):
    fake_gpus("home_rig")
    colabkit.use_gpus("0")
    assert [g.index for g in colabkit.use_gpus("1")] == [1] and os.environ["CUDA_VISIBLE_DEVICES"] == "1"


def test_memory_growth_setting(fake_gpus, monkeypatch):
    fake_gpus("home_rig")
    colabkit.use_gpus(1, memory_growth=False)
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in os.environ
    monkeypatch.setenv("COLABKIT_MEMORY_GROWTH", "false")
    colabkit.use_gpus(1)
    assert "TF_FORCE_GPU_ALLOW_GROWTH" not in os.environ
    monkeypatch.setenv("COLABKIT_MEMORY_GROWTH", "true")
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "false")   # the user's own value wins
    colabkit.use_gpus(1)
    assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"


def test_framework_already_using_cuda(fake_gpus, torch_standin):
    fake_gpus("home_rig")
    with pytest.raises(DevicesAlreadyInitialized) as info:
        colabkit.use_gpus("1")
    message = str(info.value)
    assert "use_gpus('1') chose GPU 1 (NVIDIA GeForce GTX 1080 Ti)" in message
    assert "PyTorch has already initialized CUDA" in message and "Restart the kernel" in message
    assert env() == {"CUDA_DEVICE_ORDER": None, "CUDA_VISIBLE_DEVICES": None, "TF_FORCE_GPU_ALLOW_GROWTH": None}
    with pytest.warns(GPUSelectionWarning, match="strict=False: CUDA_VISIBLE_DEVICES=1 is set for processes"):
        colabkit.use_gpus("1", strict=False)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"


@pytest.mark.parametrize("text, expected", [
    ("2", 2), ("0", 0), ("auto", "auto"), ("ALL", "auto"), ("0,1", "0,1"), ("1,", "1,"), ("device=1", "1"),
    ("GPU-9f8e", "GPU-9f8e"),
])
def test_parse_request_text(text, expected):
    assert devices.parse_request(text) == expected


def test_trailing_comma_names_one_index(fake_gpus):
    fake_gpus("home_rig")
    assert [g.index for g in colabkit.use_gpus(devices.parse_request("0,"))] == [0]


def test_gpus_magic(fake_gpus, capsys):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell
    fake_gpus("home_rig")
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "colabkit")
    try:
        shell.run_line_magic("gpus", "")
        assert "NVIDIA GeForce GTX 1080 Ti" in capsys.readouterr().out and "CUDA_VISIBLE_DEVICES" not in os.environ
        shell.run_line_magic("gpus", "2")
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1" and "CUDA_VISIBLE_DEVICES=0,1" in capsys.readouterr().out
        shell.run_line_magic("gpus", "1,")
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
        shell.run_line_magic("gpus", "auto --min-free 8GiB --json")
        assert '"cuda_visible_devices": "1"' in capsys.readouterr().out
        with pytest.raises(UsageError, match=r"colabkit: use_gpus\(3\) asked for 3 GPUs; there are 2"):
            shell.run_line_magic("gpus", "3")
        with pytest.warns(GPUSelectionWarning):
            shell.run_line_magic("gpus", "3 --no-strict")
        assert "gpus" in shell.magics_manager.magics["line"]
    finally:
        shell.run_line_magic("unload_ext", "colabkit")
    assert "gpus" not in shell.magics_manager.magics["line"]
