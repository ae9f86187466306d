"""The node's network workers: frames from sockets to the Node API and back.

One trio task per connection reads, decodes (`netio`, sans-io) and dispatches in
batches: the adds of one read go to `node.submit` as ONE list of journal requests.
Their completions (`on_done`, called by the ledger workers) encode the responses
ready and write them to the socket at once, without blocking, when the
connection's writer task is not sending; otherwise (and for TLS, and for what a
full socket does not take) the writer packs every finished response into one
buffer and sends it with one `send_all`. Other operations (reads that may
long-poll, fences, closes, ...) run as tasks of the connection, so responses go
out in completion order, matched by request id.

Limits (all in `ServerConfig`, config.py): connections, requests and request bytes in flight
per connection (past them the connection's reader stops reading: TCP pushes back
on the peer), requests in flight node-wide (past it: OVERLOADED), frame size
(refused on its length prefix), an idle timeout. A malformed frame gets a
bad-request response when its request id is known, then its connection is
closed; other connections never notice.

This module holds the listener and the statistics; the server owns the counters
(counters.py), the node-wide read budget and the shared receive buffer, and
hands them to each connection. A connection is a `Connection` (connection.py)
made of a reader (reader.py), an executor that admits requests and maps them to
Node calls (executor.py), and a writer (writer.py), none of which knows the
`Server`. `netio.status` maps engine errors to status codes; the rest of the
protocol (`netio`) knows nothing of the engine.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import trio

from journal.request import RUN_ENTRIES_MAX
from netio import frames as f
from netio.budget import Budget
from netio.codec import (
    encode_error,
)
from netio.frames import Opcode, Status
from pora.node.node import Node
from pora.server.config import ServerConfig
from pora.server.connection import Connection
from pora.server.counters import ServerCounters

__all__ = ["Server", "ServerConfig", "ServerStatistics"]

_log = logging.getLogger("pora.server")

# an ADD_RUN frame becomes one run request of the node: the wire's bound must fit it
assert f.RUN_ENTRIES_MAX <= RUN_ENTRIES_MAX


@dataclass(frozen=True, slots=True)
class ServerStatistics:
    connections_open: int
    connections_accepted: int
    #: connections turned away because connections_max were open
    connections_refused: int
    #: connections closed for sending bytes that are not the protocol
    protocol_errors: int
    requests_inflight: int
    requests_by_opcode: Mapping[str, int]
    responses_by_status: Mapping[str, int]
    bytes_received: int
    bytes_sent: int
    #: bytes received and not yet decoded, over all connections (bounded by
    #: connections x (frame_bytes_max + receive_bytes_max))
    bytes_buffered: int
    #: responses sent straight from completion whose socket took only part (the
    #: writer task sent the rest): a peer reading slowly
    sends_backed_up: int = 0
    #: bytes of read responses held over all connections (reserved by reads under
    #: way, or waiting to be sent); bounded by read_bytes_node_max
    read_bytes_held: int = 0
    #: reads waiting for room under read_bytes_per_connection_max or read_bytes_node_max
    reads_waiting: int = 0


class Server:
    """Serves one node over TCP (optionally TLS). `run` it in a nursery with
    `nursery.start`, which returns the bound (host, port)."""

    def __init__(self, node: Node, config: ServerConfig | None = None) -> None:
        self.node = node
        self.config = config if config is not None else ServerConfig()
        self._connections: set[Connection] = set()
        self._accept_scope = trio.CancelScope()
        self._connections_scope = trio.CancelScope()
        self._stopped = trio.Event()
        self._drained = trio.Event()
        self._shutting_down = False
        self.counters = ServerCounters()
        #: bytes of read responses held by all connections
        self.read_budget = Budget(
            self.config.read_bytes_node_max, "read-response bytes of the node", trio.Event
        )
        #: what every plain-TCP connection reads into, then copies out of before it
        #: awaits anything (one event loop: no two reads overlap). `recv` would
        #: allocate `receive_bytes_max` per call instead: past glibc's mmap threshold
        #: that is a fresh mapping, and page faults for every byte received into it
        self.receive_buffer = bytearray(self.config.receive_bytes_max)

    async def run(
        self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen and serve until `shutdown` (or cancellation)."""
        config = self.config
        context = config.ssl_context()
        tcp_listeners = await trio.open_tcp_listeners(config.port, host=config.host)
        host, port = tcp_listeners[0].socket.getsockname()[:2]
        listeners: list[trio.abc.Listener[trio.abc.Stream]] = []
        for tcp_listener in tcp_listeners:
            if context is None:
                listeners.append(tcp_listener)
            else:
                listeners.append(trio.SSLListener(tcp_listener, context, https_compatible=False))
        try:
            with self._connections_scope:
                async with trio.open_nursery() as connections:
                    with self._accept_scope:
                        async with trio.open_nursery() as acceptors:
                            for listener in listeners:
                                acceptors.start_soon(self._accept, listener, connections)
                            acceptors.start_soon(self._sweep_idle_connections)
                            _log.info("serving on %s:%d%s", host, port, " (TLS)" if context else "")
                            task_status.started((host, port))
        finally:
            for listener in listeners:
                with contextlib.suppress(Exception):
                    await trio.aclose_forcefully(listener)
            self._stopped.set()

    async def _accept(
        self, listener: trio.abc.Listener[trio.abc.Stream], connections: trio.Nursery
    ) -> None:
        while True:
            try:
                stream = await listener.accept()
            except OSError as error:  # out of file descriptors and the like: wait it out
                _log.warning("accept failed: %s; retrying in 0.1 s", error)
                await trio.sleep(0.1)
                continue
            self.counters.connections_accepted += 1
            connections.start_soon(self.serve_connection, stream)

    async def _sweep_idle_connections(self) -> None:
        # a connection is closed between one and 1.25 idle timeouts after it went quiet
        interval_s = self.config.idle_timeout_s / 4
        while True:
            await trio.sleep(interval_s)
            now = trio.current_time()
            for connection in list(self._connections):
                connection.close_if_idle(now)

    async def serve_connection(self, stream: trio.abc.Stream) -> None:
        """Serve one connection on `stream` until it ends, then close it: what `run`
        does for each connection it accepts, and what the simulation calls with its
        in-memory streams (tests/simulation/wire.py), where nothing listens."""
        try:
            if len(self._connections) >= self.config.connections_max:
                self.counters.connections_refused += 1
                frame = encode_error(
                    0,
                    Opcode.INFO,
                    Status.OVERLOADED,
                    f"this node already serves {self.config.connections_max} connections "
                    "(connections_max); try again later or another node",
                )
                with trio.move_on_after(1.0):
                    await stream.send_all(frame)
                return
            connection = Connection(
                stream,
                node=self.node,
                config=self.config,
                counters=self.counters,
                node_read_budget=self.read_budget,
                receive_buffer=self.receive_buffer,
            )
            self._connections.add(connection)
            try:
                await connection.run()
            finally:
                self._connections.discard(connection)
                if self._shutting_down and not self._connections:
                    self._drained.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the peer went away (or failed its TLS handshake): nothing to answer
        except Exception:
            _log.exception("connection task failed")  # a bug; the node serves on
        finally:
            await trio.aclose_forcefully(stream)

    async def shutdown(self, drain_timeout_s: float = 10.0) -> None:
        """Stop accepting, stop reading requests, let those in flight finish and their
        responses go out (for up to `drain_timeout_s`), then close every connection."""
        self._shutting_down = True
        self._accept_scope.cancel()
        for connection in list(self._connections):
            connection.stop_reading()
        with trio.move_on_after(drain_timeout_s):
            if self._connections:
                await self._drained.wait()
        self._connections_scope.cancel()
        await self._stopped.wait()

    def statistics(self) -> ServerStatistics:
        counters = self.counters
        return ServerStatistics(
            connections_open=len(self._connections),
            connections_accepted=counters.connections_accepted,
            connections_refused=counters.connections_refused,
            protocol_errors=counters.protocol_errors,
            requests_inflight=counters.inflight,
            requests_by_opcode={op.name.lower(): counters.requests_by_opcode[op] for op in Opcode},
            responses_by_status={
                status.name.lower(): counters.responses_by_status[status] for status in Status
            },
            bytes_received=counters.bytes_received,
            bytes_sent=counters.bytes_sent,
            bytes_buffered=sum(c.decoder.buffered_bytes for c in self._connections),
            sends_backed_up=counters.sends_backed_up,
            read_bytes_held=self.read_budget.used,
            reads_waiting=self.read_budget.waiting
            + sum(c.read_budget.waiting for c in self._connections),
        )
