"""`NodeSenders`: one sender per node, shared by every ledger of a client (R3, R4, R8).

Each scheduler turn, the ledgers with entries queued (or resends, R10) hand their
per-member batches to the member's node queue; the client's one dispatch task wakes
once per turn, takes every ledger's turn and then starts, for each node with work,
ONE `add_entries_many` call carrying every ledger's batch for that node. So a turn
costs per node, not per ledger and per node: one task, one deadline
(`node_timeout_s`), one wait on the channel.

Calls in flight per node are bounded by `calls_in_flight_per_node_max` with a
counter: a node at its bound keeps its batches queued, and the call that finishes
next takes them, up to `add_call_bytes_max` (no semaphore per call). Answers go
back to each ledger's sender as plain calls (`LedgerTurns.answer`), which feed its
`PendingAdds` in bulk; a call that fails or times out fails that member for every
ledger in it, a per-ledger outcome (a refusal, R13) reaches its ledger only.

What a node owes (payload bytes queued for it or in flight to it) is counted per
batch, not per entry. When it would owe more than `node_backlog_bytes_max` beyond
the client's pending payload bytes, at least that much of it was acknowledged
elsewhere: the node is that far behind the other replicas, and it fails for every
ledger with a batch queued for it (R8; R9 replaces it) and its queue is dropped.
The pending entries among them go to the replacement (R10); the others stay on
their Qa copies, as after any failure. A uniformly slow cluster never trips it:
what is pending is bounded by `pending_bytes_max`, and appends wait for room.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import anyio
import anyio.abc

from journal.errors import PoraError
from netio.budget import Budget
from pora.client.node_channel import AddAnswer, AddRequest
from pora.client.node_pool import NodePool
from pora.client.replication.config import ClientConfig
from pora.client.waiting import Event
from pora.meta.records import EnsembleMember

Batch = list[tuple[int, bytes]]
#: a ledger's batch for a node as queued: the ledger, its entries, their bytes
Queued = tuple["LedgerTurns", Batch, int]


class LedgerTurns(Protocol):
    """What a node sender needs of a ledger's sender (`sender.Sender`)."""

    @property
    def ledger_id(self) -> int: ...

    @property
    def master_key(self) -> bytes: ...

    def take_turn(self) -> None:
        """Hand this turn's batches to `NodeSenders.submit`."""

    def sends_to(self, member: EnsembleMember) -> bool:
        """Whether a batch queued for `member` is still to be sent (not replaced or
        fenced meanwhile: a replacement was sent those entries, R10)."""

    def issued_lac(self) -> int:
        """The LAC to piggyback on a call starting now (R4, R7)."""

    def answer(self, member: EnsembleMember, entries: Batch, lac: int, answer: AddAnswer) -> None:
        """The call's outcome for this ledger's batch (an error: the member failed)."""

    def call_finished(self) -> None:
        """One batch submitted is done with (answered, failed or dropped)."""


class _NodeQueue:
    __slots__ = ("idle", "member", "owed", "queued", "workers")

    def __init__(self, member: EnsembleMember) -> None:
        self.member = member
        self.queued: list[Queued] = []
        self.workers = 0  # worker tasks of the node: its calls in flight, at most
        self.idle: list[Event] = []  # the wake-ups of its workers waiting for work
        self.owed = 0  # payload bytes queued for the node or in flight to it


class NodeSenders:
    def __init__(
        self,
        pool: NodePool,
        config: ClientConfig,
        pending_bytes: Budget,
        new_event: Callable[[], Event] = anyio.Event,
    ) -> None:
        self._pool = pool
        self._new_event = new_event
        self._config = config
        #: the client's pending payload bytes: what a node may owe that is not yet
        #: acknowledged anywhere
        self.pending_bytes = pending_bytes
        self._backlog_max = config.node_backlog_bytes_max
        self._nodes: dict[EnsembleMember, _NodeQueue] = {}
        self._due: list[LedgerTurns] = []  # ledgers with a turn to take
        self._touched: list[_NodeQueue] = []  # nodes given work this turn
        self._wake = new_event()
        self._scope: anyio.CancelScope | None = None
        self._stopped = False

    def schedule(self, ledger: LedgerTurns) -> None:
        """`ledger` has work: its `take_turn` runs in the next dispatch (the caller asks
        once per turn)."""
        self._due.append(ledger)
        if not self._wake.is_set():
            self._wake.set()

    def submit(
        self, ledger: LedgerTurns, member: EnsembleMember, entries: Batch, size: int
    ) -> None:
        """Queue `ledger`'s batch for `member` (from `take_turn`), `size` payload bytes;
        or, when the node would owe more than its bound allows, fail it instead."""
        node = self._nodes.get(member)
        if node is None:
            node = self._nodes[member] = _NodeQueue(member)
        owed = node.owed + size
        if owed - self.pending_bytes.used > self._backlog_max:
            self._too_far_behind(node, (ledger, entries, size))
            return
        node.owed = owed
        if not node.queued:
            self._touched.append(node)
        node.queued.append((ledger, entries, size))

    def owed_bytes(self, member: EnsembleMember) -> int:
        """Payload bytes queued for `member` or in flight to it."""
        node = self._nodes.get(member)
        return 0 if node is None else node.owed

    def _too_far_behind(self, node: _NodeQueue, last: Queued) -> None:
        """R8: the node owes more than `node_backlog_bytes_max` of entries acknowledged
        elsewhere: it fails for every ledger with a batch queued for it, and the queue
        is dropped (its calls in flight finish or time out as usual)."""
        dropped, node.queued = [*node.queued, last], []
        owed = node.owed + last[2]
        node.owed -= sum(size for _, _, size in dropped[:-1])  # what is in flight stays
        error = TimeoutError(
            f"node {node.member.address}: {owed} bytes of adds owed, more than "
            f"node_backlog_bytes_max ({self._backlog_max}) beyond the client's "
            f"{self.pending_bytes.used} pending: too far behind the other replicas"
        )
        for ledger, entries, _ in dropped:
            ledger.answer(node.member, entries, ledger.issued_lac(), error)
            ledger.call_finished()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The dispatch, once per turn with work, until `stop`: an idle worker of each
        node given work is woken, or a new one started below the node's bound (at the
        bound, the next worker to finish takes the batches)."""
        limit = self._config.calls_in_flight_per_node_max
        async with anyio.create_task_group() as tasks:
            self._scope = tasks.cancel_scope
            if self._stopped:  # stopped before this task first ran (a client left at once)
                tasks.cancel_scope.cancel()
            task_status.started()
            while True:
                await self._wake.wait()
                self._wake = self._new_event()
                due, self._due = self._due, []
                for ledger in due:
                    ledger.take_turn()
                touched, self._touched = self._touched, []
                for node in touched:
                    if not node.queued:
                        continue
                    if node.idle:
                        node.idle.pop().set()
                    elif node.workers < limit:
                        node.workers += 1
                        tasks.start_soon(self._worker, node)

    def stop(self) -> None:
        """End the dispatch and every call in flight (the client is closing)."""
        self._stopped = True
        if self._scope is not None:
            self._scope.cancel()

    async def _worker(self, node: _NodeQueue) -> None:
        """One call in flight to `node` at a time, for as long as the client runs. Its
        calls share one cancel scope, given a deadline per call (R8: `node_timeout_s`);
        a call past it fails its ledgers' member and the worker goes on in a new
        scope."""
        try:
            while True:
                with anyio.CancelScope() as scope:
                    await self._serve(node, scope)
        finally:
            node.workers -= 1

    async def _serve(self, node: _NodeQueue, scope: anyio.CancelScope) -> None:
        call_max = self._config.add_call_bytes_max
        while True:
            while node.queued:
                queued = node.queued
                size = 0
                cut = 0
                while cut < len(queued) and (cut == 0 or size + queued[cut][2] <= call_max):
                    size += queued[cut][2]
                    cut += 1
                if cut == len(queued):
                    batch, node.queued = queued, []
                else:
                    batch, node.queued = queued[:cut], queued[cut:]
                if node.queued and node.idle:  # the rest to another worker, if idle
                    node.idle.pop().set()
                try:
                    await self._issue(node.member, batch, scope)
                finally:
                    node.owed -= size
            wake = self._new_event()
            node.idle.append(wake)
            try:
                await wake.wait()
            finally:
                if not wake.is_set():  # cancelled while idle
                    node.idle.remove(wake)

    async def _issue(
        self,
        member: EnsembleMember,
        batch: list[Queued],
        scope: anyio.CancelScope,
    ) -> None:
        live = [(ledger, entries) for ledger, entries, _ in batch if ledger.sends_to(member)]
        lacs = [ledger.issued_lac() for ledger, _ in live]
        try:
            if not live:
                return
            requests = [
                AddRequest(ledger.ledger_id, entries, ledger.master_key, lac)
                for (ledger, entries), lac in zip(live, lacs, strict=True)
            ]
            scope.deadline = anyio.current_time() + self._config.node_timeout_s
            answers = await self._call(member, requests)
            scope.deadline = math.inf
            for index, (ledger, entries) in enumerate(live):
                answer = answers if isinstance(answers, BaseException) else answers[index]
                ledger.answer(member, entries, lacs[index], answer)
        except anyio.get_cancelled_exc_class():
            if scope.cancel_called:  # past the deadline, not the client closing
                timeout_s = self._config.node_timeout_s
                late = TimeoutError(f"node {member.address}: no answer to adds in {timeout_s} s")
                for index, (ledger, entries) in enumerate(live):
                    ledger.answer(member, entries, lacs[index], late)
            raise
        finally:
            for ledger, _, _ in batch:
                ledger.call_finished()

    async def _call(
        self, member: EnsembleMember, requests: Sequence[AddRequest]
    ) -> list[AddAnswer] | PoraError | OSError:
        """One call for every ledger's batch: the answers, or what failed them all."""
        try:
            channel = await self._pool.channel(member.address)
            return await channel.add_entries_many(
                requests, instance_id=member.instance_id, timeout_s=self._config.node_timeout_s
            )
        except (PoraError, OSError) as error:
            return error


__all__ = ["LedgerTurns", "NodeSenders"]
