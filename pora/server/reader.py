"""The reading half of a connection: bytes from the socket to decoded requests.

A `RequestReader` owns the connection's decoder (its buffer, and the protocol
version the first frame chose), when bytes last came in, and the cancel scope of
reading. It is built with what it touches: the connection's `InFlight` (it
counts the requests it hands on, and waits for room), the connection's
read-response budget (it does not read while that is full), the server's shared
receive buffer and its counters (bytes received); `run` hands each batch of
requests to the function it is given (the executor's `dispatch`).

The loop reads a plain TCP socket with `os.readv` into the server's one shared
buffer and copies the bytes out before it awaits anything: one event loop, so no
two reads overlap, and no buffer of `receive_bytes_max` is allocated per read.
When a read fills the buffer it reads again at once (after a checkpoint) rather
than wait for readiness, and when a read ends inside a frame it tries once more
before waiting: the rest of a big frame is usually there already.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

import trio

from netio.budget import Budget
from netio.codec import RequestDecoder
from netio.messages import Refused, RequestMessage, WireAdd
from pora import tracing
from pora.server.config import ServerConfig
from pora.server.counters import ServerCounters
from pora.server.in_flight import InFlight

#: what the reader hands each batch of requests to
Dispatch = Callable[[list[RequestMessage | WireAdd | Refused]], Awaitable[None]]


class RequestReader:
    """Reads one connection's socket and hands its requests on, in batches."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        decoder: RequestDecoder,
        *,
        config: ServerConfig,
        counters: ServerCounters,
        in_flight: InFlight,
        read_budget: Budget,
        receive_buffer: bytearray,
    ) -> None:
        self.stream = stream
        self.decoder = decoder
        self.config = config
        self.counters = counters
        self.in_flight = in_flight
        #: the connection's read-response bytes: past its limit, stop reading
        self.read_budget = read_budget
        #: the server's one receive buffer (see `_read_loop`)
        self.receive_buffer = receive_buffer
        #: when the last bytes came in; the server's idle sweeper reads it
        self.last_received = trio.current_time()
        self.scope = trio.CancelScope()
        #: the socket's fd, read with os.readv; -1 for TLS (read through the ssl module)
        self.raw_fd = stream.socket.fileno() if type(stream) is trio.SocketStream else -1
        #: the tracer of when adds came in (`pora.tracing`), None when tracing is off
        self.trace = tracing.current()
        #: the ports that name this connection in trace records (this node's, the peer's)
        self.trace_ports = _ports(stream) if self.trace is not None else (0, 0)

    async def run(self, dispatch: Dispatch) -> None:
        """Read and hand on requests to `dispatch` until the peer closes its side
        (returns), the scope is cancelled, or the bytes are not the protocol
        (ProtocolError)."""
        with self.scope:
            await self._read_loop(dispatch)

    async def _read_loop(self, dispatch: Dispatch) -> None:
        counters = self.counters
        config = self.config
        per_connection_max = config.inflight_per_connection_max
        bytes_max = config.inflight_bytes_per_connection_max
        receive_max = config.receive_bytes_max
        stream = self.stream
        decoder = self.decoder
        in_flight = self.in_flight
        shared = self.receive_buffer
        into = [shared]
        view = memoryview(shared)
        #: the last read left the socket empty: wait for it before reading again,
        #: rather than spend a system call to learn it is still empty
        drained = False
        reads = self.read_budget
        while True:
            budget = per_connection_max - in_flight.count
            if budget <= 0 or in_flight.bytes >= bytes_max or reads.used >= reads.limit:
                in_flight.space = trio.Event()
                await in_flight.space.wait()
                continue
            requests = decoder.next_requests_raw(budget)
            if requests:
                in_flight.count += len(requests)
                if self.trace is not None:
                    self.trace.node_read(*self.trace_ports, self.last_received, requests)
                await dispatch(requests)
                continue
            # (idle connections are found by the server's sweeper, not by a timeout
            # per read: a cancel scope with a deadline per read costs too much)
            fd = self.raw_fd
            if fd < 0:  # TLS
                data = await stream.receive_some(receive_max)
            else:
                if drained:
                    await trio.lowlevel.wait_readable(fd)
                try:
                    count = os.readv(fd, into)
                except BlockingIOError:
                    drained = True
                    continue
                except OSError as exc:
                    raise trio.BrokenResourceError(f"reading the connection: {exc}") from exc
                data = bytes(view[:count])  # out of the shared buffer before any await
                drained = count < receive_max
                if not drained:
                    # more may be waiting: read again, but let the other tasks run first
                    await trio.lowlevel.checkpoint()
            if not data:
                return  # the peer closed its side; answer what is in flight
            self.last_received = trio.current_time()
            counters.bytes_received += len(data)
            decoder.receive_data(data if type(data) is bytes else bytes(data))
            if drained and decoder.buffered_bytes:
                # the read ended inside a frame: the rest of a big one (a run) is
                # usually in the next TCP segment, there already, and one more read
                # costs less than a wait for readiness (epoll_ctl, a turn, epoll_wait).
                # If it is not there, that read fails and the next wait is the real one
                drained = False


def _ports(stream: trio.abc.Stream) -> tuple[int, int]:
    """This node's port and the peer's on the connection (0, 0 when not plain TCP)."""
    if type(stream) is not trio.SocketStream:
        return 0, 0
    return int(stream.socket.getsockname()[1]), int(stream.socket.getpeername()[1])
