"""Keep-alive past Colab's idle cutoff: a top-level browser script, presence detection, idle-aware saves.

    %keepalive              # or colabkit.keepalive("60s")
    %keepalive --reconnect  # or colabkit.keepalive(reconnect=True)
    %keepalive off          # or colabkit.keepalive(False)

What it can and cannot do, honestly:

* JavaScript from a notebook cell runs in a sandboxed output frame and cannot touch Colab's toolbar. The
  keep-alive script therefore has to run in the top-level Colab page: paste it into the browser's devtools
  console, or drag the bookmarklet link to the bookmarks bar and click it on the Colab tab. It stops on
  ``stopKeepAlive()``.
* Every ``interval`` (at least 30 s, plus up to 20 % at random) it reads the runtime's state from the connect
  button's label and the open dialogs. Connected: it clicks the RAM/Disk meter, as widely used snippets do
  (whether Colab counts that as activity is not published). Gone: it tells you (title, banner, console,
  notification and tone where allowed) and does not reconnect, since a new runtime is a fresh VM with an empty
  disk; ``reconnect=True`` lets it click Reconnect. A CAPTCHA / "are you still there?" dialog is never clicked.
  No known button: it says so once, clicks nothing else and keeps checking.
* It is best-effort: Google changes the page and publishes neither the idle rule nor the cutoff. It does not
  lift the runtime cap (about 12 h on the free tier): ``AutoResume(deadline="auto")`` saves and stops before it.
* colabkit cannot see from the kernel whether the script runs in your tab. What it can see is whether a
  browser is attached (``colabkit.presence``, a guess on Colab): with keep-alive on,
  ``AutoResume(deadline="auto")`` saves and uploads a checkpoint before the idle cutoff while no browser is
  attached. A lost runtime still costs the VM, its disk and everything since the last checkpoint.
* Official routes without a script: Google's Colab extension for VS Code and Google's Colab CLI ping the runtime
  from outside the VM with the user's Google sign-in; Colab's paid plans have offered background execution.

Elsewhere (JupyterLab, a home rig) no idle cutoff applies; ``keepalive()`` says so and still starts presence
detection (shown in the ``%colabkit`` panel).
"""
from __future__ import annotations

import html
import json
import logging
import sys
import threading
import time
import types
import urllib.parse

from .units import DURATION_FORMS, parse_duration

log = logging.getLogger("colabkit")

DEFAULT_INTERVAL = "60s"
# Browsers run timers in background tabs about once a minute anyway, and a faster click rhythm looks like a bot.
MIN_INTERVAL = 30.0

# The script that runs in the top-level Colab page. No "//" comments: the bookmarklet form is one URL.
# Element names and states are the ones maintained public keep-alive extensions read (colab-facts.md, and the
# sources cited in tests/keepalive/test_keepalive_script.py); a known button is clicked, never a stand-in.
SCRIPT_TEMPLATE = r"""/* colabkit keep-alive for Google Colab (best-effort). Stop it with stopKeepAlive(). */
(function (options) {
  "use strict";
  var TAG = "[colabkit keep-alive]";
  if (typeof window.stopKeepAlive === "function") { window.stopKeepAlive(true); }
  var intervalMs = options.intervalMs, jitter = options.jitter;
  var state = window.colabkitKeepAlive = {
    running: true, intervalMs: intervalMs, reconnect: options.reconnect, runtime: null, variant: null,
    ticks: 0, activity: 0, clicks: 0, lastActivity: null, reconnects: 0, failedReconnects: 0,
    dialog: null, dialogsSeen: 0, misses: 0, startedAt: new Date().toISOString()
  };
  var BUTTONS = [
    ["colab-connect-button shadow root #connect", function () {
      var hosts = document.querySelectorAll("colab-connect-button"), i, b;
      for (i = 0; i < hosts.length; i++) {
        b = hosts[i].shadowRoot ? hosts[i].shadowRoot.getElementById("connect") : null;
        if (b) { return b; }
      }
      return null;
    }],
    ["colab-connect-button #connect", function () { return document.querySelector("colab-connect-button #connect"); }],
    ["colab-toolbar-button#connect", function () { return document.querySelector("colab-toolbar-button#connect"); }]
  ];
  var DIALOGS = "mwc-dialog, md-dialog, paper-dialog, colab-dialog, dialog, [role=dialog], [role=alertdialog]";
  var ACTIONS = "md-text-button, md-filled-button, md-outlined-button, mwc-button, paper-button, button";
  var PERSON_TEXT = /still there|not a robot|captcha|verify (that )?(you're|you are) (a )?human|are you (a )?human/i;
  var GONE_TEXT = new RegExp("runtime disconnected|disconnected due to|has been disconnected|cannot connect to|" +
    "could not connect|unable to connect|connection (was )?lost", "i");
  var RECONNECT_LABEL = /^(re)?connect$/i;

  function norm(text) {
    return String(text || "").replace(/[\u2018\u2019\u02bc\u2032`]/g, "'").replace(/\s+/g, " ").trim();
  }
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
    return norm(text);
  }
  function styled(el) {
    var style = window.getComputedStyle(el);
    return !el.hasAttribute("hidden") && style.display !== "none" && style.visibility !== "hidden";
  }
  function shown(el) {
    if (el.hasAttribute && (el.hasAttribute("open") || el.hasAttribute("opened"))) { return true; }
    if (el.open === true || el.opened === true) { return true; }
    if (/^(DIALOG|MWC-DIALOG|MD-DIALOG|PAPER-DIALOG)$/.test(el.tagName)) { return false; }
    var r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && styled(el);
  }
  function labelOf(el) {
    var text = norm(el.innerText || el.textContent);
    return text || norm(el.getAttribute("aria-label") || el.getAttribute("title"));
  }
  /* The connect button's label is the toolbar's state: Connect / Reconnect when no runtime is attached,
     Connecting (or Allocating, Initializing) on the way, a RAM / Disk meter while connected. */
  function runtimeOf(label) {
    var l = label.toLowerCase();
    if (!l) { return "unknown"; }
    if (/\b(connecting|reconnecting|allocating|initiali[sz]ing)\b/.test(l)) { return "connecting"; }
    if (/^(re)?connect\b/.test(l)) { return "disconnected"; }
    return "connected";
  }
  /* A dialog that only a person may answer, or one that says the runtime is gone. */
  function findDialog() {
    var i, el, src, text, actions, j;
    var boxes = deepQueryAll(document, "colab-recaptcha-dialog");
    for (i = 0; i < boxes.length; i++) {
      if (styled(boxes[i])) { return {kind: "captcha", text: "Colab's reCAPTCHA dialog (colab-recaptcha-dialog)"}; }
    }
    var frames = deepQueryAll(document, "iframe[src*='recaptcha']");
    for (i = 0; i < frames.length; i++) {
      el = frames[i]; src = el.getAttribute("src") || "";
      /* the invisible-reCAPTCHA badge is not a challenge; a challenge frame (bframe) or a checkbox frame
         inside a dialog is */
      if (/[?&]size=invisible/.test(src) || el.closest(".grecaptcha-badge")) { continue; }
      if (shown(el) && (/\/bframe/.test(src) || el.closest(DIALOGS))) {
        return {kind: "captcha", text: "a reCAPTCHA challenge"};
      }
    }
    var dialogs = deepQueryAll(document, DIALOGS), gone = null;
    for (i = 0; i < dialogs.length; i++) {
      if (!shown(dialogs[i])) { continue; }
      text = deepText(dialogs[i]);
      if (PERSON_TEXT.test(text)) {
        return {kind: /captcha|robot/i.test(text) ? "captcha" : "still-there", text: text.slice(0, 160)};
      }
      actions = deepQueryAll(dialogs[i], ACTIONS);
      var button = null;
      for (j = 0; j < actions.length; j++) {
        if (RECONNECT_LABEL.test(labelOf(actions[j]))) { button = actions[j]; break; }
      }
      if (!gone && (GONE_TEXT.test(text) || button)) {
        gone = {kind: "disconnected", text: text.slice(0, 160), button: button};
      }
    }
    return gone;
  }
  function findButton() {
    for (var i = 0; i < BUTTONS.length; i++) {
      var el = BUTTONS[i][1]();
      if (el) { return {name: BUTTONS[i][0], el: el}; }
    }
    return null;
  }
  function emit(event, detail) {
    detail = detail || {};
    detail.event = event;
    window.dispatchEvent(new CustomEvent("colabkit-keepalive", {detail: detail}));
  }

  /* One notice at a time in the tab title and a banner. The title is put back only if it is still the one
     set here: Colab may have retitled the tab meanwhile. */
  var notice = null;
  function showNotice(kind, prefix, text) {
    if (notice && notice.kind === kind) { return false; }
    clearNotice();
    var banner = document.createElement("div");
    banner.id = "colabkit-keepalive-banner";
    banner.textContent = text;
    banner.setAttribute("style", "position:fixed;z-index:2147483647;top:0;left:0;right:0;padding:8px;" +
      "background:#b00020;color:#fff;font:14px sans-serif;text-align:center");
    (document.body || document.documentElement).appendChild(banner);
    notice = {kind: kind, banner: banner, savedTitle: document.title, ourTitle: prefix + document.title};
    document.title = notice.ourTitle;
    alertUser(text);
    return true;
  }
  function clearNotice() {
    if (!notice) { return; }
    if (notice.banner.parentNode) { notice.banner.parentNode.removeChild(notice.banner); }
    if (document.title === notice.ourTitle) { document.title = notice.savedTitle; }
    notice = null;
  }
  /* A desktop notification and a short tone, where the browser allows them (notification permission,
     autoplay policy); silently nothing otherwise. */
  function alertUser(text) {
    if (!options.notify) { return; }
    try {
      if (window.Notification && Notification.permission === "granted") { new Notification("Colab", {body: text}); }
    } catch (err) { /* not allowed here */ }
    try {
      var Context = window.AudioContext || window.webkitAudioContext;
      if (Context) {
        var ctx = new Context(), tone = ctx.createOscillator();
        tone.frequency.value = 880;
        tone.connect(ctx.destination);
        tone.start();
        tone.stop(ctx.currentTime + 0.25);
      }
    } catch (err) { /* no sound allowed */ }
  }

  function setRuntime(runtime) {
    if (state.runtime !== runtime) {
      state.runtime = runtime;
      emit(runtime);
    }
  }
  function keepActive(el) {
    /* What widely used keep-alive snippets do while connected: click the meter the connect button shows,
       and move the pointer over the page. Whether Colab counts either as activity is not published. */
    var r = el.getBoundingClientRect();
    document.dispatchEvent(new MouseEvent("mousemove", {bubbles: true, clientX: r.left + 1, clientY: r.top + 1}));
    el.click();
    state.activity += 1;
    state.clicks += 1;
    state.lastActivity = new Date().toISOString();
    emit("activity");
  }
  function gone(dialog, found) {
    var why = dialog ? "a \"" + dialog.text.slice(0, 60) + "\" dialog" :
      "the button says \"" + labelOf(found.el) + "\"";
    if (options.reconnect && state.failedReconnects < 3) {
      var target = dialog && dialog.button ? dialog.button :
        (found && runtimeOf(labelOf(found.el)) === "disconnected" ? found.el : null);
      if (target) {
        console.warn(TAG, "the Colab runtime is gone (" + why + "); reconnecting as asked (reconnect=True). " +
          "This is a fresh VM: its disk and variables are empty; restore from your last checkpoint.");
        target.click();
        state.reconnects += 1;
        state.failedReconnects += 1;
        state.clicks += 1;
        emit("reconnect");
        return;
      }
    }
    var extra = options.reconnect ? " Reconnecting failed 3 times (Colab may be over its usage limits); " +
      "not trying again." : "";
    if (showNotice("gone", "\u26d4 Runtime gone - ", "colabkit keep-alive: the Colab runtime is gone. Not " +
        "reconnecting: a new runtime is a fresh VM (empty disk, no variables). Reconnect yourself when you need " +
        "one and resume from your last checkpoint." + extra)) {
      console.warn(TAG, "the Colab runtime is gone (" + why + "); not reconnecting: a new runtime is a fresh " +
        "VM (its disk and variables are empty) that would sit idle on your quota. Reconnect yourself when you " +
        "need one, or run %keepalive --reconnect / colabkit.keepalive(reconnect=True) for a script that does." + extra);
    }
  }
  function tick() {
    if (!state.running) { return; }
    state.ticks += 1;
    try {
      var dialog = findDialog();
      if (dialog && dialog.kind !== "disconnected") {
        state.dialog = {kind: dialog.kind, text: dialog.text};
        if (showNotice("dialog", "\u26a0 Colab needs you - ", "colabkit keep-alive: Colab shows a dialog (" +
            dialog.kind + ") that only you can answer. Keep-alive is paused until it is gone.")) {
          state.dialogsSeen += 1;
          console.warn(TAG, "Colab shows a dialog only you can answer (" + dialog.kind + "): \"" + dialog.text +
            "\". Not clicking it; answer it yourself. Keep-alive resumes once it is gone.");
          emit("dialog", {dialog: state.dialog});
        }
        return;
      }
      if (state.dialog) { state.dialog = null; emit("dialog-gone"); }
      var found = findButton();
      if (!found && !dialog) {
        state.misses += 1;
        if (state.runtime !== "no-button") {
          console.warn(TAG, "no connect button found (is this the Colab tab? Google may have changed the page). " +
            "Not clicking anything else; still checking every " + intervalMs / 1000 + " s. Stop with stopKeepAlive().");
        }
        setRuntime("no-button");
        return;
      }
      if (found && state.variant !== found.name) {
        state.variant = found.name;
        console.info(TAG, "found the connect button (" + found.name + ")");
      }
      var runtime = dialog ? "disconnected" : runtimeOf(labelOf(found.el));
      if (runtime === "unknown" && state.runtime !== "unknown") {
        console.warn(TAG, "the connect button has no label to read the runtime's state from; not clicking it. " +
          "Still checking.");
      }
      setRuntime(runtime);
      if (runtime === "connected") {
        state.failedReconnects = 0;
        clearNotice();
        keepActive(found.el);
      } else if (runtime === "disconnected") {
        gone(dialog, found);
      }
    } catch (err) {
      console.warn(TAG, "tick failed: " + err);
    }
  }
  var timer = null;
  function schedule() {
    if (!state.running) { return; }
    timer = setTimeout(function () { tick(); schedule(); }, intervalMs * (1 + jitter * Math.random()));
  }
  schedule();
  window.stopKeepAlive = function (quiet) {
    var wasRunning = state.running;
    clearTimeout(timer);
    clearNotice();
    state.running = false;
    if (quiet !== true && wasRunning) { console.info(TAG, "stopped after " + state.clicks + " click(s)"); }
    return state.clicks;
  };
  if (options.notify && window.Notification && Notification.permission === "default") {
    try { Notification.requestPermission(); } catch (err) { /* needs a click on some browsers */ }
  }
  console.info(TAG, "started: checking the runtime every " + intervalMs / 1000 + " s (plus up to " +
    Math.round(jitter * 100) + " %). While connected it keeps the page active; when the runtime is gone it " +
    (options.reconnect ? "reconnects (a fresh VM)" : "tells you and does not reconnect") +
    ". Best-effort; it does not lift the runtime cap. Stop it with stopKeepAlive().");
})(__OPTIONS__);
"""

JITTER = 0.2   # each wait is interval x (1 + up to 20 %): no fixed, bot-like rhythm


def _official_routes() -> str:
    return ("Official routes that need no script: Google's Colab extension for VS Code and Google's Colab CLI keep a "
            "runtime alive from outside the VM with your Google sign-in (the extension while a kernel is connected "
            "and was busy or active in the last hour, then it asks you; the CLI for up to 24 h until you stop it); "
            "Colab's paid plans offer background execution.")


def honest_text(interval: float, reconnect: bool = False) -> str:
    """What the script does and does not do, for the panel and the plain-text fallback."""
    gone = ("reconnects, which gives you a fresh VM with an empty disk (you asked for reconnect)" if reconnect else
            "does not reconnect: it tells you (tab title, a banner, the console, a desktop notification if you "
            "allowed them)")
    return (
        f"Best-effort; nothing Google documents or promises. This script runs in your Colab tab (not in the "
        f"notebook). While the runtime is connected it clicks the toolbar's RAM/Disk meter every {_short(interval)} "
        f"or a little later, as widely used keep-alive snippets do; whether Colab counts that as activity is not "
        f"published. When the runtime is gone (the button says Connect or Reconnect, or a \"Runtime disconnected\" "
        f"dialog is open) it {gone}. It never answers a CAPTCHA or \"are you still there\" dialog, says so when it "
        f"finds no connect button, may stop working when Google changes the page, and does not lift the runtime "
        f"cap (about 12 h on the free tier). colabkit cannot see whether it runs. If the runtime goes, you lose "
        f"the VM, its disk and everything since your last checkpoint: AutoResume(deadline=\"auto\") saves and "
        f"uploads one before the idle cutoff while no browser is attached. " + _official_routes())



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
        raise ValueError(f"keep-alive interval {value!r} is too short; use at least {MIN_INTERVAL:g}s, e.g. \"60s\" "
                         f"(browsers run timers in background tabs about once a minute anyway, and faster clicking "
                         f"looks like a bot).")
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


def script(interval=DEFAULT_INTERVAL, *, reconnect: bool = False, notify: bool = True) -> str:
    """The keep-alive JavaScript for the top-level Colab page (devtools console or a bookmarklet).

    interval: time between checks (at least 30s; each wait is up to 20 % longer, at random).
    reconnect: when the runtime is gone, click Reconnect (a fresh VM: empty disk, no variables; at most 3 tries
        in a row). Default False: the script tells you and waits.
    notify: also a desktop notification (if the page was allowed to show them) and a short tone (if the browser
        lets the page play sound) when something needs you.
    """
    ms = int(round(parse_interval(interval) * 1000))
    options = {"intervalMs": ms, "jitter": JITTER, "reconnect": bool(reconnect), "notify": bool(notify)}
    return SCRIPT_TEMPLATE.replace("__OPTIONS__", json.dumps(options))


def bookmarklet(interval=DEFAULT_INTERVAL, *, reconnect: bool = False, notify: bool = True) -> str:
    """The script as a ``javascript:`` URL to drag to the bookmarks bar and click on the Colab tab."""
    code = script(interval, reconnect=reconnect, notify=notify)
    compact = "\n".join(line.strip() for line in code.splitlines() if line.strip())
    return "javascript:" + urllib.parse.quote(compact, safe="")


# -- on / off -----------------------------------------------------------------------------------------------
class _State:
    def __init__(self):
        self.on = False
        self.interval: float | None = None
        self.reconnect = False
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
        gone = "reconnects" if _state.reconnect else "tells you, no reconnect"
        return (f"on since {since}: script handed out (checks every {_short(_state.interval)} while it runs in "
                f"your Colab tab; runtime gone: {gone}); presence monitored")
    return f"on since {since}: presence monitored (no browser script needed here)"


def keepalive(interval=DEFAULT_INTERVAL, *, reconnect: bool = False, show_script: bool | None = None,
              poll=None) -> None:
    """Turn keep-alive on (``interval`` between checks, default "60s", at least "30s") or off (``False``/"off").

    On Colab: shows the top-level keep-alive script, a bookmarklet and a copy button (ipywidgets), starts
    presence detection and the idle clock. Elsewhere: says whether an idle cutoff applies and starts presence
    detection. reconnect: the script clicks Reconnect when the runtime is gone (a fresh VM: its disk and
    variables are empty); by default it tells you and waits. show_script: show the script panel also outside
    Colab (True) or never (False). poll: how often presence is checked (default 5s).
    Bad input raises ValueError; nothing changes then.
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
        _state.reconnect = bool(reconnect)
    p = monitor.current
    presence_line = f"presence detection started (every {_short(poll_s)}): {p.text()}"
    if show_script or (show_script is None and environment.kind == "colab"):
        _show_panel(seconds, environment, presence_line, reconnect=bool(reconnect))
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
        _state.reconnect = False
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


def panel_html(interval=DEFAULT_INTERVAL, *, reconnect: bool = False) -> tuple[str, str]:
    """(intro HTML with the bookmarklet link, copy-button HTML) for the keep-alive panel."""
    seconds = parse_interval(interval)
    code = script(seconds, reconnect=reconnect)
    intro = (
        '<div class="colabkit-keepalive-intro" style="line-height:1.5">'
        "<b>colabkit keep-alive</b><br>"
        f"{html.escape(honest_text(seconds, reconnect))}<br>"
        "<b>Either</b> drag this link to your bookmarks bar, then click the bookmark while the Colab tab is open: "
        f'<a class="colabkit-bookmarklet" href="{html.escape(bookmarklet(seconds, reconnect=reconnect), quote=True)}" '
        'style="font-weight:bold;border:1px solid #888;border-radius:4px;padding:1px 6px">Colab keep-alive</a><br>'
        "<b>or</b> open the browser's developer console on the Colab tab (F12, then Console; Chrome may ask you to "
        "type <code>allow pasting</code> first), paste the script and press Enter. "
        "Stop it with <code>stopKeepAlive()</code> in that console, or reload the page."
        "</div>")
    return intro, _copy_button_html(code)


def panel(interval=DEFAULT_INTERVAL, *, reconnect: bool = False):
    """The keep-alive panel (an ipywidgets VBox): honest text, bookmarklet link, copy button, the script."""
    from .optional import require
    widgets = require("ipywidgets", "notebook", "The keep-alive panel")
    from .runtime import detect_kind
    if detect_kind() == "colab":
        _enable_colab_widgets()
    seconds = parse_interval(interval)
    intro, button = panel_html(seconds, reconnect=reconnect)
    code = widgets.Textarea(value=script(seconds, reconnect=reconnect),
                            layout=widgets.Layout(width="100%", height="10em"))
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


def _show_panel(seconds: float, environment, presence_line: str, *, reconnect: bool = False) -> None:
    try:
        box = panel(seconds, reconnect=reconnect)
        from IPython.display import display
    except ImportError:
        box = None
    if box is None or "IPython" not in sys.modules:
        print(f"colabkit keep-alive\n{honest_text(seconds, reconnect)}\n\n"
              f"Paste this into the browser console on the Colab tab:\n\n{script(seconds, reconnect=reconnect)}\n"
              f"{presence_line}")
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
