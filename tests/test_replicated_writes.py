"""The replicating client's write path on an in-process cluster: striping (R3),
acknowledgements in order (R4), the LAC piggybacked and flushed (R4, R7), close
(R14, R15), placement (R1, R2), delete, and the pending bounds."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import pytest
import trio
import trio.testing
from replication_support import Fault, local_cluster
from waiting import wait_until_true
from writer_support import client_on, holders, payload_on

import pora
from journal.errors import PoraError
from ledger.errors import EntryTooLarge, LedgerClosed, NoSuchEntry, NoSuchLedger, Unauthorized
from netio.security import master_key_from_password
from pora.client.node_channel import AddAnswer, AddRequest, NodeChannel, add_entries_each
from pora.client.replication.core.quorum import entry_write_set
from pora.client.replication.errors import NotEnoughNodes
from pora.meta.errors import NoSuchLedgerMetadata
from pora.meta.records import LedgerState, NodeRegistration


@pytest.mark.parametrize(("e", "qw", "qa"), [(3, 3, 2), (3, 2, 2), (5, 3, 2), (1, 1, 1)])
async def test_entries_land_on_exactly_their_write_sets(
    tmp_path: Path, e: int, qw: int, qa: int
) -> None:
    async with local_cluster(tmp_path, nodes=5) as cluster, client_on(cluster) as client:
        ledger = await client.create_ledger(ensemble_size=e, write_quorum=qw, ack_quorum=qa)
        payloads = [f"entry {k}".encode() for k in range(12)]
        ids = [await ledger.append(p) for p in payloads[:6]]
        ids += await ledger.append_many(payloads[6:])
        assert ids == list(range(12))  # R4: in order, each id once (R5)
        assert ledger.last_add_confirmed == 11
        record = ledger.metadata
        for entry_id, payload in enumerate(payloads):
            expected = {m.address for m in entry_write_set(record, entry_id)}

            async def on_write_set(entry_id: int = entry_id, expected: set[str] = expected) -> bool:
                return await holders(cluster, ledger.ledger_id, entry_id) == expected

            # R3: every member of the write set gets it (Qw - Qa of them after the ack)
            await wait_until_true(on_write_set, 10)
            for address in expected:
                assert await payload_on(cluster, address, ledger.ledger_id, entry_id) == payload


async def test_the_lac_rides_on_adds_and_an_idle_writer_flushes_it(tmp_path: Path) -> None:
    async with (
        local_cluster(tmp_path, nodes=3) as cluster,
        client_on(cluster, lac_flush_interval_s=0.05) as client,
    ):
        ledger = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3)
        for k in range(5):
            await ledger.append(b"x%d" % k)
        lacs = [cluster.nodes[a].last_add_confirmed(ledger.ledger_id) for a in cluster.addresses]
        assert max(lacs) >= 3  # R4: entry 4 carried LAC 3

        async def flushed() -> bool:  # R7: once idle, the nodes learn LAC 4
            await trio.lowlevel.checkpoint()
            nodes = cluster.nodes.values()
            return all(n.last_add_confirmed(ledger.ledger_id) == 4 for n in nodes)

        await wait_until_true(flushed, 10)


async def test_hundreds_of_concurrent_appends_are_acknowledged_in_order(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster, client_on(cluster) as client:
        ledgers = [
            await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
            for _ in range(4)
        ]
        got: dict[int, list[int]] = {ledger.ledger_id: [] for ledger in ledgers}

        async def append_one(k: int) -> None:
            ledger = ledgers[k % 4]
            entry_id = await ledger.append(b"payload %d" % k)
            # R4: acknowledged only with every earlier entry
            assert ledger.last_add_confirmed >= entry_id
            got[ledger.ledger_id].append(entry_id)

        async with trio.open_nursery() as nursery:
            for k in range(500):
                nursery.start_soon(append_one, k)
        for ledger in ledgers:
            assert sorted(got[ledger.ledger_id]) == list(range(125))
            assert ledger.last_add_confirmed == 124


async def test_close_writes_the_record_and_seals_the_nodes(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster, client_on(cluster) as client:
        ledger = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=3, password="pw"
        )
        await ledger.append_many([b"abc", b"de", b"f"])
        await ledger.close()
        record = (await cluster.store.read_ledger(ledger.ledger_id)).value
        assert record.state is LedgerState.CLOSED
        assert (record.last_entry_id, record.length) == (2, 6)  # R14: at the LAC, its length
        key = master_key_from_password("pw")
        for node in cluster.nodes.values():  # sealed on the nodes at the last entry
            with pytest.raises(LedgerClosed):
                await node.add_entry(ledger.ledger_id, 3, b"late", master_key=key)
        with pytest.raises(LedgerClosed):
            await ledger.append(b"after close")
        await ledger.close()  # closing a closed ledger returns
        assert (await cluster.store.read_ledger(ledger.ledger_id)).value == record  # R15


async def test_a_writer_as_context_manager_closes_on_exit(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=1) as cluster, client_on(cluster) as client:
        async with await client.create_ledger(ensemble_size=1) as ledger:
            await ledger.append(b"one")
        record = (await cluster.store.read_ledger(ledger.ledger_id)).value
        assert (record.state, record.last_entry_id, record.length) == (LedgerState.CLOSED, 0, 3)
        listed = [info async for info in client.list_ledgers()]
        assert [info.ledger_id for info in listed] == [ledger.ledger_id]


async def test_placement_needs_enough_writable_nodes_and_skips_read_only_ones(
    tmp_path: Path,
) -> None:
    async with local_cluster(tmp_path, nodes=4) as cluster, client_on(cluster) as client:
        read_only = cluster.addresses[0]
        node = cluster.nodes[read_only]
        await cluster.store.update_registration(
            NodeRegistration(read_only, node.data_dir.instance_id, read_only=True)
        )
        for _ in range(5):  # R1: never a read-only node
            ledger = await client.create_ledger(ensemble_size=3)
            assert read_only not in {m.address for m in ledger.metadata.ensembles[0].members}
        with pytest.raises(NotEnoughNodes) as refused:  # R2: nothing is created
            await client.create_ledger(ensemble_size=4)
        assert (refused.value.found, refused.value.needed) == (3, 4)
        assert len([info async for info in client.list_ledgers()]) == 5
        with pytest.raises(ValueError, match="E >= Qw >= Qa"):
            await client.create_ledger(ensemble_size=2, write_quorum=3)


async def test_delete_checks_the_password_and_removes_record_and_data(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster, client_on(cluster) as client:
        ledger = await client.create_ledger(ensemble_size=3, password="secret")
        await ledger.append_many([b"a", b"b"])
        await ledger.close()
        with pytest.raises(Unauthorized):
            await client.delete_ledger(ledger.ledger_id, password="wrong")
        assert await holders(cluster, ledger.ledger_id, 0) == set(cluster.addresses)
        await client.delete_ledger(ledger.ledger_id, password="secret")
        with pytest.raises(NoSuchLedgerMetadata):
            await cluster.store.read_ledger(ledger.ledger_id)
        for node in cluster.nodes.values():
            with pytest.raises((NoSuchLedger, NoSuchEntry)):
                await node.read_entry(ledger.ledger_id, 0)
        with pytest.raises(NoSuchLedger, match="in the metadata store"):
            await client.delete_ledger(ledger.ledger_id, password="secret")
        with pytest.raises(NoSuchLedger, match="in the metadata store"):
            await client.open_ledger(ledger.ledger_id, password="secret")


async def test_delete_leaves_an_unreachable_node_s_copy_behind_and_succeeds(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster, client_on(cluster) as client:
        ledger = await client.create_ledger(ensemble_size=3)
        await ledger.append(b"a")
        await ledger.close()
        cluster.set_fault(cluster.addresses[0], Fault.FAIL)
        await client.delete_ledger(ledger.ledger_id)  # best effort on the nodes
        assert await holders(cluster, ledger.ledger_id, 0) == {cluster.addresses[0]}


async def test_pending_appends_per_ledger_are_bounded(tmp_path: Path) -> None:
    async with (
        local_cluster(tmp_path, nodes=1) as cluster,
        client_on(cluster, pending_appends_per_ledger_max=4) as client,
    ):
        ledger = await client.create_ledger(ensemble_size=1)
        cluster.set_fault(cluster.addresses[0], Fault.HANG)  # nothing is acknowledged
        async with trio.open_nursery() as nursery:
            for k in range(10):
                nursery.start_soon(ledger.append, b"%d" % k)
            await trio.testing.wait_all_tasks_blocked()
            assert ledger._adds.next_entry_id == 4  # the other six wait for room
            nursery.cancel_scope.cancel()


async def test_pending_bytes_per_client_are_bounded(tmp_path: Path) -> None:
    async with (
        local_cluster(tmp_path, nodes=1) as cluster,
        client_on(cluster, pending_bytes_max=100) as client,
    ):
        ledgers = [await client.create_ledger(ensemble_size=1) for _ in range(2)]
        cluster.set_fault(cluster.addresses[0], Fault.HANG)
        async with trio.open_nursery() as nursery:
            for k in range(6):
                nursery.start_soon(ledgers[k % 2].append, bytes(40))
            await trio.testing.wait_all_tasks_blocked()
            admitted = sum(ledger._adds.next_entry_id for ledger in ledgers)
            assert admitted == 2  # 80 bytes pending; a third 40 would pass 100
            nursery.cancel_scope.cancel()


async def test_pora_exports_the_client() -> None:
    await trio.lowlevel.checkpoint()
    assert pora.connect is not None
    assert pora.LedgerWriter.__name__ == "LedgerWriter"
    assert issubclass(pora.ClientClosed, pora.PoraError)


class _SlowAdds:
    """A channel whose adds answer `delay_s` late (every other call passes through)."""

    def __init__(self, inner: NodeChannel, delay_s: float) -> None:
        self._inner = inner
        self._delay_s = delay_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def add_entries_many(
        self, requests: Sequence[AddRequest], **options: Any
    ) -> list[AddAnswer]:
        return await add_entries_each(self, requests, **options)

    async def add_entries(self, *args: Any, **kwargs: Any) -> list[PoraError | None]:
        await trio.sleep(self._delay_s)
        return await self._inner.add_entries(*args, **kwargs)


async def test_close_lets_the_replicas_beyond_the_ack_quorum_get_their_copies(
    tmp_path: Path,
) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster:
        slow = cluster.addresses[2]

        @asynccontextmanager
        async def open_channel(address: str) -> AsyncIterator[NodeChannel]:
            channel = await cluster.channel_for(address)
            yield cast(NodeChannel, _SlowAdds(channel, 0.2)) if address == slow else channel

        async with pora.connect(cluster.store.url, open_channel=open_channel) as client:
            ledger = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
            await ledger.append_many([b"%d" % k for k in range(50)])
            assert await holders(cluster, ledger.ledger_id, 49) != set(cluster.addresses)
            await ledger.close()  # R14: acknowledged by two, but the third is written too
            for entry_id in (0, 25, 49):
                assert await holders(cluster, ledger.ledger_id, entry_id) == set(cluster.addresses)


async def test_an_oversized_payload_is_refused_before_it_has_an_id(tmp_path: Path) -> None:
    async with (
        local_cluster(tmp_path, nodes=3) as cluster,
        client_on(cluster, payload_bytes_max=1000) as client,
    ):
        ledger = await client.create_ledger(ensemble_size=3)
        assert await ledger.append(b"x" * 1000) == 0
        with pytest.raises(EntryTooLarge, match="1001"):
            await ledger.append(b"x" * 1001)
        with pytest.raises(EntryTooLarge):
            await ledger.append_many([b"small", b"x" * 1001])
        assert await ledger.append(b"after") == 1  # the ledger goes on; no id was used
        await ledger.close()
        assert ledger.metadata.last_entry_id == 1
