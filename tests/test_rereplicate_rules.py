"""The re-replication rules (docs/rereplication.md) on their own: what is
under-replicated (A1..A3), the record change (A7..A9, A12), the throttle (A15), and a
live writer whose earlier fragment a worker repairs while it changes its ensemble and
closes (A9: the writer re-reads on its conflict and keeps the repair), and a stream's
open segment taken over by the stream's rules past the grace, then repaired (A11)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio
from replicated_ledger_support import PASSWORD, length_after, make_ledger, put, stored_bytes
from replication_support import local_cluster
from writer_support import client_on

import pora
from pora.client.replication.config import ClientConfig
from pora.client.replication.core.ledger_records import closed_at
from pora.cluster_ops.audit import audit
from pora.cluster_ops.fragments import (
    MISSING_ENTRIES,
    OTHER_INSTANCE,
    UNREGISTERED,
    count_held,
    entries_held,
    fragments_of,
    lost_members,
)
from pora.cluster_ops.record_change import with_members_replaced
from pora.cluster_ops.throttle import Throttle
from pora.cluster_ops.worker import Rereplicator, WorkerOptions
from pora.meta.records import (
    Ensemble,
    EnsembleMember,
    LedgerMetadata,
    LedgerState,
    NodeRegistration,
)
from pora.meta.store import MetadataStore

A, B, C, D, E = (EnsembleMember(f"n{k}:1", f"i{k}") for k in range(5))


def record(state: LedgerState = LedgerState.CLOSED, last: int = 29) -> LedgerMetadata:
    meta = LedgerMetadata(
        ledger_id=5,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        ensembles=(Ensemble(0, (A, B, C)), Ensemble(20, (A, B, D))),
        password_digest=b"",
        created_ms=0,
    )
    return meta.closed(last, 100) if state is LedgerState.CLOSED else replace(meta, state=state)


def live(*members: EnsembleMember) -> dict[str, NodeRegistration]:
    return {m.address: NodeRegistration(m.address, m.instance_id) for m in members}


def test_fragments_and_what_each_position_holds() -> None:
    closed = fragments_of(record())
    assert [(f.first_entry_id, f.last_entry_id) for f in closed] == [(0, 19), (20, 29)]
    opened = fragments_of(record(LedgerState.OPEN))
    assert [(f.first_entry_id, f.last_entry_id) for f in opened] == [(0, 19), (20, None)]
    # A3: a closed ledger's empty last fragment holds nothing
    assert [f.first_entry_id for f in fragments_of(record(last=19))] == [0]
    # R3 with E=3 Qw=2: position 0 holds ids 0, 2, 3, 5, 6, ...
    assert list(entries_held(0, 8, 0, 3, 2)) == [0, 2, 3, 5, 6, 8]
    for first, last in [(0, 19), (3, 3), (7, 100), (5, 4)]:
        for position in range(3):
            expected = len(list(entries_held(first, last, position, 3, 2)))
            assert count_held(first, last, position, 3, 2) == expected


def test_lost_members_name_the_fragments_a_node_held() -> None:
    wiped = EnsembleMember(C.address, "another")
    found = lost_members(record(), live(A, B, wiped, D))
    assert [(m.fragment.first_entry_id, m.member, m.why) for m in found] == [(0, C, OTHER_INSTANCE)]
    assert (found[0].entries_at_risk, found[0].copies_left) == (count_held(0, 19, 2, 3, 2), 1)
    found = lost_members(record(LedgerState.OPEN), live(B, C, D))
    assert [(m.fragment.first_entry_id, m.why, m.entries_at_risk) for m in found] == [
        (0, UNREGISTERED, count_held(0, 19, 0, 3, 2)),
        (20, UNREGISTERED, None),  # an open end: not yet known
    ]


def test_the_record_change_applies_only_while_it_is_a_repair() -> None:
    changed = with_members_replaced(record(), 0, {2: (C, E)})
    assert changed is not None and changed.ensembles[0].members == (A, B, E)
    assert changed.ensembles[1] == record().ensembles[1]
    assert with_members_replaced(record(), 0, {2: (D, E)}) is None  # another member now
    assert with_members_replaced(record(), 7, {2: (C, E)}) is None  # no such fragment
    opened = record(LedgerState.OPEN)
    assert with_members_replaced(opened, 0, {2: (C, E)}) is not None  # A9
    assert with_members_replaced(opened, 20, {2: (D, E)}) is None  # A10: the open end
    assert with_members_replaced(record(LedgerState.IN_RECOVERY), 0, {2: (C, E)}) is None
    # A8: a position that stands for a writer's member keeps standing for it
    joined = replace(record(), ensembles=(Ensemble(0, (A, B, D), ((2, C),)),))
    joined = replace(joined, last_entry_id=19)
    again = with_members_replaced(joined, 0, {2: (D, E)})
    assert again is not None and again.ensembles[0].stands_for == ((2, C),)
    back = with_members_replaced(joined, 0, {2: (D, C)})
    assert back is not None and back.ensembles[0].stands_for == ()


async def test_the_throttle_holds_the_rate(autojump_clock: trio.abc.Clock) -> None:
    throttle = Throttle(entries_per_s=100, bytes_per_s=1000)
    start = trio.current_time()
    for _ in range(10):
        await throttle.take(50, 100)  # 500 entries: the entry rate binds
    assert 4.0 <= trio.current_time() - start <= 5.0
    await Throttle().take(10**9, 10**12)  # no bound: no wait


async def test_the_throttle_never_lets_a_burst_run_past_a_tenth_of_a_second(
    autojump_clock: trio.abc.Clock,
) -> None:
    # A15: after an idle while, a throttled copy sends at most a tenth of a second's
    # worth at full speed; batches are cut to that, and the average rate still holds
    throttle = Throttle(entries_per_s=1000, bytes_per_s=100_000)
    batch = [(entry_id, bytes(200)) for entry_id in range(1000)]  # 1 s of entries, 2 s of bytes
    pieces = throttle.cut(batch)
    assert [entry for piece in pieces for entry in piece] == batch  # all, in order
    assert all(sum(len(data) for _, data in piece) <= 10_000 for piece in pieces)
    assert all(len(piece) <= 100 for piece in pieces)
    await trio.sleep(60)  # idle: the bucket refills to one burst, no more
    start = trio.current_time()
    sent_at = []
    for piece in pieces:
        await throttle.take(len(piece), sum(len(data) for _, data in piece))
        sent_at.append(trio.current_time() - start)
    assert sent_at[0] == 0  # the first burst goes at once
    assert sent_at[1] > 0  # the second waits: nothing saved up beyond a burst
    assert 1.8 <= sent_at[-1] <= 2.0  # 200 KB at 100 KB/s, less the burst
    assert Throttle().cut(batch) == [batch]  # no bound: no cut
    assert Throttle(bytes_per_s=1).cut(batch[:3]) == [batch[0:1], batch[1:2], batch[2:3]]


async def changed_off(store: MetadataStore, ledger_id: int, member: EnsembleMember) -> None:
    """Back once the record's last ensemble no longer names `member` (the writer's
    ensemble change landed: appends are acknowledged by Qa before it does)."""
    async for record in store.watch_ledger(ledger_id, after_version=-1):
        if member not in record.value.ensembles[-1].members:
            return


async def test_a_live_writer_keeps_a_repair_made_under_it(tmp_path: Path) -> None:
    """A9: a worker replaces the lost member of a live writer's earlier fragment;
    the writer's next ensemble change conflicts with it, re-reads, and keeps it, and
    so does its close."""
    async with (
        local_cluster(tmp_path, nodes=5) as cluster,
        client_on(cluster, node_timeout_s=2.0) as client,
    ):
        ledger = await client.create_ledger(3, 3, 2)
        payloads = [b"entry %d" % k for k in range(60)]
        await ledger.append_many(payloads[:20])
        first = ledger.metadata.ensembles[0].members
        await cluster.stop_node(first[0].address)  # lost: the writer moves off it
        await ledger.append_many(payloads[20:40])
        await changed_off(cluster.store, ledger.ledger_id, first[0])
        events: list[dict[str, object]] = []
        worker = Rereplicator(
            cluster.store, cluster.channel_for, ClientConfig(), WorkerOptions(), events.append
        )
        await worker.run_once()
        assert [e["event"] for e in events] == ["repaired"]
        repaired = (await cluster.store.read_ledger(ledger.ledger_id)).value.ensembles[0]
        assert first[0] not in repaired.members
        # the writer still holds the version before the repair: its change conflicts
        current = ledger.metadata.ensembles[-1].members
        await cluster.stop_node(current[1].address)
        await ledger.append_many(payloads[40:])
        await changed_off(cluster.store, ledger.ledger_id, current[1])
        await ledger.close()
        closed = (await cluster.store.read_ledger(ledger.ledger_id)).value
        assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 59
        assert closed.ensembles[0] == repaired  # the repair stays
        assert current[1] not in closed.ensembles[-1].members
        reader = await client.open_ledger(ledger.ledger_id)
        assert [p async for _, p in reader.read_entries(0, 59)] == payloads


async def test_deep_audit_finds_a_live_member_short_of_entries_and_refills_it(
    tmp_path: Path,
) -> None:
    """A1 with --deep: a member registered with its own instance id that lacks entries
    its position holds is listed (the plain audit cannot see it), and a deep worker
    copies them to it in place, the record unchanged."""
    async with local_cluster(tmp_path, nodes=4) as cluster:
        a, b, c, _ = cluster.addresses
        made = await make_ledger(cluster, [a, b, c], write_quorum=3, ack_quorum=2)
        await put(cluster, made.value, range(30))
        await put(cluster, made.value, range(30, 40), on=[a, b])  # c never got them
        closed = await cluster.store.update_ledger(
            closed_at(made.value, 39, length_after(39)), made.version
        )
        assert (await audit(cluster.store)).findings == []
        deep = await audit(cluster.store, deep=True, channel_for=cluster.channel_for)
        assert [
            (f.lost.member.address, f.lost.why, f.lost.entries_at_risk, f.lost.copies_left)
            for f in deep.findings
        ] == [(c, MISSING_ENTRIES, 10, 2)]
        events: list[dict[str, object]] = []
        options = WorkerOptions(password=PASSWORD, deep=True)
        worker = Rereplicator(
            cluster.store, cluster.channel_for, ClientConfig(), options, events.append
        )
        await worker.run_once()
        assert [(e["event"], e["refilled"], e["entries_copied"]) for e in events] == [
            ("repaired", [c], 10)
        ]
        assert (await cluster.store.read_ledger(made.value.ledger_id)) == closed
        again = await audit(cluster.store, deep=True, channel_for=cluster.channel_for)
        assert again.findings == []
        for entry_id in range(30, 40):
            data = await cluster.nodes[c].read_entry(made.value.ledger_id, entry_id)
            assert bytes(data) == stored_bytes(made.value.ledger_id, entry_id)


async def test_an_open_stream_segment_past_its_grace_is_taken_over_and_repaired(
    tmp_path: Path,
) -> None:
    """A11: a stream's open segment whose last fragment lost a member is taken over by
    the stream's own rules once the grace is past: the writer, idle all along, is
    fenced (WriterFenced at its next append), the segment closed where it ends and
    repaired in the same run, and a new writer appends after it."""
    async with (
        local_cluster(tmp_path, nodes=5) as cluster,
        client_on(cluster, node_timeout_s=2.0) as client,
    ):
        stream = await client.create_stream("events", 3, 3, 2)
        payloads = [b"entry %d" % k for k in range(30)]
        async with stream.open_writer() as idle_writer:
            positions = await idle_writer.append_many(payloads)
            segment = (await stream.info()).segments[-1]
            ensemble = (await cluster.store.read_ledger(segment.ledger_id)).value.ensembles
            lost = ensemble[-1].members[0]
            await cluster.stop_node(lost.address)
            events: list[dict[str, object]] = []
            worker = Rereplicator(
                cluster.store,
                cluster.channel_for,
                ClientConfig(node_timeout_s=2.0),
                WorkerOptions(open_grace_s=0.0),
                events.append,
            )
            await worker.run_once()
            assert [(e["event"], e["ledger"]) for e in events] == [
                ("recovered", segment.ledger_id),
                ("repaired", segment.ledger_id),
            ]
            assert events[0]["stream"] == "events"
            with pytest.raises(pora.WriterFenced):
                await idle_writer.append(b"too late")
        closed = (await cluster.store.read_ledger(segment.ledger_id)).value
        assert closed.state is LedgerState.CLOSED and closed.last_entry_id == 29
        assert all(lost not in e.members for e in closed.ensembles)
        assert (await audit(cluster.store)).findings == []
        async with stream.open_writer() as next_writer:
            later = await next_writer.append(b"after")
        read = [item async for item in stream.read()]
        assert read == [*zip(positions, payloads, strict=True), (later, b"after")]
