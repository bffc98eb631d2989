"""The live status panel: `%colabkit` in widget-capable frontends (ipywidgets), plain text elsewhere.

    colabkit.widgets.show_status()     # what %colabkit does
    panel = colabkit.widgets.StatusPanel(refresh="2s"); display(panel.widget)

Rows: environment and VM age, time left to the runtime cap (a progress bar), browser presence, the idle cutoff,
keep-alive on/off, the training run (which AutoResume, its last event), the last checkpoint (step, age, where,
upload state) of the most recent AutoResume / Checkpoints of this process, the next deadline save and the last one
that happened; once a training monitor (colabkit.health) has started, a training-health row and its live plots
(colabkit/health/plots.py). A daemon thread refreshes every open panel (widget state changes from a thread reach the
browser while a training cell keeps the kernel busy).

What it shows of a run comes from its run record (colabkit.resume.run: ``latest_run_and_store()``, and ``track(obj)``
for a bare Checkpoints, weakly). Importing this module imports neither ipywidgets nor IPython.
"""
from __future__ import annotations

import dataclasses
import html
import logging
import sys
import threading
import time

from .resume.run import latest_run_and_store, track  # noqa: F401 - track: also colabkit.widgets.track
from .display import in_kernel, prepare_widgets
from .units import format_duration, parse_duration

log = logging.getLogger("colabkit")

DEFAULT_REFRESH = 2.0
MAX_LIVE_PANELS = 4      # older %colabkit panels stop refreshing (each refresh costs a little CPU)


def latest():
    """(AutoResume or None, Checkpoints or None): the store that saved most recently and its AutoResume."""
    run, store = latest_run_and_store()
    return (run.owner if run is not None else None), store


# -- what the panel shows ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StatusSnapshot:
    kind: str
    rows: list            # [(key, label, text)]
    cap_fraction: float | None
    cap_text: str
    taken_at: float


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def snapshot() -> StatusSnapshot:
    """Everything the panel shows, as plain values (also used for the text form)."""
    from .runtime import env
    from .presence import ABSENT, ATTACHED, current, idle_label, running_monitor

    now = time.time()
    e = env()
    rows = [("environment", "environment", f"{e.kind} · VM age {format_duration(e.uptime)} (from {e.uptime_source})")]
    if e.runtime_cap is None:
        cap_fraction, cap_text = None, "no runtime cap here"
    else:
        cap_fraction = min(1.0, max(0.0, e.uptime / e.runtime_cap))
        cap_text = e.cap_phrase() + (f" (at {_clock(e.cap_at)})" if e.time_left > 0 else "")
    rows.append(("runtime", "runtime cap", cap_text))

    p = current()
    watched = running_monitor() is not None
    browser = p.text() + (f" · checked {_clock(p.checked_at)}" if p.state != "unknown" else "")
    rows.append(("browser", "browser", browser + ("" if watched else " (not monitored: run %keepalive)")))

    if e.idle_cutoff is None:
        idle = "none here"
    elif p.state == ABSENT and p.since is not None:
        idle = f"{idle_label(e.idle_cutoff)} · reached at {_clock(p.since + e.idle_cutoff)} unless a browser returns"
        if p.since_basis in ("kernel start", "presence start"):
            idle += " (at the earliest: no browser seen yet)"
    elif p.state == ATTACHED:
        idle = f"{idle_label(e.idle_cutoff)} · not counting (a browser is attached)"
    else:
        idle = f"{idle_label(e.idle_cutoff)} · cannot tell when it is reached (presence unknown)"
    rows.append(("idle", "idle cutoff", idle))

    ka = sys.modules.get("colabkit.keepalive")
    rows.append(("keepalive", "keep-alive", ka.describe() if ka is not None else "off"))

    run, store = latest_run_and_store()
    if run is not None:
        rows.append(("run", "training run", _run_text(run)))
    rows.append(("checkpoint", "last checkpoint", _checkpoint_text(store, now)))
    rows.append(("next_save", "next deadline save", _next_save_text(e, run, now)))
    last = _last_deadline_save(run)
    if last:
        rows.append(("last_save", "last deadline save", last))
    health = _health_monitor()
    if health is not None:
        report = health.report()
        rows.append(("health", "training health", f"{report['steps']} steps · {report['verdict']}"))
    return StatusSnapshot(kind=e.kind, rows=rows, cap_fraction=cap_fraction, cap_text=cap_text, taken_at=now)


def _health_monitor():
    """The newest training monitor of this process, without importing colabkit.health when none was made."""
    module = sys.modules.get("colabkit.health.health_monitor")
    return None if module is None else module.latest_monitor()


def _run_text(run) -> str:
    text = run.name
    if run.events:
        t, kind, detail = run.events[-1]
        text += f" · last event {_clock(t)}: {kind}, {detail}"
    return text


def _checkpoint_text(store, now: float) -> str:
    if store is None:
        return "none (no AutoResume or Checkpoints in this process)"
    status = store.status
    info = status.last_local or status.last_uploaded
    if info is None:
        return f"none yet in {store.destination}" + (f" (last error: {status.last_error})" if status.last_error else "")
    newest = max((i for i in (status.last_local, status.last_uploaded) if i is not None),
                 key=lambda i: (i.step, i.created))
    text = f"step {newest.step}" + (f" (epoch {newest.epoch})" if newest.epoch is not None else "")
    text += f" · {format_duration(now - newest.created)} ago · "
    uploaded = status.last_uploaded is not None and status.last_uploaded.name == newest.name
    where = getattr(store, "location", None)
    where = where if isinstance(where, str) else store.destination   # "drive:runs/x" as the user wrote it
    if getattr(store, "dest", True) is None:
        text += f"in {where}"
    elif uploaded:
        text += f"uploaded to {where}"
    else:
        text += f"on local disk, upload {status.state}"
    if status.last_error and status.state != "idle":
        text += f" ({status.last_error})"
    return text


def _next_save_text(e, run, now: float) -> str:
    from .deadline import MARGIN_FLOOR_S, DeadlineWatch, RuntimeCapClock, registered
    clocks = [RuntimeCapClock(e)] + registered()
    floor = run.margin_floor if run is not None else MARGIN_FLOOR_S
    estimate = None
    if run is not None:
        try:
            estimate = run.checkpoints.estimated_save_seconds()
        except Exception:  # noqa: BLE001
            estimate = None
    margin = DeadlineWatch([], margin_floor=floor).margin(estimate or 0.0)
    upcoming = []
    for clock in clocks:
        try:
            d = clock.next_deadline()
        except Exception:  # noqa: BLE001 - a broken clock must not break the panel
            continue
        if d is not None:
            upcoming.append(d)
    if not upcoming:
        return "none scheduled"
    d = min(upcoming, key=lambda x: x.at)
    save_at = d.at - margin
    when = "now" if save_at <= now else f"{_clock(save_at)} (in {format_duration(save_at - now)})"
    action = "save, then stop" if d.stop_training else "save and upload, keep training"
    text = f"{when}, before {d.reason}: {action}"
    if run is None or run.deadline != "auto":
        text += " · no AutoResume(deadline=\"auto\") running"
    return text


def _last_deadline_save(run) -> str | None:
    last = run.last_deadline_save() if run is not None else None
    return None if last is None else f"{_clock(last[0])}: {last[1]}"


def text() -> str:
    """The status in plain text: the summary of ``colabkit.status()`` plus the panel's live rows."""
    from .summary import status
    lines = [status().text()]
    snap = snapshot()
    for key, label, value in snap.rows:
        if key in ("environment", "runtime") or (key == "idle" and value == "none here"):
            continue  # the summary already says these
        lines.append(f"  {label:<19} {value}")
    return "\n".join(lines)


# -- the widget ----------------------------------------------------------------------------------------------
_STYLE = ("<style>.colabkit-status table{border-collapse:collapse;font-size:13px}"
          ".colabkit-status td{padding:1px 10px 1px 0;vertical-align:top;text-align:left}"
          ".colabkit-status td.k{color:#666;white-space:nowrap}</style>")


class StatusPanel:
    """An ipywidgets panel (``.widget``) refreshed every ``refresh`` seconds by a shared daemon thread."""

    def __init__(self, refresh=DEFAULT_REFRESH):
        from .optional import require
        widgets = require("ipywidgets", "notebook", "The colabkit status panel")
        self.refresh = parse_duration(refresh, name="refresh")
        self._lock = threading.Lock()
        self.updates = 0
        self._frozen = False
        self.header = widgets.HTML()
        self.bar = widgets.FloatProgress(value=0.0, min=0.0, max=1.0, layout=widgets.Layout(width="240px"))
        self.bar.add_class("colabkit-cap-bar")
        self.bar_text = widgets.HTML()
        self.bar_row = widgets.HBox([widgets.HTML("<span style='color:#666'>VM lifetime&nbsp;</span>"),
                                     self.bar, self.bar_text])
        self.table = widgets.HTML()
        self.health_box = widgets.VBox()    # the training plots, once a monitor exists (colabkit.health)
        self._plots = None
        self.widget = widgets.VBox([self.header, self.bar_row, self.table, self.health_box],
                                   layout=widgets.Layout(border="1px solid #ddd", padding="4px 10px"))
        self.widget.add_class("colabkit-status")
        self.update()
        _updater.add(self)

    @property
    def closed(self) -> bool:
        return getattr(self.widget, "comm", None) is None

    def update(self) -> None:
        with self._lock:
            if self._frozen:
                return
            try:
                snap = snapshot()
            except Exception as exc:
                log.debug("colabkit: status panel update failed", exc_info=True)
                self.header.value = (f"{_STYLE}<b>colabkit</b> · status unavailable: "
                                     f"{html.escape(str(exc) or type(exc).__name__)}")
                return
            self.updates += 1
            self.header.value = (f"{_STYLE}<b>colabkit</b> · {html.escape(snap.kind)} · "
                                 f"<span class='colabkit-updated' style='color:#666'>updated {_clock(snap.taken_at)}"
                                 f"</span>")
            if snap.cap_fraction is None:
                self.bar_row.layout.display = "none"
            else:
                self.bar_row.layout.display = None
                self.bar.value = snap.cap_fraction
                self.bar.bar_style = ("danger" if snap.cap_fraction >= 0.9 else
                                      "warning" if snap.cap_fraction >= 0.75 else "success")
                self.bar_text.value = f"&nbsp;{html.escape(snap.cap_text)}"
            shown = [row for row in snap.rows if not (row[0] == "runtime" and snap.cap_fraction is not None)]
            cells = "".join(f"<tr data-row='{key}'><td class='k'>{html.escape(label)}</td>"
                            f"<td class='v'>{html.escape(value)}</td></tr>" for key, label, value in shown)
            self.table.value = f"<table>{cells}</table>"
            self._update_plots()

    def _update_plots(self) -> None:
        if self._plots is None:
            if _health_monitor() is None:
                return
            from .health.plots import MonitorPanel
            self._plots = MonitorPanel(None, thread=False)   # redrawn from this panel's refresh, at most every 5s
            self.health_box.children = [self._plots.widget]
        else:
            self._plots.update()

    def freeze(self, note: str) -> None:
        """Stop refreshing; say so in the header."""
        _updater.discard(self)
        with self._lock:
            self._frozen = True
            self.header.value += f" <span style='color:#a60'>· {html.escape(note)}</span>"

    def close(self) -> None:
        _updater.discard(self)
        for w in (*self.bar_row.children, self.bar_row, self.header, self.table, self.widget):
            w.close()


class _Updater:
    """One daemon thread refreshing every open panel; it ends when no panel is left."""

    def __init__(self):
        self._panels: list[StatusPanel] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, panel: StatusPanel) -> None:
        with self._lock:
            self._panels.append(panel)
            retired, self._panels = self._panels[:-MAX_LIVE_PANELS], self._panels[-MAX_LIVE_PANELS:]
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="colabkit-status-panel", daemon=True)
                self._thread.start()
        for old in retired:
            old.freeze("frozen: a newer %colabkit panel is live")

    def discard(self, panel: StatusPanel) -> None:
        with self._lock:
            if panel in self._panels:
                self._panels.remove(panel)

    def _run(self) -> None:
        next_due: dict[int, float] = {}
        while True:
            with self._lock:
                self._panels = [p for p in self._panels if not p.closed]
                panels = list(self._panels)
                if not panels:
                    self._thread = None
                    return
            now = time.monotonic()
            for panel in panels:
                if now >= next_due.get(id(panel), 0.0):
                    next_due[id(panel)] = now + panel.refresh
                    try:
                        panel.update()
                    except Exception:
                        log.debug("colabkit: status panel refresh failed", exc_info=True)
            time.sleep(min(0.5, min(p.refresh for p in panels)))


_updater = _Updater()


def show_status(*, text_only: bool = False, refresh=DEFAULT_REFRESH):
    """Show the status: a live widget panel in a kernel with ipywidgets (text/plain fallback for frontends
    that cannot render widgets), plain text elsewhere. Returns the StatusPanel or None."""
    if not text_only and in_kernel():
        try:
            prepare_widgets()
            panel = StatusPanel(refresh=refresh)
        except ImportError:
            panel = None
        if panel is not None:
            from IPython.display import display
            bundle = panel.widget._repr_mimebundle_()
            bundle["text/plain"] = text()
            display(bundle, raw=True)
            return panel
    print(text())
    return None
