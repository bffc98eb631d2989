"""pytest plugin: fixtures mounting the Google Drive stand-in (drivefs.py) for a test.

Load it from tests/conftest.py with::

    pytest_plugins = ["tests.standins.pytest_drive"]

Fixtures (all skip the test, with the reason, where FUSE is unusable: no /dev/fuse, no fusermount3, no
mfusepy/libfuse3):

``drive_mount``
    A live mount with Drive's default write throttle (20e6 bytes/s), unmounted afterwards. Attributes:
    ``.mountpoint`` (the FUSE mount), ``.my_drive`` (``<mountpoint>/MyDrive``), ``.backing`` (what "reached
    Drive"), ``.set_fault(text)`` ("ok", "enotconn", "enospc", "readonly", "fail-after BYTES", "fail-op K ERR",
    "drop-at K ERR", "kill-at K"; see drivefs.py),
    ``.stderr()``. Parametrize the rate indirectly: ``@pytest.mark.parametrize("drive_mount", [None],
    indirect=True)`` mounts unthrottled (the param is the rate in bytes/s).

``drive_mount_factory``
    ``drive_mount_factory(rate=20e6, **kwargs)`` mounts another one (arguments of
    ``drive_mount.mounted_drive``: read_rate, mountpoint, backing, fault, ...); all are unmounted at teardown.

Tests using them get the ``fuse`` marker (declared in setup.cfg).
"""
from __future__ import annotations

import contextlib
import os
import sys

import pytest

try:
    from .drive_mount import DriveMount, fuse_unavailable_reason, mounted_drive
except ImportError:  # loaded as a top-level module (its folder on sys.path)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from drive_mount import DriveMount, fuse_unavailable_reason, mounted_drive  # type: ignore[no-redef]

_DEFAULT = object()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if {"drive_mount", "drive_mount_factory"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.fuse)


def _skip_without_fuse() -> None:
    reason = fuse_unavailable_reason()
    if reason:
        pytest.skip(f"Drive stand-in unavailable: {reason}")


@pytest.fixture
def drive_mount_factory(tmp_path):
    _skip_without_fuse()
    with contextlib.ExitStack() as stack:
        count = [0]

        def make(rate=20e6, **kwargs) -> DriveMount:
            count[0] += 1
            if count[0] > 1 and "mountpoint" not in kwargs:
                kwargs["mountpoint"] = tmp_path / "drivefs" / f"mnt{count[0]}"
                kwargs.setdefault("backing", tmp_path / "drivefs" / f"backing{count[0]}")
            return stack.enter_context(mounted_drive(tmp_path, rate, **kwargs))

        yield make


@pytest.fixture
def drive_mount(request, drive_mount_factory) -> DriveMount:
    rate = getattr(request, "param", _DEFAULT)
    return drive_mount_factory() if rate is _DEFAULT else drive_mount_factory(rate)
