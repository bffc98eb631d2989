"""Keep-alive past Colab's idle cutoff: a top-level browser script, presence detection, idle-aware saves.

    %keepalive            # or colabkit.keepalive("60s")
    %keepalive off        # or colabkit.keepalive(False)

What it can and cannot do, honestly:

* JavaScript from a notebook cell runs in a sandboxed output frame and cannot touch Colab's toolbar. The
  keep-alive script therefore has to run in the top-level Colab page: paste it into the browser's devtools
  console, or drag the bookmarklet link to the bookmarks bar and click it on the Colab tab. It clicks the
  connect button every ``interval`` and stops on ``stopKeepAlive()``.
* It is best-effort: Google changes the page (the script knows the selectors seen so far and says in the
  console when none matches), and a CAPTCHA / "are you still there?" dialog stops any auto-clicker. The
  script does not click through such a dialog: it reports it (console, tab title, a banner) and waits.
* It does not lift the runtime cap (about 12 h on the free tier): ``AutoResume(deadline="auto")`` saves and
  stops before it.
* colabkit cannot see from the kernel whether the script runs in your tab. What it can see is whether a
  browser is attached (``colabkit.presence``): with keep-alive on, ``AutoResume(deadline="auto")`` saves and
  uploads a checkpoint before the idle cutoff while no browser is attached, so a disconnect costs nothing.

Elsewhere (JupyterLab, a home rig) no idle cutoff applies; ``keepalive()`` says so and still starts presence
detection (shown in the ``%colabkit`` panel).
"""
from __future__ import annotations

import html
import logging
import sys
import threading
import time
import types
import urllib.parse

from .units import DURATION_FORMS, parse_duration

log = logging.getLogger("colabkit")

DEFAULT_INTERVAL = "60s"
MIN_INTERVAL = 1.0

# The script that runs in the top-level Colab page. No "//" comments: the bookmarklet form is one URL.
# Selectors are tried in order, newest first (see colab-facts.md); the first that finds a button is used.
SCRIPT_TEMPLATE = r"""/* colabkit keep-alive for Google Colab (best-effort). Stop it with stopKeepAlive(). */
(function (intervalMs) {
  "use strict";
  var TAG = "[colabkit keep-alive]";
  if (typeof window.stopKeepAlive === "function") { window.stopKeepAlive(true); }
  var state = window.colabkitKeepAlive = {
    running: true, intervalMs: intervalMs, clicks: 0, lastClick: null, variant: null,
    dialog: null, dialogsSeen: 0, misses: 0, startedAt: new Date().toISOString()
  };
  var VARIANTS = [
    ["colab-connect-button shadow root #connect", function () {
      var host = document.querySelector("colab-connect-button");
      return host && host.shadowRoot ? host.shadowRoot.querySelector("#connect") : null;
    }],
    ["colab-toolbar-button#connect", function () {
      return document.querySelector("colab-toolbar-button#connect");
    }],
    ["colab-connect-button", function () {
      var host = document.querySelector("colab-connect-button");
      return host ? (host.querySelector("#connect") || host) : null;
    }]
  ];
  var DIALOG_SELECTOR = "mwc-dialog, md-dialog, paper-dialog, colab-dialog, dialog, [role=dialog], [role=alertdialog]";
  var DIALOG_TEXT = /are you still there|still there\?|not a robot|captcha|verify (that )?you('| a)re human/i;

  function deepQueryAll(root, selector, out) {
    var i, all;
    out = out || [];
    all = root.querySelectorAll(selector);
    for (i = 0; i < all.length; i++) { out.push(all[i]); }
    all = root.querySelectorAll("*");
    for (i = 0; i < all.length; i++) {
      if (all[i].shadowRoot) { deepQueryAll(all[i].shadowRoot, selector, out); }
    }
    return out;
  }
  function deepText(el) {
    var text = el.textContent || "", i, all = el.querySelectorAll ? el.querySelectorAll("*") : [];
    if (el.shadowRoot) { text += " " + deepText(el.shadowRoot); }
    for (i = 0; i < all.length; i++) {
      if (all[i].shadowRoot) { text += " " + deepText(all[i].shadowRoot); }
    }
    return text;
  }
  function shown(el) {
    if (el.hasAttribute && (el.hasAttribute("open") || el.hasAttribute("opened"))) { return true; }
    if (el.open === true || el.opened === true) { return true; }
    if (/^(DIALOG|MWC-DIALOG|MD-DIALOG|PAPER-DIALOG)$/.test(el.tagName)) { return false; }
    var r = el.getBoundingClientRect(), style = window.getComputedStyle(el);
    return r.width > 0 && r.height > 0 && style.visibility !== "hidden" && style.display !== "none";
  }
  function findDialog() {
    var i, frames = deepQueryAll(document, "iframe[src*='recaptcha'], iframe[title*='reCAPTCHA']");
    for (i = 0; i < frames.length; i++) {
      if (shown(frames[i])) { return {kind: "captcha", text: "a reCAPTCHA challenge"}; }
    }
    var dialogs = deepQueryAll(document, DIALOG_SELECTOR);
    for (i = 0; i < dialogs.length; i++) {
      var text = deepText(dialogs[i]).replace(/\s+/g, " ").trim();
      if (shown(dialogs[i]) && DIALOG_TEXT.test(text)) {
        return {kind: /still there/i.test(text) ? "still-there" : "captcha", text: text.slice(0, 160)};
      }
    }
    return null;
  }
  function findButton() {
    for (var i = 0; i < VARIANTS.length; i++) {
      var el = VARIANTS[i][1]();
      if (el) { return {name: VARIANTS[i][0], el: el}; }
    }
    return null;
  }
  var banner = null, originalTitle = null;
  function report(dialog) {
    var first = !state.dialog;
    state.dialog = dialog;
    if (!first) { return; }
    state.dialogsSeen += 1;
    console.warn(TAG, "Colab is asking whether you are still there (" + dialog.kind + "): \"" + dialog.text +
      "\". Not clicking it; answer it yourself. Clicking resumes once it is gone.");
    originalTitle = document.title;
    document.title = "\u26a0 Colab needs you - " + originalTitle;
    banner = document.createElement("div");
    banner.id = "colabkit-keepalive-banner";
    banner.textContent = "colabkit keep-alive: Colab shows a dialog (" + dialog.kind +
      ") that only you can answer. The keep-alive script is paused until it is gone.";
    banner.setAttribute("style", "position:fixed;z-index:2147483647;top:0;left:0;right:0;padding:8px;" +
      "background:#b00020;color:#fff;font:14px sans-serif;text-align:center");
    (document.body || document.documentElement).appendChild(banner);
    window.dispatchEvent(new CustomEvent("colabkit-keepalive", {detail: {event: "dialog", dialog: dialog}}));
  }
  function clearReport() {
    if (!state.dialog) { return; }
    state.dialog = null;
    if (banner && banner.parentNode) { banner.parentNode.removeChild(banner); }
    banner = null;
    if (originalTitle !== null) { document.title = originalTitle; originalTitle = null; }
    console.info(TAG, "the dialog is gone; clicking again");
    window.dispatchEvent(new CustomEvent("colabkit-keepalive", {detail: {event: "dialog-gone"}}));
  }
  function tick() {
    if (!state.running) { return; }
    try {
      var dialog = findDialog();
      if (dialog) { report(dialog); return; }
      clearReport();
      var found = findButton();
      if (!found) {
        state.misses += 1;
        if (state.misses === 1 || state.misses % 10 === 0) {
          console.warn(TAG, "no connect button found (is this the Colab tab? Google may have changed the " +
            "page). Still trying; stop with stopKeepAlive().");
        }
        return;
      }
      if (state.variant !== found.name) {
        state.variant = found.name;
        console.info(TAG, "clicking the connect button (" + found.name + ")");
      }
      found.el.click();
      state.clicks += 1;
      state.lastClick = new Date().toISOString();
      window.dispatchEvent(new CustomEvent("colabkit-keepalive", {detail: {event: "click", variant: found.name}}));
    } catch (err) {
      console.warn(TAG, "tick failed: " + err);
    }
  }
  var timer = setInterval(tick, intervalMs);
  window.stopKeepAlive = function (quiet) {
    var wasRunning = state.running;
    clearInterval(timer);
    clearReport();
    state.running = false;
    if (quiet !== true && wasRunning) { console.info(TAG, "stopped after " + state.clicks + " click(s)"); }
    return state.clicks;
  };
  console.info(TAG, "started: clicking Colab's connect button every " + intervalMs / 1000 + " s. " +
    "Best-effort; it does not lift the runtime cap. Stop it with stopKeepAlive().");
})(__INTERVAL_MS__);
"""

HONEST_TEXT = (
    "Best-effort: this script runs in your Colab tab (not in the notebook) and clicks the connect button "
    "every {interval}. It may stop working when Google changes the page, it pauses and warns you when Colab "
    "asks whether you are still there (CAPTCHA), and it does not lift the runtime cap (about 12 h on the free "
    "tier). colabkit cannot see whether it runs. What colabkit does on its side: while no browser is attached, "
    "AutoResume(deadline=\"auto\") saves and uploads a checkpoint before the idle cutoff.")


def _short(seconds: float) -> str:
    """'60s', '0.5s', '2min', '1.5h' style: the way a user would type it."""
    if seconds >= 3600 and seconds % 360 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}min"
    return f"{seconds:g}s"


def parse_interval(value) -> float:
    """Seconds between clicks; raises ValueError with one clear line for anything else."""
    try:
        seconds = parse_duration(value, name="interval")
    except ValueError:
        if _negative_or_zero(value):
            raise ValueError(f"keep-alive interval {value!r} is negative or zero; expected a positive duration "
                             f"such as \"60s\" or \"2min\" (or \"off\").") from None
        raise ValueError(f"keep-alive interval {value!r} is not a duration; expected \"off\" or "
                         f"{DURATION_FORMS}.") from None
    if seconds < MIN_INTERVAL:
        raise ValueError(f"keep-alive interval {value!r} is too short; use at least {MIN_INTERVAL:g}s "
                         f"(60s is plenty for a 90min idle cutoff).")
    return seconds


def _negative_or_zero(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("-"):
            return True
        try:
            value = float(text)
        except ValueError:
            return False
    return isinstance(value, (int, float)) and value <= 0


def negative_argument(line: str) -> str | None:
    """For %keepalive: the one-line message for a negative interval such as "-5s" (argparse would call it an
    unknown option), else None."""
    for token in line.split():
        if len(token) > 1 and token[0] == "-" and (token[1].isdigit() or token[1] == "."):
            return (f"%keepalive: keep-alive interval {token!r} is negative; expected a positive duration such as "
                    f"\"60s\" or \"2min\" (or \"off\").")
    return None


def script(interval=DEFAULT_INTERVAL) -> str:
    """The keep-alive JavaScript for the top-level Colab page (devtools console or a bookmarklet)."""
    ms = int(round(parse_interval(interval) * 1000))
    return SCRIPT_TEMPLATE.replace("__INTERVAL_MS__", str(ms))


def bookmarklet(interval=DEFAULT_INTERVAL) -> str:
    """The script as a ``javascript:`` URL to drag to the bookmarks bar and click on the Colab tab."""
    compact = "\n".join(line.strip() for line in script(interval).splitlines() if line.strip())
    return "javascript:" + urllib.parse.quote(compact, safe="")


# -- on / off -----------------------------------------------------------------------------------------------
class _State:
    def __init__(self):
        self.on = False
        self.interval: float | None = None
        self.since: float | None = None
        self.kind: str | None = None
        self.lock = threading.Lock()


_state = _State()


def is_on() -> bool:
    return _state.on


def describe() -> str:
    """One line for the status panel."""
    if not _state.on:
        return "off"
    since = time.strftime("%H:%M", time.localtime(_state.since))
    if _state.kind == "colab":
        return (f"on since {since}: script handed out (clicks every {_short(_state.interval)} "
                f"while it runs in your Colab tab); presence monitored")
    return f"on since {since}: presence monitored (no browser script needed here)"


def keepalive(interval=DEFAULT_INTERVAL, *, show_script: bool | None = None, poll=None) -> None:
    """Turn keep-alive on (``interval`` between clicks, default "60s") or off (``False`` / "off").

    On Colab: shows the top-level keep-alive script, a bookmarklet and a copy button (ipywidgets), starts
    presence detection and the idle clock. Elsewhere: says whether an idle cutoff applies and starts presence
    detection. show_script: show the script panel also outside Colab (True) or never (False).
    poll: how often presence is checked (default 5s). Bad input raises ValueError; nothing changes then.
    """
    if interval is False or interval is None or (isinstance(interval, str) and
                                                 interval.strip().lower() in ("off", "stop", "false", "no")):
        _off()
        return
    seconds = parse_interval(interval)
    from . import presence as _presence
    poll_s = _presence.DEFAULT_POLL if poll is None else _presence._interval(poll, "poll")
    from .runtime import env
    environment = env()
    monitor = _presence.start(poll_s)
    with _state.lock:
        _state.on, _state.interval, _state.since, _state.kind = True, seconds, time.time(), environment.kind
    p = monitor.current
    presence_line = f"presence detection started (every {_short(poll_s)}): {p.text()}"
    if show_script or (show_script is None and environment.kind == "colab"):
        _show_panel(seconds, environment, presence_line)
        return
    if environment.idle_cutoff is None:
        print(f"colabkit: no idle cutoff applies here ({environment.kind}): nothing needs keeping alive. "
              f"{presence_line[0].upper() + presence_line[1:]}.")
    else:
        from .presence import idle_label
        print(f"colabkit: an idle cutoff of {idle_label(environment.idle_cutoff)} applies here "
              f"({environment.kind}); AutoResume(deadline=\"auto\") saves before it while no browser is attached. "
              f"{presence_line[0].upper() + presence_line[1:]}.")


def _off() -> None:
    from . import presence as _presence
    was_on = _state.on
    stopped = _presence.stop()
    with _state.lock:
        _state.on, _state.interval, _state.since, _state.kind = False, None, None, None
    if was_on or stopped:
        print("colabkit: keep-alive off: presence detection and the idle-cutoff save stopped. A script started in "
              "your browser tab keeps running until you run stopKeepAlive() in its console or reload the page.")
    else:
        print("colabkit: keep-alive was not on; nothing to stop.")


# -- the panel ----------------------------------------------------------------------------------------------
def _copy_button_html(code: str) -> str:
    handler = ("var b=this,t=b.getAttribute('data-script');"
               "function done(ok){b.textContent=ok?'Copied':'Copy failed: select the text below';"
               "setTimeout(function(){b.textContent='Copy script'},3000);}"
               "function fallback(){var a=document.createElement('textarea');a.value=t;document.body.appendChild(a);"
               "a.select();var ok=false;try{ok=document.execCommand('copy');}catch(e){}"
               "document.body.removeChild(a);done(ok);}"
               "if(navigator.clipboard&&navigator.clipboard.writeText){"
               "navigator.clipboard.writeText(t).then(function(){done(true);},fallback);}else{fallback();}")
    return (f'<button class="colabkit-copy" type="button" data-script="{html.escape(code, quote=True)}" '
            f'onclick="{html.escape(handler, quote=True)}" style="padding:4px 12px;cursor:pointer">'
            f'Copy script</button>')


def panel_html(interval=DEFAULT_INTERVAL) -> tuple[str, str]:
    """(intro HTML with the bookmarklet link, copy-button HTML) for the keep-alive panel."""
    seconds = parse_interval(interval)
    code = script(seconds)
    intro = (
        '<div class="colabkit-keepalive-intro" style="line-height:1.5">'
        "<b>colabkit keep-alive</b><br>"
        f"{html.escape(HONEST_TEXT.format(interval=_short(seconds)))}<br>"
        "<b>Either</b> drag this link to your bookmarks bar, then click the bookmark while the Colab tab is open: "
        f'<a class="colabkit-bookmarklet" href="{html.escape(bookmarklet(seconds), quote=True)}" '
        'style="font-weight:bold;border:1px solid #888;border-radius:4px;padding:1px 6px">Colab keep-alive</a><br>'
        "<b>or</b> open the browser's developer console on the Colab tab (F12, then Console; Chrome may ask you to "
        "type <code>allow pasting</code> first), paste the script and press Enter. "
        "Stop it with <code>stopKeepAlive()</code> in that console, or reload the page."
        "</div>")
    return intro, _copy_button_html(code)


def panel(interval=DEFAULT_INTERVAL):
    """The keep-alive panel (an ipywidgets VBox): honest text, bookmarklet link, copy button, the script."""
    from .optional import require
    widgets = require("ipywidgets", "notebook", "The keep-alive panel")
    from .runtime import detect_kind
    if detect_kind() == "colab":
        _enable_colab_widgets()
    seconds = parse_interval(interval)
    intro, button = panel_html(seconds)
    code = widgets.Textarea(value=script(seconds), layout=widgets.Layout(width="100%", height="10em"))
    code.disabled = False
    box = widgets.VBox([widgets.HTML(intro), widgets.HTML(button), code])
    box.add_class("colabkit-keepalive")
    return box


def _enable_colab_widgets() -> None:
    """On Colab, ipywidgets 8 needs the custom widget manager; harmless to call twice."""
    try:
        from google.colab import output
        output.enable_custom_widget_manager()
    except Exception as exc:  # noqa: BLE001 - an old Colab image: widgets may still render
        log.debug("colabkit: enable_custom_widget_manager failed: %s", exc)


def _show_panel(seconds: float, environment, presence_line: str) -> None:
    try:
        box = panel(seconds)
        from IPython.display import display
    except ImportError:
        box = None
    if box is None or "IPython" not in sys.modules:
        print(f"colabkit keep-alive\n{HONEST_TEXT.format(interval=_short(seconds))}\n\n"
              f"Paste this into the browser console on the Colab tab:\n\n{script(seconds)}\n{presence_line}")
        return
    display(box)
    print(f"colabkit: {presence_line}.")


class _CallableModule(types.ModuleType):
    """``colabkit.keepalive("60s")`` calls ``keepalive()``; ``colabkit.keepalive.script()`` etc. stay module
    attributes. (Importing submodule colabkit.keepalive makes the package attribute this module, so the module
    itself is callable instead of shadowing a function of the same name.)"""

    def __call__(self, interval=DEFAULT_INTERVAL, **kwargs):
        return keepalive(interval, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
