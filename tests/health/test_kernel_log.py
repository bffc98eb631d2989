"""The kernel log's account of a bad end, from lines shaped as journalctl, dmesg and syslog write them."""
from __future__ import annotations

import datetime
import os
import stat

import pytest

from colabkit.health import kernel_log

JOURNAL = """\
2026-12-02T02:09:58+0000 rig kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024
2026-12-02T02:13:40+0000 rig kernel: NVRM: Xid (PCI:0000:01:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address
2026-12-02T02:14:05.412345+00:00 rig kernel: NVRM: Xid (PCI:0000:01:00): 79, pid=4242, name=python3, GPU has fallen off the bus.
2026-12-02T02:14:05,512345+00:00 NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.
2026-12-02T02:14:06+0000 rig kernel: usb 1-1: new high-speed USB device number 2 using xhci_hcd
"""
SYSLOG = """\
Dec  2 02:10:11 rig kernel: [12345.678901] Out of memory: Killed process 4242 (python3) total-vm:98765432kB, anon-rss:61234567kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:123456kB oom_score_adj:0
Dec  2 02:12:00 rig kernel: [12460.000000] mce: CPU3: Package temperature above threshold, cpu clock throttled (total events = 41)
Dec  2 02:13:01 rig kernel: [12521.000000] watchdog: BUG: soft lockup - CPU#5 stuck for 23s! [python3:4242]
Dec  2 02:13:30 rig kernel: [12550.000000] INFO: task python3:4242 blocked for more than 120 seconds.
Dec  2 02:13:50 rig kernel: [12570.000000] mce: [Hardware Error]: Machine check events logged
Dec  2 02:14:06 rig kernel: [12586.111111] thermal thermal_zone0: critical temperature reached (105 C), shutting down
"""


def _utc(hh, mm, ss):
    return datetime.datetime(2026, 12, 2, hh, mm, ss, tzinfo=datetime.timezone.utc).timestamp()


def test_journal_and_dmesg_lines_give_xid_codes_and_the_lost_gpu():
    events = kernel_log.parse(JOURNAL.splitlines())
    assert [(e["kind"], e.get("xid")) for e in events] == [("xid", 13), ("xid", 79), ("gpu_lost", None)]
    assert events[1]["t"] == pytest.approx(_utc(2, 14, 5) + 0.412345)
    assert events[1]["pci"] == "0000:01:00" and events[1]["meaning"] == "GPU has fallen off the bus"
    assert events[1]["text"].startswith("NVRM: Xid (PCI:0000:01:00): 79, pid=4242")
    assert events[2]["t"] == pytest.approx(_utc(2, 14, 5) + 0.512345)    # dmesg's comma


def test_syslog_lines_give_oom_kills_heat_lockups_and_hardware_errors():
    events = kernel_log.parse(SYSLOG.splitlines())
    assert [e["kind"] for e in events] == ["oom_kill", "thermal_throttle", "lockup", "lockup", "hardware_error",
                                           "thermal_shutdown"]
    assert (events[0]["pid"], events[0]["process"]) == (4242, "python3")
    assert events[0]["text"].startswith("Out of memory: Killed process 4242 (python3)")    # no uptime prefix
    local = datetime.datetime(datetime.datetime.now().year, 12, 2, 2, 10, 11).timestamp()
    assert events[0]["t"] == local      # syslog stamps are local time, without a year


def test_scan_reads_the_named_file_for_the_window(monkeypatch, tmp_path):
    log = tmp_path / "kern.log"
    log.write_text(JOURNAL)
    monkeypatch.setenv(kernel_log.ENV_VAR, str(log))
    found = kernel_log.scan(_utc(2, 14, 0), _utc(2, 20, 0))
    assert found["readable"] and found["source"] == str(log)
    assert [e.get("xid") for e in found["events"]] == [79, None]


def test_a_log_nobody_lets_us_read_is_said_not_raised(monkeypatch, tmp_path):
    if os.access("/var/log/kern.log", os.R_OK):
        pytest.skip("this machine lets the tests read /var/log/kern.log")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # what journalctl and dmesg answer a user outside the adm / systemd-journal groups
    for name, script in {
        "journalctl": "echo '-- No entries --'; echo 'Hint: You are currently not seeing messages from other users "
                      "and the system.' >&2; exit 0",
        "dmesg": "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2; exit 1"}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / name).chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv(kernel_log.ENV_VAR, str(tmp_path / "missing.log"))
    found = kernel_log.scan(0, 1)
    assert found["readable"] is False and found["events"] == []
    assert "kernel log not readable: run as root or add yourself to the adm/systemd-journal group" in found["note"]
    assert "missing.log" in found["note"]


def test_a_syslog_line_from_new_years_eve_read_on_new_years_day_is_last_year():
    import datetime

    from colabkit.health.kernel_log import line_time
    new_year = datetime.datetime(2027, 1, 1, 0, 10).timestamp()
    t, rest = line_time("Dec 31 23:58:02 rig kernel: NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=python", now=new_year)
    assert t == datetime.datetime(2026, 12, 31, 23, 58, 2).timestamp()
    assert rest.startswith("rig kernel: NVRM: Xid")
    assert line_time("Jan  1 00:05:00 rig kernel: x", now=new_year)[0] == \
        datetime.datetime(2027, 1, 1, 0, 5).timestamp()
