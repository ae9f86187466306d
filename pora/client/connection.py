"""The connection of the per-node client: one connection to the node at a time
(a `Session`), made on first use and re-made after a loss with backoff; its reader
and writer tasks; the room its callers wait in line for (`admission.Admission`);
and the deadline sweep (`deadlines.DeadlineSweep`). `NodeClient` holds one.

A connection starts by asking the node who it is (INFO). Its writer task sends
the frames queued in one scheduler turn in one write, framing the coalesced adds
of that turn first; a writer's batches found the writer waiting with nothing
queued are sent at once instead (`send_soon`, plain TCP under trio). Its reader
task hands each response to the operation waiting for it by request id
(`pending.PendingOperation`). A lost connection fails what
was in flight on it with `ConnectionLost`, and the next call makes a new one.

How a stream is opened is a seam (`StreamOpener`): TCP, with or without TLS, by
default; anything that gives a byte stream for an address will do.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Final

import anyio
import anyio.abc
import trio
from anyio.streams.tls import TLSAttribute

from journal.errors import PoraError
from ledger.errors import InvalidArgument
from netio.codec import encode_request
from netio.errors import ConnectionLost, InstanceMismatch, ProtocolError, RequestTimeout
from netio.messages import ErrorResponse, Info, InfoResponse
from pora import tracing
from pora.client.admission import Admission
from pora.client.coalescer import add_call_type, frames_for
from pora.client.deadlines import DeadlineSweep
from pora.client.pending import RequestWaiter
from pora.client.remote_errors import error_from_response
from pora.client.session import RECEIVE_BYTES, NodeInfo, Session, why_lost
from pora.client.waiting import wakeup_factory

DEFAULT_PORT: Final = 3181

#: opens a byte stream to "host:port" (raising OSError, TimeoutError, ... when it
#: cannot: the connection retries with backoff)
StreamOpener = Callable[[str], Awaitable[anyio.abc.ByteStream]]


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep:
        return address, DEFAULT_PORT
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return host, int(port)
    except ValueError:
        raise InvalidArgument(f"node address {address!r} is not host:port") from None


def tcp_opener(ssl_context: ssl.SSLContext | None) -> StreamOpener:
    """The default opener: TCP to the address, through TLS when `ssl_context` is given."""

    async def open_tcp(address: str) -> anyio.abc.ByteStream:
        host, port = split_address(address)
        if ssl_context is None:
            return await anyio.connect_tcp(host, port)
        return await anyio.connect_tcp(
            host, port, ssl_context=ssl_context, tls_standard_compatible=False
        )

    return open_tcp


class NodeConnection:
    """One node's connection, its tasks, its room and its deadlines: what every call
    of a `NodeClient` goes through."""

    def __init__(
        self,
        address: str,
        task_group: anyio.abc.TaskGroup,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        inflight_max: int,
        inflight_bytes_max: int,
        frame_bytes_max: int,
        reconnect_attempts: int,
        backoff_initial_s: float,
        backoff_max_s: float,
        open_stream: StreamOpener,
    ) -> None:
        self.address = address
        self.host, self.port = split_address(address)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.frame_bytes_max = frame_bytes_max
        self._task_group = task_group
        self._open_stream = open_stream
        self._reconnect_attempts = reconnect_attempts
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        #: the connection now (None before the first call); a lost one is replaced
        #: by the next call
        self.session: Session | None = None
        self._connect_lock = anyio.Lock()
        self._next_request_id = 1  # 0 is for messages about the connection itself
        self._closed = False
        self.reconnects = 0
        #: how this event loop's callers wait: an event each (one waiter), and the
        #: call object of coalesced adds (see pora.client.waiting)
        self.new_event = wakeup_factory()
        self.new_add_call = add_call_type()
        self.admission = Admission(address, inflight_max, inflight_bytes_max, self.new_event)
        self.deadlines = DeadlineSweep(self)
        #: the event loop's clock: under trio, trio's own (anyio's costs more, once
        #: per request)
        #: the tracer of when frames leave and responses come (`pora.tracing`), None
        #: when tracing is off
        self.trace = tracing.current()
        self.now: Callable[[], float] = (
            trio.current_time if trio.lowlevel.in_trio_task() else anyio.current_time
        )

    def start(self) -> None:
        """Start the client's deadline sweep (for the lifetime of its task group)."""
        self._task_group.start_soon(self.deadlines.run)

    # --- connection --------------------------------------------------------------------------

    async def connected(self) -> Session:
        """The live connection, made (or re-made) if need be."""
        session = self.session
        if session is not None and session.alive:
            return session
        async with self._connect_lock:
            session = self.session
            if session is not None and session.alive:
                return session
            if self._closed:
                raise ConnectionLost(f"the client of {self.address} is closed")
            stream = await self._open_with_backoff()
            session = Session(stream, self.frame_bytes_max)
            session.ports = _ports(self.port, stream)
            if trio.lowlevel.in_trio_task() and stream.extra(TLSAttribute.ssl_object, None) is None:
                session.raw_socket = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
            self.session = session
            self._task_group.start_soon(self._run_session, session)
            return session

    async def room(self, count: int, size: int, timeout_s: float) -> tuple[Session, float]:
        """The live connection and room on it for `count` requests or entries of
        `size` bytes (`admission`), taken in line within `timeout_s`; returns the
        session and what is left of the timeout. The caller gives the room back
        with `admission.release` once its call is over, however it ends."""
        session = self.session
        if session is None or not session.alive:
            session = await self.connected()
        admission = self.admission
        if admission.try_admit(count, size):
            return session, timeout_s
        left_s = await admission.admit(count, size, timeout_s)
        try:
            session = await self.connected()
        except BaseException:
            admission.release(count, size)
            raise
        return session, left_s

    def frame_limit(self, session: Session) -> int:
        """The size frames are cut to: this client's frame_bytes_max, or the node's if
        it is lower (once the node said it on this connection)."""
        return min(self.frame_bytes_max, session.node_frame_bytes_max or self.frame_bytes_max)

    def _introduce(self, session: Session, tasks: anyio.abc.TaskGroup) -> None:
        """Ask the node who it is (INFO) first thing on a new connection: a reconnect
        may reach another instance of the node (a wiped data dir at the same
        address), and a call that names the instance it expects waits for the
        answer before sending. Coalesced adds wait for it too (they are cut to the
        node's frame and entry limits)."""
        request_id = self.new_id()
        waiter = RequestWaiter(1, self.new_event(), float("inf"))
        session.pending[request_id] = (waiter, 0)
        session.outbox.append(encode_request(Info(request_id)))
        session.outbox_ready.set()
        tasks.start_soon(self._learn_identity, session, waiter, tasks.cancel_scope)

    async def _learn_identity(
        self, session: Session, waiter: RequestWaiter, tasks: anyio.CancelScope
    ) -> None:
        await waiter.event.wait()
        response = waiter.responses[0]
        if not isinstance(response, InfoResponse):
            if isinstance(response, ErrorResponse) and session.error is None:
                session.error = error_from_response(response)
            tasks.cancel()  # (a lost connection fails what waits for the answer)
            return
        session.node_frame_bytes_max = response.frame_bytes_max
        session.node_entry_bytes_max = response.entry_bytes_max
        session.instance_id = response.instance_id
        session.info = NodeInfo(
            protocol_version=response.protocol_version,
            server_version=response.server_version,
            read_only_reason=response.read_only_reason,
            frame_bytes_max=response.frame_bytes_max,
            entry_bytes_max=response.entry_bytes_max,
            ledger_count=response.ledger_count,
            instance_id=response.instance_id,
        )
        session.identified.set()
        session.outbox_ready.set()  # the writer frames the adds that waited

    async def await_identity(self, session: Session, timeout_s: float) -> None:
        """Wait (within `timeout_s`) for the node's answer to the connection's INFO."""
        if not session.identified.is_set():
            with anyio.move_on_after(timeout_s):
                await session.identified.wait()
        if not session.alive:
            raise ConnectionLost(
                f"connection to node {self.address} lost before it said who it is; nothing "
                "was sent. Retry: the next call reconnects"
            )
        if not session.identified.is_set():
            raise RequestTimeout(
                f"node {self.address} did not say who it is (INFO) within {timeout_s} s; "
                "nothing was sent"
            )

    async def check_instance(
        self, session: Session, instance_id: str | None, timeout_s: float
    ) -> None:
        """When the caller names the node instance it expects: wait (within its
        timeout) for the node to say who it is on this connection, and raise
        InstanceMismatch, before anything is sent, if it is another."""
        if instance_id is None:
            return
        await self.await_identity(session, timeout_s)
        if session.instance_id != instance_id:
            raise InstanceMismatch(self.address, instance_id, session.instance_id)

    async def _open_with_backoff(self) -> anyio.abc.ByteStream:
        delay_s = self._backoff_initial_s
        attempts = max(1, self._reconnect_attempts)
        last_error: BaseException | None = None
        for attempt in range(attempts):
            if attempt:
                await anyio.sleep(delay_s)
                delay_s = min(delay_s * 2, self._backoff_max_s)
            try:
                with anyio.fail_after(self.connect_timeout_s):
                    stream = await self._open_stream(self.address)
            except (OSError, TimeoutError, ssl.SSLError, anyio.BrokenResourceError) as error:
                last_error = error
                continue
            if self.session is not None:
                self.reconnects += 1
            return stream
        raise ConnectionLost(
            f"cannot connect to node {self.address} after {attempts} attempts: {last_error}; "
            "is `pora serve` running there, and is the address (and TLS setting) right?"
        )

    async def _run_session(self, session: Session) -> None:
        try:
            with session.cancel_scope:
                async with anyio.create_task_group() as tasks:
                    self._introduce(session, tasks)
                    tasks.start_soon(self._write_loop, session, tasks.cancel_scope)
                    await self._read_loop(session, tasks.cancel_scope)
        finally:
            session.alive = False
            session.identified.set()  # (what waits for it finds the connection gone)
            error = session.error
            lost: PoraError = ConnectionLost(
                f"connection to node {self.address} lost ({why_lost(error)}); the "
                f"{len(session.pending)} requests in flight on it may or may not have been "
                "performed: retry them (an add retried with the same bytes is safe); the "
                "next call reconnects"
            )
            if isinstance(error, PoraError) and not isinstance(error, ProtocolError):
                lost = error  # the node said why (it is overloaded, say)
            pending = session.pending
            session.pending = {}
            for operation, _index in pending.values():
                operation.fail(lost)
            queued = session.add_queue
            session.add_queue = []
            for add in queued:
                add.call.fail(lost)
            with anyio.CancelScope(shield=True):
                await anyio.aclose_forcefully(session.stream)

    async def _read_loop(self, session: Session, tasks: anyio.CancelScope) -> None:
        stream = session.stream
        decoder = session.decoder
        trace = self.trace
        ports = session.ports
        try:
            while True:
                data = await stream.receive(RECEIVE_BYTES)
                decoder.receive_data(data)
                pending = session.pending
                responses = decoder.next_responses()
                if trace is not None:
                    responses = list(responses)
                    trace.client_read(*ports, [r.request_id for r in responses])
                for response in responses:
                    slot = pending.pop(response.request_id, None)
                    if slot is None:
                        if response.request_id == 0 and isinstance(response, ErrorResponse):
                            # about the connection itself (too many): the node closes it
                            session.error = error_from_response(response)
                        continue  # else its caller gave up (timeout): drop it
                    slot[0].deliver(response, slot[1])
        except anyio.EndOfStream:
            pass  # the node closed the connection (after saying why, if it did)
        except Exception as error:
            if session.error is None:
                session.error = error
        finally:
            tasks.cancel()

    def send_soon(self, session: Session, frames: list[bytes]) -> None:
        """Send `frames` at once when the writer task waits with nothing queued and the
        stream is a plain TCP socket under trio (`Session.raw_socket`): one
        non-blocking send, what the socket does not take going to the writer; else
        queue them for the writer task. Saves the writer's wake-up per call at low
        load; under load the writer is busy and takes them with the others."""
        raw = session.raw_socket
        if raw is None or not session.writer_idle or session.outbox or session.add_queue:
            session.outbox.extend(frames)
        else:
            data = frames[0] if len(frames) == 1 else b"".join(frames)
            trace = self.trace
            sending_ns = time.monotonic_ns() if trace is not None else 0
            try:
                sent = raw.send(data)
            except OSError:  # full (BlockingIOError), or broken: the writer finds out
                sent = 0
            if sent == len(data):
                if trace is not None:
                    trace.client_wrote(*session.ports, sending_ns, self._next_request_id - 1)
                return
            session.outbox.append(data[sent:] if sent else data)
        ready = session.outbox_ready
        if not ready.is_set():
            ready.set()

    async def _write_loop(self, session: Session, tasks: anyio.CancelScope) -> None:
        stream = session.stream
        trace = self.trace
        ports = session.ports
        try:
            while True:
                if session.add_queue and session.identified.is_set():
                    # the callers of this turn queue theirs first: one write for all
                    await anyio.lowlevel.checkpoint()
                    self._frame_adds(session)
                if not session.outbox:
                    session.outbox_ready = anyio.Event()
                    session.writer_idle = True
                    try:
                        await session.outbox_ready.wait()
                    finally:
                        session.writer_idle = False
                    continue
                frames = session.outbox
                session.outbox = []
                if trace is None:
                    await stream.send(frames[0] if len(frames) == 1 else b"".join(frames))
                else:  # (every id up to the last one given is in these frames or sent)
                    last_id = self._next_request_id - 1
                    sending_ns = time.monotonic_ns()  # (send returns after a checkpoint)
                    await stream.send(frames[0] if len(frames) == 1 else b"".join(frames))
                    trace.client_wrote(*ports, sending_ns, last_id)
        except Exception as error:
            if session.error is None:
                session.error = error
            tasks.cancel()

    def _frame_adds(self, session: Session) -> None:
        """Turn the queued adds into frames (few: see pora.client.coalescer)."""
        queued = session.add_queue
        session.add_queue = []
        pending = session.pending
        outbox = session.outbox
        entry_max = session.node_entry_bytes_max
        limit = self.frame_limit(session)
        for request_id, frame, add_frame in frames_for(queued, self.new_id, limit, entry_max):
            pending[request_id] = (add_frame, 0)
            outbox.append(frame)

    async def aclose(self) -> None:
        self._closed = True
        self.deadlines.stop()
        session = self.session
        if session is not None:
            session.cancel_scope.cancel()

    # --- request ids ---------------------------------------------------------------------------

    def ids(self, count: int) -> list[int]:
        first = self._next_request_id
        self._next_request_id = first + count
        return list(range(first, first + count))

    def new_id(self) -> int:
        request_id = self._next_request_id
        self._next_request_id = request_id + 1
        return request_id


def _ports(node_port: int, stream: anyio.abc.ByteStream) -> tuple[int, int]:
    """The node's port and this end's, which name the connection in trace records."""
    try:
        return node_port, int(stream.extra(anyio.abc.SocketAttribute.local_port))
    except anyio.TypedAttributeLookupError:
        return node_port, 0


__all__ = [
    "DEFAULT_PORT",
    "NodeConnection",
    "StreamOpener",
    "split_address",
    "tcp_opener",
]
