"""NVML Xid events as the flight recorder takes them: each event once, with its GPU and PCI bus id; GPUs whose
board gives no events are left out, and without any the watch is None (the recorder goes on without it)."""
from __future__ import annotations

import copy
import json

from tests.devices.conftest import SCENARIOS


def _gpus(**per_gpu):
    gpus = copy.deepcopy(json.loads((SCENARIOS / "hot_rig.json").read_text())["gpus"])
    for key, values in per_gpu.items():
        for gpu, value in zip(gpus, values):
            gpu[key] = value
    return gpus


def test_each_xid_is_polled_once_with_its_gpu(fake_gpus):
    from colabkit.devices.nvml import open_nvml
    from colabkit.health.xid_watch import XidWatch
    fake_gpus("hot_rig", gpus=_gpus(xid_events=[[[0, 13], [0, 79]], [[0, 79]]]))
    watch = XidWatch.open(open_nvml())
    try:
        assert watch.gpus == {0: "00000000:01:00.0", 1: "00000000:02:00.0"}
        first = watch.poll()
        assert sorted((e["gpu"], e["xid"]) for e in first) == [(0, 13), (0, 79), (1, 79)]
        assert watch.poll() == []          # delivered once; then NVML's Timeout: nothing new
    finally:
        watch.close()


def test_boards_without_events_are_left_out(fake_gpus):
    from colabkit.devices.nvml import open_nvml
    from colabkit.health.xid_watch import XidWatch
    fake_gpus("hot_rig", gpus=_gpus(events_supported=[False, False]))
    assert XidWatch.open(open_nvml()) is None
