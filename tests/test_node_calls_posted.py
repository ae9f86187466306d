"""The node calls posted on a TCP channel (`NodeCalls` -> `NodeChannel.post_adds`):
answered by callback from the connection's reader, its loss or its deadline sweep,
with no task waiting; the awaiting path only where the channel cannot post yet.

A scripted node (a real socket) says who it is and then holds the adds it reads
until the test answers them, in any order, or drops the connection; the callers
are plain objects recording what the node calls tell them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

import anyio
import pytest
import trio
import trio.lowlevel
import trio.testing

import pora
from netio.budget import Budget, BudgetPair
from netio.codec import encode_response
from netio.messages import AddEntry, AddEntryResponse, AddRun, AddRunResponse, Info, InfoResponse
from netio.request_codec import RequestDecoder
from pora.client.batch import Batch
from pora.client.node_calls import NodeCalls
from pora.client.node_channel import AddAnswer, AddRequest, NodeChannel
from pora.client.node_client import connect_node
from pora.client.node_pool import NodePool
from pora.client.tcp_channel import TcpChannel

KEY = b"k" * 32
TIMEOUT_S = 5.0


@dataclass(frozen=True)
class _Node:
    address: str
    instance_id: str


@dataclass
class _Caller:
    """A ledger's side of the node calls: one batch per turn, the answers it gets."""

    calls: NodeCalls[_Node]
    node: _Node
    ledger_id: int
    master_key: bytes = KEY
    turns: list[Batch] = field(default_factory=list)
    answers: list[tuple[Batch, AddAnswer]] = field(default_factory=list)
    unfinished: int = 0
    #: set once no batch of this caller is in a call or queued
    settled: trio.Event = field(default_factory=trio.Event)

    def add(self, entries: Batch) -> None:
        self.turns.append(entries)
        self.settled = trio.Event()
        self.calls.schedule(self)

    def take_turn(self) -> None:
        for entries in self.turns:
            self.unfinished += 1
            self.calls.submit(self, self.node, entries, len(entries))
        self.turns.clear()

    def sends_to(self, node: _Node) -> bool:
        return True

    def issued_lac(self) -> int:
        return -1

    def add_request(self, entries: Batch) -> AddRequest:
        return AddRequest(self.ledger_id, entries, self.master_key, self.issued_lac())

    def answer(self, node: _Node, entries: Batch, lac: int, answer: AddAnswer) -> None:
        self.answers.append((entries, answer))

    def call_finished(self) -> None:
        self.unfinished -= 1
        if not self.unfinished and not self.turns:
            self.settled.set()


class _ScriptedNode:
    """Says who it is (INFO), then keeps the add frames it reads for the test."""

    def __init__(self, instance_id: str = "i1") -> None:
        self.instance_id = instance_id
        self.frames: list[AddRun | AddEntry] = []
        self.frame_came = trio.Event()
        self.stream: trio.SocketStream | None = None
        #: when set to an event, the node reads no more until it is set
        self.reads_held: trio.Event | None = None

    async def serve(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        decoder = RequestDecoder()
        with trio.move_on_after(30), contextlib.suppress(trio.ClosedResourceError):
            while True:
                if self.reads_held is not None:
                    await self.reads_held.wait()
                data = await stream.receive_some(65536)
                if not data:
                    break
                decoder.receive_data(data)
                for request in decoder.next_requests(1000):
                    if isinstance(request, Info):
                        info = InfoResponse(
                            request.request_id, 4, None, 1 << 24, 1 << 20, 0, "t", self.instance_id
                        )
                        await stream.send_all(encode_response(info, 4))
                    else:
                        assert isinstance(request, AddRun | AddEntry)
                        self.frames.append(request)
                        self.frame_came.set()

    async def frames_read(self, count: int) -> list[AddRun | AddEntry]:
        while len(self.frames) < count:
            self.frame_came = trio.Event()
            await self.frame_came.wait()
        return self.frames

    async def answer(self, frame: AddRun | AddEntry) -> None:
        assert self.stream is not None
        response: AddRunResponse | AddEntryResponse
        if isinstance(frame, AddEntry):
            response = AddEntryResponse(frame.request_id, frame.ledger_id, frame.entry_id)
        else:
            response = AddRunResponse(
                frame.request_id, frame.ledger_id, frame.first_entry_id, len(frame.payloads)
            )
        await self.stream.send_all(encode_response(response, 4))


class _CountingChannel(TcpChannel):
    """A TCP channel that counts the calls posted and those it could not post."""

    posted = 0
    refused = 0

    def post_adds(self, requests: Sequence[AddRequest], **options: object) -> bool:
        posted: bool = super().post_adds(requests, **options)  # type: ignore[arg-type]
        if posted:
            _CountingChannel.posted += 1
        else:
            _CountingChannel.refused += 1
        return posted


@dataclass
class _Setup:
    calls: NodeCalls[_Node]
    pool: NodePool
    node: _Node
    scripted: _ScriptedNode

    def room(self) -> BudgetPair:
        channel = self.pool.channel_nowait(self.node.address)
        assert isinstance(channel, TcpChannel)
        return channel.client._connection.admission.room


def _no_overflow(node: _Node, overflow: object) -> None:
    raise AssertionError(f"node {node.address}: no backlog here reaches its bound")


@asynccontextmanager
async def _node_calls(
    scripted: _ScriptedNode,
    *,
    expected_instance: str = "i1",
    calls_in_flight_max: int = 1,
    timeout_s: float = TIMEOUT_S,
) -> AsyncIterator[_Setup]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    _CountingChannel.posted = _CountingChannel.refused = 0

    def open_channel(address: str) -> AbstractAsyncContextManager[NodeChannel]:
        @asynccontextmanager
        async def opened() -> AsyncIterator[NodeChannel]:
            async with connect_node(address, timeout_s=timeout_s) as client:
                yield _CountingChannel(client)

        return opened()

    async with anyio.create_task_group() as nursery:
        await nursery.start(trio.serve_listeners, scripted.serve, listeners)
        pool = NodePool(nursery, open_channel)
        calls = NodeCalls[_Node](
            pool,
            calls_in_flight_max=calls_in_flight_max,
            call_bytes_max=1 << 20,
            timeout_s=timeout_s,
            backlog_bytes_max=1 << 30,
            beyond=Budget(1 << 30, "pending_bytes_max", anyio.Event),
            on_overflow=_no_overflow,
        )
        await nursery.start(calls.run)
        try:
            yield _Setup(calls, pool, _Node(address, expected_instance), scripted)
        finally:
            calls.stop()
            await pool.aclose()
            nursery.cancel_scope.cancel()


async def _connected(setup: _Setup) -> None:
    """The first call goes by the awaiting path (the pool has no channel yet) and
    opens the connection; answered, it leaves the channel open for posting."""
    first = _Caller(setup.calls, setup.node, ledger_id=99)
    first.add([(0, b"warm")])
    (frame,) = await setup.scripted.frames_read(1)
    await setup.scripted.answer(frame)
    await _settled([first])
    assert first.answers == [([(0, b"warm")], None)]
    setup.scripted.frames.clear()


async def _settled(callers: Sequence[_Caller]) -> None:
    with trio.fail_after(10):
        for caller in callers:
            await caller.settled.wait()


async def _round_trip(setup: _Setup) -> None:
    """One more call, answered: what the node sent before has been read by then."""
    count = len(setup.scripted.frames)
    probe = _Caller(setup.calls, setup.node, ledger_id=77)
    probe.add([(0, b"probe")])
    frames = await setup.scripted.frames_read(count + 1)
    await setup.scripted.answer(frames[-1])
    await _settled([probe])


async def test_the_first_call_waits_for_the_connection_and_the_next_are_posted() -> None:
    async with _node_calls(_ScriptedNode()) as setup:
        assert setup.pool.channel_nowait(setup.node.address) is None
        await _connected(setup)
        assert (_CountingChannel.posted, _CountingChannel.refused) == (0, 0)  # awaited
        ledger = _Caller(setup.calls, setup.node, ledger_id=1)
        ledger.add([(0, b"a"), (1, b"b")])
        (frame,) = await setup.scripted.frames_read(1)
        assert _CountingChannel.posted == 1
        assert setup.room().count_used == 2  # the call's entries, until it ends
        await setup.scripted.answer(frame)
        await _settled([ledger])
        assert ledger.answers == [([(0, b"a"), (1, b"b")], None)]
        assert setup.room().count_used == 0
        assert setup.calls.owed_bytes(setup.node) == 0


async def test_a_posted_call_past_its_timeout_fails_every_ledger_in_it() -> None:
    timeout_s = 0.3
    async with _node_calls(_ScriptedNode(), timeout_s=timeout_s) as setup:
        await _connected(setup)
        ledgers = [_Caller(setup.calls, setup.node, ledger_id=n) for n in (1, 2)]
        for ledger in ledgers:
            ledger.add([(0, b"x")])  # one turn: one call carries both
        await setup.scripted.frames_read(2)
        assert _CountingChannel.posted == 1
        started = trio.current_time()
        await _settled(ledgers)  # the node never answers
        # on the call's timeout, not at the end of the test (bounded generously: on a
        # loaded machine the timeout's wake-up can be late)
        assert timeout_s <= trio.current_time() - started < timeout_s + 3
        for ledger in ledgers:
            ((entries, answer),) = ledger.answers
            assert entries == [(0, b"x")]
            assert isinstance(answer, pora.RequestTimeout)
        assert setup.room().count_used == 0
        assert setup.room().size_used == 0
        assert setup.calls.owed_bytes(setup.node) == 0
        # the late answers find nobody
        for frame in setup.scripted.frames:
            await setup.scripted.answer(frame)
        await _round_trip(setup)
        assert all(len(ledger.answers) == 1 for ledger in ledgers)


async def test_a_connection_lost_mid_call_fails_every_ledger_with_connection_lost() -> None:
    async with _node_calls(_ScriptedNode()) as setup:
        await _connected(setup)
        ledgers = [_Caller(setup.calls, setup.node, ledger_id=n) for n in (1, 2)]
        for ledger in ledgers:
            ledger.add([(5, b"y")])
        await setup.scripted.frames_read(2)
        assert setup.scripted.stream is not None
        await setup.scripted.stream.aclose()
        await _settled(ledgers)
        for ledger in ledgers:
            ((_, answer),) = ledger.answers
            assert isinstance(answer, pora.ConnectionLost)
        assert setup.room().count_used == 0
        assert setup.calls.owed_bytes(setup.node) == 0


async def test_calls_answered_out_of_order_each_reach_their_callers() -> None:
    async with _node_calls(_ScriptedNode(), calls_in_flight_max=2) as setup:
        await _connected(setup)
        first = _Caller(setup.calls, setup.node, ledger_id=1)
        second = _Caller(setup.calls, setup.node, ledger_id=2)
        first.add([(0, b"a")])
        await setup.scripted.frames_read(1)
        second.add([(0, b"b"), (1, b"c")])  # the next turn: a second call in flight
        frames = await setup.scripted.frames_read(2)
        assert _CountingChannel.posted == 2
        await setup.scripted.answer(frames[1])
        await _settled([second])
        assert second.answers == [([(0, b"b"), (1, b"c")], None)]
        assert first.answers == []
        await setup.scripted.answer(frames[0])
        await _settled([first])
        assert first.answers == [([(0, b"a")], None)]
        assert setup.room().count_used == 0


async def test_a_node_at_its_calls_in_flight_bound_sends_the_rest_when_a_call_ends() -> None:
    async with _node_calls(_ScriptedNode(), calls_in_flight_max=1) as setup:
        await _connected(setup)
        first = _Caller(setup.calls, setup.node, ledger_id=1)
        second = _Caller(setup.calls, setup.node, ledger_id=2)
        first.add([(0, b"a")])
        (frame,) = await setup.scripted.frames_read(1)
        second.add([(0, b"b")])
        await trio.testing.wait_all_tasks_blocked()  # the dispatch took the turn
        assert len(setup.scripted.frames) == 1  # queued behind the call in flight
        assert setup.calls.queued_bytes(setup.node) == 1
        await setup.scripted.answer(frame)  # its end posts the next, from the reader
        frames = await setup.scripted.frames_read(2)
        await setup.scripted.answer(frames[1])
        await _settled([first, second])
        assert [answer for _, answer in first.answers + second.answers] == [None, None]
        assert _CountingChannel.posted == 2


async def test_another_instance_is_not_posted_and_fails_the_call() -> None:
    async with _node_calls(_ScriptedNode("i2"), expected_instance="i1") as setup:
        ledger = _Caller(setup.calls, setup.node, ledger_id=1)
        ledger.add([(0, b"a")])
        await _settled([ledger])  # the awaiting path: the channel is opened
        ledger.add([(1, b"b")])
        await _settled([ledger])  # the channel is open: it refuses to post
        assert _CountingChannel.refused == 1
        for _, answer in ledger.answers:
            assert isinstance(answer, pora.InstanceMismatch)
        assert setup.scripted.frames == []  # nothing sent


async def test_the_client_closing_finishes_posted_calls_without_answers() -> None:
    async with _node_calls(_ScriptedNode()) as setup:
        await _connected(setup)
        ledger = _Caller(setup.calls, setup.node, ledger_id=1)
        ledger.add([(0, b"a")])
        (frame,) = await setup.scripted.frames_read(1)
        setup.calls.stop()
        assert ledger.unfinished == 0
        room = setup.room()
        assert room.count_used == 1
        with trio.fail_after(5):
            await setup.scripted.answer(frame)
            while room.count_used:  # (the connection still reads)
                await trio.testing.wait_all_tasks_blocked()
                await trio.lowlevel.checkpoint()
        assert ledger.answers == []


@pytest.mark.parametrize("instance", ["i1", None])
async def test_post_batches_waits_for_nothing(instance: str | None) -> None:
    """`TcpChannel.post_adds` posts only on a live connection whose node said who it
    is: before that it answers False and does nothing."""
    scripted = _ScriptedNode()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    got: list[object] = []
    answered = trio.Event()

    def on_answers(answers: object) -> None:
        got.append(answers)
        answered.set()

    request = [AddRequest(1, [(0, b"a")], KEY, -1)]
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, scripted.serve, listeners)
        async with connect_node(address, timeout_s=TIMEOUT_S) as client:
            channel = TcpChannel(client)
            connection = client._connection
            assert connection.session is not None
            connection.session.identified = anyio.Event()  # as if the INFO were not answered
            assert not channel.post_adds(
                request, instance_id=instance, timeout_s=None, on_answers=on_answers
            )
            connection.session.identified.set()
            await trio.testing.wait_all_tasks_blocked()  # the writer waits for frames
            assert channel.post_adds(
                request, instance_id=instance, timeout_s=None, on_answers=on_answers
            )
            # sent at once on the socket: the writer task was not woken
            assert connection.session.outbox == []
            assert not connection.session.outbox_ready.is_set()
            (frame,) = await scripted.frames_read(1)
            await scripted.answer(frame)
            with trio.fail_after(5):
                await answered.wait()
            assert got == [[None]]
        nursery.cancel_scope.cancel()


async def test_a_post_the_socket_takes_in_part_leaves_the_rest_to_the_writer() -> None:
    """A call larger than the socket's buffer, sent at once while the node does not
    read: the socket takes what it can, the writer task sends the rest, in order."""
    scripted = _ScriptedNode()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    answered = trio.Event()
    got: list[object] = []

    def on_answers(answers: object) -> None:
        got.append(answers)
        answered.set()

    entries = [(entry_id, bytes([entry_id]) * 65536) for entry_id in range(256)]  # 16 MiB
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, scripted.serve, listeners)
        async with connect_node(address, timeout_s=TIMEOUT_S) as client:
            session = client._connection.session
            assert session is not None
            scripted.reads_held = trio.Event()
            await trio.testing.wait_all_tasks_blocked()  # the writer waits for frames
            assert TcpChannel(client).post_adds(
                [AddRequest(1, entries, KEY, -1)],
                instance_id="i1",
                timeout_s=None,
                on_answers=on_answers,
            )
            assert len(session.outbox) == 1  # the rest of the bytes, for the writer
            assert session.outbox_ready.is_set()
            scripted.reads_held.set()
            with trio.fail_after(10):
                received: list[tuple[int, bytes]] = []
                while len(received) < len(entries):
                    frames = await scripted.frames_read(len(scripted.frames) + 1)
                    received = [
                        (frame.first_entry_id + n, payload)
                        for frame in frames
                        if isinstance(frame, AddRun)
                        for n, payload in enumerate(frame.payloads)
                    ]
                assert received == entries
                for frame in frames:
                    await scripted.answer(frame)
                await answered.wait()
            assert got == [[None]]
            assert client._connection.admission.room.count_used == 0
        nursery.cancel_scope.cancel()
