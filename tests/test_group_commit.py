"""Group commit in the journal task: batching, the three triggers, backpressure.

Time is trio's autojump clock: waits cost nothing and their length is exact.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from waiting import wait_until

from journal.errors import JournalError
from journal.format import RecordKind
from journal.reader import JournalScanner
from journal.request import Request
from journal.task import GroupCommitConfig, Journal


class Recorder:
    """A dispatch target that completes requests and notes each group and its time."""

    def __init__(self) -> None:
        self.groups: list[list[Request]] = []
        self.times: list[float] = []
        self.gate = trio.Event()
        self.gate.set()

    async def __call__(self, group: list[Request]) -> None:
        await self.gate.wait()
        self.groups.append(group)
        self.times.append(trio.current_time())
        for request in group:
            request.complete()


def entry(ledger_id: int, entry_id: int, size: int = 100) -> Request:
    return Request(RecordKind.ENTRY, ledger_id, entry_id, bytes([entry_id % 256]) * size)


@asynccontextmanager
async def running_journal(
    directory: Path, recorder: Recorder, **config: Any
) -> AsyncIterator[Journal]:
    journal = Journal(directory, GroupCommitConfig(**config), first_seq=0, dispatch=recorder)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        yield journal
        journal.close_input()


async def test_requests_waiting_together_share_one_sync(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    recorder = Recorder()
    recorder.gate = trio.Event()  # hold the first group in dispatch so others queue up
    async with running_journal(tmp_path, recorder, group_wait_ms_max=1.0) as journal:
        await journal.submit([entry(1, 0)])
        await trio.sleep(0.01)  # the first group is written, dispatch is held
        for i in range(1, 101):
            journal.submit_nowait([entry(1, i)])
        recorder.gate.set()
    sizes = [len(g) for g in recorder.groups]
    assert sizes == [1, 100]
    assert journal.statistics().commits == 2
    records = [r for batch in JournalScanner(tmp_path).batches() for r in batch]
    assert [r.seq for r in records] == list(range(101))
    assert [r.entry_id for r in records] == list(range(101))


async def test_a_lone_request_waits_at_most_group_wait(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    recorder = Recorder()
    async with running_journal(
        tmp_path, recorder, group_wait_ms_max=5.0, flush_when_queue_empty=False
    ) as journal:
        submitted = trio.current_time()
        done = trio.Event()
        request = entry(1, 0)
        request.on_done = lambda _r: done.set()
        await journal.submit([request])
        await done.wait()
        waited = trio.current_time() - submitted
    # the group stayed open for exactly the configured wait (nothing else came)
    assert waited == pytest.approx(0.005, abs=1e-6)


async def test_queue_empty_trigger_writes_without_waiting(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    recorder = Recorder()
    async with running_journal(
        tmp_path, recorder, group_wait_ms_max=1000.0, flush_when_queue_empty=True
    ) as journal:
        submitted = trio.current_time()
        done = trio.Event()
        request = entry(1, 0)
        request.on_done = lambda _r: done.set()
        await journal.submit([request])
        await done.wait()
        assert trio.current_time() - submitted < 0.001


async def test_bytes_trigger_closes_a_group_before_the_wait(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    recorder = Recorder()
    recorder.gate = trio.Event()
    async with running_journal(
        tmp_path,
        recorder,
        group_wait_ms_max=1000.0,
        group_bytes_max=10 * 1024,
        flush_when_queue_empty=False,
    ) as journal:
        await journal.submit([entry(1, 0, 1024)])
        await trio.sleep(2.0)  # first group waited the full second, then is held
        started = trio.current_time()
        for i in range(1, 31):
            journal.submit_nowait([entry(1, i, 1024)])
        # 30 queued KiB make three full groups; this last one waits for company
        last_done = trio.Event()
        last = entry(1, 31, 1024)
        last.on_done = lambda _r: last_done.set()
        journal.submit_nowait([last])
        recorder.gate.set()
        await last_done.wait()
        elapsed = trio.current_time() - started
    sizes = [len(g) for g in recorder.groups]
    assert sizes[0] == 1
    assert sizes[1:3] == [10, 10]  # full groups closed by bytes, not by time
    assert sum(sizes) == 32
    # only the last, partial group waited for company
    assert elapsed == pytest.approx(1.0, abs=0.01)


async def test_full_channel_is_backpressure(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    # jump only after 50 ms of real idleness: writes and syncs run in a thread,
    # which the clock would otherwise not wait for
    mock_clock.autojump_threshold = 0.05
    recorder = Recorder()
    recorder.gate = trio.Event()
    async with running_journal(
        tmp_path, recorder, channel_batches_max=3, group_wait_ms_max=0.0, syncs_in_flight_max=2
    ) as journal:
        await journal.submit([entry(1, 0)])
        await trio.sleep(0.01)  # group 1 is stuck in dispatch
        # the journal goes on writing while dispatch is stuck, but only until each
        # sync slot (2) holds a synced group waiting to be handed over
        await journal.submit([entry(1, 1)])
        # both groups are written (by the journal's thread: on a loaded machine the
        # clock may jump before the write ends, so wait for it, not for a time)
        await wait_until(lambda: journal.statistics().next_seq >= 2, 60.0)
        assert journal.statistics().next_seq == 2
        for i in range(2, 5):  # then the channel (3 batches) fills
            journal.submit_nowait([entry(1, i)])
        with pytest.raises(trio.WouldBlock):
            journal.submit_nowait([entry(1, 5)])
        unblocked = trio.Event()

        async def blocked_submitter() -> None:
            await journal.submit([entry(1, 5)])
            unblocked.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(blocked_submitter)
            await trio.sleep(1.0)
            assert not unblocked.is_set()  # still waiting for room
            assert journal.statistics().next_seq == 2  # nothing more was written
            recorder.gate.set()
            await unblocked.wait()
    assert sum(len(g) for g in recorder.groups) == 6


async def test_a_full_disk_fails_every_queued_request_and_refuses_more(
    tiny_filesystem: Path,
) -> None:
    recorder = Recorder()
    errors: list[BaseException | None] = []
    config = GroupCommitConfig(segment_bytes=256 * 1024, group_wait_ms_max=0.0)
    journal = Journal(tiny_filesystem, config, first_seq=0, dispatch=recorder)
    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        # 64 KiB entries, one at a time: segments roll until the 1 MiB disk is full
        for i in range(64):
            done = trio.Event()
            request = entry(1, i, 64 * 1024)

            def finished(r: Request, done: trio.Event = done) -> None:
                errors.append(r.error)
                done.set()

            request.on_done = finished
            try:
                await journal.submit([request])
            except JournalError:
                break
            await done.wait()
            if errors[-1] is not None:
                break
    failure = errors[-1]
    assert isinstance(failure, JournalError), errors
    assert "No space left on device" in str(failure)
    assert "restart the node" in str(failure)
    acknowledged = [e for e in errors if e is None]
    assert len(acknowledged) == sum(len(g) for g in recorder.groups) > 0
    with pytest.raises(JournalError, match="no longer accepts writes"):
        await journal.submit([entry(1, 999)])
    # everything acknowledged before the disk filled reads back
    records = [r for batch in JournalScanner(tiny_filesystem).batches() for r in batch]
    assert [r.entry_id for r in records] == list(range(len(acknowledged)))


async def test_a_malformed_group_is_refused_and_the_journal_goes_on(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder()
    outcomes: list[BaseException | None] = []
    # a payload over the journal's limit (lowered here: the real one is 64 MiB); this
    # bypasses the node's own, lower, entry_bytes_max check
    monkeypatch.setattr("journal.segment.RECORD_PAYLOAD_MAX", 100)
    async with running_journal(tmp_path, recorder) as journal:
        for size, entry_id in ((101, 0), (100, 1)):
            done = trio.Event()
            request = entry(1, entry_id, size)

            def finished(r: Request, done: trio.Event = done) -> None:
                outcomes.append(r.error)
                done.set()

            request.on_done = finished
            await journal.submit([request])
            await done.wait()
    assert isinstance(outcomes[0], JournalError)
    assert "refused a group" in str(outcomes[0])
    assert outcomes[1] is None
    records = [r for batch in JournalScanner(tmp_path).batches() for r in batch]
    assert [(r.seq, r.entry_id) for r in records] == [(0, 1)]  # no seq was skipped


@pytest.mark.parametrize("syncs", [1, 3])
async def test_pipelined_syncs_hand_groups_over_in_journal_order(
    tmp_path: Path, syncs: int
) -> None:
    """With several groups syncing at once, the ledgers still get every group once,
    in seq order, and the journal reads back whole, across segment rolls."""
    recorder = Recorder()
    async with (
        running_journal(
            tmp_path,
            recorder,
            syncs_in_flight_max=syncs,
            flush_when_queue_empty=True,
            segment_bytes=8192,  # rolls every few groups: a roll waits for older syncs
        ) as journal,
        trio.open_nursery() as nursery,
    ):
        for writer in range(8):

            async def write(writer: int = writer) -> None:
                for i in range(25):
                    await journal.submit([entry(writer, i, size=300)])

            nursery.start_soon(write)
    seqs = [request.seq for group in recorder.groups for request in group]
    assert seqs == list(range(200))
    assert all(request.error is None for group in recorder.groups for request in group)
    read = [r for batch in JournalScanner(tmp_path).batches() for r in batch]
    assert sorted((r.ledger_id, r.entry_id) for r in read) == [
        (w, i) for w in range(8) for i in range(25)
    ]


async def test_hand_overs_that_must_wait_keep_journal_order(tmp_path: Path) -> None:
    """A group whose ledger channel is full is handed over by a task that waits for
    room; the groups synced after it wait behind it, so every request still reaches
    the ledgers once, in journal order."""
    handed: list[list[Request]] = []
    tried = 0

    def dispatch_nowait(group: list[Request]) -> bool:
        nonlocal tried
        tried += 1
        if tried % 3 == 0:
            return False  # as a full ledger channel would
        handed.append(group)
        for request in group:
            request.complete()
        return True

    later = Recorder()
    later.gate = trio.Event()  # the first refused group waits until the gate opens

    async def dispatch(group: list[Request]) -> None:
        await later(group)
        handed.append(group)

    journal = Journal(
        tmp_path,
        GroupCommitConfig(),
        first_seq=0,
        dispatch=dispatch,
        dispatch_nowait=dispatch_nowait,
    )
    completed: list[int] = []

    async def add(entry_id: int, *, wait: bool) -> None:
        request = entry(1, entry_id)
        done = trio.Event()

        def on_done(_: Request) -> None:
            completed.append(entry_id)
            done.set()

        request.on_done = on_done
        await journal.submit([request])
        if wait:
            await done.wait()

    async with trio.open_nursery() as nursery:
        await nursery.start(journal.run)
        await add(0, wait=True)
        await add(1, wait=True)
        await add(2, wait=False)  # the third hand-over is refused: it waits
        for entry_id in range(3, 13):
            await add(entry_id, wait=False)
        await trio.sleep(0.05)  # every sync has ended by now
        assert completed == [0, 1]  # the rest wait behind the third, in order
        later.gate.set()
        for entry_id in range(13, 25):
            await add(entry_id, wait=True)  # one group each
        journal.close_input()
    assert [r.seq for group in handed for r in group] == list(range(25))
    assert completed == list(range(25))
    assert len(later.groups) >= 4  # groups 3, 6, 9 and 12 at least waited
    assert journal.statistics().commits == len(handed)
    assert journal.statistics().operations == 25
