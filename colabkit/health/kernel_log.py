"""The kernel's own account of a bad end: NVIDIA Xid errors, thermal shutdowns and throttling, OOM kills, soft
lockups and hung tasks, machine-check errors, read from the kernel log for a time window.

Sources, first that answers: the file named by ``COLABKIT_KERNEL_LOG`` (any of the line shapes below; for tests
and for a log copied from another machine), ``journalctl -k`` for the window (every boot the journal keeps, so
the boot that froze too when the journal is persistent), ``dmesg`` (this boot only), ``/var/log/kern.log``
(syslog; survives reboots). Line shapes understood::

    2026-12-02T02:14:05+0000 rig kernel: NVRM: Xid (PCI:0000:01:00): 79, pid=4242, name=python, GPU has ...
    2026-12-02T02:14:05.123456+00:00 rig kernel: ...          (journalctl -o short-iso / rsyslog)
    Dec  2 02:14:05 rig kernel: [12345.678901] ...            (classic syslog, kern.log)

A log that cannot be read is reported as such ("kernel log not readable: ..."), never raised.
"""
from __future__ import annotations

import datetime
import os
import re
import subprocess
import time

ENV_VAR = "COLABKIT_KERNEL_LOG"
NOT_READABLE = ("kernel log not readable: run as root or add yourself to the adm/systemd-journal group "
                "(sudo usermod -aG adm,systemd-journal $USER)")

# Xid meanings from NVIDIA's Xid catalogue, for the ones that end trainings
XID_MEANINGS = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup after an error", 48: "double-bit ECC error", 61: "internal micro-controller halt",
    62: "internal micro-controller halt", 63: "ECC page retirement", 64: "ECC page retirement failed",
    74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error",
}
_PATTERNS = [
    ("xid", re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)")),
    ("gpu_lost", re.compile(r"NVRM: .*(fallen off the bus|GPU is lost)", re.IGNORECASE)),
    ("thermal_shutdown", re.compile(r"critical temperature reached|thermal.*shutting down", re.IGNORECASE)),
    ("thermal_throttle", re.compile(r"temperature above threshold, cpu clock throttled", re.IGNORECASE)),
    ("oom_kill", re.compile(r"Out of memory: Kill(?:ed)? process (\d+) \(([^)]*)\)")),
    ("lockup", re.compile(r"soft lockup - CPU#\d+ stuck|hard LOCKUP|blocked for more than \d+ seconds|"
                          r"rcu_sched self-detected stall|rcu: INFO: rcu_\w+ (?:self-)?detected stall")),
    ("hardware_error", re.compile(r"\[Hardware Error\]|Machine check events logged")),
]
_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?)([+-]\d\d:?\d\d|Z)?\s+(.*)$")   # dmesg: ",us"
_SYSLOG = re.compile(r"^([A-Z][a-z]{2})\s+(\d{1,2}) (\d\d):(\d\d):(\d\d)\s+(.*)$")
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct",
                                        "Nov", "Dec"), start=1)}


def line_time(line: str, year: int | None = None, now: float | None = None) -> tuple[float | None, str]:
    """(wall time or None, the rest of the line) for a journalctl short-iso, rsyslog ISO or classic syslog line.
    A classic syslog line has no year: ``year``, else the one that does not put it more than a day after ``now``
    (default: the clock), so that a freeze late on 31 December is read back on 1 January."""
    m = _ISO.match(line)
    if m:
        stamp, zone, rest = m.groups()
        try:
            when = datetime.datetime.fromisoformat(stamp.replace(",", "."))
            if zone:
                z = zone.replace(":", "")
                offset = 0 if z == "Z" else (int(z[1:3]) * 60 + int(z[3:5])) * (1 if z[0] == "+" else -1)
                when = when.replace(tzinfo=datetime.timezone(datetime.timedelta(minutes=offset)))
            return when.timestamp(), rest
        except ValueError:
            return None, line
    m = _SYSLOG.match(line)
    if m:
        month, day, hh, mm, ss, rest = m.groups()
        now = time.time() if now is None else now
        guess = year or datetime.datetime.fromtimestamp(now).year
        try:
            when = datetime.datetime(guess, _MONTHS[month], int(day), int(hh), int(mm), int(ss))
            if year is None and when.timestamp() > now + 86400:
                when = when.replace(year=guess - 1)   # (29 February of a leap year: ValueError, skipped)
            return when.timestamp(), rest    # syslog's local time
        except (KeyError, ValueError):
            return None, line
    return None, line


def classify(text: str) -> dict | None:
    """{"kind", "text", ...} for a line that tells of a bad end, else None."""
    for kind, pattern in _PATTERNS:
        m = pattern.search(text)
        if not m:
            continue
        event = {"kind": kind, "text": _message(text)}
        if kind == "xid":
            code = int(m.group(2))
            event.update(pci=m.group(1), xid=code, meaning=XID_MEANINGS.get(code, "see NVIDIA's Xid catalogue"))
        elif kind == "oom_kill":
            event.update(pid=int(m.group(1)), process=m.group(2))
        return event
    return None


def _message(text: str) -> str:
    """The kernel's message without the host / "kernel:" / uptime prefix."""
    _, sep, rest = text.partition("kernel: ")
    rest = rest if sep else text
    return re.sub(r"^\[\s*\d+\.\d+\]\s*", "", rest).strip()


def parse(lines, since: float | None = None, until: float | None = None) -> list[dict]:
    """Events (with "t", wall time, where the line has one) from kernel-log lines, inside [since, until] where
    both the line's time and the bound are known."""
    events = []
    for line in lines:
        t, rest = line_time(line.rstrip("\n"))
        if t is not None and ((since is not None and t < since) or (until is not None and t > until)):
            continue
        event = classify(rest)
        if event is not None:
            events.append({"t": t, **event})
    return events


def scan(since: float, until: float) -> dict:
    """{"readable", "source", "note", "events"}: what the kernel logged between ``since`` and ``until``."""
    lines, source, notes = None, None, []
    explicit = os.environ.get(ENV_VAR, "").strip()
    if explicit:
        try:
            with open(explicit, errors="replace") as fh:
                lines, source = fh.readlines(), explicit
        except OSError as exc:
            notes.append(f"{ENV_VAR}={explicit}: {exc.strerror or exc}")
    if lines is None:
        lines, source = _run(["journalctl", "-k", "-o", "short-iso", "--no-pager",
                              "--since", f"@{int(since)}", "--until", f"@{int(until) + 1}"]), "journalctl -k"
    if lines is None:
        lines, source = _run(["dmesg", "--time-format", "iso"]), "dmesg (this boot only)"
    if lines is None:
        try:
            with open("/var/log/kern.log", errors="replace") as fh:
                lines, source = fh.readlines(), "/var/log/kern.log"
        except OSError:
            lines = None
    if lines is None:
        return {"readable": False, "source": None, "note": "; ".join(notes + [NOT_READABLE]), "events": []}
    return {"readable": True, "source": source, "note": "; ".join(notes),
            "events": parse(lines, since=since, until=until)}


def _run(argv: list) -> list | None:
    """The command's output lines, or None where it is missing, refused or shows nothing readable (journalctl
    without permission prints only a hint; dmesg says "Operation not permitted")."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, errors="replace")
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line for line in done.stdout.splitlines() if line.strip() and not line.startswith("-- ")]
    if done.returncode != 0 or not lines:
        if done.returncode == 0 and "journalctl" in argv[0] and "Hint:" not in done.stderr \
                and "No journal files" not in done.stderr + done.stdout:
            return []     # a readable journal with nothing in the window
        return None
    return lines
