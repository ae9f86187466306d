"""Read-only mode: the free-space monitor turns a real node read-only and back."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest
from fs_faults import SmallFilesystems, fill
from serve_helpers import samples

import pora
from pora.server.diskwatch import DiskMonitor, DiskThresholds, disk_space
from pora.server.metrics import NodeMetrics, node_health

HUGE = 1 << 60


async def test_full_disk_refuses_writes_serves_reads_and_recovers(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        await node.add_entry(1, 0, b"before")
        monitor = DiskMonitor(node, data_dir, DiskThresholds(HUGE, 0.0, 0), interval_ms=1000)
        await monitor.check()  # the real disk has less than 1 EiB free: "full"
        assert node.read_only is not None
        assert "disk nearly full" in node.read_only

        with pytest.raises(pora.NodeReadOnly):
            await node.add_entry(1, 1, b"refused")
        with pytest.raises(pora.NodeReadOnly):
            await node.fence_ledger(1)
        with pytest.raises(pora.NodeReadOnly):
            await node.close_ledger(1)
        assert await node.read_entry(1, 0) == b"before"  # reads go on

        monitor.thresholds = DiskThresholds(1, 0.0, 0)  # the operator lowers the threshold
        await monitor.check()
        assert node.read_only is None
        await node.add_entry(1, 1, b"after")
        assert await node.read_entry(1, 1) == b"after"


async def test_percent_threshold_and_hysteresis(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        space = disk_space(data_dir)
        free_percent = 100.0 * space.free_bytes / space.total_bytes
        monitor = DiskMonitor(
            node, data_dir, DiskThresholds(0, min(99.9, free_percent + 0.5), 0), 1000
        )
        await monitor.check()
        assert node.read_only is not None
        # back under the percentage, but not by the hysteresis margin: stays read-only
        enter = space.free_bytes - 1
        monitor.thresholds = DiskThresholds(enter, 0.0, 1 << 50)
        await monitor.check()
        assert node.read_only is not None
        monitor.thresholds = DiskThresholds(1, 0.0, 0)
        await monitor.check()
        assert node.read_only is None


async def test_a_reason_set_by_someone_else_is_left_alone(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        node.set_read_only("maintenance")
        monitor = DiskMonitor(node, data_dir, DiskThresholds(1, 0.0, 0), 1000)
        await monitor.check()
        assert node.read_only == "maintenance"
        node.set_read_only(None)


async def test_tiny_filesystem_fills_and_frees(tiny_filesystem: Path) -> None:
    data_dir = tiny_filesystem / "pora-data"
    async with pora.open_node(
        data_dir, segment_bytes=64 << 10, preallocate=False, entrylog_prealloc_bytes=4096
    ) as node:
        await node.add_entry(3, 0, b"kept")
        monitor = DiskMonitor(node, data_dir, DiskThresholds(256 << 10, 0.0, 64 << 10), 1000)
        await monitor.check()
        assert node.read_only is None

        filler = tiny_filesystem / "filler"
        free = disk_space(data_dir).free_bytes
        with filler.open("wb") as handle:
            handle.write(b"\0" * (free - (128 << 10)))
            handle.flush()
            os.fsync(handle.fileno())
        await monitor.check()
        assert node.read_only is not None
        with pytest.raises(pora.NodeReadOnly):
            await node.add_entry(3, 1, b"refused")
        assert await node.read_entry(3, 0) == b"kept"

        filler.unlink()
        await monitor.check()
        assert node.read_only is None
        await node.add_entry(3, 1, b"stored")
        assert await node.read_entry(3, 1) == b"stored"


async def test_health_reports_a_journal_that_failed_on_a_full_disk(tiny_filesystem: Path) -> None:
    data_dir = tiny_filesystem / "pora-data"
    async with pora.open_node(
        data_dir, segment_bytes=512 << 10, preallocate=False, entrylog_prealloc_bytes=4096
    ) as node:
        await node.add_entry(4, 0, b"kept")
        assert node_health(node).ok
        filler = tiny_filesystem / "filler"
        # fill the filesystem to the last byte (unbuffered: every write reaches it)
        with filler.open("wb", buffering=0) as handle, contextlib.suppress(OSError):
            while True:
                handle.write(b"\0" * 4096)
        with pytest.raises(pora.JournalError):
            for entry_id in range(1, 200):
                await node.add_entry(4, entry_id, b"y" * 4096)
        health = node_health(node)
        assert not health.ok
        assert "journal failed" in health.reason
        assert await node.read_entry(4, 0) == b"kept"  # reads go on
        filler.unlink()


@pytest.mark.parametrize("folder", ["journal", "ledgers"])
async def test_a_folder_on_its_own_filesystem_is_watched_too(
    folder: str, data_dir: Path, small_filesystems: SmallFilesystems
) -> None:
    """`journal/` or `ledgers/` mounted elsewhere fills up while the data dir's own
    filesystem has plenty: the node turns read-only, naming that folder."""
    options: dict[str, Any] = {
        "segment_bytes": 1 << 20,
        "spare_segments_max": 0,
        "recycle_segments": False,
    }
    async with pora.open_node(data_dir, **options):
        pass  # made (journal/ holds its watermark, moved onto the new filesystem)
    mounted = small_filesystems.mount(data_dir / folder, 16, move_contents=True)
    async with pora.open_node(data_dir, **options) as node:
        await node.add_entry(1, 0, b"kept")
        thresholds = DiskThresholds(4 << 20, 0.0, 1 << 20)
        monitor = DiskMonitor(node, data_dir, thresholds, interval_ms=1000)
        await monitor.check()
        assert node.read_only is None

        filler = fill(mounted, 1 << 20)
        await monitor.check()
        reason = node.read_only
        assert reason is not None
        assert reason.startswith(f"disk nearly full: {folder}/ on /dev/loop")
        assert "MiB under the minimum of 4.0 MiB" in reason
        assert "data dir" not in reason  # its own filesystem is fine
        with pytest.raises(pora.NodeReadOnly):
            await node.add_entry(1, 1, b"refused")
        # per-folder free space, as the monitor last measured it
        scrape = samples(
            NodeMetrics(node, data_dir / "journal", disk_space=lambda: monitor.last_by_folder)
            .render()
            .decode()
        )
        assert scrape[f"pora_disk_free_bytes{{folder={folder}}}"] <= 1 << 20
        assert scrape["pora_disk_free_bytes{folder=data_dir}"] > 4 << 20
        assert scrape[f"pora_disk_size_bytes{{folder={folder}}}"] <= 16 << 20

        filler.unlink()
        await monitor.check()
        assert node.read_only is None
        await node.add_entry(1, 1, b"stored")
