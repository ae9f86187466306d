"""The node API the network layer stands on: master keys, LAC, long polls, range
reads, read-only mode, commit listeners, and the state records in entry logs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import pora
from journal.request import Request
from ledger.entrylog import EntryLog
from ledger.entrylog_format import STATE_ENTRY_ID, decode_state_record
from ledger.state import LedgerState


async def test_the_first_key_fixes_the_ledger_key_and_survives_restart(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        await node.add_entry(1, 0, b"a", master_key=b"k1")
        with pytest.raises(pora.Unauthorized, match="wrong master key for ledger 1"):
            await node.add_entry(1, 1, b"b", master_key=b"k2")
        with pytest.raises(pora.Unauthorized):
            await node.fence_ledger(1, master_key=b"")
        with pytest.raises(pora.Unauthorized):
            await node.close_ledger(1, master_key=b"k2")
        # the refused add was not stored, and another ledger may have its own key
        assert await node.last_entry_id(1) == 0
        await node.add_entry(2, 0, b"x", master_key=b"k2")
    async with pora.open_node(data_dir) as node:  # clean restart: key from the index
        with pytest.raises(pora.Unauthorized):
            await node.add_entry(1, 1, b"b", master_key=b"k2")
        await node.add_entry(1, 1, b"b", master_key=b"k1")
        assert node.ledger_info(1).last_entry_id == 1


async def test_a_deleted_ledger_is_refused_under_any_key(data_dir: Path) -> None:
    # R26: its key is gone, and so is the ledger: ids are never reused
    async with pora.open_node(data_dir) as node:
        await node.add_entry(5, 0, b"a", master_key=b"old")
        await node.delete_ledger(5, master_key=b"old")
        for key in (b"old", b"new"):
            with pytest.raises(pora.LedgerDeleted):
                await node.add_entry(5, 0, b"new", master_key=key)
        with pytest.raises(pora.NoSuchLedger):
            await node.read_entry(5, 0)


async def test_last_add_confirmed_is_the_highest_piggybacked(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        await node.add_entry(3, 0, b"a")
        assert node.last_add_confirmed(3) == -1
        await node.add_entry(3, 2, b"c", last_add_confirmed=1)
        await node.add_entry(3, 1, b"b", last_add_confirmed=0)  # late and lower: kept max
        assert node.last_add_confirmed(3) == 1
        with pytest.raises(pora.NoSuchLedger):
            node.last_add_confirmed(99)
    async with pora.open_node(data_dir) as node:
        assert node.last_add_confirmed(3) == 1


async def test_long_poll_returns_when_the_entry_arrives(
    data_dir: Path, mock_clock: trio.testing.MockClock
) -> None:
    # jump only after 0.1 s of real idleness: the journal's fdatasync runs in a
    # thread, which the clock would otherwise not wait for
    mock_clock.autojump_threshold = 0.1
    async with pora.open_node(data_dir) as node:
        await node.add_entry(7, 0, b"zero")
        got: list[bytes] = []

        async def tail() -> None:
            got.append(await node.read_entry(7, 1, wait_s=30))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(tail)
            await trio.sleep(5)
            assert got == []  # still waiting: the entry is not there
            await node.add_entry(7, 1, b"one")
        assert got == [b"one"]
        started = trio.current_time()
        with pytest.raises(pora.NoSuchEntry):
            await node.read_entry(7, 2, wait_s=10)
        assert trio.current_time() - started == pytest.approx(10, abs=0.5)


async def test_long_poll_on_a_closed_ledger_fails_at_once(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        await node.add_entry(8, 0, b"a")
        await node.close_ledger(8)
        with trio.fail_after(1):
            with pytest.raises(pora.NoSuchEntry):
                await node.read_entry(8, 1, wait_s=60)


async def test_lac_long_poll_answers_when_the_lac_passes_or_the_wait_ends(
    data_dir: Path, mock_clock: trio.testing.MockClock
) -> None:
    mock_clock.autojump_threshold = 0.1  # (the journal's fdatasync runs in a thread)
    async with pora.open_node(data_dir) as node:
        await node.add_entry(5, 0, b"a", last_add_confirmed=-1)
        got: list[tuple[int, int]] = []

        async def follow() -> None:
            got.append(await node.read_lac(5, known_lac=-1, wait_s=30))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await trio.sleep(5)
            assert got == []  # the LAC is still -1
            await node.add_entry(5, 1, b"b", last_add_confirmed=0)
        assert got == [(0, 1)]
        started = trio.current_time()
        assert await node.read_lac(5, known_lac=0, wait_s=10) == (0, 1)  # the current values
        assert trio.current_time() - started == pytest.approx(10, abs=0.5)
        started = trio.current_time()
        with pytest.raises(pora.NoSuchLedger):
            await node.read_lac(6, wait_s=10)  # not here: said after the wait
        assert trio.current_time() - started == pytest.approx(10, abs=0.5)


async def test_read_range_merges_memory_and_disk_and_honours_limits(data_dir: Path) -> None:
    async with pora.open_node(data_dir, memtable_flush_bytes=4096) as node:
        # even ids only (striping), enough to flush some of them to the entry log
        for entry_id in range(0, 200, 2):
            await node.add_entry(9, entry_id, bytes([entry_id % 256]) * 100)
        got = await node.read_range(9, 10, 30)
        assert [e for e, _ in got] == list(range(10, 31, 2))
        assert all(p == bytes([e % 256]) * 100 for e, p in got)
        assert [e for e, _ in await node.read_range(9, 0, 10**6, max_entries=3)] == [0, 2, 4]
        by_bytes = await node.read_range(9, 0, 10**6, max_bytes=250)
        assert [e for e, _ in by_bytes] == [0, 2]
        assert len(await node.read_range(9, 0, 10**6, max_bytes=1)) == 1  # at least one
        assert await node.read_range(9, 500, 600) == []
    async with pora.open_node(data_dir) as node:  # all from the entry log now
        got = await node.read_range(9, 0, 198, max_entries=1000)
        assert [e for e, _ in got] == list(range(0, 200, 2))


async def test_read_only_refuses_writes_and_serves_reads(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        await node.add_entry(1, 0, b"a")
        node.set_read_only("free disk 1 MiB is under 2 GiB")
        assert node.read_only == "free disk 1 MiB is under 2 GiB"
        with pytest.raises(pora.NodeReadOnly, match="free disk 1 MiB"):
            await node.add_entry(1, 1, b"b")
        with pytest.raises(pora.NodeReadOnly):
            await node.close_ledger(1)
        outcomes = await node.add_entries([(1, 1, b"b"), (2, 0, b"c")])
        assert all(isinstance(o, pora.NodeReadOnly) for o in outcomes)
        assert await node.read_entry(1, 0) == b"a"
        node.set_read_only(None)
        await node.add_entry(1, 1, b"b")
        assert await node.last_entry_id(1) == 1


async def test_commit_listeners_see_every_group(data_dir: Path) -> None:
    seen: list[tuple[int, int, float]] = []
    async with pora.open_node(data_dir) as node:
        node.add_commit_listener(lambda r, b, s: seen.append((r, b, s)))
        await node.add_entries([(1, i, b"x" * 10) for i in range(20)])
    assert sum(r for r, _, _ in seen) == 21  # 20 adds and the ledger's KEY record
    assert all(b > 0 and s >= 0 for _, b, s in seen)


async def test_entry_logs_carry_the_ledger_state(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        await node.add_entry(4, 0, b"a", master_key=b"secret")
        await node.add_entry(4, 1, b"b", master_key=b"secret")
        await node.fence_ledger(4, master_key=b"secret")
        await node.close_ledger(4, 0, master_key=b"secret")
    log_path = data_dir / "ledgers" / "04" / f"{4:016x}.log"
    with EntryLog.open(log_path, 4, prealloc_chunk_bytes=1 << 20, fsync=False) as log:
        records = list(log.scan())
        states = [r for r in records if r.entry_id == STATE_ENTRY_ID]
        assert [r.entry_id for r in records if r.entry_id >= 0] == [0, 1]
        assert states and all(r.crc_ok for r in records)
        last = states[-1]
        payload = log.read_record(last.offset, last.record_length, STATE_ENTRY_ID)
    state = decode_state_record(payload)
    assert (state.state, state.fenced, state.sealed_last_entry_id, state.master_key) == (
        LedgerState.CLOSED,
        True,
        0,
        b"secret",
    )


@pytest.mark.slow
async def test_recovery_reports_progress(data_dir: Path) -> None:
    async with pora.open_node(data_dir, flush_interval_ms=10**7) as node:
        await node.add_entries([(1, i, b"x" * 1000) for i in range(200)])
        # a crash would leave the journal: copy it aside before the clean close trims it
        journal = {p.name: p.read_bytes() for p in (data_dir / "journal").iterdir()}
    for name, data in journal.items():
        (data_dir / "journal" / name).write_bytes(data)
    seen: list[int] = []
    async with pora.open_node(data_dir, recovery_progress=seen.append) as node:
        assert await node.read_entry(1, 199) == b"x" * 1000
    assert seen and seen[-1] >= 200 * 1000


async def test_batches_of_any_shape_apply_like_single_adds(data_dir: Path) -> None:
    """A batch of consecutive new entries is applied at once, anything else one by
    one: both must leave the same ledger, read back byte for byte."""
    batches = [
        [(0, b"a" * 10, -1), (1, b"b" * 20, 0), (2, b"c", 1)],  # consecutive: at once
        [(3, b"d" * 5, 2)],
        [(5, b"f", 2), (4, b"e" * 7, 3)],  # out of order: one by one
        [(4, b"e" * 7, 3), (6, b"g" * 3, 4)],  # a retry inside a batch
        [(7, b"h", 9), (8, b"i" * 2, 5), (9, b"j", 6)],  # LAC is the highest seen
        [(11, b"l", 6), (12, b"m", 6)],  # consecutive past a gap: at once
    ]
    async with pora.open_node(data_dir) as node:
        for batch in batches:
            done: list[object] = []
            all_done = trio.Event()

            def on_done(
                request: Request,
                done: list[object] = done,
                n: int = len(batch),
                all_done: trio.Event = all_done,
            ) -> None:
                done.extend(request.tags)  # a run of adds completes once for all
                if len(done) == n:
                    all_done.set()

            requests, refused = node.entry_requests(
                [(i, 4, e, lac, b"", p, False) for i, (e, p, lac) in enumerate(batch)], on_done
            )
            assert refused == []
            await node.submit(requests)  # one submission: one batch for the ledger
            await all_done.wait()
            outcomes = [r.error_of(i) for r in requests for i in range(r.count)]
            assert outcomes == [None] * len(batch)
        stored = {e: p for batch in batches for e, p, _ in batch}
        info = node.ledger_info(4)
        assert (info.first_entry_id, info.last_entry_id) == (0, 12)
        assert info.entry_count == len(stored)
        assert info.payload_bytes == sum(len(p) for p in stored.values())
        assert node.last_add_confirmed(4) == 9
        for entry_id, payload in stored.items():
            assert await node.read_entry(4, entry_id) == payload
        with pytest.raises(pora.NoSuchEntry):
            await node.read_entry(4, 10)


def crash_image(data_dir: Path, target: Path) -> Path:
    """What a crash right now would leave on disk: a copy of the files of a node that
    is still running (quiescent, so the copy is consistent)."""
    shutil.copytree(data_dir, target)
    return target


async def test_add_entries_answers_each_entry_of_its_runs(data_dir: Path, tmp_path: Path) -> None:
    """Entries in a row to one ledger travel as one run (one journal record), yet each
    gets its own outcome, in order, and survives a crash and a restart byte for byte."""

    def payload(ledger_id: int, entry_id: int) -> bytes:
        return bytes([ledger_id, entry_id]) * (1 + entry_id * 7)

    first = [(ledger_id, e, payload(ledger_id, e)) for ledger_id in (1, 2) for e in range(5)]
    mix = [
        (1, 2, payload(1, 2)),  # a retry with the same bytes: fine
        (1, 3, b"other bytes"),  # a retry with other bytes: this one fails
        (1, 4, payload(1, 4)),
        (1, 5, payload(1, 5)),  # new, in the same run as the retries
        (1, 6, payload(1, 6)),
        (2, 5, payload(2, 5)),  # another ledger's run, then back to the first
        (2, 6, payload(2, 6)),
        (2, 7, payload(2, 7)),
        (1, 7, payload(1, 7)),
        (1, 8, payload(1, 8)),
        (2, 0, b"not entry 0"),  # a lone retry with other bytes
        (2, 8, payload(2, 8)),
        (2, 9, payload(2, 9)),
    ]
    stored = {(1, e): payload(1, e) for e in range(9)} | {(2, e): payload(2, e) for e in range(10)}
    options: dict[str, Any] = {"flush_interval_ms": 3_600_000.0}  # flushed only on close

    async def check(node: pora.Node) -> None:
        for (ledger_id, entry_id), expected in stored.items():
            assert await node.read_entry(ledger_id, entry_id) == expected
        assert [e for e, _ in await node.read_range(1, 0, 100)] == list(range(9))
        assert (node.ledger_info(1).entry_count, node.ledger_info(2).entry_count) == (9, 10)

    async with pora.open_node(data_dir, **options) as node:
        assert await node.add_entries(first) == [None] * len(first)
        outcomes = await node.add_entries(mix)
        assert [i for i, o in enumerate(outcomes) if o is not None] == [1, 10]
        conflicts = [o for o in outcomes if isinstance(o, pora.EntryConflict)]
        assert [(o.ledger_id, o.entry_id) for o in conflicts] == [(1, 3), (2, 0)]
        await check(node)
        image = crash_image(data_dir, tmp_path / "crashed")
    # the crash image: every run comes back from the journal
    async with pora.open_node(image, **options) as node:
        # each entry of a run counts, the refused ones too, and a KEY record per ledger
        assert node.statistics().recovery.records_replayed == len(first) + len(mix) + 2
        await check(node)
    async with pora.open_node(image) as node:  # the replayed runs, flushed on close
        assert node.statistics().recovery.records_replayed == 0
        await check(node)
        # retries judged against the entry log now
        retried = await node.add_entries([(1, 3, b"other"), (1, 4, payload(1, 4))])
        assert isinstance(retried[0], pora.EntryConflict) and retried[1] is None
        assert retried[0].entry_id == 3
    async with pora.open_node(data_dir) as node:  # the clean close flushed everything
        assert node.statistics().recovery.records_replayed == 0
        await check(node)
