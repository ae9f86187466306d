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

Limits (all in `ServerConfig`): connections, requests and request bytes in flight
per connection (past them the connection's reader stops reading: TCP pushes back
on the peer), requests in flight node-wide (past it: OVERLOADED), frame size
(refused on its length prefix), an idle timeout. A malformed frame gets a
bad-request response when its request id is known, then its connection is
closed; other connections never notice.

This module maps messages to Node calls; `netio.status` maps engine errors to
status codes, and the rest of the protocol (`netio`) knows nothing of the engine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import trio

import pora
from journal.errors import PoraError
from journal.request import Request
from ledger.errors import (
    NodeClosed,
    NoSuchEntry,
    NoSuchLedger,
    StorageCorruption,
)
from netio import frames as f
from netio.codec import (
    RequestDecoder,
    encode_add_run_response,
    encode_add_run_responses,
    encode_error,
    encode_response,
)
from netio.errors import ProtocolError
from netio.frames import Opcode, Status
from netio.messages import (
    AddEntry,
    AddRun,
    Close,
    CloseResponse,
    Delete,
    DeleteResponse,
    Fence,
    FenceResponse,
    Info,
    InfoResponse,
    LacResponse,
    LedgerSummary,
    ListLedgers,
    ListLedgersResponse,
    ReadEntry,
    ReadEntryResponse,
    ReadLac,
    ReadRange,
    ReadRangeResponse,
    Refused,
    RequestMessage,
    ResponseMessage,
    WireAdd,
)
from netio.status import status_of
from pora.node.node import RUN_ENTRIES_MAX, Node
from pora.server.read_budget import ByteBudget

_log = logging.getLogger("pora.server")

#: Longest long poll a read may ask for; longer waits are cut to this.
LONG_POLL_MS_MAX: Final = 60_000
#: Most entries one READ_RANGE response carries.
RANGE_ENTRIES_MAX: Final = 10_000
#: Most ledgers one LIST_LEDGERS response carries.
LIST_LEDGERS_MAX: Final = 10_000
#: Bytes of a READ_ENTRY response besides its payload.
_ENTRY_RESPONSE_OVERHEAD: Final = f.HEADER_BYTES + f.READ_ENTRY_RESPONSE.size

# an ADD_RUN frame becomes one run request of the node: the wire's bound must fit it
assert f.RUN_ENTRIES_MAX <= RUN_ENTRIES_MAX


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How the network workers listen and what they bound. Defaults suit one node
    on a developer machine; `pora serve` maps its flags and config file onto these.

    Memory the network layer can be made to hold, at most: per connection, one
    receive buffer (`frame_bytes_max + receive_bytes_max`) plus the adds and other
    responses in flight (`inflight_bytes_per_connection_max`, overshot by at most
    one read); times `connections_max`; plus read responses, at most
    `read_bytes_node_max` over all connections (or one response, if larger). A
    connection that begins a frame and stalls is closed after `idle_timeout_s`.
    """

    host: str = "127.0.0.1"
    port: int = 3181
    connections_max: int = 1024
    #: requests read from one connection and not yet answered
    inflight_per_connection_max: int = 4096
    #: payload bytes of those requests (a few huge entries count as much as many small)
    inflight_bytes_per_connection_max: int = 64 * 1024 * 1024
    #: requests in the node from all connections; past it new ones get OVERLOADED
    inflight_node_max: int = 65_536
    #: bytes of read responses (READ_ENTRY, READ_RANGE, LIST_LEDGERS) one connection
    #: may hold: a read reserves the most its response can take before it reads, and
    #: holds the response's bytes until its socket took them. Past it the connection's reads
    #: wait and its socket is not read (TCP pushes back on a peer that does not read
    #: its responses); a single response larger than this is still served, alone
    read_bytes_per_connection_max: int = 16 * 1024 * 1024
    #: the same over all connections: past it new reads wait
    read_bytes_node_max: int = 256 * 1024 * 1024
    frame_bytes_max: int = f.FRAME_BYTES_MAX_DEFAULT
    #: bytes asked of a socket at a time, into one buffer the server's plain-TCP
    #: connections share (TLS ones read through the ssl module): an ADD_RUN of
    #: 64 x 1 KiB takes one read
    receive_bytes_max: int = 256 * 1024
    #: a connection with nothing in flight and no bytes for this long is closed
    idle_timeout_s: float = 600.0
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    def __post_init__(self) -> None:
        for name in (
            "connections_max",
            "inflight_per_connection_max",
            "inflight_bytes_per_connection_max",
            "inflight_node_max",
            "read_bytes_per_connection_max",
            "read_bytes_node_max",
            "receive_bytes_max",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerConfig.{name} must be at least 1")
        if not self.idle_timeout_s > 0:
            raise ValueError("ServerConfig.idle_timeout_s must be positive")
        if self.frame_bytes_max < 64:
            raise ValueError("ServerConfig.frame_bytes_max must be at least 64")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("TLS needs both tls_cert_file and tls_key_file, or neither")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server's TLS context, or None when TLS is off."""
        if self.tls_cert_file is None or self.tls_key_file is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        except (OSError, ssl.SSLError) as error:
            raise ValueError(
                f"cannot load the TLS certificate {self.tls_cert_file} and key "
                f"{self.tls_key_file}: {error}; check the paths (PEM files) and that the "
                "key belongs to the certificate"
            ) from error
        return context


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


def _error_frame(request_id: int, opcode: int, error: BaseException, version: int) -> bytes:
    return encode_error(
        request_id,
        opcode,
        status_of(error),
        str(error) or type(error).__name__,
        ledger_id=getattr(error, "ledger_id", -1),
        entry_id=getattr(error, "entry_id", -1),
        version=version,
    )


def _log_corruption(message: RequestMessage, error: StorageCorruption) -> None:
    """Say where a read met damaged data: the client is told too, but the operator
    must learn of it to repair the node (docs/operations.md)."""
    if isinstance(message, ReadRange):
        entries = f"entries {message.first_entry_id}..{message.last_entry_id}"
    else:
        entries = f"entry {getattr(message, 'entry_id', -1)}"
    _log.error(
        "corrupt data met reading ledger %d %s: file %s, offset %d: %s; answered CORRUPT. "
        "Read the entry from another replica; run `pora verify` on the stopped node",
        getattr(message, "ledger_id", -1),
        entries,
        error.path,
        error.offset,
        error.reason,
    )


class Server:
    """Serves one node over TCP (optionally TLS). `run` it in a nursery with
    `nursery.start`, which returns the bound (host, port)."""

    def __init__(self, node: Node, config: ServerConfig | None = None) -> None:
        self.node = node
        self.config = config if config is not None else ServerConfig()
        self._connections: set[_Connection] = set()
        self._accept_scope = trio.CancelScope()
        self._connections_scope = trio.CancelScope()
        self._stopped = trio.Event()
        self._drained = trio.Event()
        self._shutting_down = False
        self.inflight = 0
        self.connections_accepted = 0
        self.connections_refused = 0
        self.protocol_errors = 0
        self.requests_by_opcode = [0] * 256
        self.responses_by_status = [0] * 256
        self.bytes_received = 0
        self.bytes_sent = 0
        self.sends_backed_up = 0
        #: bytes of read responses held by all connections
        self.read_budget = ByteBudget(self.config.read_bytes_node_max)
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
            self.connections_accepted += 1
            connections.start_soon(self._serve, stream)

    async def _sweep_idle_connections(self) -> None:
        # a connection is closed between one and 1.25 idle timeouts after it went quiet
        interval_s = self.config.idle_timeout_s / 4
        while True:
            await trio.sleep(interval_s)
            now = trio.current_time()
            for connection in list(self._connections):
                connection.close_if_idle(now)

    async def _serve(self, stream: trio.abc.Stream) -> None:
        try:
            if len(self._connections) >= self.config.connections_max:
                self.connections_refused += 1
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
            connection = _Connection(self, stream)
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
        return ServerStatistics(
            connections_open=len(self._connections),
            connections_accepted=self.connections_accepted,
            connections_refused=self.connections_refused,
            protocol_errors=self.protocol_errors,
            requests_inflight=self.inflight,
            requests_by_opcode={op.name.lower(): self.requests_by_opcode[op] for op in Opcode},
            responses_by_status={
                status.name.lower(): self.responses_by_status[status] for status in Status
            },
            bytes_received=self.bytes_received,
            bytes_sent=self.bytes_sent,
            bytes_buffered=sum(c.decoder.buffered_bytes for c in self._connections),
            sends_backed_up=self.sends_backed_up,
            read_bytes_held=self.read_budget.used,
            reads_waiting=self.read_budget.waiting
            + sum(c.read_budget.waiting for c in self._connections),
        )


class _Connection:
    """One client connection: a reader (this task) and a writer task."""

    def __init__(self, server: Server, stream: trio.abc.Stream) -> None:
        self.server = server
        self.node = server.node
        self.stream = stream
        config = server.config
        self.config = config
        self.decoder = RequestDecoder(config.frame_bytes_max, config.receive_bytes_max)
        #: responses ready to send, and how many responses they hold
        self.outgoing: list[bytes | bytearray] = []
        self.outgoing_count = 0
        #: bytes of queued frames other than add responses (counted in inflight_bytes)
        self.outgoing_bytes = 0
        #: adds the node completed, waiting for the writer to encode their responses
        self.adds_done: list[Request] = []
        #: runs (ADD_RUN frames) the node completed, likewise; their `tag` is the
        #: frame's request id
        self.runs_done: list[Request] = []
        #: wire request id of each add in the node
        self.inflight = 0
        self.inflight_bytes = 0
        self.writer_wakeup = trio.Event()
        self.space = trio.Event()
        #: bytes of read responses this connection holds (see ServerConfig), and of
        #: those, the ones queued in `outgoing` and the ones in the writer's send
        self.read_budget = ByteBudget(config.read_bytes_per_connection_max)
        self.outgoing_read_bytes = 0
        self.sending_read_bytes = 0
        self.reading = True
        self.read_scope = trio.CancelScope()
        #: cancel scopes of the long-poll reads waiting now
        self.long_polls: set[trio.CancelScope] = set()
        self.stopping = False
        #: when the last bytes came in, and since when a send has been blocked (None:
        #: not sending); the server's idle sweeper reads them
        self.last_received = trio.current_time()
        self.sending_since: float | None = None
        self.on_add_done = self._on_add_done  # one bound method for every add
        self.on_run_done = self._on_run_done
        #: the socket's fd, for sending a response straight from the task that
        #: completed it (`_respond`); -1 for TLS, and once the connection has ended
        #: (the fd may then be another connection's)
        self.raw_fd = -1
        if type(stream) is trio.SocketStream:
            self.raw_fd = stream.socket.fileno()

    @property
    def version(self) -> int:
        """The protocol version of the connection's requests, and so of its answers."""
        return self.decoder.version or f.PROTOCOL_VERSION

    def _encode(self, message: ResponseMessage) -> bytes:
        return encode_response(message, self.version)

    def close_if_idle(self, now: float) -> None:
        """Called by the sweeper: close a connection with nothing in flight that sent
        no byte for the idle timeout (even in the middle of a frame: a peer that
        starts a frame and stalls must not hold its buffer), or one that has not read
        its responses for that long."""
        idle_s = self.config.idle_timeout_s
        if self.sending_since is not None and now - self.sending_since >= idle_s:
            _log.info("closing a connection that has not read its responses for %.0f s", idle_s)
            self.nursery.cancel_scope.cancel()
        elif self.inflight == 0 and now - self.last_received >= idle_s:
            _log.info("closing a connection idle for %.0f s", idle_s)
            self.read_scope.cancel()

    def stop_reading(self) -> None:
        """Shutdown: read no more requests, and end long polls now (they could wait a
        minute; their clients can retry elsewhere) so the drain is quick."""
        self.read_scope.cancel()
        self.stopping = True
        for scope in self.long_polls:
            scope.cancel()

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.raw_fd = -1
            # responses never sent give their bytes back (reads under way did, when
            # they were cancelled)
            held = self.outgoing_read_bytes + self.sending_read_bytes
            self.outgoing_read_bytes = self.sending_read_bytes = 0
            if held:
                self._release_read(held)

    async def _run(self) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self._write_loop)
            try:
                with self.read_scope:
                    await self._read_loop()
            except ProtocolError as error:
                self.server.protocol_errors += 1
                _log.info("closing a connection that sent a bad frame: %s", error)
                if error.request_id is not None:
                    self._queue(
                        encode_error(
                            error.request_id,
                            error.opcode,
                            error.status,
                            str(error),
                            version=self.version,
                        ),
                        0,
                    )
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                nursery.cancel_scope.cancel()  # nobody to answer
            finally:
                self.reading = False
                self._wake_writer()

    # --- reading -----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        config = self.config
        per_connection_max = config.inflight_per_connection_max
        bytes_max = config.inflight_bytes_per_connection_max
        receive_max = config.receive_bytes_max
        stream = self.stream
        decoder = self.decoder
        server = self.server
        shared = server.receive_buffer
        into = [shared]
        view = memoryview(shared)
        #: the last read left the socket empty: wait for it before reading again,
        #: rather than spend a system call to learn it is still empty
        drained = False
        reads = self.read_budget
        while True:
            budget = per_connection_max - self.inflight
            if budget <= 0 or self.inflight_bytes >= bytes_max or reads.used >= reads.limit:
                self.space = trio.Event()
                await self.space.wait()
                continue
            requests = decoder.next_requests_raw(budget)
            if requests:
                self.inflight += len(requests)
                await self._dispatch(requests)
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
            server.bytes_received += len(data)
            decoder.receive_data(data if type(data) is bytes else bytes(data))
            if drained and decoder.buffered_bytes:
                # the read ended inside a frame: the rest of a big one (a run) is
                # usually in the next TCP segment, there already, and one more read
                # costs less than a wait for readiness (epoll_ctl, a turn, epoll_wait).
                # If it is not there, that read fails and the next wait is the real one
                drained = False

    async def _dispatch(self, requests: list[RequestMessage | WireAdd | Refused]) -> None:
        server = self.server
        node = self.node
        counts = server.requests_by_opcode
        room = server.config.inflight_node_max - server.inflight
        adds: list[WireAdd] = []
        runs: list[Request] = []
        for message in requests:
            if type(message) is tuple:
                adds.append(message)
                continue
            assert not isinstance(message, tuple)  # (for the type checker)
            if isinstance(message, Refused):
                counts[message.opcode] += 1
                frame = encode_error(
                    message.request_id,
                    message.opcode,
                    message.status,
                    message.message,
                    version=self.version,
                )
                self._queue(frame, 1)
                continue
            if type(message) is AddRun:
                counts[Opcode.ADD_RUN] += 1
                if room <= 0:
                    self._overloaded(message.request_id, Opcode.ADD_RUN)
                    continue
                run = self._run_request(message)
                if run is not None:
                    room -= 1
                    runs.append(run)
                continue
            opcode = _OPCODES[type(message)]
            counts[opcode] += 1
            if room <= 0:
                self._overloaded(message.request_id, opcode)
                continue
            room -= 1
            server.inflight += 1
            self.nursery.start_soon(self._perform, message, opcode)
        if runs:
            server.inflight += len(runs)
            self.inflight_bytes += sum([run.payload_bytes for run in runs])
        batch = runs
        if adds:
            counts[Opcode.ADD_ENTRY] += len(adds)
            if len(adds) > room:  # past the node-wide limit: refuse the rest
                for add in adds[max(room, 0) :]:
                    self._overloaded(add[0], Opcode.ADD_ENTRY)
                adds = adds[: max(room, 0)]
            add_batch, refused = node.entry_requests(adds, self.on_add_done)
            for request_id, error in refused:
                self._queue(_error_frame(request_id, Opcode.ADD_ENTRY, error, self.version), 1)
            server.inflight += len(adds) - len(refused)
            self.inflight_bytes += sum([request.payload_bytes for request in add_batch])
            batch = add_batch + runs if runs else add_batch
        if not batch:
            return
        try:
            await node.submit(batch)
        except PoraError as error:  # the node is closing: none of them was queued
            for request in batch:
                request.fail(error)

    def _run_request(self, message: AddRun) -> Request | None:
        """The node's request for an ADD_RUN frame, or None when the run is refused
        whole (an entry too large, a bad id: answered here, nothing journalled)."""
        try:
            run = self.node.run_request(
                message.ledger_id,
                message.first_entry_id,
                message.payloads,
                master_key=message.master_key,
                recovery=message.recovery,
                last_add_confirmed=message.last_add_confirmed,
                on_done=self.on_run_done,
            )
        except PoraError as error:
            self._queue(_error_frame(message.request_id, Opcode.ADD_RUN, error, self.version), 1)
            return None
        run.tag = message.request_id
        return run

    def _overloaded(self, request_id: int, opcode: int) -> None:
        self._queue(
            encode_error(
                request_id,
                opcode,
                Status.OVERLOADED,
                f"the node has {self.server.config.inflight_node_max} requests in flight "
                "(inflight_node_max); retry later",
                version=self.version,
            ),
            1,
        )

    # --- performing --------------------------------------------------------------------------

    def _on_add_done(self, request: Request) -> None:
        # runs in a ledger worker: keep it tiny, the writer does the rest. The node-wide
        # count drops here, not in the writer: the connection may be gone already.
        self.server.inflight -= len(request.tags)
        self.adds_done.append(request)
        self._respond()

    def _on_run_done(self, request: Request) -> None:
        # as _on_add_done, for a run that answers one frame
        self.server.inflight -= 1
        self.runs_done.append(request)
        self._respond()

    def _respond(self) -> None:
        """Answer what is done: right now when the socket is free, else by the writer.

        Sending from here (a ledger worker, after the group's sync) rather than
        waking the writer task saves a turn of the event loop per response, a tenth
        of a millisecond or more under load. Safe because it runs only while the
        writer is not inside `send_all` and everything queued before goes first.
        """
        if self.raw_fd >= 0 and self.sending_since is None:
            self._send_directly()
        elif not self.writer_wakeup.is_set():
            self.writer_wakeup.set()

    def _send_directly(self) -> None:
        """Encode and send every response ready, with one non-blocking write; what
        the socket does not take now goes to the writer task, first in line."""
        if self.adds_done:
            self._encode_adds_done()
        if self.runs_done:
            self._encode_runs_done()
        frames = self.outgoing
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        try:
            sent = os.write(self.raw_fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._wake_writer()  # its send_all meets the error and ends the connection
            return
        server = self.server
        server.bytes_sent += sent
        self.inflight -= self.outgoing_count
        self.outgoing_count = 0
        if sent == len(data):
            self.outgoing = []
            self.inflight_bytes -= self.outgoing_bytes
            self.outgoing_bytes = 0
            if self.outgoing_read_bytes:
                self._release_read(self.outgoing_read_bytes)
                self.outgoing_read_bytes = 0
            if not self.reading:
                self._wake_writer()  # it ends the connection once nothing is in flight
        else:
            server.sends_backed_up += 1
            rest = bytes(memoryview(data)[sent:])
            self.outgoing = [rest]
            self.inflight_bytes -= self.outgoing_bytes - len(rest)
            self.outgoing_bytes = len(rest)
            self._wake_writer()
        if not self.space.is_set():
            self.space.set()

    def _range_bytes_max(self, message: ReadRange) -> int:
        # keep the response within a frame the client accepts
        return max(1, min(message.max_bytes, self.config.frame_bytes_max // 2))

    async def _perform(self, message: RequestMessage, opcode: int) -> None:
        held = _Held()  # read-response bytes reserved for this request
        try:
            try:
                frame = await self._execute(message, held)
            except PoraError as error:
                if isinstance(error, StorageCorruption):
                    _log_corruption(message, error)
                frame = _error_frame(message.request_id, opcode, error, self.version)
            except Exception as error:  # a bug: answer it, log it, keep serving
                _log.exception("request %r failed", message)
                frame = encode_error(
                    message.request_id,
                    opcode,
                    Status.INTERNAL_ERROR,
                    f"internal error: {error!r}",
                    version=self.version,
                )
            read_bytes = 0
            if held.bytes:  # a read: its response holds its own size until sent
                read_bytes = len(frame)
                self._resize_read(held.bytes, read_bytes)
                held.bytes = 0
        finally:
            self.server.inflight -= 1
            if held.bytes:  # cancelled: the connection is ending
                self._release_read(held.bytes)
        self._queue(frame, 1, read_bytes)

    # --- read-response bytes -----------------------------------------------------------------

    async def _reserve_read(self, held: _Held, size: int) -> None:
        """Reserve `size` bytes for a read's response, under the connection's limit
        and then the node's, waiting in line for each."""
        await self.read_budget.acquire(size)
        try:
            await self.server.read_budget.acquire(size)
        except BaseException:
            self._release_connection_read(size)
            raise
        held.bytes += size

    def _release_connection_read(self, size: int) -> None:
        self.read_budget.release(size)
        if not self.space.is_set():
            self.space.set()  # the reader may read the socket again

    def _release_read(self, size: int) -> None:
        self.server.read_budget.release(size)
        self._release_connection_read(size)

    def _resize_read(self, reserved: int, size: int) -> None:
        """Hold `size` bytes instead of the `reserved` ones (a response is rarely
        larger than reserved: then it is in memory already, and counts as it is)."""
        if size < reserved:
            self._release_read(reserved - size)
        elif size > reserved:
            self.read_budget.force(size - reserved)
            self.server.read_budget.force(size - reserved)

    def _entry_response_bytes_max(self) -> int:
        return self.node.config.entry_bytes_max + _ENTRY_RESPONSE_OVERHEAD

    def _range_response_bytes_max(self, message: ReadRange) -> int:
        # at most max_bytes of payload, or one entry when the first one is larger
        payload = max(self._range_bytes_max(message), self.node.config.entry_bytes_max)
        entries = max(1, min(message.max_entries, RANGE_ENTRIES_MAX))
        fixed = f.HEADER_BYTES + f.READ_RANGE_RESPONSE.size
        return fixed + payload + entries * f.RANGE_ITEM.size

    async def _read_entry(self, message: ReadEntry, held: _Held) -> bytes:
        """The payload of a READ_ENTRY, read under a reservation of read-response
        bytes; a long poll waits for its entry holding none."""
        node = self.node
        await self._reserve_read(held, self._entry_response_bytes_max())
        if message.wait_ms <= 0:
            return await node.read_entry(message.ledger_id, message.entry_id)
        try:
            return await node.read_entry(message.ledger_id, message.entry_id)
        except (NoSuchEntry, NoSuchLedger):
            pass
        self._release_read(held.bytes)
        held.bytes = 0
        wait_s = min(message.wait_ms, LONG_POLL_MS_MAX) / 1000.0
        payload = await self._long_poll(message, wait_s)
        # (an entry that just arrived is the memtable's own bytes: no copy waits here)
        await self._reserve_read(held, len(payload) + _ENTRY_RESPONSE_OVERHEAD)
        return payload

    async def _long_poll(self, message: ReadEntry, wait_s: float) -> bytes:
        """A read that may wait for its entry; shutdown ends the wait at once (the
        client may retry on another node), answering SHUTTING_DOWN."""
        if not self.stopping:
            with trio.CancelScope() as scope:
                self.long_polls.add(scope)
                try:
                    return await self.node.read_entry(
                        message.ledger_id, message.entry_id, wait_s=wait_s
                    )
                finally:
                    self.long_polls.discard(scope)
        raise NodeClosed("the node is shutting down; read from another node, or retry")

    async def _execute(self, message: RequestMessage, held: _Held) -> bytes:  # noqa: PLR0911 (one per op)
        node = self.node
        rid = message.request_id
        if isinstance(message, ReadEntry):
            if message.fence:
                await node.fence_ledger(message.ledger_id, master_key=message.master_key)
            payload = await self._read_entry(message, held)
            lac = node.last_add_confirmed(message.ledger_id)
            return self._encode(
                ReadEntryResponse(rid, message.ledger_id, message.entry_id, lac, payload)
            )
        if isinstance(message, ReadRange):
            await self._reserve_read(held, self._range_response_bytes_max(message))
            entries = await node.read_range(
                message.ledger_id,
                message.first_entry_id,
                message.last_entry_id,
                max_entries=max(1, min(message.max_entries, RANGE_ENTRIES_MAX)),
                max_bytes=self._range_bytes_max(message),
            )
            lac = node.last_add_confirmed(message.ledger_id)
            return self._encode(ReadRangeResponse(rid, message.ledger_id, lac, entries))
        if isinstance(message, ReadLac):
            lac = node.last_add_confirmed(message.ledger_id)
            return self._encode(LacResponse(rid, message.ledger_id, lac))
        if isinstance(message, Fence):
            last = await node.fence_ledger(message.ledger_id, master_key=message.master_key)
            return self._encode(FenceResponse(rid, message.ledger_id, last))
        if isinstance(message, Close):
            last = await node.close_ledger(
                message.ledger_id, message.last_entry_id, master_key=message.master_key
            )
            return self._encode(CloseResponse(rid, message.ledger_id, last))
        if isinstance(message, Delete):
            await node.delete_ledger(message.ledger_id, master_key=message.master_key)
            return self._encode(DeleteResponse(rid, message.ledger_id))
        if isinstance(message, ListLedgers):
            count_max = max(1, min(message.max_count, LIST_LEDGERS_MAX))
            # a page of 10,000 ledgers is 450 KiB: held like a read's response
            fixed = f.HEADER_BYTES + f.LIST_RESPONSE.size
            await self._reserve_read(held, fixed + count_max * f.LEDGER_SUMMARY.size)
            # one more than the page: whether MORE follow
            infos = node.ledgers(after_ledger_id=message.after_ledger_id, count_max=count_max + 1)
            page = [
                LedgerSummary(
                    i.ledger_id,
                    i.state,
                    i.first_entry_id,
                    i.last_entry_id,
                    i.entry_count,
                    i.payload_bytes,
                    i.created_ms,
                )
                for i in infos[:count_max]
            ]
            return self._encode(ListLedgersResponse(rid, page, len(infos) > count_max))
        assert isinstance(message, Info)
        return self._encode(
            InfoResponse(
                rid,
                f.PROTOCOL_VERSION,
                node.read_only,
                self.config.frame_bytes_max,
                node.config.entry_bytes_max,
                node.statistics().ledgers.ledgers,
                pora.__version__,
            )
        )

    # --- writing -----------------------------------------------------------------------------

    def _queue(self, frame: bytes, responses: int, read_bytes: int = 0) -> None:
        """Queue one response frame; `responses` is how many requests in flight it
        answers (0 for the answer to a frame that never became a request), and
        `read_bytes` the read-response bytes it holds until it is sent."""
        self.outgoing.append(frame)
        self.outgoing_read_bytes += read_bytes
        self.outgoing_count += responses
        # responses waiting to be sent count as bytes in flight until they are
        self.outgoing_bytes += len(frame)
        self.inflight_bytes += len(frame)
        self.server.responses_by_status[frame[7]] += 1
        self._wake_writer()

    def _wake_writer(self) -> None:
        if not self.writer_wakeup.is_set():
            self.writer_wakeup.set()

    def _encode_adds_done(self) -> None:
        done = self.adds_done
        self.adds_done = []
        statuses = self.server.responses_by_status
        answered = sum([len(request.tags) for request in done])
        ok = done
        failed = [r for r in done if r.error is not None or r.entry_errors is not None]
        if failed:  # rare: answer each failed add with its own error frame
            ok = [r for r in done if r.error is None and r.entry_errors is None]
            for request in failed:
                self._encode_failed_run(request)
        if ok:
            self.outgoing.append(
                encode_add_run_responses(
                    [(r.tags, r.ledger_id, r.entry_id) for r in ok], self.version
                )
            )
            statuses[0] += answered if not failed else sum([len(r.tags) for r in ok])
        self.outgoing_count += answered
        self.inflight_bytes -= sum([request.payload_bytes for request in done])

    def _encode_runs_done(self) -> None:
        """One response frame per finished ADD_RUN: OK (listing the entries that failed
        alone, if any), or the error that failed the whole run."""
        done = self.runs_done
        self.runs_done = []
        statuses = self.server.responses_by_status
        outgoing = self.outgoing
        version = self.version
        for run in done:
            if run.error is not None:
                frame = _error_frame(run.tag, Opcode.ADD_RUN, run.error, version)
            elif run.entry_errors is None:
                frame = encode_add_run_response(
                    run.tag, run.ledger_id, run.entry_id, run.count, version=version
                )
            else:
                failures = [
                    (run.entry_id + index, int(status_of(error)), str(error))
                    for index, error in enumerate(run.entry_errors)
                    if error is not None
                ]
                frame = encode_add_run_response(
                    run.tag, run.ledger_id, run.entry_id, run.count, failures, version
                )
            outgoing.append(frame)
            statuses[frame[7]] += 1
        self.outgoing_count += len(done)
        self.inflight_bytes -= sum([run.payload_bytes for run in done])

    def _encode_failed_run(self, request: Request) -> None:
        statuses = self.server.responses_by_status
        for index, tag in enumerate(request.tags):
            error = request.error_of(index)
            if error is None:
                frame = bytes(
                    encode_add_run_responses(
                        [((tag,), request.ledger_id, request.entry_id + index)], self.version
                    )
                )
            else:
                frame = _error_frame(tag, Opcode.ADD_ENTRY, error, self.version)
            self.outgoing.append(frame)
            statuses[frame[7]] += 1

    async def _write_loop(self) -> None:
        stream = self.stream
        server = self.server
        while True:
            if self.adds_done:
                self._encode_adds_done()
            if self.runs_done:
                self._encode_runs_done()
            if not self.outgoing:
                if not self.reading and self.inflight == 0:
                    return
                self.writer_wakeup = trio.Event()
                await self.writer_wakeup.wait()
                continue
            frames = self.outgoing
            count = self.outgoing_count
            sent_bytes = self.outgoing_bytes
            sending_read_bytes = self.sending_read_bytes = self.outgoing_read_bytes
            self.outgoing_read_bytes = 0
            self.outgoing_bytes = 0
            self.outgoing = []
            self.outgoing_count = 0
            data = frames[0] if len(frames) == 1 else b"".join(frames)
            self.sending_since = trio.current_time()
            try:
                await stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.nursery.cancel_scope.cancel()  # the peer is gone: nobody to answer
                return
            self.sending_since = None
            server.bytes_sent += len(data)
            self.inflight -= count
            self.inflight_bytes -= sent_bytes
            if sending_read_bytes:
                self.sending_read_bytes = 0
                self._release_read(sending_read_bytes)
            if not self.space.is_set():
                self.space.set()


class _Held:
    """The read-response bytes one request has reserved."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


_OPCODES: Final[dict[type, int]] = {
    AddEntry: Opcode.ADD_ENTRY,
    AddRun: Opcode.ADD_RUN,
    ReadEntry: Opcode.READ_ENTRY,
    ReadRange: Opcode.READ_RANGE,
    ReadLac: Opcode.READ_LAC,
    Fence: Opcode.FENCE,
    Close: Opcode.CLOSE,
    Delete: Opcode.DELETE,
    ListLedgers: Opcode.LIST_LEDGERS,
    Info: Opcode.INFO,
}
