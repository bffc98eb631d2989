"""The keep-alive script for the top-level Colab page, as text: its options, the interval floor, the bookmarklet
form. ``colabkit.keepalive`` hands it out; this module only builds it (no state, no display).

The script reads the runtime's state from the toolbar's connect button and the open dialogs (the element names
maintained public keep-alive extensions read; see tests/keepalive/test_keepalive_script.py, which also names the
scripts it follows). Every interval:

* Connected (the button shows the RAM/Disk meter): it does what maintained keep-alive scripts do. It clicks that
  button and dispatches a pointer move; both are synthetic events (the browser marks them untrusted), and whether
  Colab counts them as activity is not published, so this is a guess that may keep nothing alive. What the click
  opens (on the real page a resources view; a menu or a dialog are handled alike) is closed again within about
  two seconds: a Close / Dismiss button that appeared, else Escape, else the dialog's or menu's own close(); if
  the click instead closed a view that was open (the button toggles it), a second click opens it again; the focus
  goes back where it was. It closes only what it can recognise (a dialog, a menu, anything with a Close or
  Dismiss button), never clicks any other action, and leaves everything alone when a challenge or "Runtime
  disconnected" dialog comes up or the user acts meanwhile. It does not click while the user has typed, clicked
  or scrolled in the last 15 s, while a dialog is open, or while a view the user opened would be toggled shut.
  Anything it cannot close or bring back turns the connected click off for the session, with one warning (the
  pointer move stays). It also holds a screen wake lock while the tab is visible.
* Gone (the button says Connect / Reconnect, or a "Runtime disconnected" dialog): it tells the user and, by
  default, does not reconnect (a new runtime is a fresh VM).
* A CAPTCHA or "are you still there" dialog is never clicked or closed, also when the click brought it up.

Its status, for the console: ``window.colabkitKeepAlive`` with ``ticks``; ``activity`` (connected ticks, each a
pointer move); ``clicks`` (every click it made: the connect button, Close buttons, reconnects);
``connectClicks`` (clicks on the connected-state button); ``closed`` (views its clicks opened that it closed
again); ``skipped`` / ``lastSkip`` (connected ticks without a click, and why); ``connectedClick`` (false once
turned off); ``reconnects``; ``dialog``; ``runtime``.
"""
from __future__ import annotations

import functools
import json
import urllib.parse
from importlib import resources

from .units import DURATION_FORMS, parse_duration

DEFAULT_INTERVAL = "60s"
# A faster rhythm looks like a bot and gains little: Chrome runs chained timers in a tab hidden for 5 minutes or
# more about once a minute anyway (intensive wake-up throttling; before that, about once a second).
MIN_INTERVAL = 30.0
JITTER = 0.2   # each wait is interval x (1 + up to 20 %): no fixed, bot-like rhythm

# The script that runs in the top-level Colab page. No "//" comments: the bookmarklet form is one URL.
# Element names and states are the ones maintained public keep-alive extensions read (colab-facts.md, and the
# sources cited in tests/keepalive/test_keepalive_script.py); a known button is clicked, never a stand-in, and
# while connected only when its label reads as connected.


@functools.cache
def script_template() -> str:
    """The script itself: the package data file keepalive_page.js, whose ``__OPTIONS__`` script() fills in."""
    return (resources.files("colabkit") / "keepalive_page.js").read_text(encoding="utf-8")


def parse_interval(value) -> float:
    """Seconds between checks; raises ValueError with one clear line for anything else."""
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
                         f"(Chrome runs timers in a tab hidden for 5 minutes or more about once a minute anyway, "
                         f"and a faster rhythm looks like a bot).")
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
        in a row and 3 reconnects an hour). Default False: the script tells you and waits.
    notify: also a desktop notification (if the page was allowed to show them) and a short tone (if the browser
        lets the page play sound) when something needs you.
    """
    ms = round(parse_interval(interval) * 1000)
    options = {"intervalMs": ms, "jitter": JITTER, "reconnect": bool(reconnect), "notify": bool(notify)}
    return script_template().replace("__OPTIONS__", json.dumps(options))


def bookmarklet(interval=DEFAULT_INTERVAL, *, reconnect: bool = False, notify: bool = True) -> str:
    """The script as a ``javascript:`` URL to drag to the bookmarks bar and click on the Colab tab."""
    code = script(interval, reconnect=reconnect, notify=notify)
    compact = "\n".join(line.strip() for line in code.splitlines() if line.strip())
    return "javascript:" + urllib.parse.quote(compact, safe="")
