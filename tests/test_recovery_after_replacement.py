"""A recovery after one that replaced a member and died before closing (R17..R20):
the record says which members joined in a recovery and whom they stand in for, so a
later recovery fences and votes on the members the old writer wrote to, never takes a
joined member's "no such entry" for absence, and loses no acknowledged entry.

In-process nodes, states built by hand: the writer's entries are on every member
(Qa = Qw, so each is acknowledged) while the nodes' LAC lags, as a writer with many
appends in flight leaves them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from replicated_ledger_support import KEY, Scripted, make_ledger, put, stored_bytes
from replication_support import Fault, LocalCluster, local_cluster
from test_recovery import CONFIG, assert_on_every_replica, recover

from journal.errors import PoraError
from netio.errors import ConnectionLost
from pora.client.node_channel import NodeChannel
from pora.client.replication.errors import RecoveryFailed
from pora.client.replication.recovery import READ_AHEAD, recover_ledger
from pora.meta.records import LedgerState


def stopped_after_the_first_window(
    cluster: LocalCluster, start: int, failing_adds: list[str]
) -> Scripted:
    """Recovery 1's network: the members at `failing_adds` take fencing reads but no
    adds (so the first re-adds fall short and those members are replaced), and every
    read past the first window (READ_AHEAD entries from `start`) is lost, so the
    recovery dies right after it committed its replacement ensemble, before it
    closes."""
    script = Scripted(cluster)
    for address in failing_adds:
        script.faults[(address, "add_entries")] = lambda _: ConnectionLost("adds lost (test)")
    for address in cluster.addresses:
        script.faults[(address, "read_entry")] = lambda entry_id: (
            ConnectionLost("reads lost (test)") if entry_id >= start + READ_AHEAD else None
        )
    return script


class AnswersFirst:
    """A recovery's network where the node at `first` answers each entry read before
    the others do (the others' reads of an entry wait until it answered that entry):
    a node that holds nothing says so fastest, and its answer must not decide."""

    def __init__(self, cluster: LocalCluster, first: str) -> None:
        self.cluster = cluster
        self.first = first
        self.answered: dict[int, trio.Event] = {}

    async def channel_for(self, address: str) -> NodeChannel:
        return _AnswersFirstChannel(self, await self.cluster.channel_for(address))


class _AnswersFirstChannel:
    def __init__(self, order: AnswersFirst, inner: NodeChannel) -> None:
        self._order = order
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def read_entry(self, ledger_id: int, entry_id: int, **options: Any) -> tuple[bytes, int]:
        answered = self._order.answered.setdefault(entry_id, trio.Event())
        if self._inner.address != self._order.first:
            await answered.wait()
            return await self._inner.read_entry(ledger_id, entry_id, **options)
        try:
            return await self._inner.read_entry(ledger_id, entry_id, **options)
        finally:
            answered.set()


@pytest.mark.parametrize("lac_cap", [-1, 9], ids=["same-first-entry", "later-first-entry"])
async def test_a_second_recovery_keeps_what_a_replaced_member_held(
    tmp_path: Path, lac_cap: int
) -> None:
    """E=3 Qw=3 Qa=3 on X, S1, S2 (R spare): 40 entries acknowledged, the nodes'
    LAC at `lac_cap`. Recovery 1 cannot add to X, replaces it by R from the first
    entry it re-adds (the writer's ensemble's own first entry, or a later one), and
    dies. Recovery 2, X still unreachable, must recover all 40: R holds only what
    recovery 1 gave it, and its "no such entry" proves nothing."""
    async with local_cluster(tmp_path, nodes=4) as cluster:
        x, s1, s2, r = cluster.addresses
        record = await make_ledger(cluster, [x, s1, s2], write_quorum=3, ack_quorum=3)
        ledger_id = record.value.ledger_id
        await put(cluster, record.value, range(40), lac=lambda e: min(e - 1, lac_cap))
        with pytest.raises(RecoveryFailed):
            await recover(
                cluster,
                ledger_id,
                through=stopped_after_the_first_window(cluster, lac_cap + 1, [x]),
            )
        died = (await cluster.store.read_ledger(ledger_id)).value
        assert died.state is LedgerState.IN_RECOVERY
        last = died.ensembles[-1]
        assert [m.address for m in last.members] == [r, s1, s2]
        assert last.first_entry_id == lac_cap + 1
        # the writer's members stay in the record, whatever the recovery ensemble's start
        assert [m.address for m in died.writer_view().ensembles[-1].members] == [x, s1, s2]

        cluster.set_fault(x, Fault.FAIL)
        closed = await recover_ledger(
            cluster.store, AnswersFirst(cluster, r).channel_for, CONFIG, ledger_id, KEY
        )
        assert (closed.value.last_entry_id, closed.value.state) == (39, LedgerState.CLOSED)
        await assert_on_every_replica(cluster, closed.value)


async def test_a_second_recovery_with_qa_below_qw_fences_and_votes_on_the_writers_members(
    tmp_path: Path,
) -> None:
    """E=3 Qw=3 Qa=2 on X, S1, S2 (R1, R2 spare). Recovery 1 cannot add to X or S1,
    replaces both, and dies. Recovery 2 cannot reach S2: R1 and R2 (two "no such
    entry" answers, Qw - Qa + 1) must not end the ledger; it fences and votes on X and
    S1, the old writer's, and recovers all 20 entries. The old writer's next entry is
    acknowledged by fewer than Qa of its members (recovery 1's fence already stopped
    it; recovery 2's, on the writer's members, keeps it so)."""
    async with local_cluster(tmp_path, nodes=5) as cluster:
        x, s1, s2, r1, r2 = cluster.addresses
        record = await make_ledger(cluster, [x, s1, s2], write_quorum=3, ack_quorum=2)
        ledger_id = record.value.ledger_id
        await put(cluster, record.value, range(20), lac=lambda _: -1)
        with pytest.raises(RecoveryFailed):
            await recover(
                cluster, ledger_id, through=stopped_after_the_first_window(cluster, 0, [x, s1])
            )
        died = (await cluster.store.read_ledger(ledger_id)).value
        assert {m.address for m in died.ensembles[-1].members} == {r1, r2, s2}

        cluster.set_fault(s2, Fault.FAIL)
        closed = await recover(cluster, ledger_id)
        # the zombie writer's next entry, sent to the members it knows
        acknowledged = []
        for address in (x, s1, s2):
            try:
                await cluster.nodes[address].add_entry(
                    ledger_id,
                    20,
                    stored_bytes(ledger_id, 20),
                    master_key=KEY,
                    last_add_confirmed=19,
                )
            except PoraError:
                continue
            acknowledged.append(address)
        assert len(acknowledged) < record.value.ack_quorum, acknowledged
        assert closed.value.last_entry_id == 19
