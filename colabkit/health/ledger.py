"""The machine's cost ledger: one JSON line per run (a fit watched by the training monitor, a `colabkit run` job),
and ``costs()``, its sums per user or project since a date.

Where: the ``ledger`` setting, else ``$XDG_DATA_HOME/colabkit/ledger.jsonl`` (~/.local/share/colabkit). A run
appends its record every few minutes and when it ends, each time with the same ``id`` and the totals so far, so
a crash loses at most the last interval; readers keep the last record of each id. Each record is one
``write()`` on a file opened with O_APPEND, so concurrent runs never interleave; a torn last line (a writer
killed mid-write) is skipped.

Record keys: id, kind ("fit" | "job"), start, end (epoch s), user, host, project, gpus (names), gpu_count,
gpu_hours, gpu_kwh, cpu_kwh, kwh, estimate, money, currency, cloud_cost, cloud_as, cloud_date, cloud_currency,
lost_gpu_hours (attempts that failed or hung), lost_steps (batches trained twice after a resume), final.
"""
from __future__ import annotations

import datetime as _dt
import getpass
import json
import os
import socket
import time
import uuid
from pathlib import Path

APPEND_EVERY = 300.0    # seconds between a running run's records


def ledger_path(settings=None) -> Path:
    if settings is None:
        from .. import config
        settings = config.load()
    if settings.ledger is not None:
        return Path(settings.ledger)
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "colabkit" / "ledger.jsonl"


def default_project(settings=None, fallback: str | None = None) -> str:
    """The ``project`` setting (COLABKIT_PROJECT), else ``fallback`` (a job's name), else the working folder's
    name."""
    if settings is None:
        from .. import config
        settings = config.load()
    return settings.project or fallback or Path.cwd().name or "/"


def user_name() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name (some containers): the uid
        return str(os.getuid()) if hasattr(os, "getuid") else "unknown"


def new_id() -> str:
    return uuid.uuid4().hex[:16]


def record_of(run_id: str, kind: str, reading: dict, priced: dict, *, project: str, start: float,
              lost_gpu_hours: float = 0.0, lost_steps: int = 0, final: bool = False) -> dict:
    """A ledger record from an energy reading (energy.EnergyMeter.reading) and its prices (prices.costs_of)."""
    cloud = priced.get("cloud") or {}
    return {"id": run_id, "kind": kind, "start": start, "end": time.time(), "user": user_name(),
            "host": socket.gethostname(), "project": project, "gpus": reading.get("gpus") or [],
            "gpu_count": reading.get("gpu_count", 0), "gpu_hours": reading.get("gpu_hours") or 0.0,
            "gpu_kwh": reading.get("gpu_kwh"), "cpu_kwh": reading.get("cpu_kwh"), "kwh": reading.get("kwh"),
            "estimate": bool(reading.get("estimate")), "money": priced.get("money"),
            "currency": priced.get("currency"), "cloud_cost": cloud.get("cost"), "cloud_as": cloud.get("as"),
            "cloud_date": cloud.get("date"), "cloud_currency": cloud.get("currency"),
            "lost_gpu_hours": lost_gpu_hours, "lost_steps": int(lost_steps), "final": final}


def append(record: dict, path=None) -> Path:
    """Append ``record`` as one line, in one write (O_APPEND)."""
    path = Path(path) if path is not None else ledger_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return path


_NUMBERS = ("start", "end", "gpu_count", "gpu_hours", "gpu_kwh", "cpu_kwh", "kwh", "money", "cloud_cost",
            "lost_gpu_hours", "lost_steps")


def _checked(rec) -> dict | None:
    """``rec`` with its figures as numbers (a hand edit may leave "2.5" or null), or None where a line is not a
    run record or a figure is not a number."""
    if not isinstance(rec, dict) or not isinstance(rec.get("id"), (str, int)) or rec.get("id") in ("", None):
        return None
    out = dict(rec)
    for key in _NUMBERS:
        value = out.get(key)
        if value is None:
            continue
        if isinstance(value, bool):
            return None
        try:
            out[key] = float(value)
            if out[key] != out[key]:      # NaN
                return None
            if key in ("gpu_count", "lost_steps"):
                out[key] = int(out[key])
        except (TypeError, ValueError, OverflowError):
            return None
    return out


def read(path=None, skipped: list | None = None) -> list:
    """The ledger's runs: the last record of each id, in the order they first appeared. Lines that are not a
    run record (torn by a writer that died mid-write, or edited by hand into something else) are skipped; their
    line numbers go into ``skipped`` where given."""
    path = Path(path) if path is not None else ledger_path()
    runs: dict = {}
    try:
        with open(path, "rb") as fh:
            for number, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                try:
                    rec = _checked(json.loads(raw))
                except ValueError:
                    rec = None
                if rec is None:
                    if skipped is not None:
                        skipped.append(number)
                    continue
                runs[str(rec["id"])] = rec
    except FileNotFoundError:
        return []
    return list(runs.values())


def parse_since(value) -> float | None:
    """``value``: None, a date "2026-11-01", a date and time "2026-11-01T14:00", or a duration back from now
    ("7d", "12h"). Epoch seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, _dt.datetime):
        return value.timestamp()
    if isinstance(value, _dt.date):
        return _dt.datetime.combine(value, _dt.time()).timestamp()
    text = str(value).strip()
    try:
        return _dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        pass
    from ..units import parse_duration
    try:
        return time.time() - parse_duration(text, name="since")
    except ValueError:
        raise ValueError(f"--since {value!r}: expected a date such as 2026-11-01, a date and time such as "
                         f"2026-11-01T14:00, or a time back from now such as 7d or 12h.") from None


def costs(since=None, by: str = "project", path=None, settings=None) -> dict:
    """Sums of the ledger's runs that ended at or after ``since``, per ``by`` ("user" or "project").

    Returns {"by", "since", "ledger", "price_per_kwh", "currency", "rows": [{key, runs, gpu_hours, kwh,
    money, cloud_cost, saved, lost_gpu_hours, lost_steps, estimate}], "total": {...}, "cloud_dates", "note"}.
    Records written without an electricity price are priced at today's ``electricity_price``, if set."""
    if by not in ("user", "project"):
        raise ValueError(f"--by {by!r}: expected 'user' or 'project'.")
    if settings is None:
        from .. import config
        settings = config.load()
    start = parse_since(since)
    path = Path(path) if path is not None else ledger_path(settings)
    price = settings.electricity_price
    rows: dict = {}
    total = _empty("total")
    dates = set()
    skipped: list = []
    for rec in read(path, skipped):
        if start is not None and (rec.get("end") or 0) < start:
            continue
        key = str(rec.get(by) or "?")
        row = rows.setdefault(key, _empty(key))
        money = rec.get("money")
        if str(rec.get("currency") or settings.currency).upper() != settings.currency:
            money = None     # priced in another currency (the setting changed since): priced again in this one
        if money is None and price is not None and rec.get("kwh") is not None:
            money = rec["kwh"] * price
        same_currency = str(rec.get("cloud_currency") or "USD").upper() == settings.currency
        if rec.get("cloud_date"):
            dates.add(rec["cloud_date"])
        for target in (row, total):
            target["runs"] += 1
            target["gpu_hours"] += rec.get("gpu_hours") or 0.0
            target["kwh"] += rec.get("kwh") or 0.0
            target["lost_gpu_hours"] += rec.get("lost_gpu_hours") or 0.0
            target["lost_steps"] += int(rec.get("lost_steps") or 0)
            target["estimate"] = target["estimate"] or bool(rec.get("estimate"))
            if money is not None:
                target["money"] = (target["money"] or 0.0) + money
            if rec.get("cloud_cost") is not None and same_currency:
                target["cloud_cost"] = (target["cloud_cost"] or 0.0) + rec["cloud_cost"]
                if money is not None:
                    target["saved"] = (target["saved"] or 0.0) + rec["cloud_cost"] - money
    notes = [] if price is not None else [
        "no electricity price set: kWh only. Set it with electricity_price = 0.30 in the config file "
        "(`colabkit config` shows where) or COLABKIT_ELECTRICITY_PRICE=0.30, in your currency per kWh."]
    if skipped:
        shown = ", ".join(map(str, skipped[:10])) + (", ..." if len(skipped) > 10 else "")
        notes.append(f"{len(skipped)} line(s) of {path} skipped, not a run record with numeric figures "
                     f"(line {shown}): fix or delete them")
    note = "\n".join(notes)
    return {"by": by, "since": start, "ledger": str(path), "price_per_kwh": price, "currency": settings.currency,
            "rows": sorted(rows.values(), key=lambda r: -r["gpu_hours"]), "total": total,
            "cloud_dates": sorted(dates), "note": note}


def _empty(key: str) -> dict:
    return {"key": key, "runs": 0, "gpu_hours": 0.0, "kwh": 0.0, "money": None, "cloud_cost": None, "saved": None,
            "lost_gpu_hours": 0.0, "lost_steps": 0, "estimate": False}


def costs_text(data: dict) -> str:
    """The table `colabkit costs` prints."""
    cur = data["currency"]
    since = ("since " + _dt.datetime.fromtimestamp(data["since"]).strftime("%Y-%m-%d %H:%M")
             if data["since"] is not None else "all time")
    head = (data["by"], "runs", "GPU-h", "kWh", f"cost {cur}", f"cloud {cur}", "saved", "lost GPU-h", "lost steps")
    table = [head]

    from .prices import num

    def money(v, approx):   # cents, unless a tiny run would show 0.00
        return "-" if v is None else f"{approx}{v:.2f}" if abs(v) >= 0.01 or v == 0 else f"{approx}{num(v)}"

    for r in data["rows"] + ([data["total"]] if len(data["rows"]) > 1 else []):
        approx = "~" if r["estimate"] else ""
        table.append((r["key"], str(r["runs"]), num(r["gpu_hours"]), f"{approx}{num(r['kwh'])}",
                      money(r["money"], approx), money(r["cloud_cost"], ""), money(r["saved"], approx),
                      num(r["lost_gpu_hours"]), str(r["lost_steps"])))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = [f"colabkit costs · {since} · ledger {data['ledger']}"]
    if not data["rows"]:
        lines.append("no runs recorded" + (" in that time" if data["since"] is not None else ""))
    else:
        for row in table:
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    if data["total"]["estimate"]:
        lines.append("~ estimate: a GPU or the CPU was shared with other work, its energy split between them")
    if data["cloud_dates"]:
        lines.append(f"cloud: on-demand prices of {', '.join(data['cloud_dates'])} for a comparable GPU (a guess; "
                     f"see colabkit.health.prices)")
    if data["note"]:
        lines.append(data["note"])
    return "\n".join(lines)
