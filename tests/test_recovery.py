"""Recovery (R16..R22) over in-process nodes, from node states built by hand: each
lesson BookKeeper paid for (#2614, #2615, #1591, #2908, #2612, #1067) has its test."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from replicated_ledger_support import (
    KEY,
    Scripted,
    add_ensemble,
    corrupt,
    length_after,
    make_ledger,
    payload,
    put,
    stored_bytes,
)
from replication_support import Fault, LocalCluster, local_cluster

from ledger.errors import LedgerClosed, LedgerFenced
from netio.errors import ConnectionLost
from pora.client.replication.config import ClientConfig
from pora.client.replication.core.quorum import entry_write_set
from pora.client.replication.errors import RecoveryFailed
from pora.client.replication.recovery import recover_ledger
from pora.client.replication.replica_reads import read_from_write_set
from pora.meta.records import LedgerMetadata, LedgerState, Versioned

CONFIG = ClientConfig(node_timeout_s=5.0, recovery_fence_timeout_s=20.0)


async def recover(
    cluster: LocalCluster,
    ledger_id: int,
    *,
    through: Scripted | None = None,
    config: ClientConfig = CONFIG,
) -> Versioned[LedgerMetadata]:
    """`recover_ledger` on the cluster's store, through its channels (or a script's)."""
    channel_for = cluster.channel_for if through is None else through.channel_for
    return await recover_ledger(cluster.store, channel_for, config, ledger_id, KEY)


async def assert_on_every_replica(cluster: LocalCluster, metadata: LedgerMetadata) -> None:
    """R20: every replica of each recovered entry's write set holds it, same bytes."""
    for entry_id in range(metadata.last_entry_id + 1):
        for target in entry_write_set(metadata, entry_id):
            data = await cluster.nodes[target.address].read_entry(metadata.ledger_id, entry_id)
            assert data == stored_bytes(metadata.ledger_id, entry_id), (target, entry_id)


async def test_recovery_keeps_every_entry_held_by_an_ack_quorum(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster:
        a, b, c = cluster.addresses
        record = await make_ledger(cluster)
        await put(cluster, record.value, range(10))
        await put(cluster, record.value, [10], on=[a, b])  # Qa=2 members: must survive
        # one member (sent while the writer's LAC was 9): may or may not survive
        await put(cluster, record.value, [11], on=[c], lac=lambda _: 9)
        closed = await recover(cluster, record.value.ledger_id)
        assert closed.value.state is LedgerState.CLOSED
        assert closed.value.last_entry_id in (10, 11)
        assert closed.value.length == length_after(closed.value.last_entry_id)
        await assert_on_every_replica(cluster, closed.value)
        # reads give the same bytes from every member (R20), through R24's reader too
        for entry_id in range(closed.value.last_entry_id + 1):
            write_set = entry_write_set(closed.value, entry_id)
            for start in range(3):
                rotated = write_set[start:] + write_set[:start]
                answer = await read_from_write_set(
                    cluster.channel_for, CONFIG, record.value.ledger_id, entry_id, rotated
                )
                assert answer.entry.payload == payload(entry_id)


async def test_racing_recoveries_close_at_one_entry(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster:
        a, _, _ = cluster.addresses
        record = await make_ledger(cluster)
        await put(cluster, record.value, range(5))
        await put(cluster, record.value, [5], on=[a])
        results: list[LedgerMetadata] = []

        async def one_recovery() -> None:
            closed = await recover(cluster, record.value.ledger_id)
            results.append(closed.value)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one_recovery)
            nursery.start_soon(one_recovery)
        assert len(results) == 2
        assert results[0].last_entry_id == results[1].last_entry_id
        assert results[0].length == results[1].length
        final = await cluster.store.read_ledger(record.value.ledger_id)
        assert final.value.last_entry_id == results[0].last_entry_id


async def test_recovery_of_a_closed_ledger_changes_nothing(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster:
        record = await make_ledger(cluster)
        await put(cluster, record.value, range(3))
        first = await recover(cluster, record.value.ledger_id)
        again = await recover(cluster, record.value.ledger_id)
        assert again == first


async def test_recovery_of_an_empty_open_ledger_closes_at_minus_one(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster:
        record = await make_ledger(cluster)
        closed = await recover(cluster, record.value.ledger_id)
        assert (closed.value.state, closed.value.last_entry_id, closed.value.length) == (
            LedgerState.CLOSED,
            -1,
            0,
        )


async def test_lesson_2614_recovery_reads_fence(tmp_path: Path) -> None:
    """A node fenced only by a recovery read (its fencing LAC read and its seal were
    lost) refuses the old writer's next entry afterwards."""
    async with local_cluster(tmp_path, nodes=3) as cluster:
        _, _, c = cluster.addresses
        record = await make_ledger(cluster)
        await put(cluster, record.value, range(3))
        script = Scripted(cluster)
        lost = ConnectionLost(f"{c}: lost (test)")
        script.faults[(c, "read_lac")] = lambda _: lost
        script.faults[(c, "close_ledger")] = lambda _: lost
        closed = await recover(cluster, record.value.ledger_id, through=script)
        assert closed.value.last_entry_id == 2
        old_writer = await cluster.channel_for(c)
        outcomes = await old_writer.add_entries(
            record.value.ledger_id,
            [(3, stored_bytes(record.value.ledger_id, 3))],
            master_key=KEY,
            last_add_confirmed=2,
        )
        assert isinstance(outcomes[0], LedgerFenced | LedgerClosed)


async def test_lesson_2615_recovery_starts_at_the_last_ensembles_first_entry(
    tmp_path: Path,
) -> None:
    """The last ensemble's new member reports LAC -1 and the old ones reported no
    LAC; recovery still starts at that ensemble's first entry, never touching the
    entries before it (here on a node gone for good)."""
    async with local_cluster(tmp_path, nodes=4) as cluster:
        a, b, c, d = cluster.addresses
        record = await make_ledger(cluster, [a, b, c], write_quorum=2, ack_quorum=2)
        await put(cluster, record.value, range(5), lac=lambda _: -1)
        cluster.set_fault(c, Fault.FAIL)  # the failure that made the writer change
        changed = await add_ensemble(cluster, record, 5, [a, b, d])
        closed = await recover(cluster, changed.value.ledger_id)
        assert closed.value.last_entry_id == 4
        assert closed.value.length == length_after(4)


async def test_lesson_1591_an_ensemble_only_in_the_writers_memory_is_not_recovered(
    tmp_path: Path,
) -> None:
    """The writer replaced C by D in memory and stored entries 5 and 6 on D only; the
    compare-and-set of that ensemble never landed. Recovery follows the record: the
    ledger ends at 4, and nothing on D is in it."""
    async with local_cluster(tmp_path, nodes=4) as cluster:
        a, b, c, d = cluster.addresses
        record = await make_ledger(cluster, [a, b, c])
        await put(cluster, record.value, range(5))
        for entry_id in (5, 6):
            await cluster.nodes[d].add_entry(
                record.value.ledger_id,
                entry_id,
                stored_bytes(record.value.ledger_id, entry_id),
                master_key=KEY,
                last_add_confirmed=entry_id - 1,
            )
        cluster.set_fault(c, Fault.FAIL)
        closed = await recover(cluster, record.value.ledger_id)
        assert closed.value.last_entry_id == 4
        assert [e.members for e in closed.value.ensembles] == [record.value.ensembles[0].members]


async def test_lesson_2908_a_corrupt_copy_is_never_absent(tmp_path: Path) -> None:
    """Entry 5 was acknowledged on A and B. B is down, A's copy is corrupt, C never
    had it: counting CORRUPT as "no such entry" would cut the ledger at 4. Recovery
    fails instead, and succeeds with entry 5 once B is back."""
    async with local_cluster(tmp_path, nodes=3) as cluster:
        a, b, _ = cluster.addresses
        record = await make_ledger(cluster)
        await put(cluster, record.value, range(5))
        await put(cluster, record.value, [5], on=[a, b])
        script = Scripted(cluster)
        script.faults[(a, "read_entry")] = lambda entry_id: corrupt() if entry_id == 5 else None
        cluster.set_fault(b, Fault.FAIL)
        with pytest.raises(RecoveryFailed, match="entry 5"):
            await recover(cluster, record.value.ledger_id, through=script)
        assert (await cluster.store.read_ledger(record.value.ledger_id)).value.state is (
            LedgerState.IN_RECOVERY
        )
        cluster.set_fault(b, Fault.NONE)
        closed = await recover(cluster, record.value.ledger_id, through=script)
        assert closed.value.last_entry_id == 5


async def test_lesson_2612_a_wiped_node_is_not_taken_for_one_that_never_had_it(
    tmp_path: Path,
) -> None:
    """Entry 5 was acknowledged on A and B; B's data dir was wiped (a new instance at
    the same address), A is down, C never had it. B's "no such entry" is not absence."""
    async with local_cluster(tmp_path, nodes=3) as cluster:
        a, b, _ = cluster.addresses
        record = await make_ledger(cluster)
        await put(cluster, record.value, range(5))
        await put(cluster, record.value, [5], on=[a, b])
        await cluster.replace_data_dir(b)
        cluster.set_fault(a, Fault.FAIL)
        with pytest.raises(RecoveryFailed, match="instance"):
            await recover(cluster, record.value.ledger_id)
        cluster.set_fault(a, Fault.NONE)
        closed = await recover(cluster, record.value.ledger_id)
        assert closed.value.last_entry_id == 5


async def test_lesson_1067_a_hung_node_does_not_block_recovery(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """C answers nothing at all: two fenced members cover E=3 Qw=3 Qa=2, and two "no
    such entry" answers make entry 5 absent, so recovery ends well before C's timeout."""
    mock_clock.autojump_threshold = 0.5  # jump only when truly stuck (disk syncs run)
    async with local_cluster(tmp_path, nodes=3) as cluster:
        _, _, c = cluster.addresses
        record = await make_ledger(cluster)
        await put(cluster, record.value, range(5))
        cluster.set_fault(c, Fault.HANG)
        started = trio.current_time()
        config = ClientConfig(node_timeout_s=60.0, recovery_fence_timeout_s=120.0)
        closed = await recover(cluster, record.value.ledger_id, config=config)
        assert closed.value.last_entry_id == 4
        assert trio.current_time() - started < config.node_timeout_s


async def test_fencing_short_of_coverage_names_the_write_sets(tmp_path: Path) -> None:
    # real time, short bounds: the fence on the answering node is a journal write
    # (fdatasync in a thread), which an autojump clock would race under load
    config = ClientConfig(node_timeout_s=0.5, recovery_fence_timeout_s=1.0)
    async with local_cluster(tmp_path, nodes=3) as cluster:
        _, b, c = cluster.addresses
        record = await make_ledger(cluster)
        cluster.set_fault(b, Fault.FAIL)
        cluster.set_fault(c, Fault.HANG)
        with pytest.raises(RecoveryFailed, match="fewer than 2 fenced members") as failure:
            await recover(cluster, record.value.ledger_id, config=config)
        assert b in str(failure.value)


async def test_a_member_failing_the_re_adds_is_replaced(tmp_path: Path) -> None:
    """R20: C takes fencing reads but no adds; with Qa = 3 every entry falls short, so
    C is replaced by D (R9) from the first re-added entry, D gets the entries, and the
    record names D only after that."""
    async with local_cluster(tmp_path, nodes=4) as cluster:
        a, b, c, d = cluster.addresses
        record = await make_ledger(cluster, [a, b, c], write_quorum=3, ack_quorum=3)
        await put(cluster, record.value, range(5), lac=lambda _: 1)
        script = Scripted(cluster)
        script.faults[(c, "add_entries")] = lambda _: ConnectionLost(f"{c}: lost (test)")
        closed = await recover(cluster, record.value.ledger_id, through=script)
        assert closed.value.last_entry_id == 4
        ensembles = closed.value.ensembles
        assert [(e.first_entry_id, [m.address for m in e.members]) for e in ensembles] == [
            (0, [a, b, c]),
            (2, [a, b, d]),
        ]
        await assert_on_every_replica(cluster, closed.value)


async def test_no_replacement_for_a_failing_member_fails_the_recovery(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3) as cluster:
        _, _, c = cluster.addresses
        record = await make_ledger(cluster, write_quorum=3, ack_quorum=3)
        await put(cluster, record.value, range(3), lac=lambda _: -1)
        script = Scripted(cluster)
        script.faults[(c, "add_entries")] = lambda _: ConnectionLost(f"{c}: lost (test)")
        with pytest.raises(RecoveryFailed, match="placement needs 1 writable"):
            await recover(cluster, record.value.ledger_id, through=script)
        current = await cluster.store.read_ledger(record.value.ledger_id)
        assert current.value.state is LedgerState.IN_RECOVERY
        assert current.value.ensembles == record.value.ensembles
