"""The in-process node API: what an embedding application relies on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

import pora
from journal.format import RecordFlag, RecordKind
from journal.request import Request
from ledger.registry import LedgerRegistry
from ledger.worker import LedgerWorker
from pora.node.datadir import DATA_DIR_VERSION, MARKER_NAME


async def test_add_then_read_returns_the_same_bytes(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        await node.add_entry(7, 0, b"hello")
        await node.add_entry(7, 1, b"")
        await node.add_entry(7, 2, bytes(range(256)) * 40)
        assert await node.read_entry(7, 0) == b"hello"
        assert await node.read_entry(7, 1) == b""
        assert await node.read_entry(7, 2) == bytes(range(256)) * 40
        assert await node.last_entry_id(7) == 2


async def test_entries_survive_a_clean_restart(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        for i in range(100):
            await node.add_entry(1, i, f"entry-{i}".encode())
        await node.close_ledger(1)
    async with pora.open_node(data_dir) as node:
        assert [await node.read_entry(1, i) for i in range(100)] == [
            f"entry-{i}".encode() for i in range(100)
        ]
        info = node.ledger_info(1)
        assert (info.state, info.first_entry_id, info.last_entry_id, info.entry_count) == (
            "closed",
            0,
            99,
            100,
        )
        # a clean stop leaves nothing to replay
        assert node.statistics().recovery.records_replayed == 0


async def test_reads_after_flush_come_from_the_entry_log(data_dir: Path) -> None:
    async with pora.open_node(data_dir, memtable_flush_bytes=4096, recent_bytes_max=0) as node:
        payloads = [bytes([i]) * 1000 for i in range(50)]
        for i, p in enumerate(payloads):
            await node.add_entry(3, i, p)
        await node._registry.flush_all()
        worker = node._registry.active[3]
        assert not worker.memtable.unflushed and worker.memtable.get(0) is None
        assert [await node.read_entry(3, i) for i in range(50)] == payloads


async def test_retry_with_same_bytes_succeeds_and_other_bytes_conflict(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        await node.add_entry(1, 5, b"abc")
        await node.add_entry(1, 5, b"abc")  # an idempotent retry
        with pytest.raises(pora.EntryConflict, match="entry 5 of ledger 1"):
            await node.add_entry(1, 5, b"abd")
        await node._registry.flush_all()
        await node.add_entry(1, 5, b"abc")  # still idempotent once flushed
        with pytest.raises(pora.EntryConflict):
            await node.add_entry(1, 5, b"xyz")
        assert node.ledger_info(1).entry_count == 1
        assert await node.read_entry(1, 5) == b"abc"


async def test_out_of_order_and_sparse_entry_ids(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        for entry_id in (9, 3, 6, 0):  # striping gives each node a subset, in any order
            await node.add_entry(2, entry_id, str(entry_id).encode())
        assert await node.last_entry_id(2) == 9
        info = node.ledger_info(2)
        assert (info.first_entry_id, info.entry_count) == (0, 4)
        with pytest.raises(pora.NoSuchEntry):
            await node.read_entry(2, 4)
        assert await node.read_entry(2, 3) == b"3"


async def test_closed_ledger_refuses_adds_and_reads_past_the_seal(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        for i in range(5):
            await node.add_entry(4, i, b"x")
        assert await node.close_ledger(4, last_entry_id=2) == 2
        with pytest.raises(pora.LedgerClosed, match="ledger 4 is closed"):
            await node.add_entry(4, 5, b"y")
        assert await node.read_entry(4, 2) == b"x"
        with pytest.raises(pora.NoSuchEntry):
            await node.read_entry(4, 3)
        assert await node.last_entry_id(4) == 2
        assert await node.close_ledger(4) == 2  # closing again agrees
        with pytest.raises(pora.LedgerClosed):
            await node.close_ledger(4, last_entry_id=4)
    async with pora.open_node(data_dir) as node:
        with pytest.raises(pora.LedgerClosed):
            await node.add_entry(4, 6, b"z")
        assert node.ledger_info(4).state == "closed"


async def test_fence_shuts_out_the_writer_but_not_recovery_adds(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        await node.add_entry(5, 0, b"a")
        await node.add_entry(5, 1, b"b")
        assert await node.fence_ledger(5) == 1
        with pytest.raises(pora.LedgerFenced):
            await node.add_entry(5, 2, b"c")
        done = trio.Event()
        recovery_add = Request(
            RecordKind.ENTRY, 5, 2, b"c", RecordFlag.RECOVERY_ADD, on_done=lambda r: done.set()
        )
        await node.submit([recovery_add])
        await done.wait()
        assert recovery_add.error is None
        assert await node.read_entry(5, 2) == b"c"
    async with pora.open_node(data_dir) as node:  # the fence is durable
        assert node.ledger_info(5).state == "fenced"
        with pytest.raises(pora.LedgerFenced):
            await node.add_entry(5, 3, b"d")


async def test_fencing_an_unknown_ledger_creates_it_fenced(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        assert await node.fence_ledger(11) == -1
        with pytest.raises(pora.LedgerFenced):
            await node.add_entry(11, 0, b"late writer")


async def test_delete_removes_entries_and_files(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        for i in range(10):
            await node.add_entry(8, i, b"doomed")
        await node._registry.flush_all()
        log_path = node._registry.storage.entrylog_path(8)
        assert log_path.exists()
        await node.delete_ledger(8)
        with pytest.raises(pora.NoSuchLedger):
            await node.read_entry(8, 0)
        with pytest.raises(pora.NoSuchLedger):
            await node.delete_ledger(8)
        await node._registry.flush_all()
        assert not log_path.exists()


async def test_a_deleted_ledger_is_never_created_again_even_after_a_restart(
    data_dir: Path,
) -> None:
    # R26: ledger ids are never reused, so whatever arrives for a deleted ledger is
    # its old writer's (or recovery's) and must not bring it back
    async with pora.open_node(data_dir) as node:
        for i in range(10):
            await node.add_entry(8, i, b"doomed", master_key=b"k")
        await node.delete_ledger(8, master_key=b"k")
        # before the delete's index batch (the tombstone in memory) ...
        with pytest.raises(pora.LedgerDeleted):
            await node.add_entry(8, 10, b"late", master_key=b"k")
        await node._registry.flush_all()
        # ... and after it (the tombstone in the index), whatever the key
        for key in (b"k", b"other"):
            with pytest.raises(pora.LedgerDeleted) as refused:
                await node.add_entry(8, 11, b"late", master_key=key)
            assert isinstance(refused.value, pora.LedgerFenced)  # FENCED on the wire
            assert isinstance(refused.value, pora.NoSuchLedger)
        with pytest.raises(pora.LedgerDeleted):
            await node.fence_ledger(8, master_key=b"k")
        with pytest.raises(pora.LedgerDeleted):
            await node.close_ledger(8, master_key=b"k")
        with pytest.raises(pora.NoSuchLedger):
            await node.read_entry(8, 10)
        assert [info.ledger_id for info in node.ledgers()] == []
        await node.add_entry(9, 0, b"another ledger", master_key=b"k")
    async with pora.open_node(data_dir) as node:
        with pytest.raises(pora.LedgerDeleted):
            await node.add_entry(8, 0, b"after a restart", master_key=b"k")
        with pytest.raises(pora.LedgerDeleted):
            await node.fence_ledger(8, master_key=b"k")
        assert [info.ledger_id for info in node.ledgers()] == [9]


async def test_bad_arguments_get_clear_errors(data_dir: Path) -> None:
    async with pora.open_node(data_dir, entry_bytes_max=1024) as node:
        with pytest.raises(pora.EntryTooLarge, match=r"2000 bytes .* limit of 1024"):
            await node.add_entry(1, 0, b"x" * 2000)
        with pytest.raises(pora.InvalidArgument, match="entry_id"):
            await node.add_entry(1, -1, b"x")
        with pytest.raises(pora.InvalidArgument, match="ledger_id"):
            await node.add_entry(2**63, 0, b"x")
        with pytest.raises(pora.NoSuchLedger, match="ledger 99 does not exist"):
            await node.read_entry(99, 0)
        with pytest.raises(pora.NoSuchLedger):
            await node.last_entry_id(99)
    with pytest.raises(TypeError, match="unknown node option 'group_wait_ms'"):
        async with pora.open_node(data_dir, group_wait_ms=1):
            pass


async def test_two_nodes_cannot_open_one_data_dir(data_dir: Path) -> None:
    async with pora.open_node(data_dir):
        with pytest.raises(pora.DataDirLocked, match="in use by another Pora process"):
            async with pora.open_node(data_dir):
                pass
    async with pora.open_node(data_dir):  # released on exit
        pass


async def test_a_node_left_by_cancellation_can_be_opened_again_at_once(data_dir: Path) -> None:
    # its owner's scope cancelled mid-run (an in-process crash): the node still
    # releases its data dir and closes its index, so this process opens it again,
    # with what it acknowledged
    with trio.CancelScope() as scope:
        async with pora.open_node(data_dir) as node:
            await node.add_entry(1, 0, b"acknowledged")
            scope.cancel()
            await trio.sleep_forever()
    async with pora.open_node(data_dir) as node:
        assert await node.read_entry(1, 0) == b"acknowledged"


async def test_a_foreign_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(pora.DataDirError, match="is not a Pora data dir"):
        async with pora.open_node(tmp_path / "photos"):
            pass
    assert sorted(p.name for p in (tmp_path / "photos").iterdir()) == ["cat.jpg"]


async def test_a_data_dir_of_version_3_is_refused_by_name(data_dir: Path) -> None:
    """Version 3 journals hold one entry per record; this build writes runs (v4+)."""
    async with pora.open_node(data_dir) as node:
        await node.add_entry(1, 0, b"kept")
    marker = data_dir / MARKER_NAME
    info = json.loads(marker.read_text())
    assert info["version"] == DATA_DIR_VERSION == 6
    info["version"] = 3
    marker.write_text(json.dumps(info))
    with pytest.raises(
        pora.DataDirError, match="format version 3; this build reads versions 4, 5, 6"
    ) as caught:
        async with pora.open_node(data_dir):
            pass
    assert "Use a Pora release that knows version 3" in str(caught.value)
    info["version"] = 6  # nothing was touched: marked back, it opens with its data
    marker.write_text(json.dumps(info))
    async with pora.open_node(data_dir) as node:
        assert await node.read_entry(1, 0) == b"kept"


async def test_a_data_dir_of_version_4_is_upgraded_in_place_with_its_data(data_dir: Path) -> None:
    """Version 5 only lets segments be recycled: a node marks a version 4 dir as 5
    when it starts (older builds would misread a recycled segment), keeping its id."""
    async with pora.open_node(data_dir) as node:
        await node.add_entry(1, 0, b"from version 4")
    marker = data_dir / MARKER_NAME
    info = json.loads(marker.read_text())
    info["version"] = 4
    marker.write_text(json.dumps(info))
    async with pora.open_node(data_dir) as node:
        assert await node.read_entry(1, 0) == b"from version 4"
    upgraded = json.loads(marker.read_text())
    assert upgraded == {**info, "version": 6}


async def test_many_concurrent_writers_over_many_ledgers(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:

        async def writer(ledger_id: int) -> None:
            for entry_id in range(50):
                await node.add_entry(ledger_id, entry_id, f"{ledger_id}:{entry_id}".encode())

        async with trio.open_nursery() as nursery:
            for ledger_id in range(40):
                nursery.start_soon(writer, ledger_id)
        stats = node.statistics()
        # every add, and one KEY record fixing each new ledger's master key
        assert stats.journal.operations == 2000 + 40
        # group commit: far fewer syncs than adds
        assert stats.journal.commits < 1000
        for ledger_id in range(40):
            assert await node.read_entry(ledger_id, 49) == f"{ledger_id}:49".encode()
    async with pora.open_node(data_dir) as node:
        assert len(node.ledgers()) == 40
        assert all(info.entry_count == 50 for info in node.ledgers())


async def test_full_ledger_channels_keep_every_ledger_in_order(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room for one batch per ledger channel and workers that wait for a
    flush after every batch, hand-overs find a channel full and wait (the ledgers'
    backpressure): each ledger still applies its entries exactly once, in order,
    and restarts with all of them."""
    options: dict[str, Any] = {
        "ledger_channel_batches_max": 1,
        "memtable_flush_bytes": 256,
        "memtable_ledger_bytes_max": 256,  # less than any chunk of ten entries
    }
    ledgers, per_ledger = 6, 120
    # each ledger's worker, once it waits for its flush, is held there until a group
    # has found a channel full: the writers below make sure one does
    refused, waited = [0], [0]
    held = {ledger_id: trio.Event() for ledger_id in range(ledgers)}
    queued = {ledger_id: trio.Event() for ledger_id in range(ledgers)}
    first_refusal = trio.Event()
    dispatch_nowait, dispatch = LedgerRegistry.dispatch_nowait, LedgerRegistry.dispatch
    flush_and_wait = LedgerWorker._flush_and_wait

    def counting_dispatch_nowait(registry: LedgerRegistry, group: list[Request]) -> bool:
        sent = dispatch_nowait(registry, group)
        refused[0] += not sent
        if not sent:
            first_refusal.set()
        for request in group if sent else ():
            if held[request.ledger_id].is_set():
                queued[request.ledger_id].set()
        return sent

    async def counting_dispatch(registry: LedgerRegistry, group: list[Request]) -> None:
        waited[0] += 1  # the hand-over that waits for room in a channel
        await dispatch(registry, group)

    async def held_until_a_channel_filled(worker: LedgerWorker) -> None:
        held[worker.ledger_id].set()
        with trio.move_on_after(10):  # only turns a hang into the failure below
            await first_refusal.wait()
        await flush_and_wait(worker)

    monkeypatch.setattr(LedgerRegistry, "dispatch_nowait", counting_dispatch_nowait)
    monkeypatch.setattr(LedgerRegistry, "dispatch", counting_dispatch)
    monkeypatch.setattr(LedgerWorker, "_flush_and_wait", held_until_a_channel_filled)

    async with pora.open_node(data_dir, **options) as node:

        async def writer(ledger_id: int) -> None:
            async def chunk(first: int) -> None:
                outcomes = await node.add_entries(
                    [
                        (ledger_id, i, f"{ledger_id}/{i}".encode() * 20)
                        for i in range(first, first + 10)
                    ]
                )
                assert outcomes == [None] * 10

            # the first chunk sends the worker to its flush; the second fills its
            # channel; every later one comes in groups that find the channel full
            await chunk(0)
            await held[ledger_id].wait()
            async with trio.open_nursery() as chunks:
                chunks.start_soon(chunk, 10)
                await queued[ledger_id].wait()
                for first in range(20, per_ledger, 10):
                    chunks.start_soon(chunk, first)

        async with trio.open_nursery() as nursery:
            for ledger_id in range(ledgers):
                nursery.start_soon(writer, ledger_id)
        # the backpressure path was taken: groups found a channel full and waited
        assert refused[0] > 0 and waited[0] == refused[0], (refused, waited)
        for ledger_id in range(ledgers):
            entries = await node.read_range(ledger_id, 0, per_ledger - 1)
            assert entries == [(i, f"{ledger_id}/{i}".encode() * 20) for i in range(per_ledger)]
    async with pora.open_node(data_dir, **options) as node:
        infos = {info.ledger_id: info for info in node.ledgers()}
        assert sorted(infos) == list(range(ledgers))
        assert all(info.entry_count == per_ledger for info in infos.values())
        assert await node.read_entry(3, per_ledger - 1) == f"3/{per_ledger - 1}".encode() * 20


async def test_a_delete_waits_for_a_reader_of_its_entry_log_without_polling(
    data_dir: Path,
) -> None:
    async with pora.open_node(data_dir) as node:
        await node.add_entry(4, 0, b"kept until the reader lets go")
        await node._registry.flush_all()
        storage = node._registry.storage
        path = storage.entrylog_path(4)
        assert path.exists()
        await storage.acquire_log(4, create=False)  # a reader's pread holds the file
        await node.delete_ledger(4)
        async with trio.open_nursery() as nursery:
            # the delete's storage work happens at the ledger's next flush
            nursery.start_soon(node._registry.flush_all)
            # every task, the delete's included, sleeps until something happens: a
            # delete polling for the pin would wake every few milliseconds
            with trio.fail_after(5):
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert path.exists()
            storage.release_log(4)
        assert not path.exists()
