"""The free-space monitor: turns the node read-only when its disk runs low.

Every `interval_ms` it reads the free space of the data dir's filesystem
(`os.statvfs`, in a worker thread: a stalled filesystem must not stall the event
loop). Below the threshold (bytes, or percent of the filesystem when that is
larger) it calls `node.set_read_only(reason)`: adds, fences and closes then fail
with NodeReadOnly while reads go on. Once free space is back above the threshold
plus a hysteresis margin, it calls `node.set_read_only(None)`, so the node does
not flap around the threshold. A read-only state set by someone else (another
reason) is left alone.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import trio

_log = logging.getLogger("pora.diskwatch")

REASON_PREFIX = "disk nearly full"


class ReadOnlySwitch(Protocol):
    """What the monitor needs of a node."""

    @property
    def read_only(self) -> str | None: ...

    def set_read_only(self, reason: str | None) -> None: ...


@dataclass(frozen=True, slots=True)
class DiskSpace:
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True, slots=True)
class DiskThresholds:
    free_bytes_min: int
    free_percent_min: float
    hysteresis_bytes: int

    def enter_below(self, total_bytes: int) -> int:
        """Free bytes under which the node turns read-only."""
        by_percent = int(total_bytes * self.free_percent_min / 100.0)
        return max(self.free_bytes_min, by_percent)

    def leave_above(self, total_bytes: int) -> int:
        """Free bytes at or above which a read-only node takes writes again."""
        return self.enter_below(total_bytes) + self.hysteresis_bytes


def disk_space(path: Path) -> DiskSpace:
    """Free space for unprivileged writers (f_bavail) and size of `path`'s filesystem."""
    stats = os.statvfs(path)
    return DiskSpace(stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize)


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB"


class DiskMonitor:
    """Watches one data dir and flips one node's read-only state."""

    def __init__(
        self, node: ReadOnlySwitch, path: Path, thresholds: DiskThresholds, interval_ms: float
    ) -> None:
        self.node = node
        self.path = path
        self.thresholds = thresholds
        self.interval_s = interval_ms / 1000.0
        #: the last measurement (None before the first)
        self.last: DiskSpace | None = None

    def apply(self, space: DiskSpace) -> None:
        """Decide from one measurement; logs every transition."""
        self.last = space
        current = self.node.read_only
        ours = current is not None and current.startswith(REASON_PREFIX)
        enter = self.thresholds.enter_below(space.total_bytes)
        if current is None and space.free_bytes < enter:
            reason = (
                f"{REASON_PREFIX}: {_mib(space.free_bytes)} free on {self.path}, "
                f"under the minimum of {_mib(enter)}"
            )
            self.node.set_read_only(reason)
            _log.warning(
                "disk check: %s free on %s, under %s: turning read-only",
                _mib(space.free_bytes),
                self.path,
                _mib(enter),
                extra={"fields": {"free_bytes": space.free_bytes, "threshold_bytes": enter}},
            )
        elif ours and space.free_bytes >= self.thresholds.leave_above(space.total_bytes):
            self.node.set_read_only(None)
            _log.warning(
                "disk check: %s free on %s, at least %s: taking writes again",
                _mib(space.free_bytes),
                self.path,
                _mib(self.thresholds.leave_above(space.total_bytes)),
                extra={"fields": {"free_bytes": space.free_bytes}},
            )

    async def check(self) -> None:
        space = await trio.to_thread.run_sync(disk_space, self.path)
        self.apply(space)

    async def run(self) -> None:
        """Check now, then every interval, until cancelled."""
        while True:
            try:
                await self.check()
            except OSError as error:
                _log.error("cannot read free space of %s: %s", self.path, error)
            await trio.sleep(self.interval_s)
