"""The flight recorder: a training process records the (stand-in) GPUs into the ring file, is killed, frozen or
ends cleanly, and a fresh `colabkit health --last` says which, with the last values; damaged rings still read."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from colabkit.health.flight_report import last_recording
from colabkit.health.flight_ring import HEADER_SIZE, RingWriter, read_records
from colabkit.health.recorder import INFO_EVERY, boot_id, ring_path
from tests.test_extension import run_shell
from tests.waiting import wait_for

TRAINER = textwrap.dedent("""
    import sys, time
    import colabkit
    with colabkit.monitor(hang_timeout="off") as mon:      # a custom training loop: the monitor starts recording
        for step in range(int(sys.argv[1])):
            time.sleep(0.05)
            mon.step(loss=1.0 / (step + 1))
    print("trained", flush=True)
""")


def _samples(path) -> int:
    try:
        return sum(r.get("k") == "s" for r in read_records(path)[1])
    except (OSError, ValueError):
        return 0


@pytest.fixture
def recording_env(monkeypatch, fake_gpus, tmp_path):
    """Recorder on (fast samples), the hot two-GPU rig stand-in, a kernel log file of the test's own. A PyTorch or
    TensorFlow loaded before stays loaded (neither can be imported twice in one process)."""
    loaded = {name: sys.modules[name] for name in ("torch", "tensorflow") if name in sys.modules}
    fake_gpus("hot_rig")
    for name, module in loaded.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("COLABKIT_FLIGHT_RECORDER", "true")
    monkeypatch.setenv("COLABKIT_FLIGHT_SAMPLE_EVERY", "0.1s")
    monkeypatch.setenv("COLABKIT_FLIGHT_SYNC_EVERY", "0.2s")
    log = tmp_path / "kern.log"
    log.write_text("")
    monkeypatch.setenv("COLABKIT_KERNEL_LOG", str(log))
    return log


@pytest.mark.slow
def test_a_killed_training_is_read_back_as_an_abrupt_end_with_its_last_values(recording_env, run_cli):
    path = ring_path()
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, "100000"], start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: _samples(path) >= 8, 60), "the training process recorded nothing"
    finally:
        os.killpg(trainer.pid, signal.SIGKILL)      # the whole process group, mid-record or not
        trainer.wait(30)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime())
    recording_env.write_text(
        f"{stamp} rig kernel: NVRM: GPU at PCI:0000:02:00: GPU-5f6e7d8c-9b0a-4c1d-8e2f-3a4b5c6d7e8f\n"
        f"{stamp} rig kernel: NVRM: Xid (PCI:0000:02:00): 79, pid=4243, name=python, GPU has fallen off the bus.\n")

    done = run_cli("health", "--last", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["state"] == "abrupt" and report["rebooted_since"] is False
    assert report["pid"] == trainer.pid
    hot = report["gpus"][1]
    assert (hot["temperature"]["last"], hot["power"]["last"], hot["sm_clock"]["last"]) == (91, 287.4, 1110)
    assert hot["memory_used_mib"] == 22910 and hot["memory_total_mib"] == 24576
    assert set(hot["reasons_now"]) == {"sw_thermal_slowdown", "hw_thermal_slowdown"}
    assert hot["thresholds"] == {"slowdown": 90, "shutdown": 98, "gpu_max": 88}
    assert report["gpus"][0]["reasons_now"] == ["sw_power_cap"]
    assert report["kernel_log"]["events"][0]["xid"] == 79
    verdict = report["verdict"]
    assert verdict.startswith("the recording stopped without a clean end at ")
    assert f"its process (pid {trainer.pid}) was killed or crashed" in verdict
    assert "GPU 1 was at 91 C in thermal slowdown for the last" in verdict
    assert "kernel log: Xid 79 on 0000:02:00 (GPU has fallen off the bus)" in verdict

    shown = run_cli("health", "--last")
    assert shown.returncode == 0, shown.stderr
    assert "verdict: the recording stopped without a clean end at " in shown.stdout
    assert "GPU 1 NVIDIA GeForce RTX 3090: 91 C (peak 91 C, slowdown at 90 C), 287.4 W" in shown.stdout


@pytest.mark.slow
def test_a_training_that_exits_normally_ends_its_recording_cleanly(recording_env, run_cli):
    trainer = subprocess.run([sys.executable, "-c", TRAINER, "30"], capture_output=True, text=True, timeout=120)
    assert "trained" in trainer.stdout, trainer.stderr
    report = json.loads(run_cli("health", "--last", "--json").stdout)
    assert report["state"] == "clean"
    assert report["verdict"].startswith("the last recording ended cleanly at ")
    assert read_records(ring_path())[1][-1]["k"] == "stop"


def test_the_setting_off_records_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("COLABKIT_FLIGHT_RECORDER", "false")
    from colabkit.health.recorder import ensure_recording
    assert ensure_recording() is None
    assert not ring_path().parent.exists()
    assert last_recording(kernel_log=False)["state"] == "none"


def test_a_recorder_that_cannot_write_says_so_once_and_training_goes_on(monkeypatch, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("COLABKIT_CACHE_DIR", str(blocker))
    monkeypatch.setenv("COLABKIT_FLIGHT_RECORDER", "true")
    trainer = subprocess.run([sys.executable, "-c", TRAINER, "10"], capture_output=True, text=True, timeout=120)
    assert trainer.returncode == 0 and "trained" in trainer.stdout, trainer.stderr
    assert trainer.stderr.count("the flight recorder") == 1, trainer.stderr


def _ring(path, records, *, capacity=64 * 1024, boot=None, stop=False):
    """A ring as a recorder of boot ``boot`` leaves it: a start record, ``records`` samples, maybe a stop."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        writer = RingWriter(fd, capacity)
        t0 = time.time() - records - 60
        info = {"host": "rig", "boot_id": boot or boot_id(), "pid": 4242, "started": t0, "sample_every": 1.0}
        writer.set_info({**info, "state": "stopped" if stop else "recording"})
        facts = {**info, "gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 3090", "slowdown": 90}]}
        writer.append({"k": "start", "t": t0, **facts})
        for i in range(records):
            if i and i % INFO_EVERY == 0:     # as the recorder repeats them
                writer.append({"k": "info", "t": t0 + i + 0.5, **facts})
            hot = i >= records - 240     # the last 4 minutes in thermal slowdown
            writer.append({"k": "s", "t": t0 + i + 1, "g": [[0, 91.0 if hot else 70.0, 300.0, 1110.0, 9751.0, 100.0,
                                                              20000, 24576, 0x60 if hot else 0]],
                           "h": [65.0, 7.5, 80.0 + i % 5]})
        if stop:
            writer.append({"k": "stop", "t": t0 + records + 1, "pid": 4242})
        writer.sync()
        return writer
    finally:
        os.close(fd)


def test_a_torn_or_cut_last_record_is_skipped(tmp_path):
    path = tmp_path / "flight.ring"
    writer = _ring(path, 50)
    end = HEADER_SIZE + writer.pos
    data = bytearray(path.read_bytes())
    data[end - 7:end] = b"\0" * 7            # the last record's write torn by a power loss
    path.write_bytes(bytes(data))
    records = read_records(path)[1]
    assert [r["t"] for r in records[1:]] == [records[0]["t"] + i + 1 for i in range(49)]
    with open(path, "r+b") as fh:            # and cut in the middle of the record before it
        fh.truncate(end - 200)
    report = last_recording(path=path, kernel_log=False)
    assert report["state"] == "abrupt" and report["samples"] == 48
    assert report["last_record"] == records[0]["t"] + 48


def test_the_ring_wraps_keeping_the_newest_records_and_its_size(tmp_path):
    path = tmp_path / "flight.ring"
    _ring(path, 3000)                         # ~190 KB of records into 64 KiB
    assert path.stat().st_size == HEADER_SIZE + 64 * 1024
    records = read_records(path)[1]
    times = [r["t"] for r in records if r["k"] == "s"]
    assert times == [times[0] + i for i in range(len(times))] and times[-1] == records[-1]["t"]  # an unbroken tail
    assert 300 < len(times) < 3000
    report = last_recording(path=path, minutes=60, kernel_log=False)   # its start overwritten, its facts repeated
    assert report["state"] == "abrupt" and report["gpus"][0]["name"] == "NVIDIA GeForce RTX 3090"
    assert report["started"] == next(r for r in records if r["k"] == "info")["started"]
    assert report["last_record"] == times[-1]
    fd = os.open(path, os.O_RDWR)
    try:
        again = RingWriter(fd, 64 * 1024)    # a later recorder continues after the newest record
        again.append({"k": "stop", "t": time.time(), "pid": 1})
    finally:
        os.close(fd)
    assert read_records(path)[1][-1]["k"] == "stop" and path.stat().st_size == HEADER_SIZE + 64 * 1024


def test_a_recording_from_an_earlier_boot_says_the_machine_rebooted(tmp_path):
    path = tmp_path / "flight.ring"
    _ring(path, 600, boot="00000000-0000-4000-8000-000000000000")
    report = last_recording(path=path, minutes=10, kernel_log=False)
    assert report["state"] == "abrupt" and report["rebooted_since"] is True
    assert "and the machine has rebooted since: GPU 0 was at 91 C in thermal slowdown for the last 3m 59s" \
        in report["verdict"]
    assert report["gpus"][0]["reasons_seen_s"] == {"sw_thermal_slowdown": 239.0, "hw_thermal_slowdown": 239.0}
    assert report["host"]["ram_percent"] == {"last": 84.0, "peak": 84.0}


def test_load_ext_shows_an_abrupt_end_once(tmp_path):
    _ring(ring_path(), 300, boot="00000000-0000-4000-8000-000000000000")
    first = run_shell(["%load_ext colabkit", "%reload_ext colabkit"])
    assert "colabkit: flight recorder: the recording stopped without a clean end" in first[1]["stdout"]
    assert "and the machine has rebooted since" in first[1]["stdout"]
    assert "colabkit health --last" in first[1]["stdout"]
    # the last 5 minutes' temperatures as a line of blocks: 70 C, then the 4 hot minutes at 91 C
    assert "GPU 0 temperature, last 5 min: \u2585\u2585\u2585\u2585\u2585\u2585\u2587\u2587" in first[1]["stdout"]
    assert "91 C (peak 91 C)" in first[1]["stdout"]
    assert "flight recorder" not in first[2]["stdout"]
    later = run_shell(["%load_ext colabkit"])          # the next session: already shown
    assert "flight recorder" not in later[1]["stdout"]


def test_load_ext_says_nothing_after_a_clean_end(tmp_path):
    _ring(ring_path(), 30, stop=True)
    assert "flight recorder" not in run_shell(["%load_ext colabkit"])[1]["stdout"]


@pytest.mark.slow
def test_a_torch_autoresume_loop_records_while_it_trains(recording_env, tmp_path):
    if importlib.util.find_spec("torch") is None:   # the training runs in a subprocess: not imported here
        pytest.skip("PyTorch is not installed")
    script = textwrap.dedent(f"""
        import time, torch
        import colabkit
        from colabkit.health.flight_ring import read_records
        from colabkit.health.recorder import ring_path
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(8, 4)), batch_size=4)
        ar = colabkit.torch.AutoResume({str(tmp_path / "run")!r}, model=model, opt=opt)
        for epoch in ar.epochs(1):
            for (x,) in ar.batches(loader):
                opt.zero_grad(); model(x).sum().backward(); opt.step()
            def sampled():
                try:
                    return any(r.get("k") == "s" for r in read_records(ring_path())[1])
                except (OSError, ValueError):   # not there yet, or its header not written yet
                    return False
            deadline = time.monotonic() + 60
            while not sampled() and time.monotonic() < deadline:
                time.sleep(0.05)   # training still runs: its first sample is on disk
        ar.close()
        print("trained", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "trained" in done.stdout, done.stderr[-3000:]
    report = last_recording(kernel_log=False)
    assert report["state"] == "clean" and report["samples"] >= 1
    assert [g["name"] for g in report["gpus"]] == ["NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3090"]


@pytest.mark.slow
def test_an_xid_event_from_nvml_is_recorded_and_named_without_a_readable_kernel_log(recording_env, fake_gpus,
                                                                                      run_cli, tmp_path,
                                                                                      monkeypatch):
    # GPU 1 falls off the bus 0.3 s into the recording; GPU 0's board gives no NVML events at all
    fake_gpus("xid_rig")
    monkeypatch.setenv("COLABKIT_KERNEL_LOG", str(tmp_path / "no-such-kern.log"))
    path = ring_path()
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, "100000"], start_new_session=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def xid_recorded():
        try:
            return any(r.get("k") == "xid" for r in read_records(path)[1])
        except (OSError, ValueError):
            return False
    try:
        assert wait_for(xid_recorded, 60), "no Xid event recorded"
    finally:
        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait(30)

    report = json.loads(run_cli("health", "--last", "--json").stdout)
    assert report["state"] == "abrupt"
    assert [(e["gpu"], e["xid"], e["pci"], e["meaning"]) for e in report["xid_events"]] == \
        [(1, 79, "00000000:02:00.0", "GPU has fallen off the bus")]
    assert "NVML reported Xid 79 on GPU 1 (00000000:02:00.0): GPU has fallen off the bus at " in report["verdict"]
    shown = run_cli("health", "--last").stdout
    assert "GPU errors NVML reported while recording: 1" in shown
    assert "  Xid 79 on GPU 1 (00000000:02:00.0): GPU has fallen off the bus at " in shown


def test_a_trainer_limited_to_one_gpu_records_every_gpu_of_the_machine(fake_gpus, monkeypatch, tmp_path):
    # the ring is the machine's and only one process records it: a trainer on GPU 1 alone must not leave GPU 0,
    # where another training runs, out of it
    from colabkit.health.recorder import FlightRecorder
    fake_gpus("hot_rig")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    path = tmp_path / "flight.ring"
    recorder = FlightRecorder(path, size=64 * 1024, sample_every=0.05, sync_every=0.1).start()
    try:
        assert wait_for(lambda: _samples(path) >= 1, 60), "nothing recorded"
    finally:
        recorder.stop()
    report = last_recording(path=path, kernel_log=False)
    assert [(g["index"], g["temperature"]["last"]) for g in report["gpus"]] == [(0, 74), (1, 91)]


FORKING_TRAINER = textwrap.dedent("""
    import os, sys, time
    import colabkit
    with colabkit.monitor(hang_timeout="off") as mon:
        mon.step(loss=1.0)
        time.sleep(0.5)                 # recording by now
        worker = os.fork()              # a DataLoader worker (fork start method) that outlives its trainer
        if worker == 0:
            time.sleep(120)
            os._exit(0)
        print(worker, flush=True)
        for step in range(100000):
            time.sleep(0.05)
            mon.step(loss=1.0)
""")


@pytest.mark.slow
def test_a_forked_worker_left_behind_does_not_pass_for_the_recorder(recording_env):
    path = ring_path()
    trainer = subprocess.Popen([sys.executable, "-c", FORKING_TRAINER], stdout=subprocess.PIPE, text=True)
    worker = int(trainer.stdout.readline())
    try:
        assert wait_for(lambda: _samples(path) >= 3, 60), "the training process recorded nothing"
        trainer.kill()                   # the trainer alone: its worker lives on
        trainer.wait(30)
        report = last_recording(kernel_log=False)
        assert report["state"] == "abrupt", report["verdict"]
    finally:
        trainer.kill()
        os.kill(worker, signal.SIGKILL)
