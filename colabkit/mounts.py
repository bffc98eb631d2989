"""The mount table (Linux /proc/self/mounts): which filesystem a path is on, where Drive is mounted.

Elsewhere the table is empty, and callers treat every path as a local disk.
"""
from __future__ import annotations

import os
import re
from typing import NamedTuple

DRIVE_FSTYPE = "fuse.drive"   # Google Drive as Colab mounts it ("drive /content/drive fuse.drive ...")
_NETWORK = ("fuse", "nfs", "cifs", "smb", "9p", "ceph", "glusterfs", "lustre", "afs")
# FUSE filesystems over local disks: ntfs-3g and exfat (fuseblk), rootless containers' overlay, mergerfs pools
# of local drives, encrypted folders
_LOCAL_FUSE = ("fuseblk", "fuse.fuse-overlayfs", "fuse.mergerfs", "fuse.gocryptfs", "fuse.encfs", "fuse.lxcfs")


class Mount(NamedTuple):
    mountpoint: str
    fstype: str


def table() -> list[Mount]:
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="surrogateescape") as fh:  # as os.fsdecode
            lines = fh.read().splitlines()
    except OSError:
        return []
    mounts = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 3:  # octal escapes: "\040" is a space in a mount point
            mounts.append(Mount(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1]), fields[2]))
    return mounts


def filesystem_of(path) -> str | None:
    """The type of the filesystem holding ``path`` ("ext4", "fuse.drive", "nfs4"...), None where unknown."""
    real = os.path.realpath(path)
    best = None
    for m in table():
        inside = real == m.mountpoint or real.startswith(m.mountpoint.rstrip("/") + "/")
        if inside and (best is None or len(m.mountpoint) >= len(best.mountpoint)):
            best = m
    return best.fstype if best else None


def on_network_fs(path) -> bool:
    """Whether ``path`` is on a FUSE or network filesystem (Drive's mount, rclone, NFS, SMB), where every file
    costs a round trip."""
    fstype = filesystem_of(path) or ""
    return fstype.startswith(_NETWORK) and not fstype.startswith(_LOCAL_FUSE)


def drive_mounts() -> list[str]:
    """Mount points of Google Drive's FUSE filesystem (Colab's drive.mount, wherever it was pointed)."""
    return [m.mountpoint for m in table() if m.fstype == DRIVE_FSTYPE]
