"""The client's node calls (`pora/client/node_calls.py`: one queue and one call per
node per turn, shared by every ledger) as the replicating client sets them up, and
R8's decision on a node too far behind, which they call on an overflow.

What a node owes (payload bytes queued for it or in flight to it) may exceed
`node_backlog_bytes_max` only by the client's pending payload bytes: beyond that, at
least that much of it was acknowledged elsewhere, so the node is that far behind the
other replicas. The node calls then drop its queue, and the member fails for every
ledger with a batch in it (R8; R9 replaces it). The pending entries among them go
to the replacement (R10); the others stay on their Qa copies, as after any failure.
A uniformly slow cluster never trips it: what is pending is bounded by
`pending_bytes_max`, and appends wait for room.

A call that fails or times out fails that member for every ledger in it (the
ledger's writer, `writer.py`, decides so on the answer, R8); a per-ledger outcome (a
refusal, R13) reaches its ledger only.
"""

from __future__ import annotations

from collections.abc import Callable

from netio.budget import Budget
from pora.client.node_calls import NodeCalls, Overflow
from pora.client.node_pool import NodePool
from pora.client.replication.config import ClientConfig
from pora.client.waiting import Event
from pora.meta.records import EnsembleMember


def client_node_calls(
    pool: NodePool, config: ClientConfig, pending_bytes: Budget, new_event: Callable[[], Event]
) -> NodeCalls[EnsembleMember]:
    """The node calls a client's ledgers share, bounded by `config`, a node's backlog
    by `node_backlog_bytes_max` beyond the client's `pending_bytes` (R8)."""
    backlog_max = config.node_backlog_bytes_max

    def too_far_behind(member: EnsembleMember, overflow: Overflow[EnsembleMember]) -> None:
        """R8: the node owes more than `node_backlog_bytes_max` of entries acknowledged
        elsewhere: it fails for every ledger with a batch queued for it (the queue is
        dropped; its calls in flight finish or time out as usual)."""
        error = TimeoutError(
            f"node {member.address}: {overflow.owed} bytes of adds owed, more than "
            f"node_backlog_bytes_max ({backlog_max}) beyond the client's "
            f"{overflow.beyond} pending: too far behind the other replicas"
        )
        for ledger, its_member, entries, _ in overflow.dropped:
            ledger.answer(its_member, entries, ledger.issued_lac(), error)
            ledger.call_finished()

    return NodeCalls[EnsembleMember](
        pool,
        calls_in_flight_max=config.calls_in_flight_per_node_max,
        call_bytes_max=config.add_call_bytes_max,
        timeout_s=config.node_timeout_s,
        backlog_bytes_max=backlog_max,
        beyond=pending_bytes,
        on_overflow=too_far_behind,
        new_event=new_event,
    )


__all__ = ["client_node_calls"]
