"""Journal trimming deletes only what is durable elsewhere; 10,000 ledgers work."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_until

import pora
from journal.segment import list_segments
from ledger.entrylog import EntryLog
from ledger.worker import FlushBarrier
from pora.node.node import Node


def crash_image(data_dir: Path, target: Path) -> Path:
    """What a crash right now would leave on disk: a copy of the files of a node
    that is still running (quiescent, so the copy is consistent), lock and all."""
    shutil.copytree(data_dir, target)
    return target


async def flush_ledger(node: Node, ledger_id: int) -> None:
    barrier = FlushBarrier()
    await node._registry.active[ledger_id].send.send(barrier)
    await barrier.done.wait()


async def test_trimming_keeps_segments_a_ledger_has_not_flushed(
    data_dir: Path, tmp_path: Path
) -> None:
    options: dict[str, Any] = {
        "segment_bytes": 64 * 1024,
        "flush_interval_ms": 3_600_000.0,  # nothing flushes unless we say so
        "trim_interval_ms": 3_600_000.0,  # nothing trims unless we say so
        "spare_segments_max": 0,  # nor does the journal reclaim before making spares
    }
    async with pora.open_node(data_dir, **options) as node:
        await node.add_entry(1, 0, b"slow ledger, never flushed")
        for entry_id in range(200):
            await node.add_entry(2, entry_id, bytes([entry_id % 256]) * 2000)
        segments_before = list_segments(data_dir / "journal")
        assert len(segments_before) > 3
        await flush_ledger(node, 2)
        # ledger 1's only record sits in the first segment: nothing may go
        assert await node.trim_journal() == 0
        assert list_segments(data_dir / "journal") == segments_before
        image = crash_image(data_dir, tmp_path / "crash-1")
        await flush_ledger(node, 1)
        # now everything but the open segment is durable elsewhere
        assert await node.trim_journal() == len(segments_before) - 1
        remaining = list_segments(data_dir / "journal")
        assert [s.path.name for s in remaining] == [segments_before[-1].path.name]
        image_after_trim = crash_image(data_dir, tmp_path / "crash-2")
    for crashed in (image, image_after_trim):
        async with pora.open_node(crashed) as node:
            assert await node.read_entry(1, 0) == b"slow ledger, never flushed"
            for entry_id in range(200):
                assert await node.read_entry(2, entry_id) == bytes([entry_id % 256]) * 2000


async def test_reclaiming_flushes_a_quiet_ledger_that_holds_closed_segments(
    data_dir: Path,
) -> None:
    options: dict[str, Any] = {
        "segment_bytes": 64 * 1024,
        "flush_interval_ms": 3_600_000.0,  # a quiet ledger would hold on for an hour
        "trim_interval_ms": 3_600_000.0,  # nothing trims unless we say so
        "spare_segments_max": 0,  # nor does the journal reclaim before making spares
    }
    async with pora.open_node(data_dir, **options) as node:
        await node.add_entry(1, 0, b"written once, then quiet")
        for entry_id in range(200):  # ledger 2 rolls the journal past ledger 1's record
            await node.add_entry(2, entry_id, bytes([entry_id % 256]) * 2000)
        await node.add_entry(3, 0, b"only in the open segment")
        segments_before = list_segments(data_dir / "journal")
        assert len(segments_before) > 3
        # ledgers 1 and 2 flush now rather than in an hour, and the closed segments go
        assert await node.reclaim_journal() == len(segments_before) - 1
        assert list_segments(data_dir / "journal") == segments_before[-1:]
        assert node._registry.active[1].oldest_undurable_seq() is None
        # a ledger whose unflushed entries are all in the open segment keeps them
        assert node._registry.active[3].oldest_undurable_seq() is not None
    async with pora.open_node(data_dir, **options) as node:
        assert await node.read_entry(1, 0) == b"written once, then quiet"
        assert await node.read_entry(2, 199) == bytes([199]) * 2000
        assert await node.read_entry(3, 0) == b"only in the open segment"


async def test_reclaiming_leaves_a_ledger_whose_flush_failed_to_its_own_retries(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options: dict[str, Any] = {
        "segment_bytes": 64 * 1024,
        "flush_interval_ms": 3_600_000.0,
        "trim_interval_ms": 3_600_000.0,
        "spare_segments_max": 0,
    }
    async with pora.open_node(data_dir, **options) as node:
        await node.add_entry(1, 0, b"kept through a full disk")
        for entry_id in range(200):
            await node.add_entry(2, entry_id, bytes([entry_id % 256]) * 2000)
        attempts: list[int] = []
        write_bodies = EntryLog.write_bodies

        def disk_full(self: EntryLog, *args: Any, **kwargs: Any) -> Any:
            attempts.append(1)
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(EntryLog, "write_bodies", disk_full)
        assert await node.reclaim_journal() == 0  # both flushes failed: nothing goes
        assert len(attempts) == 2
        # a failing ledger retries on its own schedule, not at every trim
        assert await node.reclaim_journal() == 0
        assert len(attempts) == 2
        monkeypatch.setattr(EntryLog, "write_bodies", write_bodies)
    async with pora.open_node(data_dir, **options) as node:  # closing flushed them
        assert await node.read_entry(1, 0) == b"kept through a full disk"
        assert await node.read_entry(2, 199) == bytes([199]) * 2000


async def test_the_journal_reclaims_by_itself_before_making_a_spare(data_dir: Path) -> None:
    async with pora.open_node(
        data_dir,
        segment_bytes=64 * 1024,
        flush_interval_ms=3_600_000.0,
        trim_interval_ms=3_600_000.0,
    ) as node:
        await node.add_entry(1, 0, b"written once, then quiet")
        for entry_id in range(200):  # 400 kB through segments of 64 KiB
            await node.add_entry(2, entry_id, bytes([entry_id % 256]) * 2000)
        # each segment a quarter full wants a spare: the closed ones were reclaimed
        # (ledger 1 flushed, an hour early) and recycled, none zero-filled but the first
        await wait_until(lambda: len(list_segments(data_dir / "journal")) <= 2, 10.0)
        statistics = node.statistics()
        assert statistics.journal_segments_trimmed > 3
        assert node._registry.active[1].oldest_undurable_seq() is None


async def test_the_trimmer_runs_by_itself_once_ledgers_flush(data_dir: Path) -> None:
    async with pora.open_node(
        data_dir, segment_bytes=64 * 1024, flush_interval_ms=100.0, trim_interval_ms=100.0
    ) as node:
        for entry_id in range(200):  # 400 kB: the journal rolls through 6+ segments
            await node.add_entry(3, entry_id, b"y" * 2000)
        await wait_until(lambda: len(list_segments(data_dir / "journal")) == 1, 20.0)
        # the files go in a worker thread and the count is bumped once it is back on
        # the loop: the last deletion can be on disk a moment before it is counted
        await wait_until(lambda: node.statistics().journal_segments_trimmed > 3, 5.0)
        assert len(list_segments(data_dir / "journal")) == 1
        assert await node.read_entry(3, 199) == b"y" * 2000


@pytest.mark.slow
async def test_ten_thousand_ledgers_on_one_node(data_dir: Path) -> None:
    ledgers = 10_000
    async with pora.open_node(
        data_dir, open_files_max=256, idle_retire_ms=300.0, flush_interval_ms=3_600_000.0
    ) as node:
        for start in range(0, ledgers, 500):
            outcomes = await node.add_entries(
                [
                    (ledger_id, 0, ledger_id.to_bytes(4, "big"))
                    for ledger_id in range(start, start + 500)
                ]
            )
            assert outcomes == [None] * 500
        assert node.statistics().ledgers.workers_started == ledgers
        await node._registry.flush_all()
        assert node.statistics().ledgers.open_files <= 256
        # idle, clean workers retire and let go of their files
        await wait_until(lambda: node.statistics().ledgers.active_workers == 0, 60.0)
        stats = node.statistics().ledgers
        assert stats.active_workers == 0
        assert stats.workers_retired == ledgers
        assert stats.memtable_unflushed_bytes == 0
        # every read goes to an entry log now, through the capped file cache
        for ledger_id in range(ledgers):
            assert await node.read_entry(ledger_id, 0) == ledger_id.to_bytes(4, "big")
        assert node.statistics().ledgers.open_files <= 256
    async with pora.open_node(data_dir) as node:
        infos = node.ledgers()
        assert len(infos) == ledgers
        assert all(info.entry_count == 1 and info.state == "open" for info in infos)
        assert await node.read_entry(9_999, 0) == (9_999).to_bytes(4, "big")
