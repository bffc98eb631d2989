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

What the script does while connected follows these maintained public keep-alive scripts (read, not copied):
- satyajitghana/colab-keepalive ("Colab Alive", a Chrome extension), README.md: clicks that ``#connect`` button on
  every tick, connected or not, to prevent the idle timeout.
- Sirczechs-Kaustubh/no-terminate-colab, README.md (after a snippet by Hugging Face's Patrick von Platen, also
  pasted into many fine-tuning notebooks): the same click every 60 s.
- Greasy Fork script 461356, "colab 保持活跃 / make colab keep alive" (Epool, WangZha; v2.0): the same click at a
  random interval of 60-120 s.
- rtindru/colabAlive, src/inject/inject.js: clicks ``colab-connect-button``, then one second later closes the
  dialog the click opened (``colab-sessions-dialog`` -> ``.dismiss``). The close step here is that step made
  general: the opened view's Close / Dismiss button, else Escape, else its own close().
- The pointer move: some extensions also dispatch a synthetic mousemove (colab-facts.md).
Not followed: Greasy Fork script 484737 ("colab 自动重连"), which removes ``colab-recaptcha-dialog`` and the
reCAPTCHA scripts from the page; here a challenge is always left to the person.
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

# Every page records clicks in window.clicks: {t: performance.now(), target: "connect" | "host" | "dialog:<label>" |
# "menu:<label>" | "panel:Close" | "captcha:Cancel", runtime: the state the page was in when clicked}, and the
# script's (synthetic) pointer moves in window.moves. window.setRuntime(state) relabels the button the way Colab
# does; clicking it while disconnected starts "Connecting", then "connected" 10 s later (a fresh VM); window.STUCK
# makes the click do nothing (Colab refusing a new VM), window.DROP_AFTER drops each new runtime again after that
# many ms.
#
# Clicking the button while connected opens a view, as on the real page (colab-facts.md: "when connected it opens
# the resource view"; rtindru/colabAlive closes the dialog its click opened). What exactly opens is not published
# and has changed over the years, so the pages model the shapes a script may meet; window.OPENS picks one:
# - "panel" (default): a Resources side panel in the page, drawn 300 ms after the click, that takes the focus to
#   its close button (an md-icon-button, aria-label "Close"); the same button toggles it (a second click closes it).
# - "menu": a connection menu inside the button's own shadow root (md-menu, open attribute) with items such as
#   "Disconnect and delete runtime" that must never be clicked; Escape closes it.
# - "sessions": the 2020-era sessions dialog (an mwc-dialog) with Terminate and Close buttons.
# - "sticky": a menu ([role=menu]) without a close button that ignores Escape: something the script cannot close.
# - "captcha": Colab answers the click with its reCAPTCHA dialog (colab-recaptcha-dialog), which only a person may
#   answer (its Cancel included).
# - "switch": the side pane shows one tool at a time: the Resources panel takes the place of a Files pane the user
#   had open, which closing Resources does not bring back.
# - "nothing": the click opens nothing.
# window.views logs each view opening and closing: {t, view, event: "open" | "close", how}; window.shownViews()
# lists the views showing now.
RESOURCES = """<style>md-menu:not([open]), mwc-dialog:not([open]) { display: none; }</style>
<script>
window.clicks = [];
window.views = [];
window.OPENS = window.OPENS || "panel";
function logView(view, event, how) { window.views.push({t: performance.now(), view: view, event: event, how: how}); }
function record(target) { window.clicks.push({t: performance.now(), target: target, runtime: window.runtime}); }
window.shownViews = function () {
  var shown = [], panel = document.getElementById("resources-panel"), menu = window.connectMenu && connectMenu();
  if (panel && !panel.hidden) { shown.push("panel"); }
  var files = document.getElementById("files-pane");
  if (files && !files.hidden) { shown.push("files"); }
  if (menu && menu.hasAttribute("open")) { shown.push("menu"); }
  var sessions = document.getElementById("sessions");
  if (sessions && sessions.hasAttribute("open")) { shown.push("sessions"); }
  var sticky = document.getElementById("sticky-menu");
  if (sticky && !sticky.hidden) { shown.push("sticky"); }
  if (document.getElementById("click-captcha")) { shown.push("captcha"); }
  return shown;
};
window.openPanel = function (how) {
  var panel = document.getElementById("resources-panel");
  panel.hidden = false;
  logView("panel", "open", how);
  panel.querySelector("md-icon-button").focus();   /* the view takes the focus, as dialogs and panels do */
};
function closePanel(how) {
  var panel = document.getElementById("resources-panel");
  panel.hidden = true;
  logView("panel", "close", how);
}
/* What a click on the connected-state button does on this page. */
window.connectedClick = function () {
  var panel = document.getElementById("resources-panel");
  if (OPENS === "panel") {
    if (!panel.hidden) { closePanel("toggle"); return; }
    setTimeout(function () { openPanel("click"); }, 300);
  } else if (OPENS === "switch") {
    var files = document.getElementById("files-pane");
    if (!files.hidden) { files.hidden = true; logView("files", "close", "switch"); }
    openPanel("click");
  } else if (OPENS === "menu") {
    connectMenu().setAttribute("open", "");
    logView("menu", "open", "click");
  } else if (OPENS === "sessions") {
    document.getElementById("sessions").setAttribute("open", "");
    logView("sessions", "open", "click");
  } else if (OPENS === "sticky") {
    document.getElementById("sticky-menu").hidden = false;
    logView("sticky", "open", "click");
  } else if (OPENS === "captcha" && !document.getElementById("click-captcha")) {
    var box = document.createElement("colab-recaptcha-dialog");
    box.id = "click-captcha";
    box.innerHTML = '<md-dialog open><div style="width:300px;height:80px">reCAPTCHA</div>' +
      '<md-text-button onclick="record(&quot;captcha:Cancel&quot;)">Cancel</md-text-button></md-dialog>';
    document.body.appendChild(box);
    logView("captcha", "open", "click");
  }
};
</script>
<section id="resources-panel" hidden aria-label="Resources" style="position:fixed;right:0;top:60px;width:300px">
  <h3>Resources</h3><p>You are not subscribed. Python 3 Google Compute Engine backend (GPU)</p>
  <p>System RAM 1.2 / 12.7 GB</p><p>Disk 30.1 / 107.7 GB</p>
  <md-icon-button tabindex="0" aria-label="Close"
    onclick="record('panel:Close'); closePanel('close button')">close</md-icon-button>
</section>
<mwc-dialog id="sessions" heading="Active sessions"><h2>Active sessions</h2>
  <p>My notebook - Colab: GPU, 2 h 10 min</p>
  <mwc-button onclick="record('dialog:Terminate')">Terminate</mwc-button>
  <mwc-button dialogAction="close" onclick="record('dialog:Close');
    document.getElementById('sessions').removeAttribute('open'); logView('sessions', 'close', 'close button')"
    >Close</mwc-button>
</mwc-dialog>
<section id="files-pane" hidden aria-label="Files"><h3>Files</h3><p>sample_data</p>
  <md-icon-button tabindex="0" aria-label="Close" onclick="this.parentNode.hidden = true">close</md-icon-button>
</section>
<div id="sticky-menu" role="menu" hidden><div role="menuitem" onclick="record('menu:Sticky')">Sticky</div></div>
<textarea id="cell" aria-label="Code cell">model.fit(x, y, epochs=100)</textarea>
"""

TOOLBAR = RESOURCES + """<script>
window.runtime = "connected";
window.CONNECT_ID = window.CONNECT_ID || "connect";
var LABELS = {connected: '<span class="ram">RAM</span> <span class="disk">Disk</span>',
              connecting: "Connecting", disconnected: "Connect", reconnect: "Reconnect"};
function inner() {
  return document.querySelector("colab-connect-button").shadowRoot.getElementById(CONNECT_ID);
}
window.connectMenu = function () {
  return document.querySelector("colab-connect-button").shadowRoot.getElementById("menu");
};
window.setRuntime = function (s) { window.runtime = s; inner().innerHTML = LABELS[s]; };
customElements.define("colab-connect-button", class extends HTMLElement {
  constructor() {
    super();
    var root = this.attachShadow({mode: "open"});
    root.innerHTML = '<style>md-menu:not([open]) { display: none; }</style>' +
      '<div class="wrap"><button id="' + CONNECT_ID + '"></button></div>' +
      '<md-menu id="menu"><md-menu-item>View resources</md-menu-item><md-menu-item>Change runtime type' +
      '</md-menu-item><md-menu-item>Disconnect and delete runtime</md-menu-item></md-menu>';
    var menu = root.getElementById("menu");
    menu.addEventListener("keydown", function (e) {
      if (e.key === "Escape") { menu.removeAttribute("open"); logView("menu", "close", "Escape"); }
    });
    menu.addEventListener("click", function (e) { record("menu:" + e.target.textContent); });
    var host = this;
    this.addEventListener("click", function (e) {
      var own = e.composedPath()[0] === host;
      if (within(e.composedPath()[0], menu)) { return; }
      record(own ? "host" : "connect");
      if (!own && window.runtime === "connected") { connectedClick(); }
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
function within(el, box) { for (var n = el; n; n = n.parentNode) { if (n === box) { return true; } } return false; }
</script>
<div id="top-toolbar"><colab-connect-button></colab-connect-button></div>
<script>setRuntime(window.INITIAL || "connected");</script>"""

# The light-DOM variant the script also knows: colab-connect-button not upgraded, #connect a child of it.
LIGHT_TOOLBAR = RESOURCES + """<script>window.runtime = "connected";</script>
<div id="top-toolbar"><colab-connect-button><div id="connect" role="button" tabindex="0">
  <span class="ram">RAM</span> <span class="disk">Disk</span></div></colab-connect-button></div>
<script>document.getElementById("connect").addEventListener("click", function () {
  record("connect"); if (window.runtime === "connected") { connectedClick(); } });</script>"""


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
    "toolbar-2019": RESOURCES + """<script>window.runtime = "connected";</script>
<colab-toolbar id="top"><colab-toolbar-button id="connect">RAM Disk</colab-toolbar-button></colab-toolbar>
<script>document.querySelector("#connect").addEventListener("click", function () {
  record("connect"); if (window.runtime === "connected") { connectedClick(); } });</script>""",
    "light-dom": LIGHT_TOOLBAR,
    "opens-menu": "<script>window.OPENS = 'menu'</script>" + TOOLBAR,
    "opens-sessions": "<script>window.OPENS = 'sessions'</script>" + TOOLBAR,
    "opens-sticky": "<script>window.OPENS = 'sticky'</script>" + TOOLBAR,
    "opens-captcha": "<script>window.OPENS = 'captcha'</script>" + TOOLBAR,
    "opens-nothing": "<script>window.OPENS = 'nothing'</script>" + TOOLBAR,
    "opens-switch": "<script>window.OPENS = 'switch'</script>" + TOOLBAR,
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


def unconnected_clicks(page) -> list:
    """Clicks made while the page showed no connected runtime (Connect, Reconnect, Connecting), leaving out the
    Close button of a view a connected-state click opened just before the runtime dropped."""
    return [c for c in clicks(page) if c["runtime"] != "connected" and c["target"] not in CLOSERS]


def moves(page) -> list:
    """The script's keep-active gestures (synthetic pointer moves) so far."""
    return page.evaluate("window.moves")


def state(page) -> dict:
    return page.evaluate("window.colabkitKeepAlive")


def warnings(page, text) -> list:
    return [m for kind, m in page.messages if kind == "warning" and text in m]


def our_errors(page) -> list:
    return [m for m in page.messages if m[0] in ("error", "pageerror")]


# -- connected: click the connect button, as the maintained scripts do, and close what that opens ------------------
CLOSERS = {"panel:Close", "dialog:Close"}   # the only other things the script may click while connected


def views_closed_again(page) -> list:
    """Each view the page opened, as (view, how it was closed, seconds it stayed open); asserts none stays open."""
    log, done, opened = page.evaluate("window.views"), [], {}
    for entry in log:
        if entry["event"] == "open":
            opened[entry["view"]] = entry
        else:
            was = opened.pop(entry["view"])
            done.append((entry["view"], entry["how"], (entry["t"] - was["t"]) / 1000))
    assert opened == {}, f"left open: {opened}"
    return done


@pytest.mark.parametrize("name, view, how", [
    ("connected", "panel", "close button"),          # the resources panel, closed by its own Close button
    ("opens-menu", "menu", "Escape"),                # a menu in the button's shadow root: Escape, no item clicked
    ("opens-sessions", "sessions", "close button"),  # the old sessions dialog: Close, never Terminate
    ("light-dom", "panel", "close button"),          # colab-connect-button #connect in the light DOM
    ("toolbar-2019", "panel", "close button"),       # colab-toolbar-button#connect
    ("invisible-badge", "panel", "close button"),    # the invisible-reCAPTCHA badge is no challenge
    ("closed-captcha", "panel", "close button"),     # nor is a closed colab-recaptcha-dialog
    ("opens-nothing", None, None),
])
def test_connected_clicks_the_connect_button_every_tick_and_closes_what_it_opens(page, name, view, how):
    start(page, name, "60s")
    page.focus("#cell")   # the user left the cursor in a code cell
    minutes(page, 30)
    page.evaluate("stopKeepAlive()")
    minutes(page, 0.1)    # a close the last tick started still completes after the stop
    pressed = clicks(page, "connect")
    # 60 s plus up to 20 % jitter: 25 to 30 ticks in 30 min, each a click on the connected-state button.
    assert 25 <= len(pressed) <= 30, clicks(page)
    assert {c["runtime"] for c in pressed} == {"connected"}
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(pressed)]
    assert all(60_000 <= g <= 72_000 for g in gaps), gaps
    assert len({round(g) for g in gaps}) > 3, "no jitter: every gap is the same"
    assert pressed[0]["t"] >= 60_000, "the first tick comes after one interval, not at once"
    # Nothing else is clicked but a Close button of what the click opened: no menu item, no Terminate, no host.
    others = [c["target"] for c in clicks(page) if c["target"] != "connect"]
    assert set(others) <= CLOSERS, others
    # Whatever the click opened is closed again within seconds, every time: the page ends as it was.
    closed = views_closed_again(page)
    if view is None:
        assert closed == []
    else:
        assert len(closed) == len(pressed), closed
        assert {(v, h) for v, h, _ in closed} == {(view, how)}, closed
        assert max(s for _, _, s in closed) <= 3, closed
    assert page.evaluate("window.shownViews()") == []
    assert page.evaluate("document.activeElement.id") == "cell", "the focus was not given back to the cell"
    # Some maintained scripts also move the mouse: a synthetic (untrusted) pointer move each tick stays.
    done = moves(page)
    assert len(done) == len(pressed) and not any(m["trusted"] for m in done)
    s = state(page)
    assert s["runtime"] == "connected" and s["dialog"] is None
    # The counters are what happened: every click the script made, the ticks it kept the page active, what it closed.
    assert s["clicks"] == len(clicks(page)) and s["activity"] == len(pressed)
    assert s["connectClicks"] == len(pressed) and s["closed"] == len(closed) and s["reconnects"] == 0
    assert clicks(page, "host") == []
    assert page.title() == "My notebook - Colab"
    assert our_errors(page) == []


def test_a_challenge_the_click_brings_up_is_left_to_the_person(page):
    start(page, "opens-captcha", "60s")
    minutes(page, 10)
    # One click, then Colab asks for a person: the dialog is neither closed nor answered, and no more clicks.
    assert [c["target"] for c in clicks(page)] == ["connect"], clicks(page)
    assert page.evaluate("window.shownViews()") == ["captcha"]
    s = state(page)
    assert s["dialog"]["kind"] == "captcha" and s["closed"] == 0
    assert len(warnings(page, "only you can answer")) == 1, page.messages
    page.evaluate("""() => { document.querySelector('colab-recaptcha-dialog').remove();   // the user answered it
                             logView('captcha', 'close', 'user'); window.OPENS = 'panel'; }""")
    minutes(page, 2.5)
    assert len(clicks(page, "connect")) >= 2 and clicks(page, "captcha:Cancel") == []
    views_closed_again(page)


def test_a_view_the_user_opened_is_left_open(page):
    start(page, "connected", "60s")
    page.evaluate("openPanel('user')")   # the user is looking at the resources panel
    minutes(page, 10)
    # The first click toggled it shut: the script clicks once more to bring it back, then leaves it be while it
    # is open.
    assert [c["target"] for c in clicks(page)] == ["connect", "connect"], clicks(page)
    assert page.evaluate("window.shownViews()") == ["panel"]
    assert [(v["event"], v["how"]) for v in page.evaluate("window.views")] == [
        ("open", "user"), ("close", "toggle"), ("open", "click")]
    assert len(moves(page)) >= 8
    page.click("#resources-panel md-icon-button")   # the user closes it: the clicks resume
    minutes(page, 5)
    assert len(clicks(page, "connect")) >= 5
    views_closed_again(page)


def test_what_it_cannot_close_ends_the_connected_clicks_and_is_said_once(page):
    start(page, "opens-sticky", "60s")
    minutes(page, 10)
    assert [c["target"] for c in clicks(page)] == ["connect"], "kept clicking though it could not close what opened"
    said = warnings(page, "could not close")
    assert len(said) == 1 and "no longer clicks" in said[0], page.messages
    assert len(moves(page)) >= 8 and state(page)["connectClicks"] == 1 and state(page)["closed"] == 0
    assert clicks(page, "menu:Sticky") == []


def test_a_view_of_the_users_it_cannot_bring_back_ends_the_connected_clicks(page):
    start(page, "opens-switch", "60s")
    page.evaluate("document.getElementById('files-pane').hidden = false")   # the user browses their files
    minutes(page, 10)
    assert [c["target"] for c in clicks(page)] == ["connect", "panel:Close"], clicks(page)
    said = warnings(page, "closed a view you had open")
    assert len(said) == 1 and "no longer clicks" in said[0] and "Files" in said[0], page.messages
    assert page.evaluate("window.shownViews()") == [] and state(page)["connectedClick"] is False
    assert len(moves(page)) >= 8


def test_no_click_while_the_user_is_typing(page):
    start(page, "connected", "60s")
    page.focus("#cell")
    for _ in range(36):   # three minutes of typing, a key every 5 s
        page.keyboard.press("a")
        page.clock.run_for(5000)
    assert clicks(page) == [], "clicked the toolbar while the user typed in a cell"
    assert len(moves(page)) >= 2 and state(page)["skipped"] == len(moves(page))
    assert len([m for _, m in page.messages if "you are using the page" in m]) == 1, page.messages
    minutes(page, 3)      # the user stopped typing
    assert len(clicks(page, "connect")) >= 2
    assert page.evaluate("document.activeElement.id") == "cell"


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
    assert unconnected_clicks(page) == [] and our_errors(page) == []


def test_a_refused_wake_lock_is_said_once_and_changes_nothing_else(page):
    page.add_init_script(WAKE_LOCK_STANDIN + "window.locks.refuse = true;")
    start(page, "connected", "60s")
    minutes(page, 10)
    assert len([m for kind, m in page.messages if "refused a screen wake lock" in m]) == 1
    assert len(moves(page)) >= 8 and len(clicks(page, "connect")) >= 8 and our_errors(page) == []


def test_connecting_is_left_alone(page):
    start(page, "connecting", "60s")
    minutes(page, 5)
    assert clicks(page) == [] and state(page)["runtime"] == "connecting"
    page.evaluate("setRuntime('connected')")
    minutes(page, 2.5)
    assert len(moves(page)) >= 1 and len(clicks(page, "connect")) >= 1 and unconnected_clicks(page) == []


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
    assert len(moves(page)) >= 2 and state(page)["runtime"] == "connected"
    assert len(clicks(page, "connect")) >= 2 and unconnected_clicks(page) == []
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
    assert len(unconnected_clicks(page)) == 1, clicks(page)   # no second reconnect
    assert moves(page) and state(page)["reconnects"] == 1 and state(page)["runtime"] == "connected"
    # Connected again: the connected-state clicks of every tick, as on any connected page.
    assert len(clicks(page, "connect")) >= 9 and state(page)["connectClicks"] == len(clicks(page, "connect")) - 1


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
    assert state(page)["runtime"] == "connected" and len(moves(page)) >= 4
    assert len(clicks(page, "connect")) >= 4 and unconnected_clicks(page) == []


@pytest.mark.parametrize("reconnect", [False, True])
def test_the_local_runtime_dialogs_connect_button_is_not_a_gone_runtime(page, reconnect):
    start(page, "local-runtime-dialog", "60s", reconnect=reconnect)
    minutes(page, 5)
    assert clicks(page) == [], "clicked Connect in Colab's local-runtime dialog"
    s = state(page)
    # Connected, but a dialog is open: no click under it (it is the user's), only the pointer move.
    assert s["skipped"] >= 4 and "a dialog is open" in s["lastSkip"] and len(moves(page)) == s["activity"]
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
    assert len(unconnected_clicks(page)) == 3, [c["runtime"] for c in clicks(page)]
    assert state(page)["reconnects"] == 3
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
    # Gone: the connected page is kept active again, its clicks included.
    assert len(moves(page)) >= 1 and len(clicks(page, "connect")) >= 1
    assert {c["target"] for c in clicks(page)} <= {"connect"} | CLOSERS
    assert page.title() == "My notebook - Colab"
    assert page.locator("#colabkit-keepalive-banner").count() == 0
    assert our_errors(page) == []


@pytest.mark.parametrize("name, challenge", [("captcha-element-only", True), ("light-captcha-open", True),
                                             ("light-captcha-closed", False)])
def test_colab_recaptcha_dialog_is_recognised_by_its_element_and_open_state(page, name, challenge):
    start(page, name, "60s")
    minutes(page, 5)
    if challenge:
        assert clicks(page) == []
        assert state(page)["dialog"]["kind"] == "captcha" and moves(page) == []
        assert len(warnings(page, "only you can answer")) == 1, page.messages
    else:
        assert state(page)["dialog"] is None and len(moves(page)) >= 4 and len(clicks(page, "connect")) >= 4
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
    assert 8 <= len(moves(page)) <= 10 and 8 <= len(clicks(page, "connect")) <= 10


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
