"""GPU figures through the NVML stand-in (real nvidia-ml-py signatures): thermal throttling gets the thermal
verdict, utilization comes from nvmlDeviceGetSamples, and a machine without a driver reports None."""
from __future__ import annotations

import time

import colabkit
from colabkit.health import verdicts


def _loop(mon, steps=30):
    for _ in mon.wrap(range(steps)):
        time.sleep(0.002)
        mon.step()


def _sampled(mon, at_least=3, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(len(q) >= at_least for q in mon.sampler.gpu_history.values()):
            return True
        time.sleep(0.05)
    return False


def test_thermal_throttling_gets_the_thermal_verdict(fake_gpus, capsys):
    fake_gpus("throttling")
    with colabkit.monitor(sample_every="0.05s") as mon:
        _loop(mon)
        assert _sampled(mon)
        time.sleep(0.3)   # the violation counters grow with time
        report = mon.report()
    assert report["gpu_utilization"] is not None and 97 <= report["gpu_utilization"][0] <= 100
    throttled = report["throttled"]
    assert set(throttled["reasons"]) == {"sw_thermal_slowdown", "hw_thermal_slowdown", "sw_power_cap"}
    # the driver's thermal violation counter grows 0.4 s per second in this scenario
    assert abs(throttled["per_gpu"][0]["violation"]["thermal"] - 0.4) < 0.05, throttled
    texts = [v["text"] for v in report["verdicts"]]
    thermal = next(t for t in texts if t.startswith("thermal throttling"))
    assert "GPU 0 (NVIDIA GeForce RTX 3090)" in thermal
    assert "HW thermal slowdown and SW thermal slowdown" in thermal
    assert "40% of the time" in thermal and "slowdown temperature 90 C" in thermal and "91 C" in thermal
    assert "airflow" in thermal and "nvidia-smi -pl" in thermal
    assert any(t.startswith("power-limited") and "SW power cap" in t and "349 W of a 350 W limit" in t for t in texts)
    # said once, while training ran
    assert capsys.readouterr().out.count("colabkit: thermal throttling") == 1
    assert "91 C (slowdown 90 C)" in report["text"]


def test_no_throttling_no_thermal_verdict_and_cuda_visible_devices(fake_gpus, monkeypatch):
    fake_gpus("home_rig")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with colabkit.monitor(sample_every="0.05s", verbose=0) as mon:
        _loop(mon)
        assert _sampled(mon)
        report = mon.report()
    assert [g["name"] for g in report["gpus"]] == ["NVIDIA GeForce GTX 1080 Ti"]   # the one this process sees
    assert report["gpu_utilization"] == [0.0]
    assert report["throttled"]["reasons"] == [] and report["throttled"]["share"] == 0.0
    assert not any(v["kind"] == "throttle" for v in report["verdicts"])


def test_old_driver_without_samples_falls_back_to_utilization_rates(fake_gpus):
    data = fake_gpus("throttling")
    data["gpus"][0]["samples"] = False
    fake_gpus("throttling", gpus=data["gpus"])
    with colabkit.monitor(sample_every="0.05s", verbose=0) as mon:
        _loop(mon, 5)
        assert _sampled(mon)
        assert mon.sampler.gpus[0].samples_supported is False
        assert mon.report()["gpu_utilization"] == [99.0]


def test_without_a_driver_gpu_fields_are_none(fake_gpus):
    fake_gpus(None)
    with colabkit.monitor(sample_every="0.05s", verbose=0) as mon:
        _loop(mon, 25)
        report = mon.report()
    assert report["gpu_utilization"] is None and report["throttled"]["share"] is None
    assert report["gpus"] == [] and "GPU: none" in report["text"]
    assert report["input_kind"] == "unknown" and report["input_fraction"] is not None


def test_idle_gpu_while_cpu_saturated_is_said():
    window = {"gpus": [{"index": 0, "name": "RTX 4090", "utilization": 12.0}], "host": {"cpu_percent": 97.0}}
    v = verdicts.idle_gpu_verdict(window, 0.1)
    assert v is not None and "idle much of the time (busy 12%)" in v.text and "CPU is saturated (97%)" in v.text
    assert verdicts.idle_gpu_verdict({**window, "host": {"cpu_percent": 40.0}}, 0.1) is None
    assert "waiting for input takes 10% of each step" in v.text
    assert "waiting for input" not in verdicts.idle_gpu_verdict(window, None).text


def test_nvidia_smi_standin_reports_power_and_clock_event_reasons(fake_gpus):
    import subprocess
    fake_gpus("throttling")
    fields = ("power.draw,power.limit,clocks_event_reasons.active,clocks_throttle_reasons.sw_thermal_slowdown,"
              "clocks_event_reasons.hw_power_brake_slowdown")
    out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "349.20, 350.00, 0x0000000000000064, Active, Not Active"


def test_the_first_utilization_read_starts_when_the_gpu_is_opened(fake_gpus):
    """The driver keeps ~20 s of utilization samples; what ran before the monitor started is not its figure."""
    fake_gpus("throttling")
    import pynvml

    from colabkit.health.sampler import _Gpu
    pynvml.nvmlInit()
    stamps = []
    real = pynvml.nvmlDeviceGetSamples

    def spy(handle, kind, since):
        value_type, samples = real(handle, kind, since)
        stamps.extend(s.timeStamp for s in samples)
        return value_type, samples

    opened_us = int(time.time() * 1e6)
    gpu = _Gpu(pynvml, 0, pynvml.nvmlDeviceGetHandleByIndex(0))
    gpu.nv = type("Spied", (), {k: getattr(pynvml, k) for k in dir(pynvml) if not k.startswith("__")})
    gpu.nv.nvmlDeviceGetSamples = staticmethod(spy)
    time.sleep(0.4)               # at least two of the stand-in's 1/6 s sample periods
    assert gpu.utilization() is not None
    assert stamps and min(stamps) >= opened_us - 166_667, (opened_us, stamps[:3])


def test_the_throttled_share_covers_the_window_asked_for(fake_gpus):
    """The driver's violation counters are cumulative: a window (a stall, the last 2 minutes) gets the share
    within it. The counters here: throttled all of the first 50 s, none of the next 50 s."""
    fake_gpus("throttling")
    import pynvml

    from colabkit.health.sampler import Sampler, _Gpu
    pynvml.nvmlInit()
    base = time.time()
    readings = iter([(base - 100, 0.0), (base - 50, 50.0), (base, 50.0)])

    def violation_status(handle, policy):
        if policy != pynvml.NVML_PERF_POLICY_THERMAL:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        ref, viol = next(readings)
        return pynvml.c_nvmlViolationTime_t(int(ref * 1e6), int(viol * 1e9))

    nv = type("Counters", (), {k: getattr(pynvml, k) for k in dir(pynvml) if not k.startswith("__")})
    nv.nvmlDeviceGetViolationStatus = staticmethod(violation_status)
    gpu = _Gpu(nv, 0, pynvml.nvmlDeviceGetHandleByIndex(0))    # reads the counters at base - 100 s
    gpu.violation_history.append(gpu.violations())             # a sample at base - 50 s
    sampler = Sampler(gpus=False)
    assert sampler._violation_share(gpu, since=base - 50) == {"thermal": 0.0}   # the window: no throttling
    gpu.violation_history.pop()
    readings = iter([(base, 50.0)])
    assert sampler._violation_share(gpu, since=base - 200) == {"thermal": 0.5}  # all since the start
