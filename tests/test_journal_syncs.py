"""The journal's fdatasyncs in worker threads (journal/syncs.py), and the journal
using them."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio

from journal.format import RecordKind
from journal.reader import JournalScanner
from journal.request import Request
from journal.segment import SegmentWriter
from journal.syncs import Syncable, SyncInThread
from journal.task import GroupCommitConfig, Journal


class ClosedFile:
    """A segment whose descriptor was closed under the journal: its sync fails."""

    def __init__(self, directory: Path) -> None:
        self.fd = os.open(directory / "gone", os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(self.fd)

    def sync(self) -> None:
        os.fdatasync(self.fd)


async def _ended(writer: Syncable) -> float:
    """Start a sync, wait for its `on_end` call, and return its outcome."""
    ended = trio.Event()
    sync = SyncInThread(writer, ended.set)
    assert not sync.ended
    await ended.wait()
    assert sync.ended
    return sync.outcome()


async def test_thread_syncs_report_their_end_and_a_failure(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, segment_bytes=4096, first_seq=0)
    writer.write_batch([Request(RecordKind.ENTRY, 1, 0, b"kept")], 0)
    assert await _ended(writer) >= 0
    with pytest.raises(OSError) as caught:
        await _ended(ClosedFile(tmp_path))
    assert caught.value.errno == errno.EBADF
    writer.close()


def entries(ledger_id: int, count: int) -> list[Request]:
    return [Request(RecordKind.ENTRY, ledger_id, i, bytes([i % 256]) * 300) for i in range(count)]


async def _complete_all(group: list[Request]) -> None:
    for request in group:
        request.complete()


async def test_the_journal_syncs_in_threads_and_acks_in_order(tmp_path: Path) -> None:
    dispatched: list[int] = []

    async def dispatch(group: list[Request]) -> None:
        dispatched.extend(request.seq for request in group)
        await _complete_all(group)

    config = GroupCommitConfig(segment_bytes=16 * 1024)  # rolls, which wait for syncs
    journal = Journal(tmp_path, config, first_seq=0, dispatch=dispatch)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            batch = entries(3, 200)
            for start in range(0, 200, 10):
                await journal.submit(batch[start : start + 10])
            journal.close_input()  # the run ends once every group is handed over
    assert dispatched == list(range(200))
    records = [r for batch in JournalScanner(tmp_path).batches() for r in batch]
    assert [(r.ledger_id, r.entry_id) for r in records] == [(3, i) for i in range(200)]


async def test_a_cancelled_journal_still_waits_for_its_syncs(tmp_path: Path) -> None:
    journal = Journal(tmp_path, GroupCommitConfig(), first_seq=0, dispatch=_complete_all)
    with trio.move_on_after(5) as deadline:
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            await journal.submit(entries(4, 50))
            # no event marks a written group: look once per turn of the loop
            while journal.statistics().next_seq < 50:
                await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()  # the group is written, its sync in flight
    assert not deadline.cancelled_caught, "the journal did not end"
    assert journal.statistics().next_seq == 50
