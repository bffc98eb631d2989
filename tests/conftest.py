"""Shared fixtures. Every test runs with its own HOME / config / cache dirs and no COLABKIT_* variables."""
from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

from tests.browser import CHROMIUM, CHROMIUM_ARGS

pytest_plugins = ["tests.standins.pytest_drive"]

REPO_ROOT = Path(__file__).resolve().parent.parent
STANDINS = Path(__file__).resolve().parent / "standins"

# Variables that would change what colabkit detects or which settings it reads.
_PLATFORM_VARS = ("KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE", "COLAB_RELEASE_TAG", "COLAB_GPU", "APPDATA",
                  "LOCALAPPDATA")


def _prepend_pythonpath(monkeypatch, *paths) -> None:
    parts = [str(p) for p in paths] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(dict.fromkeys(parts)))


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory, monkeypatch):
    """A private HOME, XDG_CONFIG_HOME and XDG_CACHE_HOME; no COLABKIT_*, Kaggle or Colab variables; the
    working tree's colabkit first on PYTHONPATH (for subprocesses); the Colab VM marker file pointed at a
    path that does not exist. Returns the home folder."""
    base = tmp_path_factory.mktemp("env")
    home, config, cache = base / "home", base / "config", base / "cache"
    for folder in (home, config, cache):
        folder.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("USERPROFILE", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    for name in list(os.environ):
        if name.startswith("COLABKIT_") or name in _PLATFORM_VARS:
            monkeypatch.delenv(name)
    # the trainings of other tests leave no flight-recorder thread behind (tests/health/test_recorder.py turns it on)
    monkeypatch.setenv("COLABKIT_FLIGHT_RECORDER", "false")
    _prepend_pythonpath(monkeypatch, REPO_ROOT)
    import colabkit.runtime
    monkeypatch.setattr(colabkit.runtime, "COLAB_MARKER", base / "no-colab-marker")
    return home


def _drop_standin_modules() -> None:
    for name in [m for m in sys.modules if m == "google.colab" or m.startswith("google.colab.")]:
        del sys.modules[name]
    google = sys.modules.get("google")
    if google is not None and hasattr(google, "colab"):
        delattr(google, "colab")


@pytest.fixture
def colab_standin(monkeypatch, tmp_path):
    """Simulate Google Colab with the google.colab stand-in (tests/standins/README.md).

    Puts the stand-in on sys.path (importable here, NOT imported: import it to look like a Colab kernel)
    and on PYTHONPATH for subprocesses; points colabkit.locations.COLAB_MOUNTPOINT at <tmp>/content/drive
    and the stand-in Drive's backing folder (COLABKIT_TEST_DRIVE_BACKING) at <tmp>/drive-backing; logs
    stand-in calls made by subprocesses to COLABKIT_TEST_COLAB_LOG. Removes google.colab from sys.modules
    afterwards.
    """
    import colabkit.locations

    if any(m == "google.colab" for m in sys.modules):
        pytest.fail("google.colab was already imported before the colab_standin fixture ran")
    monkeypatch.syspath_prepend(str(STANDINS))
    google = sys.modules.get("google")
    if google is not None and isinstance(getattr(google, "__path__", None), list):
        # A regular (non-namespace) 'google' package was imported first: let it see the stand-in.
        monkeypatch.setattr(google, "__path__", [*google.__path__, str(STANDINS / "google")])
    _prepend_pythonpath(monkeypatch, STANDINS, REPO_ROOT)
    content = tmp_path / "content"
    content.mkdir()
    backing = tmp_path / "drive-backing"
    log = tmp_path / "colab-calls.jsonl"
    monkeypatch.setenv("COLABKIT_TEST_DRIVE_BACKING", str(backing))
    monkeypatch.setenv("COLABKIT_TEST_COLAB_LOG", str(log))
    monkeypatch.setattr(colabkit.locations, "COLAB_MOUNTPOINT", content / "drive")
    yield types.SimpleNamespace(path=STANDINS, mountpoint=content / "drive", my_drive=content / "drive" / "MyDrive",
                                backing=backing, log=log)
    _drop_standin_modules()


@pytest.fixture(scope="session")
def chromium():
    """A headless Chromium (tests/browser.py) for the whole session; skipped where Playwright or it is missing."""
    with pytest.MonkeyPatch.context() as mp:   # session-wide, so not the per-test monkeypatch
        if "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD" not in os.environ:
            mp.setenv("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
        sync_api = pytest.importorskip("playwright.sync_api")
        if not Path(CHROMIUM).exists():
            pytest.skip(f"no Chromium at {CHROMIUM} (Debian package 'chromium')")
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            yield browser
            browser.close()
