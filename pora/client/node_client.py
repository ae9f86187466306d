"""The client of one node: `connect_node("host:port")` (asyncio or trio, through anyio).

Every operation of the in-process node, over one pipelined connection: any number
of tasks call at once, their frames are coalesced into few sends by one writer
task, and one reader task hands each response to its caller by request id
(responses come back in completion order, not request order). Failures raise the
engine's own exception types (`pora.NoSuchEntry`, `pora.LedgerFenced`, ...), with
the node's message. A broken connection fails what was in flight with
`ConnectionLost` and the next call reconnects, with exponential backoff.
"""

from __future__ import annotations

import contextlib
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar

import anyio
import anyio.abc
import trio

from journal.errors import PoraError
from ledger.errors import (
    EntryTooLarge,
    InvalidArgument,
)
from netio import frames as f
from netio.codec import (
    ResponseDecoder,
    encode_add_run,
    encode_request,
)
from netio.errors import ConnectionLost, InstanceMismatch, ProtocolError, RequestTimeout
from netio.frames import Status
from netio.messages import (
    AddRunResponse,
    Close,
    CloseResponse,
    Delete,
    DeleteResponse,
    ErrorResponse,
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
    ResponseMessage,
    WriteLac,
    WriteLacResponse,
)
from netio.security import master_key_from_password
from netio.status import error_type_of
from pora.client.coalescer import AddCall, AddFrame, QueuedAdd, frames_for

DEFAULT_PORT: Final = 3181
_Response = TypeVar("_Response", bound=ResponseMessage)
_RECEIVE_BYTES: Final = 256 * 1024
#: What an ADD_RUN frame's length field counts besides its key and its entries, and
#: what each entry adds to it besides its payload (its u32 size).
_RUN_FRAME_BASE: Final = f.LENGTH_MIN + f.ADD_RUN_REQUEST_FIXED.size
_RUN_BYTES_PER_ENTRY: Final = 4
#: Granularity of request timeouts: a request times out at most this much late.
TIMEOUT_TICK_S: Final = 0.02


def error_from_response(response: ErrorResponse) -> PoraError:
    """The typed exception of an error response, carrying the node's own message.

    Built without calling the type's constructor: the node already wrote the
    message (what, where, what to do), and the constructors want arguments (a
    size limit, say) that only the node knows.
    """
    error_type = error_type_of(response.status)
    error = error_type.__new__(error_type)
    Exception.__init__(error, response.message)
    error.ledger_id = response.ledger_id  # type: ignore[attr-defined]
    error.entry_id = response.entry_id  # type: ignore[attr-defined]
    if isinstance(error, ProtocolError):
        error.status = response.status
        error.request_id = response.request_id
    if isinstance(error, EntryTooLarge):
        error.size = error.limit = -1  # not carried by the protocol
    return error


def _clone(error: PoraError) -> PoraError:
    """A copy of `error` for another caller (or entry) to raise with a traceback of
    its own. Made without the constructor, as `error_from_response` makes errors:
    `copy.copy` would call it with the message alone, which most engine errors
    (EntryTooLarge, Unauthorized, ...) do not take."""
    clone = type(error).__new__(type(error))
    Exception.__init__(clone, *error.args)
    clone.__dict__.update(error.__dict__)
    return clone


def _split_runs(
    entries: Sequence[tuple[int, bytes]], key_bytes: int, frame_bytes_max: int
) -> list[tuple[int, int]]:
    """`entries` cut into runs, as `(start, stop)` slices in the caller's order: each
    as long as it can be while its entry ids go up by one, it holds at most
    RUN_ENTRIES_MAX entries, and its ADD_RUN frame stays within `frame_bytes_max`.
    An entry too large for any frame is a run of its own (the node refuses it)."""
    budget = frame_bytes_max - _RUN_FRAME_BASE - key_bytes
    runs: list[tuple[int, int]] = []
    start = used = next_id = 0
    for index, (entry_id, payload) in enumerate(entries):
        cost = _RUN_BYTES_PER_ENTRY + len(payload)
        if index and (
            entry_id != next_id or index - start == f.RUN_ENTRIES_MAX or used + cost > budget
        ):
            runs.append((start, index))
            start = index
            used = 0
        used += cost
        next_id = entry_id + 1
    if entries:
        runs.append((start, len(entries)))
    return runs


def _run_outcomes(
    result: ResponseMessage | PoraError, ledger_id: int, first_entry_id: int, count: int
) -> list[PoraError | None]:
    """One outcome per entry of an ADD_RUN from its response: every entry fails with
    the error that refused the whole run (each with its own copy), or the entries the
    response lists fail alone, with the error their status stands for."""
    if isinstance(result, PoraError):
        return [result, *[_clone(result) for _ in range(count - 1)]]
    if not (
        isinstance(result, AddRunResponse)
        and (result.ledger_id, result.first_entry_id, result.count)
        == (ledger_id, first_entry_id, count)
    ):
        raise ProtocolError(
            f"response {result.request_id} does not answer its ADD_RUN (entries "
            f"{first_entry_id}..{first_entry_id + count - 1} of ledger {ledger_id}): "
            f"{type(result).__name__}",
            status=Status.BAD_REQUEST,
            request_id=result.request_id,
        )
    outcomes: list[PoraError | None] = [None] * count
    for entry_id, status, message in result.failures:
        index = entry_id - first_entry_id
        if not 0 <= index < count:
            raise ProtocolError(
                f"response {result.request_id} to an ADD_RUN of entries {first_entry_id}.."
                f"{first_entry_id + count - 1} names entry {entry_id}, outside the run",
                status=Status.BAD_REQUEST,
                request_id=result.request_id,
            )
        outcomes[index] = error_from_response(
            ErrorResponse(result.request_id, f.Opcode.ADD_RUN, status, ledger_id, entry_id, message)
        )
    return outcomes


@dataclass(frozen=True, slots=True)
class NodeInfo:
    protocol_version: int
    server_version: str
    #: why the node refuses writes, or None when it takes them
    read_only_reason: str | None
    frame_bytes_max: int
    entry_bytes_max: int
    ledger_count: int
    #: the node's data-dir instance id (a wiped data dir has a new one)
    instance_id: str = ""


class _Event(Protocol):
    def set(self) -> None: ...
    def is_set(self) -> bool: ...
    async def wait(self) -> None: ...


class _TrioWakeup:
    """An event with one waiter, under trio: the waiting task parked and rescheduled
    directly, without the parking lot of a `trio.Event` (each caller of the client
    waits on its own, once per request: this is part of the per-add cost)."""

    __slots__ = ("_flag", "_task")

    def __init__(self) -> None:
        self._flag = False
        self._task: trio.lowlevel.Task | None = None

    def set(self) -> None:
        if self._flag:
            return
        self._flag = True
        task = self._task
        if task is not None:
            self._task = None
            trio.lowlevel.reschedule(task)

    def is_set(self) -> bool:
        return self._flag

    async def wait(self) -> None:
        if self._flag:
            await trio.lowlevel.checkpoint()
            return
        if self._task is not None:
            raise RuntimeError("a _TrioWakeup has one waiter at most")
        self._task = trio.lowlevel.current_task()

        def abort(_raise_cancel: object) -> trio.lowlevel.Abort:
            self._task = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)


def _event_type() -> Callable[[], _Event]:
    """The cheapest one-waiter event of the running event loop: under trio, a task
    parked and rescheduled directly (anyio's wrapper of trio.Event costs ten times
    as much, once per request)."""
    if trio.lowlevel.in_trio_task():
        return _TrioWakeup
    return anyio.Event


class _Waiter:
    """One caller waiting for `remaining` responses, one per frame it sent (one
    request, or a batch: the ADD_RUN frames of an `add_entries`)."""

    __slots__ = ("error", "event", "remaining", "responses", "timed_out")

    def __init__(self, count: int, event: _Event) -> None:
        self.event = event
        self.remaining = count
        self.responses: list[ResponseMessage | None] = [None] * count
        self.error: PoraError | None = None
        self.timed_out = False


class _Session:
    """One connection: its stream, its requests in flight, its frames to send."""

    def __init__(self, stream: anyio.abc.ByteStream, frame_bytes_max: int) -> None:
        self.stream = stream
        self.decoder = ResponseDecoder(frame_bytes_max, _RECEIVE_BYTES)
        #: request id -> (waiter, index of the response in the waiter)
        self.pending: dict[int, tuple[_Waiter | AddFrame, int]] = {}
        self.outbox: list[bytes] = []
        self.outbox_ready = anyio.Event()
        self.error: BaseException | None = None
        self.alive = True
        self.cancel_scope = anyio.CancelScope()
        #: the node's frame_bytes_max, once asked on this connection (a reconnect
        #: may reach a node restarted with another)
        self.node_frame_bytes_max: int | None = None
        #: the node's entry_bytes_max and data-dir instance id, from its INFO at connect
        self.node_entry_bytes_max = 0
        self.instance_id = ""
        #: coalesced adds queued for the writer task, which frames them each turn
        self.add_queue: list[QueuedAdd] = []
        #: set once the node answered the connection's first request, its INFO
        self.identified = anyio.Event()
        self.info: NodeInfo | None = None


def _why_lost(error: BaseException | None) -> str:
    """Why a connection ended, for its ConnectionLost message."""
    if error is None:
        return "the node closed it"
    text = str(error) or str(error.__cause__ or "")
    kind = type(error).__name__
    if isinstance(error, anyio.BrokenResourceError | anyio.ClosedResourceError | OSError):
        kind = f"the connection broke: {kind}"
    return f"{kind}: {text}" if text else kind


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep:
        return address, DEFAULT_PORT
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return host, int(port)
    except ValueError:
        raise InvalidArgument(f"node address {address!r} is not host:port") from None


class NodeClient:
    """A pipelined connection to one node. Make one with `connect_node`."""

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
    ) -> None:
        self.address = address
        self.host, self.port = _split_address(address)
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._task_group = task_group
        self._ssl_context = ssl_context
        self._inflight_max = inflight_max
        self._frame_bytes_max = frame_bytes_max
        self._reconnect_attempts = reconnect_attempts
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._session: _Session | None = None
        self._connect_lock = anyio.Lock()
        self._next_request_id = 1  # 0 is for messages about the connection itself
        #: callers waiting for room under `inflight_max`, first come first served:
        #: one event each, set when room is handed to it
        self._room_waiters: deque[_Event] = deque()
        #: room handed to woken callers that have not yet put their requests in
        self._room_granted = 0
        self._closed = False
        #: entries of coalesced add calls not yet answered, and their payload bytes:
        #: they count against inflight_max and inflight_bytes_max
        self._adds_in_flight = 0
        self._add_bytes_in_flight = 0
        self._inflight_bytes_max = inflight_bytes_max
        self.reconnects = 0
        #: deadline bucket -> waiters whose timeout ends in it
        self._deadlines: dict[int, set[_Waiter | AddCall]] = {}
        self._sweeper_wakeup = anyio.Event()
        self._sweeper_scope = anyio.CancelScope()
        self._new_event = _event_type()
        #: the event loop's clock: under trio, trio's own (anyio's costs more, once
        #: per request)
        self._now: Callable[[], float] = (
            trio.current_time if trio.lowlevel.in_trio_task() else anyio.current_time
        )

    # --- connection --------------------------------------------------------------------------

    async def _connected(self) -> _Session:
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
            session = _Session(stream, self._frame_bytes_max)
            self._session = session
            self._task_group.start_soon(self._run_session, session)
            return session

    def _introduce(self, session: _Session, tasks: anyio.abc.TaskGroup) -> None:
        """Ask the node who it is (INFO) first thing on a new connection: a reconnect
        may reach another instance of the node (a wiped data dir at the same
        address), and a call that names the instance it expects waits for the
        answer before sending. Coalesced adds wait for it too (they are cut to the
        node's frame and entry limits)."""
        request_id = self._new_id()
        waiter = _Waiter(1, self._new_event())
        session.pending[request_id] = (waiter, 0)
        session.outbox.append(encode_request(Info(request_id)))
        session.outbox_ready.set()
        tasks.start_soon(self._learn_identity, session, waiter, tasks.cancel_scope)

    async def _learn_identity(
        self, session: _Session, waiter: _Waiter, tasks: anyio.CancelScope
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
                    if self._ssl_context is None:
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

    async def _run_session(self, session: _Session) -> None:
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
                f"connection to node {self.address} lost ({_why_lost(error)}); the "
                f"{len(session.pending)} requests in flight on it may or may not have been "
                "performed: retry them (an add retried with the same bytes is safe); the "
                "next call reconnects"
            )
            if isinstance(error, PoraError) and not isinstance(error, ProtocolError):
                lost = error  # the node said why (it is overloaded, say)
            pending = session.pending
            session.pending = {}
            for waiter, _index in pending.values():
                if isinstance(waiter, AddFrame):
                    waiter.fail(lost)
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

    async def _read_loop(self, session: _Session, tasks: anyio.CancelScope) -> None:
        stream = session.stream
        decoder = session.decoder
        try:
            while True:
                data = await stream.receive(_RECEIVE_BYTES)
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
                    if isinstance(waiter, AddFrame):
                        waiter.deliver(response, _clone)
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

    async def _write_loop(self, session: _Session, tasks: anyio.CancelScope) -> None:
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

    def _frame_adds(self, session: _Session) -> None:
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

    # --- timeouts ----------------------------------------------------------------------------

    # A cancel scope with a deadline per request costs more than the rest of a
    # pipelined add (trio keeps every deadline in a heap). Instead, waiters go into
    # buckets of TIMEOUT_TICK_S by deadline, and one sweeper task fails the waiters
    # of each bucket that has passed: a request times out at most one tick late.

    def _track_deadline(self, waiter: _Waiter | AddCall, timeout_s: float) -> int:
        bucket = int((self._now() + timeout_s) / TIMEOUT_TICK_S) + 1
        waiters = self._deadlines.get(bucket)
        if waiters is None:
            waiters = self._deadlines[bucket] = set()
            if not self._sweeper_wakeup.is_set():
                self._sweeper_wakeup.set()
        waiters.add(waiter)
        return bucket

    async def _sweep_deadlines(self) -> None:
        with self._sweeper_scope:
            while True:
                if not self._deadlines:
                    self._sweeper_wakeup = anyio.Event()
                    await self._sweeper_wakeup.wait()
                    continue
                now = int(anyio.current_time() / TIMEOUT_TICK_S)
                for bucket in [b for b in self._deadlines if b <= now]:
                    for waiter in self._deadlines.pop(bucket):
                        if waiter.remaining and waiter.error is None:
                            waiter.timed_out = True
                            waiter.event.set()
                await anyio.sleep(TIMEOUT_TICK_S)

    # --- calls -------------------------------------------------------------------------------

    def _busy(self, session: _Session) -> bool:
        """No room under inflight_max (requests and coalesced adds in flight, and
        room handed out) or inflight_bytes_max (bytes of coalesced adds)."""
        return (
            len(session.pending) + self._adds_in_flight + self._room_granted >= self._inflight_max
            or self._add_bytes_in_flight >= self._inflight_bytes_max
        )

    async def _check_instance(
        self, session: _Session, instance_id: str | None, timeout_s: float
    ) -> None:
        """When the caller names the node instance it expects: wait (within its
        timeout) for the node to say who it is on this connection, and raise
        InstanceMismatch, before anything is sent, if it is another."""
        if instance_id is None:
            return
        await self._await_identity(session, timeout_s)
        if session.instance_id != instance_id:
            raise InstanceMismatch(self.address, instance_id, session.instance_id)

    async def _await_identity(self, session: _Session, timeout_s: float) -> None:
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

    async def _call(
        self,
        frames: list[bytes],
        request_ids: list[int],
        timeout_s: float | None,
        instance_id: str | None = None,
    ) -> list[ResponseMessage | PoraError]:
        """Send frames (one buffer may hold many) for `request_ids` and wait for their
        responses (errors as values, in the order of `request_ids`)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        left_s = timeout
        session = await self._connected()
        if self._room_waiters or self._busy(session):
            left_s = await self._wait_for_room(timeout)
            session = await self._connected()
        await self._check_instance(session, instance_id, left_s)
        waiter = _Waiter(len(request_ids), self._new_event())
        pending = session.pending
        for index, request_id in enumerate(request_ids):
            pending[request_id] = (waiter, index)
        session.outbox.extend(frames)
        session.outbox_ready.set()
        bucket = self._track_deadline(waiter, left_s)
        try:
            await waiter.event.wait()
        finally:
            waiters = self._deadlines.get(bucket)
            if waiters is not None:
                waiters.discard(waiter)
            if waiter.remaining:
                for request_id in request_ids:
                    pending.pop(request_id, None)
                if self._room_waiters:
                    self._grant_room(len(pending))
        if waiter.timed_out:
            raise RequestTimeout(
                f"no response from node {self.address} within {timeout} s; the request may "
                "or may not have been performed"
            )
        if waiter.error is not None:
            # one error fails many waiters: each raises its own copy, so that their
            # tracebacks do not pile up on one shared exception object
            raise _clone(waiter.error)
        results: list[ResponseMessage | PoraError] = []
        for response in waiter.responses:
            assert response is not None
            if isinstance(response, ErrorResponse):
                results.append(error_from_response(response))
            else:
                results.append(response)
        return results

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

    async def _call_one(
        self,
        frame: bytes,
        request_id: int,
        timeout_s: float | None,
        expected: type[_Response],
        instance_id: str | None = None,
    ) -> _Response:
        """The response to one request, of the type its request is answered with; the
        node's error raised as its exception."""
        (result,) = await self._call([frame], [request_id], timeout_s, instance_id)
        if isinstance(result, PoraError):
            raise result
        if not isinstance(result, expected):
            raise ProtocolError(
                f"node {self.address} answered request {request_id} with "
                f"{type(result).__name__}, not {expected.__name__}",
                status=Status.BAD_REQUEST,
                request_id=request_id,
            )
        return result

    def _ids(self, count: int) -> list[int]:
        first = self._next_request_id
        self._next_request_id = first + count
        return list(range(first, first + count))

    def _new_id(self) -> int:
        request_id = self._next_request_id
        self._next_request_id = request_id + 1
        return request_id

    @staticmethod
    def _key(master_key: bytes, password: str | bytes | None) -> bytes:
        return master_key_from_password(password) if password is not None else master_key

    async def add_entry(
        self,
        ledger_id: int,
        entry_id: int,
        payload: bytes,
        *,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        last_add_confirmed: int = -1,
        recovery: bool = False,
        timeout_s: float | None = None,
    ) -> None:
        """Store an entry on the node; returns once it is durable there.

        `password` (or an already derived `master_key`) must match the ledger's;
        `last_add_confirmed` piggybacks the writer's LAC for tail readers;
        `recovery` marks an add of a recovery, which a fenced ledger accepts.
        """
        (outcome,) = await self.add_coalesced(
            ledger_id,
            [(entry_id, payload)],
            master_key=self._key(master_key, password),
            last_add_confirmed=last_add_confirmed,
            recovery=recovery,
            timeout_s=timeout_s,
        )
        if outcome is not None:
            raise outcome

    async def add_coalesced(
        self,
        ledger_id: int,
        entries: Sequence[tuple[int, bytes]],
        *,
        master_key: bytes = b"",
        last_add_confirmed: int = -1,
        recovery: bool = False,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> list[PoraError | None]:
        """Store `(entry_id, payload)` entries of one ledger, sharing frames with every
        other add queued on the connection in the same scheduler turn (ADD_RUN,
        ADD_BATCH or ADD_ENTRY frames; see pora.client.coalescer). One outcome per
        entry, in order: None (stored) or the error of that entry alone; a frame
        refused whole (a ledger refusal) gives each of its entries that error.
        Raises RequestTimeout or ConnectionLost (outcomes unknown: retrying with
        the same bytes is safe), and InstanceMismatch, sending nothing, when
        `instance_id` is given and the node answers from another instance."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        left_s = timeout
        session = self._session
        if session is None or not session.alive:
            session = await self._connected()
        if self._room_waiters or self._busy(session):
            left_s = await self._wait_for_room(timeout)
            session = await self._connected()
        if instance_id is not None:
            await self._check_instance(session, instance_id, left_s)
        count = len(entries)
        call = AddCall(count, self._new_event())
        queue = session.add_queue
        if count == 1:  # add_entry: the common case, kept lean
            entry_id, payload = entries[0]
            size = len(payload)
            queue.append(
                QueuedAdd(
                    ledger_id, master_key, recovery, entry_id, payload, last_add_confirmed, call, 0
                )
            )
        else:
            size = 0
            for index, (entry_id, payload) in enumerate(entries):
                size += len(payload)
                queue.append(
                    QueuedAdd(
                        ledger_id,
                        master_key,
                        recovery,
                        entry_id,
                        payload,
                        last_add_confirmed,
                        call,
                        index,
                    )
                )
        self._adds_in_flight += count
        self._add_bytes_in_flight += size
        ready = session.outbox_ready
        if not ready.is_set():
            ready.set()
        bucket = self._track_deadline(call, left_s)
        try:
            await call.event.wait()
        finally:
            waiters = self._deadlines.get(bucket)
            if waiters is not None:
                waiters.discard(call)
            self._adds_in_flight -= count
            self._add_bytes_in_flight -= size
            if self._room_waiters:
                self._grant_room(len(session.pending))
        if call.timed_out:
            raise RequestTimeout(
                f"no response from node {self.address} within {timeout} s; the adds may "
                "or may not have been performed (retrying with the same bytes is safe)"
            )
        if call.error is not None:
            raise _clone(call.error)
        return call.outcomes

    async def add_run(
        self,
        ledger_id: int,
        first_entry_id: int,
        payloads: Sequence[bytes],
        *,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        last_add_confirmed: int = -1,
        recovery: bool = False,
        timeout_s: float | None = None,
    ) -> list[PoraError | None]:
        """Store entries `first_entry_id`, `first_entry_id + 1`, ... with these payloads
        (1 to RUN_ENTRIES_MAX of them) in one ADD_RUN frame, answered by one response;
        returns once they are durable: one outcome per payload, in order (None: stored,
        else the engine's exception of an entry that failed alone, EntryConflict say).

        Raises the error that refused the whole run, when the node took none of it: a
        ledger refusal (Unauthorized, LedgerFenced, LedgerClosed, NodeReadOnly, ...)
        or one unfit entry (EntryTooLarge or InvalidArgument, its `entry_id` naming
        the entry). The frame must fit the node's frame_bytes_max, else the node
        refuses it with EntryTooLarge and drops the connection: `add_entries` cuts
        entries into runs that fit. Options as for `add_entry`.
        """
        count = len(payloads)
        if not 1 <= count <= f.RUN_ENTRIES_MAX:
            raise InvalidArgument(
                f"a run carries 1 to {f.RUN_ENTRIES_MAX} entries, got {count}; "
                "add_entries takes any number"
            )
        request_id = self._new_id()
        frame = encode_add_run(
            request_id,
            ledger_id,
            first_entry_id,
            payloads,
            master_key=self._key(master_key, password),
            last_add_confirmed=last_add_confirmed,
            recovery=recovery,
        )
        (result,) = await self._call([frame], [request_id], timeout_s)
        if isinstance(result, PoraError):
            raise result
        return _run_outcomes(result, ledger_id, first_entry_id, count)

    async def add_entries(
        self,
        ledger_id: int,
        entries: Sequence[tuple[int, bytes]],
        *,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        last_add_confirmed: int = -1,
        recovery: bool = False,
        timeout_s: float | None = None,
    ) -> list[PoraError | None]:
        """Store many `(entry_id, payload)` of one ledger; one outcome per entry, in
        the order given (None: stored, else the engine's exception).

        Entries whose ids go up by one in the order given travel as one run: one
        ADD_RUN frame of up to RUN_ENTRIES_MAX entries, cut where the frame would
        pass this client's frame_bytes_max or the node's, if lower (asked with an
        INFO, under the same timeout, on a connection's first `add_entries`). Every
        frame is sent at once, pipelined. Sparse or unordered ids work, as shorter
        runs.

        A run is refused whole, each of its entries getting that error and none of
        them stored, by a ledger refusal (Unauthorized, LedgerFenced, ...) and by
        an unfit entry: one entry over the node's entry_bytes_max (EntryTooLarge)
        or with a bad id (InvalidArgument) refuses its whole run, the error's
        `entry_id` naming it. An entry too large for any frame goes alone, and the
        node refuses it with EntryTooLarge and drops the connection. Entries of a
        run fail alone when they are stored already with other bytes (EntryConflict).
        A timeout or a lost connection raises RequestTimeout or ConnectionLost, as
        for every call: then each entry may or may not be stored (retrying with the
        same bytes is safe).
        """
        if not entries:
            return []
        key = self._key(master_key, password)
        runs = _split_runs(entries, len(key), await self._frame_limit(timeout_s))
        request_ids = self._ids(len(runs))
        frames = [
            encode_add_run(
                request_id,
                ledger_id,
                entries[start][0],
                [payload for _, payload in entries[start:stop]],
                master_key=key,
                last_add_confirmed=last_add_confirmed,
                recovery=recovery,
            )
            for request_id, (start, stop) in zip(request_ids, runs, strict=True)
        ]
        results = await self._call(frames, request_ids, timeout_s)
        outcomes: list[PoraError | None] = []
        for result, (start, stop) in zip(results, runs, strict=True):
            outcomes += _run_outcomes(result, ledger_id, entries[start][0], stop - start)
        return outcomes

    async def _frame_limit(self, timeout_s: float | None) -> int:
        """The size runs are packed to: this client's frame_bytes_max, or the node's
        if it is lower (its answer to the connection's first request, an INFO)."""
        session = await self._connected()
        await self._await_identity(session, self.timeout_s if timeout_s is None else timeout_s)
        return min(self._frame_bytes_max, session.node_frame_bytes_max or self._frame_bytes_max)

    async def read_entry(
        self,
        ledger_id: int,
        entry_id: int,
        *,
        wait_s: float = 0.0,
        fence: bool = False,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        timeout_s: float | None = None,
    ) -> bytes:
        """The entry's payload. `wait_s` > 0: long poll (wait for the entry to arrive,
        else NoSuchEntry); `fence`: fence the ledger first (a recovery read)."""
        payload, _lac = await self.read_entry_and_lac(
            ledger_id,
            entry_id,
            wait_s=wait_s,
            fence=fence,
            master_key=master_key,
            password=password,
            timeout_s=timeout_s,
        )
        return payload

    async def read_entry_and_lac(
        self,
        ledger_id: int,
        entry_id: int,
        *,
        wait_s: float = 0.0,
        fence: bool = False,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> tuple[bytes, int]:
        """`read_entry`, plus the ledger's last-add-confirmed as the node knows it."""
        request_id = self._new_id()
        wait_ms = max(0, min(round(wait_s * 1000), 2**32 - 1))
        frame = encode_request(
            ReadEntry(
                request_id,
                ledger_id,
                entry_id,
                wait_ms,
                fence,
                self._key(master_key, password),
            )
        )
        timeout = (self.timeout_s if timeout_s is None else timeout_s) + wait_s
        response = await self._call_one(frame, request_id, timeout, ReadEntryResponse, instance_id)
        return response.payload, response.last_add_confirmed

    async def read_range(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        max_entries: int = 1000,
        max_bytes: int = 1 << 20,
        timeout_s: float | None = None,
    ) -> list[tuple[int, bytes]]:
        """The entries stored in [first, last], in order, up to the limits (the node
        may return fewer: ask again after the last one returned)."""
        request_id = self._new_id()
        frame = encode_request(
            ReadRange(request_id, ledger_id, first_entry_id, last_entry_id, max_entries, max_bytes)
        )
        response = await self._call_one(frame, request_id, timeout_s, ReadRangeResponse)
        return response.entries

    async def last_add_confirmed(self, ledger_id: int, *, timeout_s: float | None = None) -> int:
        request_id = self._new_id()
        frame = encode_request(ReadLac(request_id, ledger_id))
        response = await self._call_one(frame, request_id, timeout_s, LacResponse)
        return response.last_add_confirmed

    async def read_range_page(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        max_entries: int = 1000,
        max_bytes: int = 1 << 20,
        fence_key: bytes | None = None,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> tuple[list[tuple[int, bytes]], int, bool]:
        """`(entries, last_add_confirmed, more)`: the entries stored in [first, last]
        up to the limits, and whether the node stopped before `last` (then the
        answer is complete only through its last entry; ids in it not returned are
        not stored there). With `fence_key`, the ledger is fenced first."""
        request_id = self._new_id()
        frame = encode_request(
            ReadRange(
                request_id,
                ledger_id,
                first_entry_id,
                last_entry_id,
                max_entries,
                max_bytes,
                fence_key is not None,
                fence_key or b"",
            )
        )
        response = await self._call_one(
            frame, request_id, timeout_s, ReadRangeResponse, instance_id
        )
        return response.entries, response.last_add_confirmed, response.more

    async def read_lac(
        self,
        ledger_id: int,
        *,
        known_lac: int = -1,
        wait_s: float = 0.0,
        fence_key: bytes | None = None,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> tuple[int, int]:
        """`(last_add_confirmed, last_entry_id)` of the ledger on the node. `wait_s` >
        0: a long poll, answered once the LAC passes `known_lac`, the ledger is closed
        or fenced, or the wait ends (then with the current values). With
        `fence_key`, the ledger is fenced first (created fenced if unknown here)."""
        request_id = self._new_id()
        wait_ms = max(0, min(round(wait_s * 1000), 2**32 - 1))
        frame = encode_request(
            ReadLac(
                request_id, ledger_id, known_lac, wait_ms, fence_key is not None, fence_key or b""
            )
        )
        timeout = (self.timeout_s if timeout_s is None else timeout_s) + wait_s
        response = await self._call_one(frame, request_id, timeout, LacResponse, instance_id)
        return response.last_add_confirmed, response.last_entry_id

    async def write_lac(
        self,
        ledger_id: int,
        last_add_confirmed: int,
        *,
        master_key: bytes = b"",
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> int:
        """Tell the node the writer's LAC (it keeps the highest, in memory); returns
        the node's LAC for the ledger after."""
        request_id = self._new_id()
        frame = encode_request(WriteLac(request_id, ledger_id, last_add_confirmed, master_key))
        response = await self._call_one(frame, request_id, timeout_s, WriteLacResponse, instance_id)
        return response.last_add_confirmed

    async def fence_ledger(
        self,
        ledger_id: int,
        *,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        timeout_s: float | None = None,
    ) -> int:
        """Shut the ledger's writer out; returns the last entry id stored on the node."""
        request_id = self._new_id()
        frame = encode_request(Fence(request_id, ledger_id, self._key(master_key, password)))
        response = await self._call_one(frame, request_id, timeout_s, FenceResponse)
        return response.last_entry_id

    async def close_ledger(
        self,
        ledger_id: int,
        last_entry_id: int | None = None,
        *,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> int:
        """Seal the ledger at `last_entry_id` (or at its last stored entry)."""
        request_id = self._new_id()
        frame = encode_request(
            Close(request_id, ledger_id, last_entry_id, self._key(master_key, password))
        )
        response = await self._call_one(frame, request_id, timeout_s, CloseResponse, instance_id)
        return response.last_entry_id

    async def delete_ledger(
        self,
        ledger_id: int,
        *,
        master_key: bytes = b"",
        password: str | bytes | None = None,
        timeout_s: float | None = None,
        instance_id: str | None = None,
    ) -> None:
        """Delete the ledger and its entries on the node; only with the ledger's key
        (its password): else Unauthorized, and nothing is deleted."""
        request_id = self._new_id()
        frame = encode_request(Delete(request_id, ledger_id, self._key(master_key, password)))
        await self._call_one(frame, request_id, timeout_s, DeleteResponse, instance_id)

    async def list_ledgers(
        self, *, page_size: int = 1000, timeout_s: float | None = None
    ) -> list[LedgerSummary]:
        """Every ledger on the node, by id (fetched a page at a time)."""
        ledgers: list[LedgerSummary] = []
        after = -1
        while True:
            request_id = self._new_id()
            frame = encode_request(ListLedgers(request_id, after, page_size))
            response = await self._call_one(frame, request_id, timeout_s, ListLedgersResponse)
            ledgers.extend(response.ledgers)
            if not response.more or not response.ledgers:
                return ledgers
            after = response.ledgers[-1].ledger_id

    async def identity(self, *, timeout_s: float | None = None) -> NodeInfo:
        """Who the node on the current connection is, from the INFO the client asks
        first on every connection (no new request; connects if need be)."""
        session = await self._connected()
        await self._await_identity(session, self.timeout_s if timeout_s is None else timeout_s)
        if not session.alive:
            session = await self._connected()
            await self._await_identity(session, self.timeout_s if timeout_s is None else timeout_s)
        info = session.info
        if info is None:
            raise ConnectionLost(f"connection to node {self.address} lost before it said who it is")
        return info

    async def info(self, *, timeout_s: float | None = None) -> NodeInfo:
        """What the node says about itself (also a ping)."""
        request_id = self._new_id()
        response = await self._call_one(
            encode_request(Info(request_id)), request_id, timeout_s, InfoResponse
        )
        return NodeInfo(
            protocol_version=response.protocol_version,
            server_version=response.server_version,
            read_only_reason=response.read_only_reason,
            frame_bytes_max=response.frame_bytes_max,
            entry_bytes_max=response.entry_bytes_max,
            ledger_count=response.ledger_count,
            instance_id=response.instance_id,
        )


def _ssl_context(tls: bool | ssl.SSLContext, tls_ca_file: str | None) -> ssl.SSLContext | None:
    if isinstance(tls, ssl.SSLContext):
        return tls
    if not tls and tls_ca_file is None:
        return None
    return ssl.create_default_context(cafile=tls_ca_file)


@contextlib.asynccontextmanager
async def connect_node(
    address: str,
    *,
    timeout_s: float = 30.0,
    connect_timeout_s: float = 10.0,
    tls: bool | ssl.SSLContext = False,
    tls_ca_file: str | None = None,
    inflight_max: int = 65_536,
    inflight_bytes_max: int = 256 << 20,
    frame_bytes_max: int = f.FRAME_BYTES_MAX_DEFAULT,
    reconnect_attempts: int = 5,
    backoff_initial_s: float = 0.05,
    backoff_max_s: float = 2.0,
) -> AsyncIterator[NodeClient]:
    """Connect to the node at "host:port" (port 3181 if omitted) for the block.

    `timeout_s` bounds each request (long polls add their wait); `frame_bytes_max`
    bounds the frames this client accepts and those `add_entries` packs (the node's
    own limit too, if lower, is asked for that); `tls=True` checks
    the node's certificate against the system's CAs, `tls_ca_file` against a
    file's (a self-signed node), or pass your own SSLContext. A lost connection is
    re-made on the next call, up to `reconnect_attempts` tries with exponential
    backoff from `backoff_initial_s` to `backoff_max_s`.
    """
    try:
        async with anyio.create_task_group() as task_group:
            client = NodeClient(
                address,
                task_group,
                timeout_s=timeout_s,
                connect_timeout_s=connect_timeout_s,
                ssl_context=_ssl_context(tls, tls_ca_file),
                inflight_max=inflight_max,
                inflight_bytes_max=inflight_bytes_max,
                frame_bytes_max=frame_bytes_max,
                reconnect_attempts=reconnect_attempts,
                backoff_initial_s=backoff_initial_s,
                backoff_max_s=backoff_max_s,
            )
            task_group.start_soon(client._sweep_deadlines)
            try:
                session = await client._connected()
                # (a node that says nothing is found by the first call's timeout)
                with anyio.move_on_after(min(timeout_s, connect_timeout_s)):
                    await session.identified.wait()
                yield client
            finally:
                await client.aclose()
    except BaseExceptionGroup as group:
        # the client's own tasks never raise: a lone exception is the caller's (or a
        # failed connect), and it should surface as itself, not wrapped in a group
        if len(group.exceptions) != 1:
            raise
        error = group.exceptions[0]
        raise error from error.__cause__


__all__ = ["NodeClient", "NodeInfo", "connect_node", "error_from_response"]
