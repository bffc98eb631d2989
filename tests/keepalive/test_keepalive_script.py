"""The top-level keep-alive script in headless Chromium, against local pages that mimic each Colab toolbar
DOM variant (2019 toolbar button, 2020 element, current shadow-DOM button) and the "are you still there" /
reCAPTCHA dialogs. Pages are served by Playwright's router from memory: nothing leaves the machine."""
from __future__ import annotations

import time

import pytest

from colabkit import keepalive
from tests.waiting import wait_for

pytestmark = pytest.mark.slow

ORIGIN = "http://colab.test"

# Each page counts clicks on its connect button in window.clickTimes (performance.now(), ms).
COMMON = """<script>
window.clickTimes = [];
function counted(el) { el.addEventListener("click", function () { window.clickTimes.push(performance.now()); }); }
</script>"""

SHADOW_ELEMENT = """<script>
customElements.define("colab-connect-button", class extends HTMLElement {
  constructor() {
    super();
    var root = this.attachShadow({mode: "open"});
    root.innerHTML = '<div class="wrap"><button id="connect">Connected</button></div>';
    counted(root.querySelector("#connect"));
  }
});
</script>"""

PAGES = {
    # 2019: a toolbar button with id "connect"
    "toolbar-2019": COMMON + """
<colab-toolbar id="top"><colab-toolbar-button id="connect">Connect</colab-toolbar-button></colab-toolbar>
<script>counted(document.querySelector("colab-toolbar-button#connect"));</script>""",
    # 2020: the colab-connect-button element itself, no shadow root
    "element-2020": COMMON + """
<colab-connect-button>Connect</colab-connect-button>
<script>counted(document.querySelector("colab-connect-button"));</script>""",
    # current: #connect inside the open shadow root of colab-connect-button
    "shadow-current": COMMON + SHADOW_ELEMENT + """<colab-connect-button></colab-connect-button>""",
    # no button at all (Google changed the page, or this is not the Colab tab)
    "no-button": COMMON + "<p>Some other page</p>",
}

# Dialogs as they may appear over the current toolbar.
STILL_THERE_DIALOG = """
<script>
customElements.define("colab-dialog", class extends HTMLElement {
  constructor() {
    super();
    this.attachShadow({mode: "open"}).innerHTML =
      '<h2>Are you still there?</h2><p>Confirm that you are not a robot to keep using Colab.</p><slot></slot>';
  }
});
</script>
<mwc-dialog id="dlg" open><colab-dialog></colab-dialog></mwc-dialog>"""

CAPTCHA_DIALOG = """
<div id="dlg" role="dialog" style="position:fixed;top:20px;left:20px;width:320px;height:120px;background:#fff">
  <iframe title="reCAPTCHA" src="/recaptcha/api2/anchor?k=test" width="300" height="80"></iframe>
</div>"""

CLOSED_DIALOG = """<mwc-dialog id="old"><p>Are you still there?</p></mwc-dialog>"""  # not open: ignored


@pytest.fixture
def page(chromium):
    context = chromium.new_context()
    page = context.new_page()
    messages = []
    page.on("console", lambda m: messages.append((m.type, m.text)))
    page.on("pageerror", lambda e: messages.append(("pageerror", str(e))))

    def serve(route):
        path = route.request.url[len(ORIGIN):].split("?")[0]
        name = path.strip("/").removesuffix(".html")
        if path.startswith("/recaptcha/"):
            return route.fulfill(status=200, content_type="text/html", body="<p>I'm not a robot</p>")
        body = PAGES.get(name) or EXTRA.get(name)
        if body is None:
            return route.fulfill(status=404, body="")
        return route.fulfill(status=200, content_type="text/html",
                             body=f"<!doctype html><html><head><title>{name}</title></head><body>{body}</body></html>")

    page.route(f"{ORIGIN}/**", serve)
    page.messages = messages
    yield page
    context.close()


EXTRA = {
    "still-there": COMMON + SHADOW_ELEMENT + "<colab-connect-button></colab-connect-button>" + STILL_THERE_DIALOG,
    "captcha": COMMON + SHADOW_ELEMENT + "<colab-connect-button></colab-connect-button>" + CAPTCHA_DIALOG,
    "closed-dialog": COMMON + SHADOW_ELEMENT + "<colab-connect-button></colab-connect-button>" + CLOSED_DIALOG,
}


def inject(page, interval="1s"):
    page.add_script_tag(content=keepalive.script(interval))
    return time.monotonic()


def clicks(page) -> list:
    return page.evaluate("window.clickTimes")


def our_errors(page) -> list:
    return [m for m in page.messages if m[0] in ("error", "pageerror")]


@pytest.mark.parametrize("variant, expected", [
    ("toolbar-2019", "colab-toolbar-button#connect"),
    ("element-2020", "colab-connect-button"),
    ("shadow-current", "colab-connect-button shadow root #connect"),
])
def test_clicks_each_variant_on_schedule_and_stops(page, variant, expected):
    page.goto(f"{ORIGIN}/{variant}.html")
    page.evaluate("window.t0 = performance.now()")
    inject(page, "1s")
    times = wait_for(lambda: len(clicks(page)) >= 3 and clicks(page), timeout=8)
    assert len(times) >= 3, f"{variant}: only {len(times)} clicks in 8 s with a 1 s interval"
    t0 = page.evaluate("window.t0")
    assert times[0] - t0 >= 900, "the first click comes after one interval, not at once"
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert all(800 <= g <= 2000 for g in gaps), gaps   # 1 s apart, with room for a loaded CI machine
    # one read of both: a tick between two reads would make them differ
    state, n = page.evaluate("[window.colabkitKeepAlive, window.clickTimes.length]")
    assert state["variant"] == expected and state["running"] is True and state["clicks"] == n
    assert any(expected in text for kind, text in page.messages if kind == "info")

    returned = page.evaluate("stopKeepAlive()")
    stopped_at = len(clicks(page))
    assert returned == stopped_at
    time.sleep(2.5)
    assert len(clicks(page)) == stopped_at, "clicks continued after stopKeepAlive()"
    assert page.evaluate("window.colabkitKeepAlive.running") is False
    assert page.evaluate("stopKeepAlive()") == stopped_at  # a second stop is harmless
    assert our_errors(page) == []


def test_bookmarklet_link_runs_the_same_script(page):
    page.goto(f"{ORIGIN}/shadow-current.html")
    href = keepalive.bookmarklet("1s")
    assert href.startswith("javascript:") and " " not in href and "\n" not in href
    page.evaluate("""href => { var a = document.createElement('a'); a.id = 'bm'; a.href = href;
                               a.textContent = 'Colab keep-alive'; document.body.appendChild(a); }""", href)
    page.click("#bm")
    assert wait_for(lambda: len(clicks(page)) >= 2, timeout=6)
    page.evaluate("stopKeepAlive()")
    assert our_errors(page) == []


def test_injecting_twice_replaces_the_first_timer(page):
    page.goto(f"{ORIGIN}/shadow-current.html")
    inject(page, "1s")
    inject(page, "1s")
    time.sleep(3.6)
    n = len(clicks(page))
    assert 2 <= n <= 4, f"{n} clicks in 3.6 s: two timers are running"
    page.evaluate("stopKeepAlive()")


@pytest.mark.parametrize("variant, kind", [("still-there", "still-there"), ("captcha", "captcha")])
def test_reports_a_dialog_instead_of_clicking_and_resumes_after_it(page, variant, kind):
    page.goto(f"{ORIGIN}/{variant}.html")
    page.evaluate("""window.events = [];
        window.addEventListener('colabkit-keepalive', e => window.events.push(e.detail));""")
    title = page.title()
    inject(page, "1s")
    time.sleep(2.6)
    assert clicks(page) == [], "clicked while Colab asked whether anyone is there"
    state = page.evaluate("window.colabkitKeepAlive")
    assert state["dialog"]["kind"] == kind and state["dialogsSeen"] == 1
    warnings = [text for k, text in page.messages if k == "warning" and "still there" in text]
    assert len(warnings) == 1, page.messages  # reported once, not every tick
    assert page.title().startswith("\u26a0 Colab needs you")
    assert page.locator("#colabkit-keepalive-banner").is_visible()
    assert [e["event"] for e in page.evaluate("window.events")] == ["dialog"]

    page.evaluate("document.getElementById('dlg').remove()")  # the user answered it
    assert wait_for(lambda: len(clicks(page)) >= 1, timeout=4)
    assert page.title() == title
    assert page.locator("#colabkit-keepalive-banner").count() == 0
    assert page.evaluate("window.colabkitKeepAlive.dialog") is None
    page.evaluate("stopKeepAlive()")
    assert our_errors(page) == []


def test_a_closed_dialog_is_not_a_dialog(page):
    page.goto(f"{ORIGIN}/closed-dialog.html")
    inject(page, "1s")
    assert wait_for(lambda: len(clicks(page)) >= 1, timeout=4)
    assert page.evaluate("window.colabkitKeepAlive.dialog") is None
    page.evaluate("stopKeepAlive()")


def test_no_button_warns_and_keeps_trying(page):
    page.goto(f"{ORIGIN}/no-button.html")
    inject(page, "1s")
    assert wait_for(lambda: page.evaluate("window.colabkitKeepAlive.misses") >= 2, timeout=6)  # ticks at 1 s, 2 s
    state = page.evaluate("window.colabkitKeepAlive")
    assert state["clicks"] == 0 and state["misses"] >= 2 and state["running"] is True
    warnings = [text for kind, text in page.messages if kind == "warning"]
    assert len(warnings) == 1 and "no connect button found" in warnings[0]
    # The button appears later (the page finished loading): clicking starts.
    page.evaluate("""() => { var b = document.createElement('colab-toolbar-button'); b.id = 'connect';
        counted(b); document.body.appendChild(b); }""")
    assert wait_for(lambda: len(clicks(page)) >= 1, timeout=4)
    page.evaluate("stopKeepAlive()")
    assert our_errors(page) == []
