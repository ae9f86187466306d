"""The write path under failures: a node failing or hanging mid-write (R8..R10), no
replacement (R12, R6), fencing by the nodes or by a recovery's record (R11, R13)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
import trio.testing
from replication_support import Fault, LocalCluster, local_cluster
from writer_support import (
    append_all,
    client_on,
    failing_appends,
    holders,
    start_failing_appends,
)

from ledger.errors import LedgerFenced
from netio.security import master_key_from_password
from pora.client.replication.core.ledger_records import in_recovery
from pora.client.replication.errors import ClientClosed, NotEnoughNodes


async def _poll(condition: Callable[[], Awaitable[bool]], steps: int = 40) -> None:
    """Wait for `condition` on the mock clock: a coarse poll, since every jump of an
    autojump clock waits for its threshold of real idleness."""
    for _ in range(steps):
        if await condition():
            return
        await trio.sleep(0.5)
    raise AssertionError(f"{condition.__name__} did not hold in {steps * 0.5} s")


async def _all_on(cluster: LocalCluster, address: str, ledger_id: int, ids: range) -> bool:
    for entry_id in ids:
        if address not in await holders(cluster, ledger_id, entry_id):
            return False
    return True


@pytest.mark.parametrize("fault", [Fault.FAIL, Fault.HANG])
async def test_a_failed_node_is_replaced_and_no_append_fails(
    tmp_path: Path, fault: Fault, mock_clock: trio.testing.MockClock
) -> None:
    # a hung node is found by node_timeout_s, on the mock clock (jumping only when the
    # real threads of the nodes have been idle a while)
    mock_clock.autojump_threshold = 0.1
    async with (
        local_cluster(tmp_path, nodes=4) as cluster,
        client_on(cluster, node_timeout_s=5.0) as client,
    ):
        ledger = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        assert await append_all(ledger, 10) == list(range(10))
        first_ensemble = ledger.metadata.ensembles[0]
        lost = first_ensemble.members[1].address
        (spare,) = set(cluster.addresses) - {m.address for m in first_ensemble.members}
        cluster.set_fault(lost, fault)
        started = trio.current_time()
        assert await append_all(ledger, 30, first=10) == list(range(10, 40))  # Qa < Qw
        if fault is Fault.HANG:
            assert trio.current_time() - started < 5.0 + 1.0  # no pause beyond the timeout

        async def replaced() -> bool:
            return len((await cluster.store.read_ledger(ledger.ledger_id)).value.ensembles) == 2

        await _poll(replaced)
        record = (await cluster.store.read_ledger(ledger.ledger_id)).value
        second = record.ensembles[1]
        # R9: the failed position replaced by the spare, from the first unacknowledged entry
        assert [m.address for m in second.members] == [
            spare if m.address == lost else m.address for m in first_ensemble.members
        ]
        assert 10 <= second.first_entry_id <= 40
        assert ledger.last_add_confirmed == 39
        # R10: what the lost node had pending reached the replacement
        await ledger.append(b"more")  # the writer goes on, on the new ensemble

        async def resent() -> bool:
            return await _all_on(cluster, spare, ledger.ledger_id, range(second.first_entry_id, 41))

        await _poll(resent)
        await ledger.close()
        closed = (await cluster.store.read_ledger(ledger.ledger_id)).value
        assert closed.last_entry_id == 40


async def test_with_no_spare_node_appends_fail_with_not_enough_nodes(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    mock_clock.autojump_threshold = 0.1
    async with (
        local_cluster(tmp_path, nodes=3) as cluster,
        client_on(cluster, ensemble_change_timeout_s=5.0) as client,
    ):
        ledger = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3)
        await ledger.append_many([b"a", b"b"])
        lost = cluster.addresses[2]
        cluster.set_fault(lost, Fault.FAIL)
        started = trio.current_time()
        outcomes = await failing_appends(ledger, 5, NotEnoughNodes, b"late")
        # R12: they waited for a node to register, then failed; R6: none acknowledged
        # with two copies of the three the ack quorum asks for
        assert len(outcomes) == 5
        assert trio.current_time() - started >= 5.0
        assert ledger.last_add_confirmed == 1
        assert len(ledger.metadata.ensembles) == 1
        with pytest.raises(NotEnoughNodes):
            await ledger.append(b"after")


async def test_a_node_registering_during_the_wait_becomes_the_replacement(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    mock_clock.autojump_threshold = 0.1
    async with (
        local_cluster(tmp_path, nodes=3) as cluster,
        client_on(cluster, ensemble_change_timeout_s=30.0) as client,
    ):
        ledger = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3)
        cluster.set_fault(cluster.addresses[0], Fault.FAIL)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ledger.append, b"waits")
            await trio.sleep(5)  # R12: the writer lists the nodes again with backoff
            assert ledger.last_add_confirmed == -1
            await cluster.start_node("127.0.0.1:41009")
        assert ledger.last_add_confirmed == 0
        record = (await cluster.store.read_ledger(ledger.ledger_id)).value
        assert "127.0.0.1:41009" in {m.address for m in record.ensembles[-1].members}


async def test_a_ledger_fenced_on_the_nodes_fails_pending_and_later_appends(
    tmp_path: Path,
) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster, client_on(cluster) as client:
        ledger = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password="pw"
        )
        await ledger.append_many([b"a", b"b", b"c"])
        key = master_key_from_password("pw")
        for node in cluster.nodes.values():  # what a recovery's fencing reads do (R17)
            await node.fence_ledger(ledger.ledger_id, master_key=key)
        failures = await failing_appends(ledger, 20, LedgerFenced, b"fenced")
        assert len(failures) == 20  # R13: every pending append
        assert ledger.last_add_confirmed == 2  # none acknowledged after the fence
        with pytest.raises(LedgerFenced):
            await ledger.append(b"later")
        with pytest.raises(LedgerFenced):  # R14 meets R11: the close cannot win either
            await ledger.close()


async def test_a_ledger_sealed_on_the_nodes_by_a_recovery_fences_the_writer(
    tmp_path: Path,
) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster, client_on(cluster) as client:
        ledger = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password="pw"
        )
        await ledger.append_many([b"a", b"b", b"c"])
        key = master_key_from_password("pw")
        for node in cluster.nodes.values():  # what a recovery's close does (R22)
            await node.close_ledger(ledger.ledger_id, 2, master_key=key)
        with pytest.raises(LedgerFenced):  # R13: CLOSED from a node is another's close
            await ledger.append(b"pending")
        with pytest.raises(LedgerFenced):
            await ledger.append(b"later")
        assert ledger.last_add_confirmed == 2


async def test_a_record_in_recovery_fences_the_writer_at_its_ensemble_change(
    tmp_path: Path,
) -> None:
    async with local_cluster(tmp_path, nodes=4) as cluster, client_on(cluster) as client:
        ledger = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3)
        await ledger.append(b"a")
        read = await cluster.store.read_ledger(ledger.ledger_id)
        await cluster.store.update_ledger(in_recovery(read.value), read.version)  # R16
        cluster.set_fault(ledger.metadata.ensembles[0].members[0].address, Fault.FAIL)
        with pytest.raises(LedgerFenced):  # R11: the change's CAS conflicts; re-read: fenced
            await ledger.append(b"b")
        assert ledger.last_add_confirmed == 0
        record = (await cluster.store.read_ledger(ledger.ledger_id)).value
        assert len(record.ensembles) == 1  # the writer wrote nothing over the recovery


async def test_a_writer_fenced_while_waiting_for_a_replacement_changes_nothing(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    mock_clock.autojump_threshold = 0.1
    async with local_cluster(tmp_path, nodes=3) as cluster, client_on(cluster) as client:
        ledger = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3)
        cluster.set_fault(cluster.addresses[0], Fault.FAIL)
        key = master_key_from_password("")
        for address in cluster.addresses[1:]:
            await cluster.nodes[address].fence_ledger(ledger.ledger_id, master_key=key)
        with pytest.raises(LedgerFenced):  # R12's wait is under way when R13 fences it
            await ledger.append(b"a")
        await cluster.start_node("127.0.0.1:41009")  # a replacement, too late
        await trio.sleep(5)
        record = (await cluster.store.read_ledger(ledger.ledger_id)).value
        assert len(record.ensembles) == 1
        with pytest.raises(LedgerFenced):
            await ledger.append(b"b")


async def test_leaving_the_client_fails_pending_appends_with_client_closed(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=1) as cluster:
        async with trio.open_nursery() as nursery, client_on(cluster) as client:
            ledger = await client.create_ledger(ensemble_size=1)
            cluster.set_fault(cluster.addresses[0], Fault.HANG)
            outcomes = start_failing_appends(nursery, ledger, 3, ClientClosed, b"unanswered")
            await trio.testing.wait_all_tasks_blocked()
        assert len(outcomes) == 3  # the outcome is unknown: neither acknowledged nor lost
        with pytest.raises(ClientClosed):
            await ledger.append(b"later")
        record = (await cluster.store.read_ledger(ledger.ledger_id)).value
        assert record.state.value == "OPEN"  # a recovery closes it
