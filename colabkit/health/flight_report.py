"""Reading the flight recorder back: what the machine looked like in the last minutes of its newest recording,
whether that recording ended cleanly, and what the kernel logged meanwhile (``colabkit health --last``).

    report = colabkit.health.last_recording(minutes=10)     # a plain dict
    print(report["verdict"])
    print(colabkit.health.flight_report.text(report))

How a recording ended: "clean" (its "stop" record is there), "recording" (its process still holds the ring: it
runs now), "abrupt" (neither: killed, crashed, frozen or powered off; when the boot id differs from this boot's,
the machine has rebooted since). The last records before a power loss may be missing: up to flight_sync_every
(5 s) of them.
"""
from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from ..units import format_duration
from .flight_ring import RingFormatError, read_records
from .recorder import boot_id, ring_path

THERMAL_BITS = 0x20 | 0x40        # sw/hw thermal slowdown
POWER_BITS = 0x4 | 0x80           # sw power cap, hw power brake
_EVENT_ORDER = ("xid", "gpu_lost", "thermal_shutdown", "oom_kill", "lockup", "hardware_error", "thermal_throttle")
SHOWN_NAME = "shown-abrupt"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def writer_alive(path: Path) -> bool:
    """True while a process holds the ring's lock (records now)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _sessions(records: list) -> list[list]:
    """The records grouped by recording, each list headed by its start record or, where the ring's wrap has
    overwritten that, by the first repeat of its facts (an "info" record; samples before it are dropped)."""
    out = []
    for r in records:
        kind = r.get("k")
        if kind == "start" or (kind == "info" and (not out or (out[-1][0].get("pid"), out[-1][0].get("started"))
                                                   != (r.get("pid"), r.get("started")))):
            out.append([r])
        elif out and kind != "info":
            out[-1].append(r)
    return out


def _end_state(session: list, live: bool) -> str:
    if session[-1].get("k") == "stop":
        return "clean"
    return "recording" if live else "abrupt"


def _streak(samples: list, index: int, bits: int) -> float | None:
    """How long GPU ``index`` had one of ``bits`` set without a break up to the last sample (s), or None."""
    first = None
    for s in reversed(samples):
        row = next((g for g in s.get("g", []) if g[0] == index), None)
        if row is None or not (row[8] or 0) & bits:
            break
        first = s["t"]
    return None if first is None else samples[-1]["t"] - first


def _stat(values: list, peak=max) -> dict:
    known = [v for v in values if v is not None]
    return {"last": values[-1] if values else None, "peak": peak(known) if known else None}


def _gpu_summary(index: int, meta: dict, samples: list, period: float) -> dict:
    """One GPU's last, peak (clocks: lowest) values and throttling in ``samples``."""
    from .sampler import REASONS   # (NVML's binding module loads with it: not at %load_ext)
    rows = [(s["t"], next(g for g in s["g"] if g[0] == index)) for s in samples
            if any(g[0] == index for g in s.get("g", []))]
    col = [[row[k] for _, row in rows] for k in range(9)]
    seen = {}     # seconds from a sample with the reason to the next sample (the last one: not counted)
    for (t, row), (t_next, _) in zip(rows, rows[1:]):
        for bit, name in REASONS.items():
            if (row[8] or 0) & bit:
                seen[name] = seen.get(name, 0.0) + min(t_next - t, 3 * period)
    last = rows[-1][1] if rows else [None] * 9
    return {"index": index, "name": meta.get("name", f"GPU {index}"), "samples": len(rows),
            "temperature": _stat(col[1]), "power": _stat(col[2]),
            "sm_clock": _stat(col[3], peak=min), "memory_clock": _stat(col[4], peak=min),
            "utilization": last[5], "memory_used_mib": last[6], "memory_total_mib": last[7],
            "reasons_now": [name for bit, name in REASONS.items() if (last[8] or 0) & bit],
            "reasons_seen_s": {k: round(v, 1) for k, v in seen.items()},
            "thermal_for_s": _streak(samples, index, THERMAL_BITS),
            "power_capped_for_s": _streak(samples, index, POWER_BITS),
            "thresholds": {k: meta[k] for k in ("slowdown", "shutdown", "gpu_max") if meta.get(k) is not None},
            "trend": {"temperature": _trend(col[1]), "power": _trend(col[2])}}


TREND_POINTS = 30
_BLOCKS = "▁▂▃▄▅▆▇█"


def _trend(values: list) -> list:
    """At most TREND_POINTS values: the highest of each equal slice of ``values`` (None: no reading)."""
    if len(values) <= TREND_POINTS:
        return list(values)
    out = []
    for i in range(TREND_POINTS):
        part = [v for v in values[i * len(values) // TREND_POINTS:(i + 1) * len(values) // TREND_POINTS]
                if v is not None]
        out.append(max(part) if part else None)
    return out


def sparkline(values: list, low: float | None = None, high: float | None = None) -> str:
    """The values as a line of block characters (a space where there was no reading)."""
    known = [v for v in values if v is not None]
    if not known:
        return ""
    low = min(known) if low is None else low
    high = max(known) if high is None else high
    span = (high - low) or 1.0
    return "".join(" " if v is None else _BLOCKS[min(7, max(0, int((v - low) / span * 7.999)))] for v in values)


def last_recording(minutes: float = 10.0, path=None, kernel_log: bool = True) -> dict:
    """What the machine looked like in the last ``minutes`` of its newest flight recording (a plain dict; see
    the module docstring). ``path``: a ring file (default: this machine's). Never raises for a missing or
    damaged file: ``state`` says "none" or "unreadable"."""
    if not minutes > 0:
        raise ValueError(f"minutes={minutes!r} must be a positive number of minutes (e.g. 10)")
    path = Path(path) if path is not None else ring_path()
    now = time.time()
    report = {"path": str(path), "state": "none", "now": now, "minutes": minutes, "gpus": [], "host": {},
              "xid_events": [], "earlier": [], "kernel_log": None}
    try:
        _, records = read_records(path)
    except FileNotFoundError:
        records = []
    except (OSError, RingFormatError) as exc:
        report.update(state="unreadable", verdict=f"the flight-recorder file {path} cannot be read: {exc}")
        return report
    sessions = _sessions(records)
    if not sessions:
        report["verdict"] = ("no flight recording on this machine yet: it starts with the first training "
                             "colabkit watches (flight_recorder setting)")
        return report
    this_boot = boot_id()
    live = writer_alive(path)
    for older in sessions[-6:-1]:
        report["earlier"].append({"started": older[0].get("started", older[0]["t"]), "ended": older[-1]["t"],
                                  "pid": older[0].get("pid"),
                                  "state": _end_state(older, False),
                                  "rebooted_since": older[0].get("boot_id") != this_boot})
    session = sessions[-1]
    start, last = session[0], session[-1]
    started = start.get("started", start["t"])
    rebooted = bool(start.get("boot_id") and this_boot and start["boot_id"] != this_boot)
    state = _end_state(session, live and not rebooted)
    samples = [r for r in session if r.get("k") == "s"]
    window = [s for s in samples if s["t"] >= last["t"] - minutes * 60]
    period = float(start.get("sample_every") or 2.0)
    metas = {g["index"]: g for g in start.get("gpus", [])}
    report.update(state=state, rebooted_since=rebooted, host_name=start.get("host"), boot_id=start.get("boot_id"),
                  pid=start.get("pid"), started=started, last_record=last["t"], ago_s=now - last["t"],
                  samples=len(window), sample_every=period, note=start.get("note") or "",
                  recorder_error=last.get("error") if last.get("k") == "stop" else None)
    report["gpus"] = [_gpu_summary(i, metas[i], window, period) for i in sorted(metas)]
    report["xid_events"] = [xid_event(r) for r in session if r.get("k") == "xid"]
    host = [s.get("h") or [None] * 3 for s in window]
    report["host"] = {"cpu_temperature": _stat([h[0] for h in host]), "load1": _stat([h[1] for h in host]),
                      "ram_percent": _stat([h[2] for h in host])}
    if kernel_log:
        from .kernel_log import scan
        report["kernel_log"] = scan(started - 60, now if state == "recording" else last["t"] + 600)
    report["verdict"] = verdict(report)
    return report


def verdict(report: dict) -> str:
    """One line: how the newest recording ended, and the worst of what the GPUs and the kernel showed."""
    if report["state"] in ("none", "unreadable"):
        return report["verdict"]
    when, ago = _clock(report["last_record"]), format_duration(report["ago_s"])
    if report["state"] == "clean" and report.get("recorder_error"):
        head = f"the last recording ended at {when}, {ago} ago, when the recorder failed ({report['recorder_error']})"
    elif report["state"] == "clean":
        head = f"the last recording ended cleanly at {when}, {ago} ago"
    elif report["state"] == "recording":
        head = f"recording now (pid {report['pid']}, since {_clock(report['started'])})"
        abrupt = [e for e in report["earlier"] if e["state"] == "abrupt"]
        if abrupt:
            head += (f"; the recording before stopped without a clean end at {_clock(abrupt[-1]['ended'])}"
                     + (" and the machine rebooted after it" if abrupt[-1]["rebooted_since"] else ""))
    elif report["rebooted_since"]:
        head = f"the recording stopped without a clean end at {when}, {ago} ago, and the machine has rebooted since"
    else:
        head = (f"the recording stopped without a clean end at {when}, {ago} ago; the machine has not rebooted "
                f"since, so its process (pid {report['pid']}) was killed or crashed")
    parts = [_gpu_phrase(report["gpus"], report["sample_every"])] if report["gpus"] else []
    if report.get("xid_events"):
        parts.append("NVML reported " + describe_xid(report["xid_events"][-1]))
    events = (report.get("kernel_log") or {}).get("events") or []
    if events:
        parts.append("kernel log: " + describe_event(min(events, key=lambda e: _EVENT_ORDER.index(e["kind"]))))
    return head + (": " + "; ".join(p for p in parts if p) if any(parts) else "")


def _gpu_phrase(gpus: list, period: float) -> str:
    def hot(g):
        return ((g["thermal_for_s"] is not None), g["temperature"]["last"] or 0)
    g = max(gpus, key=hot)
    temp = g["temperature"]["last"]
    if temp is None:
        return ""
    at = f"GPU {g['index']} was at {temp:.0f} C"
    if g["thermal_for_s"] is not None:
        span = ("at the last sample" if g["thermal_for_s"] < period
                else f"for the last {format_duration(g['thermal_for_s'])}")
        return f"{at} in thermal slowdown {span}"
    if g["power_capped_for_s"] is not None and g["power"]["last"] is not None:
        return f"{at}, held at its power limit ({g['power']['last']:.0f} W)"
    return f"{at} (the hottest), no thermal slowdown"


def xid_event(record: dict) -> dict:
    """A ring's "xid" record (NVML event) as the report gives it: time, GPU index, PCI bus id, Xid, meaning."""
    from .kernel_log import XID_MEANINGS
    xid = record.get("xid")
    return {"t": record.get("t"), "gpu": record.get("gpu"), "pci": record.get("pci"), "xid": xid,
            "meaning": XID_MEANINGS.get(xid, "see NVIDIA's Xid catalogue")}


def describe_xid(e: dict) -> str:
    where = f"GPU {e['gpu']}" if e.get("gpu") is not None else "a GPU"
    where += f" ({e['pci']})" if e.get("pci") else ""
    when = f" at {_clock(e['t'])}" if e.get("t") else ""
    return f"Xid {e['xid']} on {where}: {e['meaning']}{when}"


def describe_event(e: dict) -> str:
    when = f" at {_clock(e['t'])}" if e.get("t") else ""
    if e["kind"] == "xid":
        return f"Xid {e['xid']} on {e['pci']} ({e['meaning']}){when}"
    if e["kind"] == "oom_kill":
        return f"the kernel's OOM killer killed {e['process']} (pid {e['pid']}){when}"
    names = {"gpu_lost": "a GPU fell off the bus", "thermal_shutdown": "thermal shutdown",
             "lockup": "a CPU lockup / hung task", "hardware_error": "a machine-check hardware error",
             "thermal_throttle": "CPU thermal throttling"}
    return f"{names[e['kind']]}{when}"


def _num(v, unit: str, digits: int = 0) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}{unit}"


def text(report: dict) -> str:
    """The report as `colabkit health --last` prints it."""
    lines = [f"flight recorder: {report['path']}", f"verdict: {report['verdict']}"]
    if report["state"] in ("none", "unreadable"):
        return "\n".join(lines)
    ended = {"clean": "ended cleanly", "recording": "still recording", "abrupt": "ended without a clean stop"}
    lines.append(f"recording: host {report['host_name']}, pid {report['pid']}, {_clock(report['started'])} - "
                 f"{_clock(report['last_record'])}, {ended[report['state']]}"
                 + (", machine rebooted since" if report["rebooted_since"] else ""))
    lines.append(f"last {report['minutes']:g} min of it ({report['samples']} samples, one per "
                 f"{report['sample_every']:g} s):")
    for g in report["gpus"]:
        t, p, sm = g["temperature"], g["power"], g["sm_clock"]
        limit = f", slowdown at {g['thresholds']['slowdown']} C" if "slowdown" in g["thresholds"] else ""
        mem = ("" if g["memory_used_mib"] is None else
               f", memory {g['memory_used_mib'] / 1024:.1f}/{(g['memory_total_mib'] or 0) / 1024:.1f} GiB")
        lines.append(f"  GPU {g['index']} {g['name']}: {_num(t['last'], ' C')} (peak {_num(t['peak'], ' C')}{limit}), "
                     f"{_num(p['last'], ' W', 1)} (peak {_num(p['peak'], ' W', 1)}), SM {_num(sm['last'], ' MHz')} "
                     f"(lowest {_num(sm['peak'], ' MHz')}), memory clock {_num(g['memory_clock']['last'], ' MHz')}"
                     f"{mem}, utilization {_num(g['utilization'], '%')}")
        if g["reasons_seen_s"]:
            seen = ", ".join(f"{k} {format_duration(v)}" for k, v in sorted(g["reasons_seen_s"].items()))
            lines.append(f"    throttled: {seen}; at the end: {', '.join(g['reasons_now']) or 'none'}")
    h = report["host"]
    if h:
        lines.append(f"  host: CPU {_num(h['cpu_temperature']['last'], ' C')} (peak "
                     f"{_num(h['cpu_temperature']['peak'], ' C')}), load {_num(h['load1']['last'], '', 2)} (peak "
                     f"{_num(h['load1']['peak'], '', 2)}), RAM {_num(h['ram_percent']['last'], '%')} (peak "
                     f"{_num(h['ram_percent']['peak'], '%')})")
    if report.get("note"):
        lines.append(f"  note: {report['note']}")
    if report.get("xid_events"):
        lines.append(f"GPU errors NVML reported while recording: {len(report['xid_events'])}")
        lines.extend(f"  {describe_xid(e)}" for e in report["xid_events"][-12:])
    k = report.get("kernel_log")
    if k is not None:
        if not k["readable"]:
            lines.append(k["note"])
        else:
            lines.append(f"kernel log ({k['source']}): " + (f"{len(k['events'])} event(s)" if k["events"]
                                                              else "nothing about GPUs, heat, OOM or lockups"))
            for e in k["events"][-12:]:
                lines.append(f"  {describe_event(e)}: {e['text'][:160]}")
    for e in report["earlier"]:
        lines.append(f"earlier: {_clock(e['started'])} - {_clock(e['ended'])} (pid {e['pid']}) "
                     f"{ended[e['state']]}" + (", machine rebooted since" if e["rebooted_since"] else ""))
    return "\n".join(lines)


def abrupt_notice(path=None) -> str | None:
    """A short block for `%load_ext colabkit` when the newest recording ended abruptly and has not been shown
    yet (remembered next to the ring), else None. Reads the ring's header first; the records only when it says
    the writer did not stop cleanly."""
    from .flight_ring import read_header
    path = Path(path) if path is not None else ring_path()
    try:
        with open(path, "rb") as fh:
            _, info = read_header(fh)
    except (OSError, RingFormatError):
        return None
    if info.get("state") != "recording":
        return None
    if info.get("boot_id") == boot_id() and writer_alive(path):
        return None
    key = f"{info.get('boot_id')}:{info.get('pid')}:{info.get('started')}"
    shown = path.with_name(SHOWN_NAME)
    try:
        if shown.read_text().strip() == key:
            return None
    except OSError:
        pass
    report = last_recording(minutes=5, path=path, kernel_log=False)
    if report["state"] != "abrupt":
        return None
    try:
        shown.write_text(key + "\n")
    except OSError:
        pass
    lines = [f"colabkit: flight recorder: {report['verdict']}."]
    for g in report["gpus"]:
        temps = g["trend"]["temperature"]
        if any(v is not None for v in temps):
            # one scale for every GPU (30-100 C), so that a hot GPU looks hot next to a cool one
            lines.append(f"  GPU {g['index']} temperature, last {report['minutes']:g} min: "
                         f"{sparkline(temps, low=30.0, high=100.0)} {g['temperature']['last']:.0f} C "
                         f"(peak {g['temperature']['peak']:.0f} C)")
    lines.append("  What the machine looked like before, and the kernel log: colabkit health --last")
    return "\n".join(lines)
