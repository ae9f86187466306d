"""Which filesystem a path is on, and how much room it has: for messages that say
where space is short ("journal/ on /dev/loop3 has 12.0 MiB free") and for the
free-space monitor, which watches each filesystem a node writes to.

A path that does not exist yet (a fresh data dir's `journal/`) is on the filesystem
of its nearest existing ancestor: that is where it will be made.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC_MOUNTS = Path("/proc/self/mounts")


@dataclass(frozen=True, slots=True)
class Filesystem:
    #: st_dev: one value per mounted filesystem
    device_id: int
    #: where it is mounted
    mount_point: Path
    #: what is mounted there, as the mount table names it (/dev/sda1, tmpfs, ...)
    source: str


def existing_ancestor(path: Path) -> Path:
    """`path` if it exists, else its nearest ancestor that does."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use (f_bavail) on `path`'s filesystem."""
    stats = os.statvfs(existing_ancestor(path))
    return stats.f_bavail * stats.f_frsize


def filesystem_of(path: Path) -> Filesystem:
    """The filesystem holding `path` (or where it will be made)."""
    path = existing_ancestor(path).resolve()
    device_id = path.stat().st_dev
    mount_point = path
    while mount_point != mount_point.parent and mount_point.parent.stat().st_dev == device_id:
        mount_point = mount_point.parent
    return Filesystem(device_id, mount_point, _source_of(mount_point))


def describe(path: Path) -> str:
    """`path`'s filesystem in words: its device, or where it is mounted."""
    filesystem = filesystem_of(path)
    if filesystem.source.startswith("/"):
        return filesystem.source
    return f"the {filesystem.source} filesystem at {filesystem.mount_point}"


def _source_of(mount_point: Path) -> str:
    """The source of the last (visible) mount at `mount_point`, or 'unknown'."""
    source = "unknown"
    try:
        with PROC_MOUNTS.open() as mounts:
            for line in mounts:
                fields = line.split()
                # the mount table escapes spaces in paths as \040
                if len(fields) >= 2 and fields[1].replace("\\040", " ") == str(mount_point):
                    source = fields[0]
    except OSError:
        pass
    return source
