"""Stand-in for google.colab.drive: ``mount`` and ``flush_and_unmount`` with the real signatures.

"Mounting" makes ``<mountpoint>/MyDrive`` a symlink to a backing folder: the folder named by the
environment variable ``COLABKIT_TEST_DRIVE_BACKING`` (created if missing), or else a per-mountpoint folder
under the system temp dir. Like Google Drive, the backing folder outlives an unmount, so a remount (a "fresh
VM") sees the same files. The checks the real ``mount`` makes on its argument are reproduced: a space in
the mountpoint, a symlink, a non-empty folder, a file, a missing parent folder are refused with the real
messages. ``readonly`` and ``timeout_ms`` are recorded, not enforced. What the stand-in does NOT model:
Drive's slow asynchronous upload, the lack of links inside Drive, a mount that drops (Errno 107).
"""
import hashlib
import os
import tempfile

from google.colab._standin import record

__all__ = ["flush_and_unmount", "mount"]

_MY_DRIVE = "MyDrive"


def _backing_for(mountpoint):
    explicit = os.environ.get("COLABKIT_TEST_DRIVE_BACKING")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    digest = hashlib.sha1(os.path.abspath(mountpoint).encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), "colabkit-standin-drive", digest)


def _mounted_at(mountpoint):
    return os.path.isdir(os.path.join(mountpoint, _MY_DRIVE))


def mount(mountpoint, force_remount=False, timeout_ms=120000, readonly=False):
    """Mount your Google Drive at the specified mountpoint path."""
    # The real function tests the raw argument (a pathlib.Path fails here with TypeError, as on Colab).
    if " " in mountpoint:
        raise ValueError("Mountpoint must not contain a space.")
    mountpoint = os.path.expanduser(mountpoint)
    record("drive.mount", mountpoint=mountpoint, force_remount=force_remount, timeout_ms=timeout_ms,
           readonly=readonly)
    if not force_remount and _mounted_at(mountpoint):
        print(f"Drive already mounted at {mountpoint}; to attempt to forcibly remount, "
              f'call drive.mount("{mountpoint}", force_remount=True).')
        return
    if force_remount:
        _unmount(mountpoint)
    if os.path.islink(mountpoint):
        raise ValueError("Mountpoint must not be a symlink")
    if os.path.isdir(mountpoint) and os.listdir(mountpoint):
        raise ValueError("Mountpoint must not already contain files")
    if not os.path.isdir(mountpoint) and os.path.exists(mountpoint):
        raise ValueError("Mountpoint must either be a directory or not exist")
    normed = os.path.normpath(mountpoint)
    if "/" in normed and not os.path.exists(os.path.dirname(normed)):
        raise ValueError("Mountpoint must be in a directory that exists")
    backing = _backing_for(mountpoint)
    os.makedirs(backing, exist_ok=True)
    os.makedirs(mountpoint, exist_ok=True)
    os.symlink(backing, os.path.join(mountpoint, _MY_DRIVE), target_is_directory=True)
    print(f"Mounted at {mountpoint}")


def _unmount(mountpoint):
    link = os.path.join(mountpoint, _MY_DRIVE)
    if os.path.islink(link):
        os.unlink(link)
        return True
    return False


def flush_and_unmount(timeout_ms=24 * 60 * 60 * 1000):
    """Unmount Google Drive and flush any outstanding writes to it."""
    record("drive.flush_and_unmount", timeout_ms=timeout_ms)
    # The real function looks for any Drive FUSE mount; the stand-in knows its mounts by their symlink.
    unmounted = False
    for entry in _known_mountpoints():
        unmounted = _unmount(entry) or unmounted
    if not unmounted:
        print("Drive not mounted, so nothing to flush and unmount.")


def _known_mountpoints():
    from google.colab._standin import CALLS
    seen = []
    for call in CALLS:
        if call["call"] == "drive.mount" and call["mountpoint"] not in seen:
            seen.append(call["mountpoint"])
    return seen
