"""The top-level keep-alive script in headless Chromium, against local pages shaped like Colab's toolbar as
maintained public keep-alive extensions read it. Playwright's fake clock runs minutes of intervals in
milliseconds; pages are served by Playwright's router from memory: nothing leaves the machine.

Where the element names and states in these fixtures come from (read, not copied):
- tdulcet/Colab-Autorun-and-Connect, content_script.js (Jan 2026): the connect button is
  ``document.querySelector("colab-connect-button").shadowRoot.getElementById("connect")`` and its label says
  whether a runtime is attached (it clicks only when the label contains "connect"); dialog actions are
  ``md-text-button[slot=primaryAction]`` / ``[slot=secondaryAction]`` in the document; a CAPTCHA is a
  ``colab-recaptcha-dialog`` element with its own shadow root.
- satyajitghana/colab-keepalive, README.md: the same button reached as
  ``#top-toolbar > colab-connect-button`` -> shadowRoot ``#connect``.
- colab-facts.md ("The page as maintained keep-alive extensions read it"): "Connect"/"Reconnect" when no runtime
  is attached, a RAM/Disk meter when connected; "Runtime disconnected" dialogs with md-text-button actions;
  the UI's own disconnect text ("disconnected due to inactivity or reaching its maximum duration").
- The 2019 ``colab-toolbar-button#connect`` toolbar: colab-facts.md's list of selectors seen over the years.
The invisible-reCAPTCHA badge (``.grecaptcha-badge`` holding an anchor iframe with ``size=invisible``) is how
Google's reCAPTCHA script renders an invisible widget on any page; it is not a challenge.
"""
from __future__ import annotations

import itertools

import pytest

from colabkit import keepalive

pytestmark = pytest.mark.slow

ORIGIN = "http://colab.test"
MINUTE = 60_000

# Every page records clicks in window.clicks: {t: performance.now(), target: "connect" | "host" | "dialog:<label>",
# runtime: the state the page was in when clicked}, and the script's (synthetic) pointer moves in window.moves.
# window.setRuntime(state) relabels the button the way Colab does; clicking it while disconnected starts
# "Connecting", then "connected" 10 s later (a fresh VM); window.STUCK makes the click do nothing (Colab refusing
# a new VM), window.DROP_AFTER drops each new runtime again after that many ms.
TOOLBAR = """<script>
window.clicks = [];
window.runtime = "connected";
window.CONNECT_ID = window.CONNECT_ID || "connect";
var LABELS = {connected: '<span class="ram">RAM</span> <span class="disk">Disk</span>',
              connecting: "Connecting", disconnected: "Connect", reconnect: "Reconnect"};
function inner() {
  return document.querySelector("colab-connect-button").shadowRoot.getElementById(CONNECT_ID);
}
window.setRuntime = function (s) { window.runtime = s; inner().innerHTML = LABELS[s]; };
customElements.define("colab-connect-button", class extends HTMLElement {
  constructor() {
    super();
    var root = this.attachShadow({mode: "open"});
    root.innerHTML = '<div class="wrap"><button id="' + CONNECT_ID + '"></button></div>';
    var host = this;
    this.addEventListener("click", function (e) {
      var own = e.composedPath()[0] === host;
      window.clicks.push({t: performance.now(), target: own ? "host" : "connect", runtime: window.runtime});
      if (!own && !window.STUCK && (window.runtime === "disconnected" || window.runtime === "reconnect")) {
        setRuntime("connecting");
        setTimeout(function () {
          setRuntime("connected");
          /* a runtime that drops again soon after each reconnect */
          if (window.DROP_AFTER) { setTimeout(function () { setRuntime("reconnect"); }, window.DROP_AFTER); }
        }, 10000);
      }
    });
  }
});
</script>
<div id="top-toolbar"><colab-connect-button></colab-connect-button></div>
<script>setRuntime(window.INITIAL || "connected");</script>"""


def dialog_buttons(*labels):
    slots = ["secondaryAction", "primaryAction"][-len(labels):]
    return "".join(f'<md-text-button slot="{slot}" onclick="window.clicks.push({{t: performance.now(), '
                   f'target: \'dialog:{label}\', runtime: window.runtime}})">{label}</md-text-button>'
                   for slot, label in zip(slots, labels))


DISCONNECTED_DIALOG = (
    '<md-dialog id="dlg" open><div slot="headline">Runtime disconnected</div>'
    '<div slot="content">Your runtime has been disconnected due to inactivity or reaching its maximum duration.'
    '</div><div slot="actions">' + dialog_buttons("Close", "Reconnect") + "</div></md-dialog>")

CAPTCHA_DIALOG = """<script>
customElements.define("colab-recaptcha-dialog", class extends HTMLElement {
  constructor() {
    super();
    this.attachShadow({mode: "open"}).innerHTML =
      '<div role="dialog"><iframe title="reCAPTCHA" src="/recaptcha/api2/anchor?k=test" width="300" height="80">' +
      '</iframe><md-text-button>Cancel</md-text-button></div>';
  }
});
</script><colab-recaptcha-dialog id="dlg"></colab-recaptcha-dialog>"""

# The element alone, no reCAPTCHA frame in it and no challenge wording: recognised by its name.
CAPTCHA_ELEMENT_ONLY = """<script>
customElements.define("colab-recaptcha-dialog", class extends HTMLElement {
  constructor() {
    super();
    this.attachShadow({mode: "open"}).innerHTML =
      '<md-dialog open><div slot="content" style="width:300px;height:80px"></div>' +
      '<md-text-button slot="secondaryAction">Cancel</md-text-button></md-dialog>';
  }
});
</script><colab-recaptcha-dialog id="dlg"></colab-recaptcha-dialog>"""

# Not upgraded (no shadow root), its dialog in the light DOM: closed, then open.
LIGHT_CAPTCHA_CLOSED = ('<colab-recaptcha-dialog id="dlg"><md-dialog><div style="width:300px;height:80px">'
                        '</div><md-text-button>Cancel</md-text-button></md-dialog></colab-recaptcha-dialog>')
LIGHT_CAPTCHA_OPEN = LIGHT_CAPTCHA_CLOSED.replace("<md-dialog>", "<md-dialog open>")

# Colab's own "Connect to a local runtime" dialog: a Connect button, but the runtime is not gone.
LOCAL_RUNTIME_DIALOG = (
    '<md-dialog id="dlg" open><div slot="headline">Connect to a local runtime</div>'
    '<div slot="content">Set up Jupyter on your machine, then enter the backend URL.'
    '<input value="http://localhost:8888"></div><div slot="actions">' + "{buttons}" + "</div></md-dialog>")

# The same element left in the page after its dialog closed: not a challenge.
CLOSED_CAPTCHA_DIALOG = CAPTCHA_DIALOG.replace('<div role="dialog">', "<mwc-dialog>").replace(
    "</md-text-button></div>", "</md-text-button></mwc-dialog>")

# Curly apostrophe, as typeset text in dialogs often has it; no "captcha" or "robot" in it.
STILL_THERE_DIALOG = ('<mwc-dialog id="dlg" open><h2>Still working?</h2><p>Please verify you\u2019re human to '
                      'keep using this runtime.</p>' + dialog_buttons("Cancel", "OK") + "</mwc-dialog>")

INVISIBLE_BADGE = (
    '<div class="grecaptcha-badge" style="width:256px;height:60px;position:fixed;bottom:14px;right:0">'
    '<div class="grecaptcha-logo"><iframe title="reCAPTCHA" width="256" height="60" '
    'src="/recaptcha/api2/anchor?ar=1&k=test&size=invisible"></iframe></div></div>')

PAGES = {
    "connected": TOOLBAR,
    "disconnected": "<script>window.INITIAL = 'disconnected'</script>" + TOOLBAR,
    "reconnect-label": "<script>window.INITIAL = 'reconnect'</script>" + TOOLBAR,
    "connecting": "<script>window.INITIAL = 'connecting'</script>" + TOOLBAR,
    "disconnected-dialog": TOOLBAR + DISCONNECTED_DIALOG,
    "captcha": TOOLBAR + CAPTCHA_DIALOG,
    "still-there": TOOLBAR + STILL_THERE_DIALOG,
    "invisible-badge": TOOLBAR + INVISIBLE_BADGE,
    "closed-captcha": TOOLBAR + CLOSED_CAPTCHA_DIALOG,
    "captcha-element-only": TOOLBAR + CAPTCHA_ELEMENT_ONLY,
    "light-captcha-closed": TOOLBAR + LIGHT_CAPTCHA_CLOSED,
    "light-captcha-open": TOOLBAR + LIGHT_CAPTCHA_OPEN,
    "local-runtime-dialog": TOOLBAR + LOCAL_RUNTIME_DIALOG.replace("{buttons}", dialog_buttons("Cancel", "Connect")),
    # A UI in another language: the disconnected button's label is not an English one.
    "other-language": "<script>window.INITIAL = 'disconnected'</script>" + TOOLBAR +
                      "<script>inner().textContent = 'Verbinden';</script>",
    # The same UI while connected: the meter still says RAM.
    "other-language-connected": TOOLBAR + "<script>inner().innerHTML = '<span class=\"ram\">RAM</span> "
                                "<span class=\"disk\">Datentr\u00e4ger</span>';</script>",
    # Colab refuses a new VM: the button keeps saying Reconnect.
    "stuck-reconnect": "<script>window.INITIAL = 'reconnect'; window.STUCK = true;</script>" + TOOLBAR,
    # Each new VM drops again two minutes after it connected.
    "dropping": "<script>window.INITIAL = 'reconnect'; window.DROP_AFTER = 120000;</script>" + TOOLBAR,
    # Gone, with no known connect button and a dialog with nothing to reconnect with.
    "gone-nothing-to-click": "<script>window.CONNECT_ID = 'connect-2027'</script>" + TOOLBAR +
                             DISCONNECTED_DIALOG.replace(dialog_buttons("Close", "Reconnect"), dialog_buttons("Close")),
    # Google renamed the inner button: the host element is still there, #connect is not.
    "renamed": "<script>window.CONNECT_ID = 'connect-2027'</script>" + TOOLBAR,
    # A button whose label says nothing (an icon-only redesign): its state cannot be read.
    "no-label": TOOLBAR + "<script>inner().innerHTML = '<svg width=20 height=20></svg>';</script>",
    "toolbar-2019": """<script>window.clicks = []; window.runtime = "connected";</script>
<colab-toolbar id="top"><colab-toolbar-button id="connect">RAM Disk</colab-toolbar-button></colab-toolbar>
<script>document.querySelector("#connect").addEventListener("click", function () {
  window.clicks.push({t: performance.now(), target: "connect", runtime: window.runtime}); });</script>""",
}


@pytest.fixture
def page(chromium):
    context = chromium.new_context()
    context.add_init_script("""window.moves = [];
        document.addEventListener("mousemove", function (e) {
          window.moves.push({t: performance.now(), trusted: e.isTrusted}); }, true);""")
    page = context.new_page()
    page.clock.install()
    messages = []
    page.on("console", lambda m: messages.append((m.type, m.text)))
    page.on("pageerror", lambda e: messages.append(("pageerror", str(e))))

    def serve(route):
        path = route.request.url[len(ORIGIN):].split("?")[0]
        if path.startswith("/recaptcha/"):
            return route.fulfill(status=200, content_type="text/html", body="<p>reCAPTCHA</p>")
        body = PAGES.get(path.strip("/").removesuffix(".html"))
        if body is None:
            return route.fulfill(status=404, body="")
        return route.fulfill(status=200, content_type="text/html",
                             body=f'<!doctype html><html><head><meta charset="utf-8">'
                                  f"<title>My notebook - Colab</title></head><body>{body}</body></html>")

    page.route(f"{ORIGIN}/**", serve)
    page.messages = messages
    yield page
    context.close()


def start(page, name, interval="60s", **options):
    page.goto(f"{ORIGIN}/{name}.html")
    page.evaluate("""() => { window.events = [];
        window.addEventListener('colabkit-keepalive', e => window.events.push(e.detail.event)); }""")
    page.add_script_tag(content=keepalive.script(interval, **options))


def minutes(page, n):
    page.clock.run_for(int(n * MINUTE))


def clicks(page, target=None) -> list:
    return [c for c in page.evaluate("window.clicks") if target is None or c["target"] == target]


def moves(page) -> list:
    """The script's keep-active gestures (synthetic pointer moves) so far."""
    return page.evaluate("window.moves")


def state(page) -> dict:
    return page.evaluate("window.colabkitKeepAlive")


def warnings(page, text) -> list:
    return [m for kind, m in page.messages if kind == "warning" and text in m]


def our_errors(page) -> list:
    return [m for m in page.messages if m[0] in ("error", "pageerror")]


# -- connected: click nothing, a synthetic pointer move only -----------------------------------------------------------
@pytest.mark.parametrize("name", ["connected", "toolbar-2019", "invisible-badge", "closed-captcha"])
def test_connected_clicks_nothing_and_checks_every_interval_with_jitter(page, name):
    start(page, name, "60s")
    minutes(page, 30)
    # While connected nothing is clicked (a click on the RAM/Disk meter may open Colab's resources view).
    assert clicks(page) == [], clicks(page)
    done = moves(page)
    # 60 s plus up to 20 % jitter: 25 to 30 ticks in 30 min, every one of them an activity gesture.
    assert 25 <= len(done) <= 30, len(done)
    assert not any(m["trusted"] for m in done)
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(done)]
    assert all(60_000 <= g <= 72_000 for g in gaps), gaps
    assert len({round(g) for g in gaps}) > 3, "no jitter: every gap is the same"
    assert done[0]["t"] >= 60_000, "the first tick comes after one interval, not at once"
    s = state(page)
    assert s["runtime"] == "connected" and s["dialog"] is None and s["activity"] == len(done)
    assert clicks(page, "host") == []
    assert page.title() == "My notebook - Colab"
    assert our_errors(page) == []


# A stand-in for the Screen Wake Lock API (the test origin is not a secure context, so Chromium has none):
# records each request and release the way the real sentinel reports them.
WAKE_LOCK_STANDIN = """window.locks = {requested: 0, released: 0, refuse: false};
Object.defineProperty(navigator, "wakeLock", {configurable: true, value: {request: function (type) {
  window.locks.requested += 1;
  if (window.locks.refuse) { return Promise.reject(new DOMException("not allowed", "NotAllowedError")); }
  var handlers = [], done = false;
  return Promise.resolve({type: type, addEventListener: function (n, f) { if (n === "release") handlers.push(f); },
    release: function () { if (!done) { done = true; window.locks.released += 1; handlers.forEach(f => f()); }
                           return Promise.resolve(); }});
}}});"""


def test_a_screen_wake_lock_is_held_while_connected_and_given_back_when_gone_or_stopped(page):
    page.add_init_script(WAKE_LOCK_STANDIN)
    start(page, "connected", "60s")
    minutes(page, 10)
    # One lock for the whole connected stretch, not one request per tick.
    assert page.evaluate("window.locks") == {"requested": 1, "released": 0, "refuse": False}
    assert state(page)["wakeLock"] is True
    page.evaluate("setRuntime('reconnect')")
    minutes(page, 1.5)
    assert page.evaluate("window.locks.released") == 1 and state(page)["wakeLock"] is False
    page.evaluate("setRuntime('connected')")
    minutes(page, 1.5)
    assert page.evaluate("window.locks") == {"requested": 2, "released": 1, "refuse": False}
    page.evaluate("stopKeepAlive()")
    assert page.evaluate("window.locks.released") == 2
    assert clicks(page) == [] and our_errors(page) == []


def test_a_refused_wake_lock_is_said_once_and_changes_nothing_else(page):
    page.add_init_script(WAKE_LOCK_STANDIN + "window.locks.refuse = true;")
    start(page, "connected", "60s")
    minutes(page, 10)
    assert len([m for kind, m in page.messages if "refused a screen wake lock" in m]) == 1
    assert len(moves(page)) >= 8 and clicks(page) == [] and our_errors(page) == []


def test_connecting_is_left_alone(page):
    start(page, "connecting", "60s")
    minutes(page, 5)
    assert clicks(page) == [] and state(page)["runtime"] == "connecting"
    page.evaluate("setRuntime('connected')")
    minutes(page, 2.5)
    assert len(moves(page)) >= 1 and clicks(page) == []


# -- the runtime is gone: tell the user, never reconnect by default -----------------------------------------
@pytest.mark.parametrize("name", ["disconnected", "reconnect-label", "disconnected-dialog"])
def test_a_gone_runtime_is_reported_and_not_reconnected(page, name):
    start(page, name, "60s")
    minutes(page, 20)
    assert clicks(page) == [], "clicked on a page whose runtime is gone: that attaches a fresh, idle VM"
    s = state(page)
    assert s["runtime"] == "disconnected" and s["reconnects"] == 0
    said = warnings(page, "runtime is gone")
    assert len(said) == 1, page.messages   # once, not every tick
    assert "not reconnecting" in said[0] and "reconnect=True" in said[0] and "failed" not in said[0]
    assert page.title().startswith("\u26d4 Runtime gone")
    banner = page.locator("#colabkit-keepalive-banner")
    assert banner.is_visible() and "runtime is gone" in banner.inner_text()
    assert page.evaluate("window.events").count("disconnected") == 1
    assert our_errors(page) == []


def test_after_the_user_reconnects_it_keeps_the_page_active_again(page):
    start(page, "disconnected", "60s")
    minutes(page, 3)
    assert clicks(page) == []
    page.evaluate("setRuntime('connected')")   # the user clicked Connect themselves
    minutes(page, 3)
    assert len(moves(page)) >= 2 and state(page)["runtime"] == "connected" and clicks(page) == []
    assert page.title() == "My notebook - Colab"
    assert page.locator("#colabkit-keepalive-banner").count() == 0
    assert "connected" in page.evaluate("window.events")


def test_reconnect_opt_in_clicks_connect_once_and_then_keeps_alive(page):
    start(page, "reconnect-label", "60s", reconnect=True)
    minutes(page, 1.3)
    first = clicks(page)
    assert [c["target"] for c in first] == ["connect"] and first[0]["runtime"] == "reconnect"
    assert any("fresh VM" in m for kind, m in page.messages if kind == "warning")
    minutes(page, 10)
    assert len(clicks(page)) == 1, clicks(page)   # no second reconnect, no clicks while connected
    assert moves(page) and state(page)["reconnects"] == 1 and state(page)["runtime"] == "connected"


def test_reconnect_opt_in_uses_the_dialogs_reconnect_button(page):
    start(page, "disconnected-dialog", "60s", reconnect=True)
    minutes(page, 1.3)
    assert [c["target"] for c in clicks(page)] == ["dialog:Reconnect"]
    assert state(page)["reconnects"] == 1


@pytest.mark.parametrize("reconnect", [False, True])
def test_a_label_in_another_language_is_unknown_and_never_clicked(page, reconnect):
    start(page, "other-language", "60s", reconnect=reconnect)
    minutes(page, 10)
    assert clicks(page) == [], "clicked a button whose label it cannot read (here: a disconnected one)"
    assert moves(page) == [] and state(page)["runtime"] == "unknown"
    said = warnings(page, '"Verbinden"')
    assert len(said) == 1 and "not clicking" in said[0], page.messages


def test_the_meter_in_another_language_still_reads_as_connected(page):
    start(page, "other-language-connected", "60s")
    minutes(page, 5)
    assert state(page)["runtime"] == "connected" and len(moves(page)) >= 4 and clicks(page) == []


@pytest.mark.parametrize("reconnect", [False, True])
def test_the_local_runtime_dialogs_connect_button_is_not_a_gone_runtime(page, reconnect):
    start(page, "local-runtime-dialog", "60s", reconnect=reconnect)
    minutes(page, 5)
    assert clicks(page) == [], "clicked Connect in Colab's local-runtime dialog"
    s = state(page)
    assert s["runtime"] == "connected" and s["reconnects"] == 0
    assert warnings(page, "runtime is gone") == [] and page.locator("#colabkit-keepalive-banner").count() == 0
    assert page.title() == "My notebook - Colab"


def test_reconnect_stops_after_three_tries_that_change_nothing(page):
    start(page, "stuck-reconnect", "60s", reconnect=True)
    minutes(page, 30)
    assert [c["target"] for c in clicks(page)] == ["connect"] * 3, clicks(page)
    said = warnings(page, "failed 3 times")
    assert len(said) == 1, page.messages
    assert page.title().startswith("\u26d4 Runtime gone")
    assert "failed 3 times" in page.locator("#colabkit-keepalive-banner").inner_text()


def test_a_runtime_that_keeps_dropping_is_reconnected_at_most_three_times_an_hour(page):
    start(page, "dropping", "60s", reconnect=True)
    minutes(page, 55)
    assert len(clicks(page)) == 3, [c["runtime"] for c in clicks(page)]
    assert len(warnings(page, "3 times in the last hour")) == 1, page.messages
    assert state(page)["runtime"] == "disconnected"


def test_reconnect_with_nothing_to_click_says_so_without_claiming_failed_tries(page):
    start(page, "gone-nothing-to-click", "60s", reconnect=True)
    minutes(page, 5)
    assert clicks(page) == []
    said = warnings(page, "runtime is gone")
    assert len(said) == 1 and "failed" not in said[0] and "nothing to click" in said[0], page.messages


# -- dialogs only a person may answer -----------------------------------------------------------------------
@pytest.mark.parametrize("name, kind", [("captcha", "captcha"), ("still-there", "still-there")])
@pytest.mark.parametrize("reconnect", [False, True])
def test_a_challenge_is_never_clicked_through(page, name, kind, reconnect):
    start(page, name, "60s", reconnect=reconnect)
    minutes(page, 10)
    assert clicks(page) == [], "clicked while Colab asked for a person"
    s = state(page)
    assert s["dialog"]["kind"] == kind and s["dialogsSeen"] == 1
    assert len(warnings(page, "only you can answer")) == 1, page.messages
    assert page.title().startswith("\u26a0 Colab needs you")
    assert page.locator("#colabkit-keepalive-banner").is_visible()

    assert moves(page) == []
    page.evaluate("document.getElementById('dlg').remove()")   # the user answered it
    minutes(page, 1.5)
    assert len(moves(page)) >= 1 and clicks(page) == []
    assert page.title() == "My notebook - Colab"
    assert page.locator("#colabkit-keepalive-banner").count() == 0
    assert our_errors(page) == []


@pytest.mark.parametrize("name, challenge", [("captcha-element-only", True), ("light-captcha-open", True),
                                             ("light-captcha-closed", False)])
def test_colab_recaptcha_dialog_is_recognised_by_its_element_and_open_state(page, name, challenge):
    start(page, name, "60s")
    minutes(page, 5)
    assert clicks(page) == []
    if challenge:
        assert state(page)["dialog"]["kind"] == "captcha" and moves(page) == []
        assert len(warnings(page, "only you can answer")) == 1, page.messages
    else:
        assert state(page)["dialog"] is None and len(moves(page)) >= 4
        assert warnings(page, "only you can answer") == []


def test_the_title_colab_sets_during_a_still_there_dialog_is_kept(page):
    start(page, "still-there", "60s")
    minutes(page, 1.5)
    assert page.title().startswith("\u26a0 Colab needs you")
    page.evaluate("document.title = 'Renamed notebook - Colab'")   # Colab retitles the tab meanwhile
    page.evaluate("document.getElementById('dlg').remove()")
    minutes(page, 1.5)
    assert page.title() == "Renamed notebook - Colab"
    page.evaluate("stopKeepAlive()")
    assert page.title() == "Renamed notebook - Colab"


# -- a renamed button: say so once, never click a stand-in --------------------------------------------------
def test_a_renamed_button_is_reported_once_and_the_host_is_never_clicked(page):
    start(page, "renamed", "60s")
    minutes(page, 30)
    assert clicks(page) == [], "clicked something that is not a known connect button"
    s = state(page)
    assert s["runtime"] == "no-button" and s["misses"] >= 25 and s["running"] is True
    said = warnings(page, "no connect button found")
    assert len(said) == 1, page.messages
    # The page comes back with a known button (say, after a reload of Colab's toolbar code): it carries on.
    page.evaluate("""() => { var b = document.querySelector('colab-connect-button').shadowRoot
                        .getElementById('connect-2027'); b.id = 'connect'; }""")
    minutes(page, 1.5)
    assert len(moves(page)) >= 1 and state(page)["runtime"] == "connected"


def test_a_button_without_a_label_is_not_clicked(page):
    start(page, "no-label", "60s")
    minutes(page, 10)
    assert clicks(page) == [], "clicked a button whose state it cannot read (it may attach a fresh VM)"
    assert state(page)["runtime"] == "unknown"
    assert len(warnings(page, "no label to read the runtime's state from")) == 1, page.messages


# -- the title: restored only if it is still ours -----------------------------------------------------------
def test_the_title_colab_set_meanwhile_is_kept(page):
    start(page, "disconnected", "60s")
    minutes(page, 1.5)
    assert page.title().startswith("\u26d4 Runtime gone")
    page.evaluate("document.title = 'Renamed notebook - Colab'")   # Colab retitles the tab meanwhile
    page.evaluate("setRuntime('connected')")
    minutes(page, 1.5)
    assert page.title() == "Renamed notebook - Colab"


def test_stop_ends_the_timer_and_cleans_up(page):
    start(page, "disconnected", "60s")
    minutes(page, 1.5)
    assert page.locator("#colabkit-keepalive-banner").count() == 1
    page.evaluate("stopKeepAlive()")
    assert page.title() == "My notebook - Colab" and page.locator("#colabkit-keepalive-banner").count() == 0
    page.evaluate("setRuntime('connected')")
    minutes(page, 10)
    assert clicks(page) == [] and moves(page) == [] and state(page)["running"] is False
    assert page.evaluate("stopKeepAlive()") == 0   # a second stop is harmless


def test_injecting_twice_leaves_one_timer(page):
    start(page, "connected", "60s")
    page.add_script_tag(content=keepalive.script("60s"))
    minutes(page, 10)
    assert 8 <= len(moves(page)) <= 10


def test_bookmarklet_link_runs_the_same_script(page):
    page.goto(f"{ORIGIN}/connected.html")
    href = keepalive.bookmarklet("60s")
    assert href.startswith("javascript:") and " " not in href and "\n" not in href
    page.evaluate("""href => { var a = document.createElement('a'); a.id = 'bm'; a.href = href;
                               a.textContent = 'Colab keep-alive'; document.body.appendChild(a); }""", href)
    page.click("#bm")
    minutes(page, 5)
    assert len(moves(page)) >= 4
    assert our_errors(page) == []


# -- the interval floor -------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["1s", "29s", 10, "0.5min"])
def test_intervals_under_30s_are_refused_with_the_value_named(value):
    from colabkit.units import parse_duration
    seconds = parse_duration(value, name="interval")
    if seconds >= 30:
        assert keepalive.parse_interval(value) == seconds
        return
    with pytest.raises(ValueError) as info:
        keepalive.script(value)
    message = str(info.value)
    assert repr(value) in message and "at least 30s" in message and "once a minute" in message
