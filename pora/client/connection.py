"""The connection side of the per-node client: connecting (with backoff), the
reader and writer tasks of each connection, and flow control.

A connection starts by asking the node who it is (INFO). Its writer task sends
the frames queued in one scheduler turn in one write, framing the coalesced adds
of that turn first; its reader task hands each response to its waiter by request
id. A lost connection fails what was in flight on it with `ConnectionLost`, and
the next call makes a new one.
"""

from __future__ import annotations

import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final

import anyio
import anyio.abc

from journal.errors import PoraError
from ledger.errors import InvalidArgument
from netio.codec import encode_request
from netio.errors import ConnectionLost, ProtocolError, RequestTimeout
from netio.messages import ErrorResponse, Info, InfoResponse
from pora.client.coalescer import add_call_type, frames_for
from pora.client.deadlines import DeadlineSweeper
from pora.client.remote_errors import clone_error, error_from_response
from pora.client.session import (
    RECEIVE_BYTES,
    Event,
    NodeInfo,
    Session,
    Waiter,
    why_lost,
)
from pora.client.waiting import wakeup_factory

DEFAULT_PORT: Final = 3181

#: Opens a byte stream to a node address in place of TCP (`connect_node(open_stream=)`):
#: the simulation's in-memory links (tests/simulation/wire.py). Raising OSError is a
#: failed attempt, retried with backoff as a refused TCP connect is.
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


class NodeConnection(DeadlineSweeper):
    """The connection side of a `NodeClient`: one connection (a `Session`) at a time,
    made on first use and re-made after a loss with backoff; its reader and writer
    tasks; and the room under `inflight_max` and `inflight_bytes_max` that callers
    wait in line for."""

    def __init__(
        self,
        address: str,
        task_group: anyio.abc.TaskGroup,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        ssl_context: ssl.SSLContext | None,
        inflight_max: int,
        inflight_bytes_max: int,
        frame_bytes_max: int,
        reconnect_attempts: int,
        backoff_initial_s: float,
        backoff_max_s: float,
        open_stream: StreamOpener | None = None,
    ) -> None:
        super().__init__()
        self._stream_opener = open_stream
        self.address = address
        self.host, self.port = split_address(address)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._task_group = task_group
        self._ssl_context = ssl_context
        self._inflight_max = inflight_max
        self._frame_bytes_max = frame_bytes_max
        self._reconnect_attempts = reconnect_attempts
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._session: Session | None = None
        self._connect_lock = anyio.Lock()
        self._next_request_id = 1  # 0 is for messages about the connection itself
        #: callers waiting for room under `inflight_max`, first come first served:
        #: one event each, set when room is handed to it
        self._room_waiters: deque[Event] = deque()
        #: room handed to woken callers that have not yet put their requests in
        self._room_granted = 0
        self._closed = False
        #: entries of coalesced add calls not yet answered, and their payload bytes:
        #: they count against inflight_max and inflight_bytes_max
        self._adds_in_flight = 0
        self._add_bytes_in_flight = 0
        self._inflight_bytes_max = inflight_bytes_max
        self.reconnects = 0
        self._new_event = wakeup_factory()
        self._new_add_call = add_call_type()

    # --- connection --------------------------------------------------------------------------

    async def _connected(self) -> Session:
        session = self._session
        if session is not None and session.alive:
            return session
        async with self._connect_lock:
            session = self._session
            if session is not None and session.alive:
                return session
            if self._closed:
                raise ConnectionLost(f"the client of {self.address} is closed")
            stream = await self._open_stream()
            session = Session(stream, self._frame_bytes_max)
            self._session = session
            self._task_group.start_soon(self._run_session, session)
            return session

    def _introduce(self, session: Session, tasks: anyio.abc.TaskGroup) -> None:
        """Ask the node who it is (INFO) first thing on a new connection: a reconnect
        may reach another instance of the node (a wiped data dir at the same
        address), and a call that names the instance it expects waits for the
        answer before sending. Coalesced adds wait for it too (they are cut to the
        node's frame and entry limits)."""
        request_id = self._new_id()
        waiter = Waiter(1, self._new_event())
        session.pending[request_id] = (waiter, 0)
        session.outbox.append(encode_request(Info(request_id)))
        session.outbox_ready.set()
        tasks.start_soon(self._learn_identity, session, waiter, tasks.cancel_scope)

    async def _learn_identity(
        self, session: Session, waiter: Waiter, tasks: anyio.CancelScope
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

    async def _open_stream(self) -> anyio.abc.ByteStream:
        delay_s = self._backoff_initial_s
        attempts = max(1, self._reconnect_attempts)
        last_error: BaseException | None = None
        for attempt in range(attempts):
            if attempt:
                await anyio.sleep(delay_s)
                delay_s = min(delay_s * 2, self._backoff_max_s)
            try:
                with anyio.fail_after(self.connect_timeout_s):
                    stream: anyio.abc.ByteStream
                    if self._stream_opener is not None:
                        stream = await self._stream_opener(self.address)
                    elif self._ssl_context is None:
                        stream = await anyio.connect_tcp(self.host, self.port)
                    else:
                        stream = await anyio.connect_tcp(
                            self.host,
                            self.port,
                            ssl_context=self._ssl_context,
                            tls_standard_compatible=False,
                        )
            except (OSError, TimeoutError, ssl.SSLError, anyio.BrokenResourceError) as error:
                last_error = error
                continue
            if self._session is not None:
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
            for waiter, _index in pending.values():
                if not isinstance(waiter, Waiter):
                    waiter.fail(lost)  # coalesced adds, batches
                elif waiter.error is None:
                    waiter.error = lost
                    waiter.event.set()
            queued = session.add_queue
            session.add_queue = []
            for add in queued:
                add.call.fail(lost)
            self._grant_room(0)
            with anyio.CancelScope(shield=True):
                await anyio.aclose_forcefully(session.stream)

    async def _read_loop(self, session: Session, tasks: anyio.CancelScope) -> None:
        stream = session.stream
        decoder = session.decoder
        try:
            while True:
                data = await stream.receive(RECEIVE_BYTES)
                decoder.receive_data(data)
                pending = session.pending
                for response in decoder.next_responses():
                    slot = pending.pop(response.request_id, None)
                    if slot is None:
                        if response.request_id == 0 and isinstance(response, ErrorResponse):
                            # about the connection itself (too many): the node closes it
                            session.error = error_from_response(response)
                        continue  # else its caller gave up (timeout): drop it
                    waiter, index = slot
                    if not isinstance(waiter, Waiter):  # coalesced adds, batches
                        waiter.deliver(response, clone_error)
                        continue
                    waiter.responses[index] = response
                    waiter.remaining -= 1
                    if waiter.remaining == 0:
                        waiter.event.set()
                if self._room_waiters:
                    self._grant_room(len(pending))
        except anyio.EndOfStream:
            pass  # the node closed the connection (after saying why, if it did)
        except Exception as error:
            if session.error is None:
                session.error = error
        finally:
            tasks.cancel()

    async def _write_loop(self, session: Session, tasks: anyio.CancelScope) -> None:
        stream = session.stream
        try:
            while True:
                if session.add_queue and session.identified.is_set():
                    # the callers of this turn queue theirs first: one write for all
                    await anyio.lowlevel.checkpoint()
                    self._frame_adds(session)
                if not session.outbox:
                    session.outbox_ready = anyio.Event()
                    await session.outbox_ready.wait()
                    continue
                frames = session.outbox
                session.outbox = []
                await stream.send(frames[0] if len(frames) == 1 else b"".join(frames))
        except Exception as error:
            if session.error is None:
                session.error = error
            tasks.cancel()

    def _frame_adds(self, session: Session) -> None:
        """Turn the queued adds into frames (few: see pora.client.coalescer)."""
        queued = session.add_queue
        session.add_queue = []
        limit = min(self._frame_bytes_max, session.node_frame_bytes_max or self._frame_bytes_max)
        pending = session.pending
        outbox = session.outbox
        entry_max = session.node_entry_bytes_max
        for request_id, frame, add_frame in frames_for(queued, self._new_id, limit, entry_max):
            pending[request_id] = (add_frame, 0)
            outbox.append(frame)

    async def aclose(self) -> None:
        self._closed = True
        self._sweeper_scope.cancel()
        session = self._session
        if session is not None:
            session.cancel_scope.cancel()

    # --- room under inflight_max ------------------------------------------------------------

    def _busy(self, session: Session) -> bool:
        """No room under inflight_max (requests and coalesced adds in flight, and
        room handed out) or inflight_bytes_max (bytes of coalesced adds)."""
        return (
            len(session.pending) + self._adds_in_flight + self._room_granted >= self._inflight_max
            or self._add_bytes_in_flight >= self._inflight_bytes_max
        )

    def _grant_room(self, pending: int) -> None:
        """Wake the callers first in line, as many as there is room for besides the
        `pending` requests in flight and the room already handed out."""
        waiters = self._room_waiters
        while (
            waiters
            and pending + self._adds_in_flight + self._room_granted < self._inflight_max
            and self._add_bytes_in_flight < self._inflight_bytes_max
        ):
            self._room_granted += 1
            waiters.popleft().set()

    async def _wait_for_room(self, timeout_s: float) -> float:
        """Wait in line for room under `inflight_max`; returns what is left of the
        call's timeout, or raises RequestTimeout when it runs out first."""
        event = self._new_event()
        self._room_waiters.append(event)
        started = anyio.current_time()
        try:
            with anyio.move_on_after(timeout_s):
                await event.wait()
        except BaseException:  # cancelled: room handed to this caller goes to the next
            if event.is_set():
                self._room_granted -= 1
                session = self._session
                self._grant_room(len(session.pending) if session is not None else 0)
            else:
                self._room_waiters.remove(event)
            raise
        if event.is_set():
            self._room_granted -= 1  # this caller's requests take the room now
        else:
            self._room_waiters.remove(event)
        if not event.is_set():
            raise RequestTimeout(
                f"no room to send a request to node {self.address} within {timeout_s} s: "
                f"{self._inflight_max} requests were in flight all along (inflight_max); "
                "nothing was sent. Retry, raise inflight_max, or make fewer calls at once"
            )
        return max(0.0, timeout_s - (anyio.current_time() - started))

    def _ids(self, count: int) -> list[int]:
        first = self._next_request_id
        self._next_request_id = first + count
        return list(range(first, first + count))

    def _new_id(self) -> int:
        request_id = self._next_request_id
        self._next_request_id = request_id + 1
        return request_id


__all__ = ["DEFAULT_PORT", "NodeConnection", "split_address"]
