"""Live plots of a training monitor: `%monitor`, the `%colabkit` panel, or ``colabkit.health.plots.show()``.

Three panels: loss (and validation loss at each epoch's end) by step; step time with its input-wait share;
per GPU utilization, memory and temperature over time. In a terminal (or without ipywidgets), a compact text
summary instead.

Why matplotlib drawn into an ``ipywidgets.Image``: the PNG is made in the kernel (matplotlib's Agg canvas, no
pyplot state, from a daemon thread) and sent as a widget value, so it renders wherever ipywidgets' core widgets
render: Colab, JupyterLab 4, Notebook 7 and VS Code, with no front-end extension to install (on Colab colabkit
switches on its ipywidgets 8 support itself, as for the status panel). Widget
state changes from a thread reach the browser while a training cell keeps the kernel busy. Interactive plotting
widgets (ipympl, bqplot, plotly's FigureWidget) are custom widgets: on Colab they need
``enable_custom_widget_manager()`` and a third-party widget manager, and some need a front-end extension
elsewhere. The cost: a redraw is ~0.1-0.3 s of one CPU core, so plots refresh every 5 s by default and only
when something changed.
"""
from __future__ import annotations

import html
import io
import logging
import threading
import time

from ..units import parse_duration
from .health_monitor import latest_monitor

log = logging.getLogger("colabkit")

DEFAULT_REFRESH = 5.0


def render_png(monitor, *, width: float = 8.0, height: float = 6.2, dpi: int = 80) -> bytes:
    """The monitor's plots as PNG bytes (matplotlib's Agg canvas; no pyplot)."""
    from ..optional import require
    require("matplotlib", "health", "colabkit's training plots")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = monitor.series()
    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    ax_loss, ax_step, ax_gpu = fig.subplots(3, 1)

    losses = data["losses"]
    if losses:
        ax_loss.plot([s for s, _ in losses], [v for _, v in losses], lw=1, color="#1f77b4", label="loss")
    val = [(e.get("step"), e["val_loss"]) for _, e in data["epochs"] if "val_loss" in e]
    if val:
        ax_loss.plot([s for s, _ in val], [v for _, v in val], "o-", color="#d62728", ms=4, label="val loss")
    ax_loss.set_ylabel("loss")
    ax_loss.set_title("loss", loc="left", fontsize=9)
    if losses or val:
        ax_loss.legend(loc="upper right", fontsize=8)

    steps = data["steps"]
    if steps:
        xs = [s for _, s, _, _ in steps]
        ms = [t * 1000 for _, _, t, _ in steps]
        ax_step.plot(xs, ms, lw=1, color="#444", label="step time")
        measured = [(s, t * 1000 * share) for _, s, t, share in steps if share is not None]
        if measured:
            ax_step.bar([s for s, _ in measured], [v for _, v in measured], width=max(1.0, len(xs) / 200),
                        color="#ff7f0e", label="input wait")
        ax_step.legend(loc="upper right", fontsize=8)
    share = monitor.input_fraction()[0]
    ax_step.set_title("step time (ms)" + ("" if share is None else f" · input {share:.0%} of step time"),
                      loc="left", fontsize=9)
    ax_step.set_xlabel("step")

    gpus = data["gpus"]
    if gpus:
        t0 = min((series[0][0] for series in gpus.values() if series), default=time.time())
        temp_ax = ax_gpu.twinx()
        for index, series in gpus.items():
            if not series:
                continue
            ts = [t - t0 for t, *_ in series]
            ax_gpu.plot(ts, [u if u is not None else float("nan") for _, u, _, _ in series], lw=1,
                        label=f"GPU {index} util %")
            ax_gpu.plot(ts, [m * 100 if m is not None else float("nan") for _, _, m, _ in series], lw=1, ls="--",
                        label=f"GPU {index} mem %")
            temp_ax.plot(ts, [c if c is not None else float("nan") for *_, c in series], lw=1, ls=":",
                         label=f"GPU {index} C")
        ax_gpu.set_ylim(0, 105)
        temp_ax.set_ylabel("C")
        handles = ax_gpu.get_legend_handles_labels()
        more = temp_ax.get_legend_handles_labels()
        ax_gpu.legend(handles[0] + more[0], handles[1] + more[1], loc="lower left", fontsize=7, ncol=3)
        ax_gpu.set_title("GPU utilization, memory (%) and temperature (C)", loc="left", fontsize=9)
        ax_gpu.set_xlabel("seconds")
    else:
        note = monitor.sampler.note if monitor.sampler is not None else "not started"
        ax_gpu.text(0.5, 0.5, note if note.startswith("no GPU") else f"no GPU figures: {note}",
                    ha="center", va="center", fontsize=9,
                    transform=ax_gpu.transAxes)
        ax_gpu.set_axis_off()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


class MonitorPanel:
    """An ipywidgets panel: the verdict line and the plots, redrawn every ``refresh`` while data changes.

    ``monitor=None`` follows the most recently started monitor (what `%monitor` shows)."""

    def __init__(self, monitor=None, refresh=DEFAULT_REFRESH, *, thread: bool = True):
        from ..optional import require
        widgets = require("ipywidgets", "notebook", "The colabkit training plots")
        self.monitor, self.refresh = monitor, parse_duration(refresh, name="refresh")
        self.updates = 0
        self._seen = None
        self._lock = threading.Lock()
        self.header = widgets.HTML()
        self.image = widgets.Image(format="png", layout=widgets.Layout(max_width="100%"))
        self.image.add_class("colabkit-health-plot")
        self.widget = widgets.VBox([self.header, self.image])
        self.widget.add_class("colabkit-health")
        self.update()
        if thread:
            threading.Thread(target=self._run, name="colabkit-health-plots", daemon=True).start()

    @property
    def closed(self) -> bool:
        return getattr(self.widget, "comm", None) is None

    def _target(self):
        return self.monitor if self.monitor is not None else latest_monitor()

    def update(self) -> None:
        with self._lock:
            mon = self._target()
            if mon is None:
                self.header.value = ("<span class='colabkit-health-verdict' style='color:#666'>colabkit health: no "
                                     "monitor yet (colabkit.keras.Monitor(), AutoResume(monitor=True) or "
                                     "colabkit.monitor())</span>")
                return
            key = (id(mon), mon.steps, len(mon.epochs), mon.current_phase, len(mon.hangs),
                   int(time.time() // self.refresh) if mon.running else 0)
            if key == self._seen:
                return
            self._seen = key
            report = mon.report()
            color = "#a00" if report["hangs"] and mon._stall is not None else "#333"
            self.header.value = (f"<b>colabkit health</b> · {report['steps']} steps · "
                                 f"<span class='colabkit-health-steps' data-steps='{report['steps']}'></span>"
                                 f"<span class='colabkit-health-verdict' style='color:{color}'>"
                                 f"{html.escape(report['verdict'])}</span>"
                                 + "".join(f"<br><span class='colabkit-health-also' style='color:#555'>"
                                           f"{html.escape(v['text'])}</span>" for v in report["verdicts"][1:])
                                 + ("" if not report.get("energy") else
                                    f"<br><span class='colabkit-health-energy' style='color:#555'>"
                                    f"{html.escape(report['energy']['text'])}</span>"))
            try:
                self.image.value = render_png(mon)
            except ImportError as exc:
                self.header.value += f"<br><span style='color:#a60'>{html.escape(str(exc))}</span>"
            self.updates += 1

    def _run(self) -> None:
        while not self.closed:
            time.sleep(self.refresh)
            try:
                self.update()
            except Exception:
                log.debug("colabkit: health plot update failed", exc_info=True)


def text_summary(monitor=None) -> str:
    """The compact text form (terminals, text-only frontends)."""
    mon = monitor if monitor is not None else latest_monitor()
    if mon is None:
        return "colabkit health: no monitor has run in this process yet"
    return mon.text()


def show(monitor=None, *, text_only: bool = False, refresh=DEFAULT_REFRESH):
    """Live plots in a kernel with ipywidgets (text/plain fallback), the text summary elsewhere.
    Returns the MonitorPanel or None."""
    from ..display import in_kernel, prepare_widgets
    if not text_only and in_kernel():
        try:
            prepare_widgets()
            panel = MonitorPanel(monitor, refresh=refresh)
        except ImportError:
            panel = None
        if panel is not None:
            from IPython.display import display
            bundle = panel.widget._repr_mimebundle_()
            bundle["text/plain"] = text_summary(monitor)
            display(bundle, raw=True)
            return panel
    print(text_summary(monitor))
    return None
