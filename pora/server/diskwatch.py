"""The free-space monitor: turns the node read-only when its disk runs low.

Every `interval_ms` it reads the free space of each filesystem the node writes
to: the data dir's, and those of `journal/`, `ledgers/` and `index/` when one is
mounted elsewhere (`os.statvfs`, in a worker thread: a stalled filesystem must
not stall the event loop). When any of them is below the threshold (bytes, or
percent of that filesystem when that is larger) it calls
`node.set_read_only(reason)`, the reason naming the folder, its filesystem and
how far under it is: adds, fences and closes then fail with NodeReadOnly while
reads go on. Once every filesystem is back above the threshold plus a hysteresis
margin, it calls `node.set_read_only(None)`, so the node does not flap around
the threshold. A read-only state set by someone else (another
reason) is left alone.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import trio

from journal import mounts

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


#: the folders of a data dir the node writes to; any may be a mount of its own
WATCHED_FOLDERS: Final = ("journal", "ledgers", "index")


@dataclass(frozen=True, slots=True)
class WatchedFilesystem:
    """One filesystem the node writes to, and which of its folders are on it."""

    #: the folders on it, as the operator knows them: "data dir", "journal/", ...
    folders: tuple[str, ...]
    #: a path on it, to measure
    path: Path
    #: its device (/dev/sdb1), or where it is mounted
    where: str

    @property
    def name(self) -> str:
        return ", ".join(self.folders)


def watched_filesystems(data_dir: Path) -> list[WatchedFilesystem]:
    """Each distinct filesystem among the data dir and its journal/, ledgers/ and
    index/ (a folder not made yet will be made on the data dir's)."""
    by_device: dict[int, tuple[list[str], Path]] = {}
    candidates = [("data dir", data_dir)] + [(f"{n}/", data_dir / n) for n in WATCHED_FOLDERS]
    for label, folder in candidates:
        try:
            device = folder.stat().st_dev
        except FileNotFoundError:
            continue
        labels, _ = by_device.setdefault(device, ([], folder))
        labels.append(label)
    return [
        WatchedFilesystem(tuple(labels), path, mounts.describe(path))
        for labels, path in by_device.values()
    ]


def _metric_label(folder: str) -> str:
    return folder.rstrip("/").replace(" ", "_")


class DiskMonitor:
    """Watches the filesystems of one data dir and flips one node's read-only state.

    The thresholds apply to each filesystem on its own (the percentage of its own
    size): the node turns read-only when any of them runs short, and takes writes
    again once all of them are back above the threshold plus the hysteresis.
    """

    def __init__(
        self, node: ReadOnlySwitch, path: Path, thresholds: DiskThresholds, interval_ms: float
    ) -> None:
        self.node = node
        self.path = path
        self.thresholds = thresholds
        self.interval_s = interval_ms / 1000.0
        #: the last measurement of the data dir's own filesystem (None before the first)
        self.last: DiskSpace | None = None
        #: the last measurement of every watched folder, by folder ("data_dir",
        #: "journal", "ledgers", "index"): folders on one filesystem share its figures
        self.last_by_folder: dict[str, DiskSpace] = {}
        #: the filesystems the current read-only reason names
        self._short: tuple[str, ...] = ()

    def measure(self) -> list[tuple[WatchedFilesystem, DiskSpace]]:
        """Blocking (stat and statvfs): run it in a thread."""
        return [(fs, disk_space(fs.path)) for fs in watched_filesystems(self.path)]

    def apply(self, measured: list[tuple[WatchedFilesystem, DiskSpace]]) -> None:
        """Decide from one measurement of each filesystem; logs every transition."""
        self.last_by_folder = {
            _metric_label(folder): space for fs, space in measured for folder in fs.folders
        }
        self.last = self.last_by_folder.get("data_dir")
        current = self.node.read_only
        ours = current is not None and current.startswith(REASON_PREFIX)
        short = [
            (fs, space, self.thresholds.enter_below(space.total_bytes))
            for fs, space in measured
            if space.free_bytes < self.thresholds.enter_below(space.total_bytes)
        ]
        if short and (current is None or ours):
            reason = f"{REASON_PREFIX}: " + "; ".join(
                f"{fs.name} on {fs.where} has {_mib(space.free_bytes)} free, "
                f"{_mib(enter - space.free_bytes)} under the minimum of {_mib(enter)}"
                for fs, space, enter in short
            )
            names = tuple(fs.name for fs, _, _ in short)
            if ours and names == self._short:
                return  # the same filesystems are still short: no news
            self._short = names
            self.node.set_read_only(reason)
            for fs, space, enter in short:
                _log.warning(
                    "disk check: %s on %s has %s free, under %s: turning read-only",
                    fs.name, fs.where, _mib(space.free_bytes), _mib(enter),
                    extra={"fields": {
                        "folders": fs.name, "filesystem": fs.where,
                        "free_bytes": space.free_bytes, "threshold_bytes": enter,
                    }},
                )  # fmt: skip
        elif ours and all(
            space.free_bytes >= self.thresholds.leave_above(space.total_bytes)
            for _, space in measured
        ):
            self.node.set_read_only(None)
            self._short = ()
            _log.warning(
                "disk check: %s: taking writes again",
                "; ".join(
                    f"{fs.name} on {fs.where} has {_mib(space.free_bytes)} free, at least "
                    f"{_mib(self.thresholds.leave_above(space.total_bytes))}"
                    for fs, space in measured
                ),
                extra={"fields": {
                    "free_bytes": {fs.name: space.free_bytes for fs, space in measured},
                }},
            )  # fmt: skip

    async def check(self) -> None:
        self.apply(await trio.to_thread.run_sync(self.measure))

    async def run(self) -> None:
        """Check now, then every interval, until cancelled."""
        while True:
            try:
                await self.check()
            except OSError as error:
                _log.error("cannot read free space of %s: %s", self.path, error)
            await trio.sleep(self.interval_s)
