"""Headless Chromium for the browser tests: Debian's /usr/bin/chromium driven by Playwright (never a browser
Playwright downloads). One browser serves the whole session (tests/conftest.py's `chromium` fixture): two sync
Playwright instances cannot run at once in one process."""
from __future__ import annotations

import os

CHROMIUM = os.environ.get("COLABKIT_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
