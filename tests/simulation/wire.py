"""In-memory connections between the simulation's clients and its nodes' servers.

A connection is two directions of bytes. Every write (`send` on the client's end,
`send_all` on the server's) is one segment that arrives at a seeded time: a delay
drawn by the link's `Random`, never before the segment sent ahead of it (a
connection keeps its order, as TCP does; two connections do not). What the link
decides when a segment is written (`LinkRules`):

- its delay, which `SimNetwork` draws from the link's own `Random` (and slows down
  for a slow node);
- whether it is lost: then the connection is reset when the segment would have
  arrived, or later (the peer's retransmissions going unanswered for a while);
- whether the link holds it: a partition or a paused client keeps every segment
  where it is until the link is mended, and the reader sees nothing meanwhile (a
  request times out on its caller's clock, and a late answer finds no waiter).

Closing one end (a client giving up the connection, a node's server ending it, a
node crashing) is an end-of-stream the other end reads after what was sent before.
The client's end is an `anyio.abc.ByteStream` (what `connect_node(open_stream=)`
takes), the server's a `trio.abc.Stream` (what `Server.serve_connection` takes).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import anyio.abc
import trio

#: a segment that is not bytes: the end of the stream, or a reset
_EOF = b""
_RESET = None


class LinkRules(Protocol):
    """What the network decides for each segment on one link."""

    def delay_s(self) -> float:
        """The segment's one-way delay."""
        ...

    def lost_after_s(self) -> float | None:
        """None: the segment goes through; else the connection is reset this long
        after the segment would have arrived."""
        ...

    def holds(self) -> bool:
        """The link holds its segments now (partitioned, or its client paused)."""
        ...

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call `wake` whenever what `holds` answers may change; returns the undo."""
        ...

    def delivered(self, to_node: bool) -> None:
        """A segment reached its reader (counted for the scenarios' checks)."""
        ...


@dataclass
class _Direction:
    """The segments of one direction, with their arrival times, in order."""

    rules: LinkRules
    to_node: bool
    segments: deque[tuple[float, bytes | None]] = field(default_factory=deque)
    last_arrival: float = 0.0
    #: the writing end was closed: no more segments
    write_closed: bool = False
    #: the reading end was closed by its own side
    read_closed: bool = False
    _wakeup: trio.Event = field(default_factory=trio.Event)

    def wake(self) -> None:
        self._wakeup.set()

    def push(self, data: bytes | None, delay_s: float) -> None:
        arrival = max(self.last_arrival, trio.current_time() + delay_s)
        self.last_arrival = arrival
        self.segments.append((arrival, data))
        self.wake()

    def send(self, data: bytes) -> None:
        lost_after = self.rules.lost_after_s()
        self.push(bytes(data), self.rules.delay_s())
        if lost_after is not None:
            self.push(_RESET, lost_after)

    async def receive(self, max_bytes: int) -> bytes | None:
        """The next bytes, b"" at the end of the stream, None for a reset."""
        while True:
            if self.read_closed:
                raise trio.ClosedResourceError("this end of the connection is closed")
            deadline = self.segments[0][0] if self.segments else math.inf
            now = trio.current_time()
            if self.segments and deadline <= now:
                if not self.rules.holds():
                    arrival, data = self.segments.popleft()
                    if data and len(data) > max_bytes:
                        self.segments.appendleft((arrival, data[max_bytes:]))
                        data = data[:max_bytes]
                    if data:
                        self.rules.delivered(self.to_node)
                    return data
                deadline = math.inf  # held: wait for the link to change
            self._wakeup = trio.Event()
            unwatch = self.rules.watch(self.wake)
            try:
                with trio.move_on_at(deadline):
                    await self._wakeup.wait()
            finally:
                unwatch()


class SimConnection:
    """One connection: the client's end and the server's end of two directions."""

    def __init__(self, rules: LinkRules) -> None:
        self.to_node = _Direction(rules, to_node=True)
        self.to_client = _Direction(rules, to_node=False)
        self.client_end = ClientEnd(self)
        self.server_end = ServerEnd(self)

    def close(self, outgoing: _Direction, incoming: _Direction) -> None:
        if not outgoing.write_closed:
            outgoing.write_closed = True
            outgoing.push(_EOF, 0.0)
        incoming.read_closed = True
        incoming.wake()


class ClientEnd(anyio.abc.ByteStream):
    """The client's end (anyio's byte stream, as `anyio.connect_tcp` gives)."""

    def __init__(self, connection: SimConnection) -> None:
        self._connection = connection

    async def receive(self, max_bytes: int = 65536) -> bytes:
        try:
            data = await self._connection.to_client.receive(max_bytes)
        except trio.ClosedResourceError:
            raise anyio.ClosedResourceError from None
        if data is _RESET:
            raise anyio.BrokenResourceError("connection reset (simulated network)")
        if not data:
            raise anyio.EndOfStream
        return data

    async def send(self, item: bytes) -> None:
        await trio.lowlevel.checkpoint()
        _send(self._connection.to_node, item, anyio.BrokenResourceError, anyio.ClosedResourceError)

    async def send_eof(self) -> None:
        await trio.lowlevel.checkpoint()
        self._connection.to_node.write_closed = True
        self._connection.to_node.push(_EOF, 0.0)

    async def aclose(self) -> None:
        self._connection.close(self._connection.to_node, self._connection.to_client)
        await trio.lowlevel.checkpoint()


class ServerEnd(trio.abc.Stream):
    """The server's end (trio's stream, as a listener accepts)."""

    def __init__(self, connection: SimConnection) -> None:
        self._connection = connection

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self._connection.to_node.receive(max_bytes or 65536)
        if data is _RESET:
            raise trio.BrokenResourceError("connection reset (simulated network)")
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        _send(self._connection.to_client, data, trio.BrokenResourceError, trio.ClosedResourceError)

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self._connection.close(self._connection.to_client, self._connection.to_node)
        await trio.lowlevel.checkpoint()

    def reset(self) -> None:
        """The node's process is gone: the client reads a reset after what was sent
        before, and nothing the node writes from now on leaves it."""
        connection = self._connection
        if not connection.to_client.write_closed:
            connection.to_client.write_closed = True
            connection.to_client.push(_RESET, 0.0)
        connection.to_node.read_closed = True
        connection.to_node.wake()


def _send(
    direction: _Direction,
    data: bytes | bytearray | memoryview,
    broken: type[Exception],
    closed: type[Exception],
) -> None:
    if direction.write_closed:
        raise closed("this end of the connection is closed")
    if direction.read_closed:  # the peer closed its end: a write meets a reset
        raise broken("connection reset by peer (simulated network)")
    direction.send(bytes(data))
