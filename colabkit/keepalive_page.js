/* colabkit keep-alive for Google Colab (best-effort). Stop it with stopKeepAlive(). */
(function (options) {
  "use strict";
  var TAG = "[colabkit keep-alive]";
  if (typeof window.stopKeepAlive === "function") { window.stopKeepAlive(true); }
  var intervalMs = options.intervalMs, jitter = options.jitter;
  var state = window.colabkitKeepAlive = {
    running: true, intervalMs: intervalMs, reconnect: options.reconnect, runtime: null, variant: null,
    ticks: 0, activity: 0, clicks: 0, connectClicks: 0, closed: 0, connectedClick: true, skipped: 0,
    lastSkip: null, lastActivity: null, reconnects: 0, failedReconnects: 0, reconnectTimes: [],
    dialog: null, dialogsSeen: 0, misses: 0, wakeLock: false, startedAt: new Date().toISOString()
  };
  var MAX_RECONNECTS = 3, HOUR_MS = 3600000;
  /* After its click on the connected-state button the script looks at the page again SETTLE_MS later (what the
     click opened is drawn by then), closes what opened, and checks once more SETTLE_MS after that. No click
     within QUIET_MS of the user's own key press, click or scroll: the user keeps the page active then, and a
     view opening under their fingers would take their keys. */
  var SETTLE_MS = 1000, QUIET_MS = 15000;
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
  /* What a click can open and how it is closed again: a dialog or menu (Escape, or its own close()), or any view
     with a Close / Dismiss button (that button; never any other action). */
  var POPUPS = DIALOGS + ", md-menu, mwc-menu, paper-menu, [role=menu]";
  var CLOSERS = ACTIONS + ", md-icon-button, mwc-icon-button, paper-icon-button, [role=button]";
  var CLOSE_LABEL = /^(close|dismiss)$/i;
  var PERSON_TEXT = /still there|not a robot|captcha|verify (that )?(you're|you are) (a )?human|are you (a )?human/i;
  var GONE_TEXT = new RegExp("runtime disconnected|disconnected due to|has been disconnected|cannot connect to|" +
    "could not connect|unable to connect|connection (was )?lost", "i");
  var RECONNECT_LABEL = /^reconnect$/i;
  var METER = "meter, progress, [role=meter], [role=progressbar]";

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
  /* One walk over the page and its open shadow roots, sorting out what findDialog and the close step need.
     (Notebook outputs live in iframes of their own on Colab: never walked.) */
  function collect() {
    var found = {recaptcha: [], frames: [], dialogs: [], popups: [], closers: []};
    (function walk(root) {
      var all = root.querySelectorAll("*"), i, el;
      for (i = 0; i < all.length; i++) {
        el = all[i];
        if (el.localName === "colab-recaptcha-dialog") { found.recaptcha.push(el); }
        if (el.localName === "iframe" && /recaptcha/.test(el.getAttribute("src") || "")) { found.frames.push(el); }
        if (el.matches(DIALOGS)) { found.dialogs.push(el); }
        if (el.matches(POPUPS)) { found.popups.push(el); }
        if (el.matches(CLOSERS) && closes(el)) { found.closers.push(el); }
        if (el.shadowRoot) { walk(el.shadowRoot); }
      }
    })(document);
    return found;
  }
  function closes(el) {
    return [el.textContent, el.getAttribute("aria-label"), el.getAttribute("title")].some(function (text) {
      return CLOSE_LABEL.test(norm(text));
    });
  }
  function within(box, el) {
    for (var n = el; n; n = n.parentNode || n.host) { if (n === box) { return true; } }
    return false;
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
  function visible(el) {
    var r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && styled(el);
  }
  function shown(el) {
    if (el.hasAttribute && (el.hasAttribute("open") || el.hasAttribute("opened"))) { return true; }
    if (el.open === true || el.opened === true) { return true; }
    if (/^(DIALOG|MWC-DIALOG|MD-DIALOG|PAPER-DIALOG|MD-MENU|MWC-MENU|PAPER-MENU)$/.test(el.tagName)) { return false; }
    return visible(el);
  }
  function labelOf(el) {
    var text = norm(el.innerText || el.textContent);
    return text || norm(el.getAttribute("aria-label") || el.getAttribute("title"));
  }
  /* The connect button's label is the toolbar's state: Connect / Reconnect when no runtime is attached,
     Connecting (or Allocating, Initializing) on the way, a RAM / Disk meter while connected. Only those
     (English) labels are known: anything else, say a UI in another language, is "unknown" and never clicked. */
  function runtimeOf(el) {
    var l = labelOf(el).toLowerCase();
    if (/\b(connecting|reconnecting|allocating|initiali[sz]ing)\b/.test(l)) { return "connecting"; }
    if (/^(re)?connect\b/.test(l)) { return "disconnected"; }
    if (/\b(ram|disk)\b/.test(l) || deepQueryAll(el, METER).length) { return "connected"; }
    return "unknown";
  }
  /* A dialog that only a person may answer, or one that says the runtime is gone. */
  function findDialog(found) {
    var i, el, src, text, actions, j;
    var boxes = found.recaptcha;
    for (i = 0; i < boxes.length; i++) {
      /* a closed dialog left in the page is not a challenge: with a dialog inside (in its shadow root or its
         light DOM), that one must be open; without one, the element itself must show */
      var box = boxes[i];
      var inside = found.dialogs.filter(function (d) { return within(box, d); });
      var open = inside.length ? inside.some(shown) : visible(box);
      if (open && styled(box)) {
        return {kind: "captcha", text: "Colab's reCAPTCHA dialog (colab-recaptcha-dialog)"};
      }
    }
    var frames = found.frames;
    for (i = 0; i < frames.length; i++) {
      el = frames[i]; src = el.getAttribute("src") || "";
      /* the invisible-reCAPTCHA badge is not a challenge; a challenge frame (bframe) or a checkbox frame
         inside a dialog is */
      if (/[?&]size=invisible/.test(src) || el.closest(".grecaptcha-badge")) { continue; }
      var holder = el.closest(DIALOGS);
      if (shown(el) && (/\/bframe/.test(src) || (holder && shown(holder)))) {
        return {kind: "captcha", text: "a reCAPTCHA challenge"};
      }
    }
    var dialogs = found.dialogs, gone = null;
    for (i = 0; i < dialogs.length; i++) {
      if (!shown(dialogs[i])) { continue; }
      text = deepText(dialogs[i]);
      if (PERSON_TEXT.test(text)) {
        return {kind: /captcha|robot/i.test(text) ? "captcha" : "still-there", text: text.slice(0, 160)};
      }
      /* Only a dialog that says the runtime is gone counts, and only its Reconnect is ever clicked: Colab's
         "Connect to a local runtime" dialog also has a Connect button. */
      if (gone || !GONE_TEXT.test(text)) { continue; }
      actions = deepQueryAll(dialogs[i], ACTIONS);
      var button = null;
      for (j = 0; j < actions.length; j++) {
        if (RECONNECT_LABEL.test(labelOf(actions[j]))) { button = actions[j]; break; }
      }
      gone = {kind: "disconnected", text: text.slice(0, 160), button: button};
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
        tone.onended = function () { ctx.close(); };
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
  /* A Screen Wake Lock while connected and the tab is visible: a computer that goes to sleep stops the tab's
     own pings to the runtime, which no script can make up for. The browser drops the lock when the tab is
     hidden; the next tick with the tab visible asks again. Released once the runtime is gone or on stop. */
  var wakeLock = null, wakeLockAsked = false;
  function holdWakeLock() {
    if (wakeLock || wakeLockAsked || !navigator.wakeLock || document.visibilityState !== "visible") { return; }
    wakeLockAsked = true;
    navigator.wakeLock.request("screen").then(function (lock) {
      wakeLockAsked = false;
      if (!state.running || state.runtime !== "connected") { lock.release(); return; }
      wakeLock = lock;
      state.wakeLock = true;
      lock.addEventListener("release", function () { wakeLock = null; state.wakeLock = false; });
    }, function (err) {
      wakeLockAsked = false;
      if (!state.wakeLockRefused) {
        state.wakeLockRefused = true;
        console.info(TAG, "the browser refused a screen wake lock (" + err + "); keep the computer awake yourself");
      }
    });
  }
  function dropWakeLock() {
    if (wakeLock) { var lock = wakeLock; wakeLock = null; state.wakeLock = false; lock.release(); }
  }
  /* The user's own key presses, clicks and scrolls (trusted events only: the script's own are not). */
  var lastInput = -Infinity, INPUTS = ["keydown", "pointerdown", "mousedown", "wheel", "touchstart"];
  function onInput(e) { if (e.isTrusted) { lastInput = Date.now(); } }
  INPUTS.forEach(function (type) { window.addEventListener(type, onInput, true); });

  /* While connected, each tick does what maintained keep-alive scripts do: a click on the connected-state toolbar
     button (the connect button, showing the RAM/Disk meter) and a pointer move. Both are synthetic (the browser
     marks them untrusted); whether Colab counts them as activity is not published. The click opens a view on the
     real page (the resources view, a menu or a dialog): settle closes it again so the page ends as it was. */
  function keepActive(found, page) {
    holdWakeLock();
    var r = found.el.getBoundingClientRect();
    document.dispatchEvent(new MouseEvent("mousemove", {bubbles: true, clientX: r.left + 1, clientY: r.top + 1}));
    state.activity += 1;
    state.lastActivity = new Date().toISOString();
    emit("activity");
    var skip = whyNotClick(page);
    if (skip) {
      state.skipped += 1;
      state.lastSkip = skip[1];
      if (!skipsSaid[skip[0]]) {
        skipsSaid[skip[0]] = true;
        console.info(TAG, "not clicking the connect button this time: " + skip[1] + " (said once)");
      }
      return;
    }
    var round = {button: found.el, before: openIn(page), focus: focused(), at: Date.now(), tried: [], restoring: []};
    press(found.el);
    settling = true;
    later(function () { settle(round, 1); });
  }
  var settling = false, toggled = null, skipsSaid = {};
  function whyNotClick(page) {
    if (!state.connectedClick) { return ["off", "it stopped clicking while connected (see the warning above)"]; }
    if (settling) { return ["busy", "it is still closing what its last click opened"]; }
    if (Date.now() - lastInput < QUIET_MS) { return ["user", "you are using the page"]; }
    if (toggled && isOpen(toggled)) { return ["toggled", "a view you opened is open, and the button would close it"]; }
    toggled = null;
    var open = page.dialogs.filter(shown);
    if (open.length) { return ["dialog", "a dialog is open (" + describe(open[0]) + ")"]; }
    return null;
  }
  function press(el) {
    el.click();
    state.clicks += 1;
    state.connectClicks += 1;
  }
  function later(fn) {
    setTimeout(function () {
      try { fn(); } catch (err) { settling = false; console.warn(TAG, "closing what the click opened failed: " + err); }
    }, SETTLE_MS);
  }
  function openIn(found) {
    return {popups: found.popups.filter(shown), closers: found.closers.filter(visible)};
  }
  function isOpen(el) { return el.isConnected && (el.matches(CLOSERS) ? visible(el) : shown(el)); }
  function focused() {
    var el = document.activeElement;
    while (el && el.shadowRoot && el.shadowRoot.activeElement) { el = el.shadowRoot.activeElement; }
    return el;
  }
  function describe(el) {
    /* a Close button stands for the view it sits in: the nearest labelled container above it */
    var n = el.matches(CLOSERS) ? el.parentNode || el.host : null;
    for (; n && n !== document.body; n = n.parentNode || n.host) {
      if (n.getAttribute && (n.getAttribute("aria-label") || n.getAttribute("heading") || n.matches(POPUPS))) {
        el = n;
        break;
      }
    }
    var text = norm(el.getAttribute("aria-label") || el.getAttribute("heading") || el.textContent).slice(0, 40);
    return el.localName + (el.id ? "#" + el.id : "") + (text ? " \"" + text + "\"" : "");
  }
  /* What is open now that was not before the click: new Close / Dismiss buttons, and new dialogs or menus
     without one (a new button closes the view it sits in). */
  function newlyOpen(now, before) {
    var found = now.closers.filter(function (el) { return before.closers.indexOf(el) < 0; });
    now.popups.forEach(function (el) {
      if (before.popups.indexOf(el) < 0 && !found.some(function (c) { return within(el, c); })) { found.push(el); }
    });
    return found;
  }
  /* Up to three looks, SETTLE_MS apart, after a click on the connected-state button. 1: close what it opened; if
     it opened nothing but closed a view that was open (the button toggles it), click once more to bring that
     back. 2: close what is still open. 3: anything still open, or a view of the user's that stays closed, turns
     the connected click off for good, with one warning. */
  function settle(round, step) {
    var page = collect();
    /* A challenge or a "Runtime disconnected" dialog came up, or the user has taken over: leave the page alone
       (the next tick tells the user about a dialog). */
    if (findDialog(page) || lastInput > round.at) { finish(round, null); return; }
    var now = openIn(page), left = newlyOpen(now, round.before);
    if (step === 1 && !left.length) {
      round.restoring = round.before.closers.concat(round.before.popups).filter(function (el) { return !isOpen(el); });
      if (!round.restoring.length) { finish(round, null); return; }
      press(round.button);
      later(function () { settle(round, 2); });
      return;
    }
    if (left.length && step < 3) {
      left.forEach(function (el) { if (round.tried.indexOf(el) < 0) { round.tried.push(el); } close(el); });
      later(function () { settle(round, step + 1); });
      return;
    }
    var lost = round.before.closers.concat(round.before.popups).filter(function (el) { return !isOpen(el); });
    if (!left.length && !lost.length && round.restoring.length) { toggled = round.restoring[0]; }
    finish(round, left.length || lost.length ? {left: left, lost: lost} : null);
  }
  function finish(round, failed) {
    round.tried.forEach(function (el) { if (!isOpen(el)) { state.closed += 1; } });
    var focus = round.focus;
    if (!failed || !failed.left.length) {
      if (focus && focus !== document.body && focus.isConnected && focused() !== focus && focus.focus) {
        focus.focus({preventScroll: true});
      }
    }
    settling = false;
    if (!failed) { return; }
    state.connectedClick = false;
    console.warn(TAG, (failed.left.length ? "could not close what its click on the connect button opened (" +
      failed.left.map(describe).join(", ") + "); close it yourself." : "its click on the connect button closed a " +
      "view you had open (" + failed.lost.map(describe).join(", ") + ") and could not bring it back.") +
      " The script no longer clicks the button while connected (the pointer move and the wake lock stay) and " +
      "still tells you when the runtime is gone.");
    emit("click-off");
  }
  /* Close one thing the click opened: its Close / Dismiss button if it is one, else Escape (as a person would),
     and a dialog's or menu's own close() if Escape did not do it. */
  function close(el) {
    if (el.matches(CLOSERS)) {
      el.click();
      state.clicks += 1;
      return;
    }
    var key = {key: "Escape", code: "Escape", keyCode: 27, which: 27, bubbles: true, composed: true, cancelable: true};
    el.dispatchEvent(new KeyboardEvent("keydown", key));
    el.dispatchEvent(new KeyboardEvent("keyup", key));
    if (shown(el) && typeof el.close === "function") { el.close(); }
  }
  function gone(dialog, found) {
    var why = dialog ? "a \"" + dialog.text.slice(0, 60) + "\" dialog" :
      "the button says \"" + labelOf(found.el) + "\"";
    var extra = "";
    if (options.reconnect) {
      /* At most 3 tries in a row that bring no runtime, and at most 3 reconnects an hour: a runtime that
         keeps dropping must not turn into one fresh VM after another. */
      var now = Date.now();
      state.reconnectTimes = state.reconnectTimes.filter(function (t) { return now - t < HOUR_MS; });
      var target = dialog && dialog.button ? dialog.button :
        (found && runtimeOf(found.el) === "disconnected" ? found.el : null);
      if (state.failedReconnects >= MAX_RECONNECTS) {
        extra = " Reconnecting failed " + MAX_RECONNECTS + " times in a row (Colab may be over its usage " +
          "limits); not trying again until you reconnect yourself.";
      } else if (state.reconnectTimes.length >= MAX_RECONNECTS) {
        extra = " Reconnected " + MAX_RECONNECTS + " times in the last hour (each a fresh VM); not reconnecting " +
          "again within the hour.";
      } else if (!target) {
        extra = " Found nothing to click to reconnect (no Reconnect button in the dialog, no known connect " +
          "button that says Connect).";
      } else {
        console.warn(TAG, "the Colab runtime is gone (" + why + "); reconnecting as asked (reconnect=True). " +
          "This is a fresh VM: its disk and variables are empty; restore from your last checkpoint.");
        target.click();
        state.reconnects += 1;
        state.failedReconnects += 1;
        state.reconnectTimes.push(now);
        state.clicks += 1;
        emit("reconnect");
        return;
      }
    }
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
      var page = collect(), dialog = findDialog(page);
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
      var runtime = dialog ? "disconnected" : runtimeOf(found.el);
      if (runtime === "unknown" && state.runtime !== "unknown") {
        var label = labelOf(found.el);
        console.warn(TAG, (label ? "the connect button says \"" + label.slice(0, 40) + "\", which this script " +
          "cannot read as a state (it knows Colab's English labels only)" : "the connect button has no label to " +
          "read the runtime's state from") + "; not clicking it. Still checking.");
      }
      setRuntime(runtime);
      if (runtime === "connected") {
        state.failedReconnects = 0;
        clearNotice();
        keepActive(found, page);
      } else if (runtime === "disconnected") {
        dropWakeLock();
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
    dropWakeLock();
    INPUTS.forEach(function (type) { window.removeEventListener(type, onInput, true); });
    state.running = false;
    if (quiet !== true && wasRunning) {
      console.info(TAG, "stopped after " + state.ticks + " check(s): " + state.connectClicks + " click(s) on the " +
        "connected-state button, " + state.closed + " view(s) it opened closed again, " + state.reconnects +
        " reconnect(s)");
    }
    return state.clicks;
  };
  if (options.notify && window.Notification && Notification.permission === "default") {
    try {
      var asked = Notification.requestPermission();
      if (asked && asked.catch) { asked.catch(function () { /* refused without a click */ }); }
    } catch (err) { /* needs a click on some browsers */ }
  }
  console.info(TAG, "started: checking the runtime every " + intervalMs / 1000 + " s (plus up to " +
    Math.round(jitter * 100) + " %). While connected it clicks the connect button, as maintained keep-alive " +
    "scripts do, and closes what that opens; when the runtime is gone it " +
    (options.reconnect ? "reconnects (a fresh VM)" : "tells you and does not reconnect") +
    ". Best-effort; it does not lift the runtime cap. Stop it with stopKeepAlive().");
})(__OPTIONS__);
