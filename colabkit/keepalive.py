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
  button's label and the open dialogs. Connected: it does what maintained keep-alive scripts do, a click on that
  button (the RAM/Disk meter) and a pointer move, and closes what the click opens (Colab's resources view, a
  menu or a dialog) so the page ends as it was; it does not click while you use the page or a dialog is open, and
  turns the click off (with a warning) if it cannot put the page back. Both events are synthetic (untrusted);
  what Colab counts as activity is not published, so whether this keeps a runtime alive is a guess. Gone: it
  tells you (title, banner, console, notification and tone where allowed) and does not reconnect, since a new
  runtime is a fresh VM with an empty disk; ``reconnect=True`` lets it click Reconnect (at most 3 tries in a row,
  3 an hour). A CAPTCHA / "are you still there?" dialog is never clicked or closed. No known button, or a label
  it cannot read: it says so once, clicks nothing and keeps checking.
* It is best-effort: Google changes the page and publishes neither the idle rule nor the cutoff. It does not
  lift the runtime cap (about 12 h on the free tier): ``AutoResume(deadline="auto")`` saves and stops before it.
* colabkit cannot see from the kernel whether the script runs in your tab. What it can see is whether a
  browser is attached (``colabkit.presence``, a guess on Colab): with keep-alive on,
  ``AutoResume(deadline="auto")`` saves and uploads a checkpoint before the idle cutoff while no browser is
  attached. A lost runtime still costs the VM, its disk and everything since the last checkpoint.
* Official routes without a script: Google's Colab extension for VS Code and Google's Colab CLI ping a runtime
  they connected or created from outside the VM with the user's Google sign-in; Colab's paid plans have offered
  background execution.

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

from .keepalive_page import (  # noqa: F401 - re-exported: colabkit.keepalive.script() etc.
    DEFAULT_INTERVAL,
    JITTER,
    MIN_INTERVAL,
    bookmarklet,
    negative_argument,
    parse_interval,
    script,
)

log = logging.getLogger("colabkit")


def _typed_interval(seconds: float) -> str:
    """'60s', '0.5s', '2min', '1.5h': an interval the way a user would type it (health's short_duration is
    another form, for step times)."""
    if seconds >= 3600 and seconds % 360 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}min"
    return f"{seconds:g}s"


OFFICIAL_ROUTES = (
    "Official routes that need no script, for a runtime they connect or create themselves (not a notebook you "
    "opened in the browser): Google's Colab extension for VS Code and Google's Colab CLI keep it alive from "
    "outside the VM with your Google sign-in (the extension while a kernel is connected and was busy or active in "
    "the last hour, then it asks you; the CLI, whose `colab new` makes a new VM, for up to 24 h until you stop "
    "it); Colab's paid plans have offered background execution (see Google's plan page for what yours includes).")


def honest_text(interval: float, reconnect: bool = False, notify: bool = True) -> str:
    """What the script does and does not do, for the panel and the plain-text fallback."""
    told = ("tab title, a banner, the console, a desktop notification if you allowed them" if notify else
            "tab title, a banner, the console")
    gone = ("reconnects, which gives you a fresh VM with an empty disk (you asked for reconnect; at most 3 tries in "
            "a row and 3 reconnects an hour)" if reconnect else f"does not reconnect: it tells you ({told})")
    return (
        f"Best-effort; nothing Google documents or promises. This script runs in your Colab tab (not in the "
        f"notebook). It checks the toolbar every {_typed_interval(interval)} or a little later. While the runtime is "
        f"connected it does what maintained keep-alive scripts do: it clicks the toolbar's connect button (the "
        f"RAM/Disk meter) and moves the pointer, then closes what the click opened, so the page ends as it was; "
        f"it does not click while you use the page or a dialog is open, and stops clicking if it cannot put the "
        f"page back. These are synthetic events and what Colab counts as activity is not published, so this may "
        f"keep nothing alive; the script is also there to tell you at once when something needs you. When the "
        f"runtime is gone "
        f"(the button says Connect or Reconnect, or a \"Runtime disconnected\" dialog is open) it {gone}. It "
        f"never answers a CAPTCHA or \"are you still there\" dialog, says so when it finds no connect button or "
        f"cannot read its label (it knows Colab's English labels only), may stop working when Google changes the "
        f"page, and does not lift the runtime cap (Colab's FAQ: as much as 12 h on the free tier). colabkit "
        f"cannot see whether it runs. If the runtime goes, you lose the VM, its disk and everything since your "
        f"last checkpoint: AutoResume(deadline=\"auto\") saves and uploads one before the idle cutoff (as "
        f"colabkit counts it) while no browser is attached. "
        + OFFICIAL_ROUTES)


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
        return (f"on since {since}: script handed out (checks every {_typed_interval(_state.interval)} while it runs "
                f"in your Colab tab; runtime gone: {gone}); presence monitored")
    return f"on since {since}: presence monitored (no browser script needed here)"


def keepalive(interval=DEFAULT_INTERVAL, *, reconnect: bool = False, notify: bool = True,
              show_script: bool | None = None, poll=None) -> None:
    """Turn keep-alive on (``interval`` between checks, default "60s", at least "30s") or off (``False``/"off").

    On Colab: shows the top-level keep-alive script, a bookmarklet and a copy button (ipywidgets), starts
    presence detection and the idle clock. Elsewhere: says whether an idle cutoff applies and starts presence
    detection. reconnect: the script clicks Reconnect when the runtime is gone (a fresh VM: its disk and
    variables are empty); by default it tells you and waits. notify: the script also shows a desktop
    notification and plays a short tone when something needs you, where the browser allows them.
    show_script: show the script panel also outside Colab (True) or never (False). poll: how often presence is
    checked (default 5s).
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
    presence_line = f"presence detection started (every {_typed_interval(poll_s)}): {p.text()}"
    if show_script or (show_script is None and environment.kind == "colab"):
        _show_panel(seconds, environment, presence_line, reconnect=bool(reconnect), notify=bool(notify))
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


def panel_html(interval=DEFAULT_INTERVAL, *, reconnect: bool = False, notify: bool = True) -> tuple[str, str]:
    """(intro HTML with the bookmarklet link, copy-button HTML) for the keep-alive panel."""
    seconds = parse_interval(interval)
    code = script(seconds, reconnect=reconnect, notify=notify)
    intro = (
        '<div class="colabkit-keepalive-intro" style="line-height:1.5">'
        "<b>colabkit keep-alive</b><br>"
        f"{html.escape(honest_text(seconds, reconnect, notify))}<br>"
        "<b>Either</b> drag this link to your bookmarks bar, then click the bookmark while the Colab tab is open: "
        '<a class="colabkit-bookmarklet" '
        f'href="{html.escape(bookmarklet(seconds, reconnect=reconnect, notify=notify), quote=True)}" '
        'style="font-weight:bold;border:1px solid #888;border-radius:4px;padding:1px 6px">Colab keep-alive</a><br>'
        "<b>or</b> open the browser's developer console on the Colab tab (F12, then Console; Chrome may ask you to "
        "type <code>allow pasting</code> first), paste the script and press Enter. "
        "Stop it with <code>stopKeepAlive()</code> in that console, or reload the page."
        "</div>")
    return intro, _copy_button_html(code)


def panel(interval=DEFAULT_INTERVAL, *, reconnect: bool = False, notify: bool = True):
    """The keep-alive panel (an ipywidgets VBox): honest text, bookmarklet link, copy button, the script."""
    from .optional import require
    widgets = require("ipywidgets", "notebook", "The keep-alive panel")
    from .display import prepare_widgets
    prepare_widgets()
    seconds = parse_interval(interval)
    intro, button = panel_html(seconds, reconnect=reconnect, notify=notify)
    code = widgets.Textarea(value=script(seconds, reconnect=reconnect, notify=notify),
                            layout=widgets.Layout(width="100%", height="10em"))
    code.disabled = False
    box = widgets.VBox([widgets.HTML(intro), widgets.HTML(button), code])
    box.add_class("colabkit-keepalive")
    return box


def _show_panel(seconds: float, environment, presence_line: str, *, reconnect: bool = False,
                notify: bool = True) -> None:
    try:
        box = panel(seconds, reconnect=reconnect, notify=notify)
        from IPython.display import display
    except ImportError:
        box = None
    if box is None or "IPython" not in sys.modules:
        print(f"colabkit keep-alive\n{honest_text(seconds, reconnect, notify)}\n\n"
              f"Paste this into the browser console on the Colab tab:\n\n"
              f"{script(seconds, reconnect=reconnect, notify=notify)}\n"
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
