"""`NodeSenders`: the client's node calls (`pora/client/node_calls.py`: one queue and
one call per node per turn, shared by every ledger) keyed by ensemble members, and
R8's decision on a node too far behind.

What a node owes (payload bytes queued for it or in flight to it) may exceed
`node_backlog_bytes_max` only by the client's pending payload bytes: beyond that, at
least that much of it was acknowledged elsewhere, so the node is that far behind the
other replicas. The node calls then drop its queue, and the member fails for every
ledger with a batch in it (R8; R9 replaces it). The pending entries among them go
to the replacement (R10); the others stay on their Qa copies, as after any failure.
A uniformly slow cluster never trips it: what is pending is bounded by
`pending_bytes_max`, and appends wait for room.

A call that fails or times out fails that member for every ledger in it (the
ledger's sender, `sender.py`, decides so on the answer, R8); a per-ledger outcome (a
refusal, R13) reaches its ledger only.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from netio.budget import Budget
from pora.client.batch import Batch
from pora.client.node_calls import NodeCaller, NodeCalls, Overflow
from pora.client.node_pool import NodePool
from pora.client.replication.config import ClientConfig
from pora.client.waiting import Event
from pora.meta.records import EnsembleMember

#: what the node senders need of a ledger's sender (`sender.Sender`)
LedgerTurns = NodeCaller[EnsembleMember]


class NodeSenders:
    def __init__(
        self,
        pool: NodePool,
        config: ClientConfig,
        pending_bytes: Budget,
        new_event: Callable[[], Event] = anyio.Event,
    ) -> None:
        calls = self._calls = NodeCalls[EnsembleMember](
            pool,
            calls_in_flight_max=config.calls_in_flight_per_node_max,
            call_bytes_max=config.add_call_bytes_max,
            timeout_s=config.node_timeout_s,
            backlog_bytes_max=config.node_backlog_bytes_max,
            beyond=pending_bytes,
            new_event=new_event,
        )
        self._backlog_max = config.node_backlog_bytes_max
        #: the client's pending payload bytes: what a node may owe that is not yet
        #: acknowledged anywhere
        self.pending_bytes = pending_bytes
        # the node calls' own, bound once (a ledger's sender schedules each turn):
        #: `ledger` has work: its `take_turn` runs in the next dispatch
        self.schedule = calls.schedule
        #: the dispatch task, until `stop`
        self.run = calls.run
        #: end the dispatch and every call in flight (the client is closing)
        self.stop = calls.stop
        #: payload bytes queued for a member or in flight to it
        self.owed_bytes = calls.owed_bytes

    def submit(
        self, ledger: LedgerTurns, member: EnsembleMember, entries: Batch, size: int
    ) -> None:
        """Queue `ledger`'s batch for `member` (from `take_turn`), `size` payload bytes;
        or, when the node would owe more than its bound allows, fail it instead."""
        overflow = self._calls.submit(ledger, member, entries, size)
        if overflow is not None:
            self._too_far_behind(member, overflow)

    def queued_bytes(self, member: EnsembleMember) -> int:
        """Payload bytes queued for `member`, not yet in a call."""
        return self._calls.queued_bytes(member)

    def _too_far_behind(self, member: EnsembleMember, overflow: Overflow[EnsembleMember]) -> None:
        """R8: the node owes more than `node_backlog_bytes_max` of entries acknowledged
        elsewhere: it fails for every ledger with a batch queued for it (the queue is
        dropped; its calls in flight finish or time out as usual)."""
        error = TimeoutError(
            f"node {member.address}: {overflow.owed} bytes of adds owed, more than "
            f"node_backlog_bytes_max ({self._backlog_max}) beyond the client's "
            f"{overflow.beyond} pending: too far behind the other replicas"
        )
        for ledger, entries, _ in overflow.dropped:
            ledger.answer(member, entries, ledger.issued_lac(), error)
            ledger.call_finished()


__all__ = ["LedgerTurns", "NodeSenders"]
