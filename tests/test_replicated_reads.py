"""Reads of a replicated ledger (R23, R24) and the tail (R25), over in-process nodes
holding ledgers built by hand."""

from __future__ import annotations

import contextlib
import random
import threading
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
import trio
import trio.testing
from net_helpers import serving
from replicated_ledger_support import (
    KEY,
    PASSWORD,
    add_ensemble,
    length_after,
    make_ledger,
    payload,
    put,
    put_on_nodes,
    stored_bytes,
)
from replication_support import Fault, LocalCluster, local_cluster
from waiting import wait_until

from ledger.errors import NoSuchEntry, Unauthorized
from pora.client.node_channel import NodeChannel
from pora.client.node_client import connect_node
from pora.client.replication.config import ClientConfig
from pora.client.replication.core.entry_format import encode_entry
from pora.client.replication.core.ledger_records import closed_at, new_ledger
from pora.client.replication.errors import EntryLost
from pora.client.replication.reader import LedgerReader, open_ledger
from pora.client.tcp_channel import TcpChannel
from pora.meta.backends import open_metadata
from pora.meta.records import EnsembleMember, LedgerMetadata, LedgerState, Versioned

CONFIG = ClientConfig(node_timeout_s=5.0, speculative_read_delay_s=0.05, tail_poll_wait_s=2.0)


async def reader_of(
    cluster: LocalCluster, ledger_id: int, *, recover: bool = False, config: ClientConfig = CONFIG
) -> LedgerReader:
    return await open_ledger(
        cluster.store, cluster.channel_for, config, random.Random(1), ledger_id, PASSWORD, recover
    )


async def test_a_wrong_password_is_unauthorized(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster:
        record = await make_ledger(cluster)
        with pytest.raises(Unauthorized):
            await open_ledger(
                cluster.store, cluster.channel_for, CONFIG, random.Random(1), 0, "nope"
            )
        assert record.value.state is LedgerState.OPEN


async def test_open_with_recover_closes_and_reads_back(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster:
        record = await make_ledger(cluster)
        await put(cluster, record.value, range(7))
        reader = await reader_of(cluster, record.value.ledger_id, recover=True)
        assert reader.closed
        assert reader.last_entry_id == 6
        assert reader.metadata.length == length_after(6)
        assert [await reader.read(k) for k in range(7)] == [payload(k) for k in range(7)]
        with pytest.raises(NoSuchEntry):
            await reader.read(7)
        await reader.aclose()


async def test_read_entries_in_order_by_range_reads(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=4) as cluster:
        a, b, c, d = cluster.addresses
        record = await make_ledger(cluster, [a, b, c], write_quorum=2, ack_quorum=2)
        await put(cluster, record.value, range(20))
        changed = await add_ensemble(cluster, record, 20, [a, b, d])
        await put(cluster, changed.value, range(20, 45))
        reader = await reader_of(cluster, record.value.ledger_id, recover=True)
        config = ClientConfig(read_range_entries_max=7)
        reader.config = config
        got = [item async for item in reader.read_entries(3, 44)]
        assert got == [(k, payload(k)) for k in range(3, 45)]
        # nodes that stop at their byte cap after one entry: read on from there
        reader.config = ClientConfig(read_range_entries_max=50, read_range_bytes_max=1)
        calls_before = sum(cluster.calls.values())
        got = [item async for item in reader.read_entries(0, 44)]
        assert got == [(k, payload(k)) for k in range(45)]
        assert sum(cluster.calls.values()) - calls_before < 3 * 45


async def test_speculative_read_answers_from_the_second_member(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    mock_clock.autojump_threshold = 0.5  # jump only when truly stuck (disk syncs run)
    async with local_cluster(tmp_path, nodes=3) as cluster:
        a, _, _ = cluster.addresses
        record = await make_ledger(cluster)
        await put(cluster, record.value, range(4))
        reader = await reader_of(cluster, record.value.ledger_id, recover=True)
        cluster.set_fault(a, Fault.HANG)  # first member of entry 0's write set
        started = trio.current_time()
        assert await reader.read(0) == payload(0)
        assert trio.current_time() - started < CONFIG.node_timeout_s


async def test_a_damaged_copy_is_skipped_and_reported(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster:
        a, b, c = cluster.addresses
        record = await make_ledger(cluster)
        ledger_id = record.value.ledger_id
        await put(cluster, record.value, [0], on=[b, c])
        await put(cluster, record.value, [1], on=[a, c])
        await put(cluster, record.value, [2])
        # A, first of entry 0's write set, holds it with another entry's bytes (a
        # wrong payload under the id)
        await cluster.nodes[a].add_entry(ledger_id, 0, stored_bytes(ledger_id, 1), master_key=KEY)
        # B, first of entry 1's, holds it with one byte flipped
        flipped = bytearray(stored_bytes(ledger_id, 1))
        flipped[-1] ^= 0xFF
        await cluster.nodes[b].add_entry(ledger_id, 1, bytes(flipped), master_key=KEY)
        reader = await reader_of(cluster, ledger_id)
        await cluster.nodes[b].write_lac(ledger_id, 2, master_key=KEY)
        assert await reader.read(0) == payload(0)
        assert await reader.read(1) == payload(1)
        assert {(address, damage.entry_id) for address, damage in reader.damaged} == {
            (a, 0),
            (b, 1),
        }
        assert [item async for item in reader.read_entries(0, 2)] == [
            (k, payload(k)) for k in range(3)
        ]


async def test_r23_an_open_ledger_is_never_read_above_its_lac(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster:
        record = await make_ledger(cluster)
        await put(cluster, record.value, range(6), lac=lambda k: min(k - 1, 3))
        reader = await reader_of(cluster, record.value.ledger_id)
        assert not reader.closed
        assert reader.last_add_confirmed == 3
        assert await reader.read(3) == payload(3)
        for entry_id in (4, 5, 6):  # stored (4, 5) or not: above the LAC either way
            with pytest.raises(NoSuchEntry):
                await reader.read(entry_id)
        with pytest.raises(NoSuchEntry):
            _ = [item async for item in reader.read_entries(0, 4)]
        # the writer's LAC moves on: the bound is refreshed once per read above it
        await cluster.nodes[cluster.addresses[0]].write_lac(
            record.value.ledger_id, 4, master_key=KEY
        )
        assert await reader.read(4) == payload(4)
        with pytest.raises(NoSuchEntry):
            await reader.read(5)


async def test_an_acknowledged_entry_no_replica_holds_is_lost(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster:
        record = await make_ledger(cluster)
        await put(cluster, record.value, [0, 1, 3, 4])
        await cluster.nodes[cluster.addresses[0]].write_lac(
            record.value.ledger_id, 4, master_key=KEY
        )
        reader = await reader_of(cluster, record.value.ledger_id)
        assert reader.last_add_confirmed == 4
        with pytest.raises(EntryLost, match="entry 2 of ledger"):
            await reader.read(2)


async def test_a_reader_learns_of_an_ensemble_change_before_calling_an_entry_lost(
    tmp_path: Path,
) -> None:
    async with local_cluster(tmp_path, nodes=4) as cluster:
        a, b, c, d = cluster.addresses
        record = await make_ledger(cluster, [a, b, c], write_quorum=1, ack_quorum=1)
        ledger_id = record.value.ledger_id
        await put(cluster, record.value, range(3))
        reader = await reader_of(cluster, ledger_id)
        assert reader.last_add_confirmed == 1
        changed = await add_ensemble(cluster, record, 3, [a, b, d])
        await put(cluster, changed.value, range(3, 9))
        # entry 5 lives on D alone (LAC 7 there); the reader's record still says C
        assert await reader.read(5) == payload(5)
        assert reader.metadata == changed.value
        assert reader.last_add_confirmed == 7
        # a LAC learnt before the record (as piggybacked): the read re-reads it
        reader.record = record
        assert await reader.read(5) == payload(5)
        assert reader.metadata == changed.value


async def close_record(
    cluster: LocalCluster, current: Versioned[LedgerMetadata], last: int
) -> Versioned[LedgerMetadata]:
    closed = closed_at(current.value, last, length_after(last))
    return await cluster.store.update_ledger(closed, current.version)


async def test_tail_follows_appends_an_ensemble_change_and_the_close(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=4) as cluster:
        a, b, c, d = cluster.addresses
        record = await make_ledger(cluster, [a, b, c])
        ledger_id = record.value.ledger_id
        follower = await reader_of(cluster, ledger_id)
        seen: list[tuple[int, bytes]] = []
        done = trio.Event()
        arrived = trio.Condition()

        async def follow() -> None:
            async for item in follower.tail(0):
                async with arrived:
                    seen.append(item)
                    arrived.notify_all()
            done.set()

        async def until_seen(count: int) -> None:
            with trio.fail_after(10):
                async with arrived:
                    while len(seen) < count:
                        await arrived.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await put(cluster, record.value, range(5))  # LAC 3 piggybacked on entry 4
            await until_seen(4)
            assert seen == [(k, payload(k)) for k in range(4)]
            for member in record.value.ensembles[0].members:  # R7: the idle writer's LAC
                await cluster.nodes[member.address].write_lac(ledger_id, 4, master_key=KEY)
            await until_seen(5)
            # C fails; the writer moves to A, B, D from entry 5 on
            changed = await add_ensemble(cluster, record, 5, [a, b, d])
            # the watch tells the waiting tail of the change (nothing else can: no
            # node has anything new); A and B would serve entries 5.. from either
            await wait_until(lambda: follower.metadata == changed.value, 10)
            await put(cluster, changed.value, range(5, 9))
            for address in (a, b, d):
                await cluster.nodes[address].write_lac(ledger_id, 8, master_key=KEY)
            await until_seen(9)
            await put(cluster, changed.value, [9], lac=lambda _: 8)
            await close_record(cluster, changed, 9)
            with trio.fail_after(10):
                await done.wait()
        assert seen == [(k, payload(k)) for k in range(10)]


async def test_tail_of_a_closed_ledger_ends_after_its_last_entry(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster:
        record = await make_ledger(cluster)
        await put(cluster, record.value, range(3))
        await close_record(cluster, record, 2)
        reader = await reader_of(cluster, record.value.ledger_id)
        assert [item async for item in reader.tail(1)] == [(1, payload(1)), (2, payload(2))]


def test_wrong_bytes_are_not_an_entry() -> None:
    assert encode_entry(1, 0, 3, b"abc") != encode_entry(1, 1, 3, b"abc")


def _tail_under_asyncio(
    url: str, addresses: list[str], ledger_id: int, first_seen: threading.Event
) -> list[tuple[int, bytes]]:
    """An asyncio program: the metadata store and TCP channels to the nodes, tailing
    the ledger until its close."""

    async def main() -> list[tuple[int, bytes]]:
        async with contextlib.AsyncExitStack() as stack:
            store = await stack.enter_async_context(open_metadata(url))
            channels: dict[str, NodeChannel] = {}
            for address in addresses:
                client = await stack.enter_async_context(connect_node(address, timeout_s=10))
                channels[address] = TcpChannel(client)

            async def channel_for(address: str) -> NodeChannel:
                await anyio.lowlevel.checkpoint()
                return channels[address]

            reader = await open_ledger(
                store, channel_for, CONFIG, random.Random(1), ledger_id, PASSWORD, recover=False
            )
            seen: list[tuple[int, bytes]] = []
            async for item in reader.tail(0):
                seen.append(item)
                if len(seen) == 3:
                    first_seen.set()
            return seen

    return anyio.run(main, backend="asyncio")


async def test_tail_under_asyncio_over_tcp(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/meta.db"
    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(open_metadata(url))
        served = [
            await stack.enter_async_context(serving(tmp_path / f"node-{k}")) for k in range(3)
        ]
        members = [
            EnsembleMember(address, node.data_dir.instance_id) for node, _, address in served
        ]
        ledger_id = await store.allocate_ledger_id()
        record = await store.create_ledger(new_ledger(ledger_id, 3, 2, members, KEY, 0))
        nodes = {address: node for node, _, address in served}

        await put_on_nodes(nodes, record.value, range(4))  # LAC 2 piggybacked on entry 3
        first_seen = threading.Event()
        async with trio.open_nursery() as nursery:
            result: list[list[tuple[int, bytes]]] = []

            async def tail() -> None:
                result.append(
                    await trio.to_thread.run_sync(
                        _tail_under_asyncio, url, list(nodes), ledger_id, first_seen
                    )
                )

            nursery.start_soon(tail)
            with trio.fail_after(20):
                await trio.to_thread.run_sync(first_seen.wait)
            await put_on_nodes(nodes, record.value, range(4, 8))  # the long polls see LAC 6
            await put_on_nodes(nodes, record.value, [8], lac=lambda _: 7)
            await store.update_ledger(closed_at(record.value, 8, length_after(8)), record.version)
        assert result == [[(k, payload(k)) for k in range(9)]]


class _CountingChannels:
    """The cluster's channels, counting each kind of request sent through them."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.calls: dict[str, int] = {}

    async def channel_for(self, address: str) -> NodeChannel:
        return _CountingChannel(self, await self.cluster.channel_for(address))  # type: ignore[return-value]


class _CountingChannel:
    def __init__(self, counts: _CountingChannels, inner: NodeChannel) -> None:
        self._counts = counts
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        method = getattr(self._inner, name)
        if not callable(method):
            return method

        def counted(*args: object, **options: object) -> object:
            self._counts.calls[name] = self._counts.calls.get(name, 0) + 1
            return method(*args, **options)

        return counted


async def test_tail_gets_each_entry_with_its_lac_in_one_round_trip(tmp_path: Path) -> None:
    """R25: the long poll for the entry after the LAC brings that entry when the LAC
    confirms it (READ_LAC with ENTRY): one request per entry, no read after it."""
    async with local_cluster(tmp_path, nodes=1) as cluster:
        (a,) = cluster.addresses
        record = await make_ledger(cluster, [a], write_quorum=1, ack_quorum=1)
        ledger_id = record.value.ledger_id
        counting = _CountingChannels(cluster)
        config = ClientConfig(node_timeout_s=5.0, tail_poll_wait_s=30.0)
        follower = await open_ledger(
            cluster.store,
            counting.channel_for,
            config,
            random.Random(1),
            ledger_id,
            PASSWORD,
            recover=False,
        )
        send, receive = trio.open_memory_channel[tuple[int, bytes]](0)

        async def follow() -> None:
            async with send:
                async for item in follower.tail(0):
                    await send.send(item)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await put(cluster, record.value, [0])
            await put(cluster, record.value, [1])  # LAC 0 piggybacked: confirms entry 0
            with trio.fail_after(10):
                assert await receive.receive() == (0, payload(0))
            counting.calls.clear()
            for entry_id in range(1, 11):
                await put(cluster, record.value, [entry_id + 1])  # confirms entry_id
                with trio.fail_after(10):
                    assert await receive.receive() == (entry_id, payload(entry_id))
            assert counting.calls == {"read_lac_and_entry": 10}
            nursery.cancel_scope.cancel()
