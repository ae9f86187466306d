"""`NodeCalls`: one queue of add batches per node, shared by every ledger of a client,
and the calls that carry them: the per-node side of the replicating client's sends.

Each scheduler turn, the callers with work (a ledger's sender) hand their batches
for each node to `submit`; the one dispatch task (`run`) wakes once per turn, takes
every due caller's turn and then makes, for each node with work, ONE call carrying
every caller's batch for that node. So a turn costs per node, not per ledger and
per node.

A call is posted on the node's channel (`NodeChannel.post_adds`): no task waits for
it, and its answers come back as a callback (`_Call.answered`, run by the
connection's reader, its loss or its deadline sweep), which gives each caller its
answer and makes the node's next call from what is queued. When the channel cannot
take a call without a wait (not connected yet, the node's identity not known yet, no
room on the connection), a task of its own makes it with `add_entries_many` and
waits, within `timeout_s`; its end is the same callback.

Calls in flight per node are bounded by `calls_in_flight_max` with a counter: a
node at its bound keeps its batches queued, and the call that ends next takes
them, up to `call_bytes_max` (no semaphore per call). Answers go back to each
caller as plain calls (`NodeCaller.answer`); a call that fails or times out gives
that error to every caller in it.

What a node owes (payload bytes queued for it or in flight to it) is counted per
batch. The backlog is bounded: a batch that would make a node owe more than
`backlog_bytes_max` beyond what `beyond` (a budget of the callers') holds is not
queued; the node's queue is dropped instead and handed to `on_overflow`
(`Overflow`), which the owner of the node calls gives and which decides what it
means (replication's R8: `replication/backlog.py`).

This module knows nodes only as an address and an instance id, and callers only
through `NodeCaller`: it imports nothing of replication or of the metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Generic, NamedTuple, Protocol, TypeVar

import anyio
import anyio.abc

from journal.errors import PoraError
from netio.budget import Budget
from pora.client.batch import Batch
from pora.client.node_channel import AddAnswer, AddRequest
from pora.client.node_pool import NodePool
from pora.client.waiting import Event


class CalledNode(Hashable, Protocol):
    """A node calls go to: its address, and the instance id it must answer from."""

    @property
    def address(self) -> str: ...

    @property
    def instance_id(self) -> str: ...


Node = TypeVar("Node", bound=CalledNode)
Node_contra = TypeVar("Node_contra", bound=CalledNode, contravariant=True)


class NodeCaller(Protocol[Node_contra]):
    """What the node calls need of a caller (a ledger's writer, `replication/writer.py`)."""

    def take_turn(self) -> None:
        """Hand this turn's batches to `NodeCalls.submit`."""

    def sends_to(self, node: Node_contra) -> bool:
        """Whether a batch queued for `node` is still to be sent when its call starts."""

    def issued_lac(self) -> int:
        """The LAC to piggyback on a call starting now."""

    def add_request(self, entries: Batch) -> AddRequest:
        """`entries` as the caller's request in a call starting now: its ledger, its
        key and the LAC to piggyback (`issued_lac`)."""

    def answer(self, node: Node_contra, entries: Batch, lac: int, answer: AddAnswer) -> None:
        """The call's outcome for this caller's batch (an error: the call failed)."""

    def call_finished(self) -> None:
        """One batch submitted is done with (answered, failed or dropped)."""


#: a caller's batch for a node as queued: the caller, the node as the caller named
#: it, its entries, their bytes. The caller is given back its own node object (the
#: queue's is another ledger's, equal): its lookups then match by identity, without
#: calling a dataclass's `__eq__` (which makes two tuples) per lookup
Queued = tuple[NodeCaller[Node], Node, Batch, int]


class Overflow(NamedTuple, Generic[Node]):
    """A node's queue dropped because a batch would have made it owe `owed` bytes,
    more than the bound allows beyond `beyond` bytes: the batches dropped, the one
    refused last. Their callers are owed an answer and a `call_finished` each, which
    `on_overflow` gives them."""

    dropped: list[Queued[Node]]
    owed: int
    beyond: int


class _NodeQueue(Generic[Node]):
    __slots__ = ("busy", "node", "owed", "queued")

    def __init__(self, node: Node) -> None:
        self.node = node
        self.queued: list[Queued[Node]] = []
        self.busy = 0  # calls in flight to the node, posted or awaited
        self.owed = 0  # payload bytes queued for the node or in flight to it


class _Call(Generic[Node]):
    """One call to a node: the batches it took from the queue (`size` payload bytes)
    and, of those, the ones it carries (`live`, the batches of the callers that still
    send to the node: often all of them, the same list) with each one's request."""

    __slots__ = ("batch", "calls", "live", "queue", "requests", "size", "stopped")

    def __init__(
        self,
        calls: NodeCalls[Node],
        queue: _NodeQueue[Node],
        batch: list[Queued[Node]],
        size: int,
        live: list[Queued[Node]],
        requests: list[AddRequest],
    ) -> None:
        self.calls = calls
        self.queue = queue
        self.batch = batch
        self.size = size
        self.live = live
        self.requests = requests
        self.stopped = False  # the client closed: its callers were told it finished

    def answered(self, answers: Sequence[AddAnswer] | PoraError | OSError) -> None:
        """The call's end: each caller's answer (an error: every caller's), the
        callers told the call finished, and the node's next call made. A posted
        call's `on_answers` (the call itself, `__call__`); the awaiting path calls
        it too."""
        if self.stopped:
            return
        calls = self.calls
        queue = self.queue
        requests = self.requests
        for index, (caller, node, entries, _) in enumerate(self.live):
            answer = answers if isinstance(answers, BaseException) else answers[index]
            caller.answer(node, entries, requests[index].last_add_confirmed, answer)
        calls.ended(self)
        calls.send_queued(queue)

    #: posted as the answers' callback itself: no bound method is made per call
    __call__ = answered


class NodeCalls(Generic[Node]):
    def __init__(
        self,
        pool: NodePool,
        *,
        calls_in_flight_max: int,
        call_bytes_max: int,
        timeout_s: float,
        backlog_bytes_max: int,
        beyond: Budget,
        on_overflow: Callable[[Node, Overflow[Node]], None],
        new_event: Callable[[], Event] = anyio.Event,
    ) -> None:
        self._pool = pool
        self._on_overflow = on_overflow
        self._new_event = new_event
        self._calls_in_flight_max = calls_in_flight_max
        self._call_bytes_max = call_bytes_max
        self._timeout_s = timeout_s
        self._backlog_max = backlog_bytes_max
        #: what a node may owe on top of the backlog bound: bytes not yet acknowledged
        #: anywhere, as the callers count them
        self.beyond = beyond
        self._nodes: dict[Node, _NodeQueue[Node]] = {}
        self._due: list[NodeCaller[Node]] = []  # callers with a turn to take
        self._touched: list[_NodeQueue[Node]] = []  # nodes given work this turn
        #: the calls in flight (an ordered set: `stop` ends them in the order made)
        self._in_flight: dict[_Call[Node], None] = {}
        self._wake = new_event()
        self._tasks: anyio.abc.TaskGroup | None = None
        self._stopped = False

    def schedule(self, caller: NodeCaller[Node]) -> None:
        """`caller` has work: its `take_turn` runs in the next dispatch (the caller asks
        once per turn)."""
        self._due.append(caller)
        if not self._wake.is_set():
            self._wake.set()

    def submit(self, caller: NodeCaller[Node], node: Node, entries: Batch, size: int) -> None:
        """Queue `caller`'s batch for `node` (from `take_turn`), `size` payload bytes;
        or, when the node would owe more than its backlog bound, queue nothing, drop
        its queue and hand what was dropped, this batch last, to `on_overflow`."""
        queue = self._nodes.get(node)
        if queue is None:
            queue = self._nodes[node] = _NodeQueue(node)
        owed = queue.owed + size
        beyond = self.beyond.used
        if owed - beyond > self._backlog_max:
            dropped, queue.queued = [*queue.queued, (caller, node, entries, size)], []
            queue.owed -= sum(size for _, _, _, size in dropped[:-1])  # what is in flight stays
            self._on_overflow(node, Overflow(dropped, owed, beyond))
            return
        queue.owed = owed
        if not queue.queued:
            self._touched.append(queue)
        queue.queued.append((caller, node, entries, size))

    def owed_bytes(self, node: Node) -> int:
        """Payload bytes queued for `node` or in flight to it."""
        queue = self._nodes.get(node)
        return 0 if queue is None else queue.owed

    def queued_bytes(self, node: Node) -> int:
        """Payload bytes queued for `node`, not yet in a call."""
        queue = self._nodes.get(node)
        return 0 if queue is None else sum(size for _, _, _, size in queue.queued)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The dispatch, once per turn with work, until `stop`: every due caller's turn,
        then the calls of each node given work (`send_queued`)."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            if self._stopped:  # stopped before this task first ran (a client left at once)
                tasks.cancel_scope.cancel()
            task_status.started()
            while True:
                await self._wake.wait()
                self._wake = self._new_event()
                due, self._due = self._due, []
                for caller in due:
                    caller.take_turn()
                touched, self._touched = self._touched, []
                for queue in touched:
                    self.send_queued(queue)

    def stop(self) -> None:
        """End the dispatch and every call in flight (the client is closing): their
        callers are told the calls finished, and get no answer."""
        self._stopped = True
        if self._tasks is not None:
            self._tasks.cancel_scope.cancel()
        in_flight, self._in_flight = self._in_flight, {}
        for call in in_flight:
            call.stopped = True
            for caller, _, _, _ in call.batch:
                caller.call_finished()

    def send_queued(self, queue: _NodeQueue[Node]) -> None:
        """Make the node's calls for what is queued, up to `calls_in_flight_max` in
        flight (at the bound, the next call to end makes them), each cut to
        `call_bytes_max`."""
        limit = self._calls_in_flight_max
        call_max = self._call_bytes_max
        while queue.queued and queue.busy < limit and not self._stopped:
            queued = queue.queued
            size = 0
            cut = 0
            while cut < len(queued) and (cut == 0 or size + queued[cut][3] <= call_max):
                size += queued[cut][3]
                cut += 1
            if cut == len(queued):
                batch, queue.queued = queued, []
            else:
                batch, queue.queued = queued[:cut], queued[cut:]
            queue.busy += 1
            self._make_call(queue, batch, size)

    def _make_call(self, queue: _NodeQueue[Node], batch: list[Queued[Node]], size: int) -> None:
        """Post the call on the node's channel, its answers coming back as a callback;
        when the channel cannot take it without a wait (no connection yet, the node's
        identity not known, no room), a task makes it and waits (`_call_waiting`)."""
        node = queue.node
        requests = [
            caller.add_request(entries)
            for caller, its_node, entries, _ in batch
            if caller.sends_to(its_node)
        ]
        live = (
            batch
            if len(requests) == len(batch)
            else [queued for queued in batch if queued[0].sends_to(queued[1])]
        )
        call = _Call(self, queue, batch, size, live, requests)
        self._in_flight[call] = None
        if not requests:
            self.ended(call)
            return
        channel = self._pool.channel_nowait(node.address)
        if channel is not None and channel.post_adds(
            requests, instance_id=node.instance_id, timeout_s=self._timeout_s, on_answers=call
        ):
            return
        assert self._tasks is not None  # (calls are made by the dispatch, or after it)
        self._tasks.start_soon(self._call_waiting, call)

    def ended(self, call: _Call[Node]) -> None:
        """`call` is over: its callers are told, and the node owes its bytes no more."""
        del self._in_flight[call]
        for caller, _, _, _ in call.batch:
            caller.call_finished()
        queue = call.queue
        queue.owed -= call.size
        queue.busy -= 1

    async def _call_waiting(self, call: _Call[Node]) -> None:
        """The call made by a task of its own, which waits for the channel and the
        answers, within `timeout_s`: past it, every caller of the call gets a
        TimeoutError."""
        node = call.queue.node
        with anyio.CancelScope(deadline=anyio.current_time() + self._timeout_s) as scope:
            answers = await self._call(node, call.requests)
        if scope.cancelled_caught:
            answers = TimeoutError(f"node {node.address}: no answer to adds in {self._timeout_s} s")
        call.answered(answers)

    async def _call(
        self, node: Node, requests: Sequence[AddRequest]
    ) -> list[AddAnswer] | PoraError | OSError:
        """One call for every caller's batch: the answers, or what failed them all."""
        try:
            channel = await self._pool.channel(node.address)
            return await channel.add_entries_many(
                requests, instance_id=node.instance_id, timeout_s=self._timeout_s
            )
        except (PoraError, OSError) as error:
            return error


__all__ = ["CalledNode", "NodeCaller", "NodeCalls", "Overflow", "Queued"]
