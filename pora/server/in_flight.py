"""What the parts of one connection share: its requests and bytes in flight, and
its reservations of read-response bytes.

`InFlight` counts the requests read from the connection and not yet answered,
and their bytes; the reader stops reading past the limits and waits on `space`,
which the others `open()` when they give something back. `ReadBytes` reserves a
read's response bytes under the connection's budget and then the node's, and
gives them back (waking the reader: it does not read while the connection's
budget is full). The `Connection` makes one of each and hands them to its
reader, executor and writer.
"""

from __future__ import annotations

import trio

from netio.budget import Budget


class InFlight:
    """Requests and bytes in flight on one connection, and the reader's wake-up."""

    __slots__ = ("bytes", "count", "reading", "space")

    def __init__(self) -> None:
        #: requests read and not yet answered (their responses not yet sent): the
        #: reader adds what it hands on, the writer takes away what it sent
        self.count = 0
        #: payload bytes of those requests, and bytes of responses waiting to be sent
        self.bytes = 0
        #: the reader still reads: the writer must not end the connection yet
        self.reading = True
        #: set when room may have opened (the reader waits on it when full)
        self.space = trio.Event()

    def open(self) -> None:
        if not self.space.is_set():
            self.space.set()


class ReadBytes:
    """The read-response bytes one connection holds, under its own budget and the
    node's (see `ServerConfig.read_bytes_per_connection_max`)."""

    __slots__ = ("connection", "in_flight", "node")

    def __init__(self, connection: Budget, node: Budget, in_flight: InFlight) -> None:
        self.connection = connection
        self.node = node
        self.in_flight = in_flight

    async def reserve(self, size: int) -> None:
        """Reserve `size` bytes under the connection's limit and then the node's,
        waiting in line for each."""
        await self.connection.take(size)
        try:
            await self.node.take(size)
        except BaseException:
            self._release_connection(size)
            raise

    def release(self, size: int) -> None:
        self.node.give(size)
        self._release_connection(size)

    def resize(self, reserved: int, size: int) -> None:
        """Hold `size` bytes instead of the `reserved` ones (a response is rarely
        larger than reserved: then it is in memory already, and counts as it is)."""
        if size < reserved:
            self.release(reserved - size)
        elif size > reserved:
            self.connection.force(size - reserved)
            self.node.force(size - reserved)

    def _release_connection(self, size: int) -> None:
        self.connection.give(size)
        self.in_flight.open()  # the reader may read the socket again
