"""The add operations of the per-node client, over its `NodeConnection`.

`add_coalesced` (and `NodeClient.add_entry`) queue their entries on the
connection, to share frames with every other add of the same scheduler turn (see
pora.client.coalescer);
`add_batches_many` (several ledgers' batches as one caller, the replicating
client's call per node) encodes its batches straight into frames (see
pora.client.ledger_frames), and `post_batches` (the TCP channel's `post_adds`)
does the same without waiting when nothing in it would wait, its answers going to
a callback; `add_run` sends
one ADD_RUN frame; `add_entries` cuts its entries into runs that fit a frame
(pora.client.frame_cuts) and sends them pipelined.

Every kind takes its room on the connection (`NodeConnection.room`, or
`Admission.try_admit` on `NodeClient.add_entry`'s lean path) before it queues
anything and gives it back once its call is over, however it ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NoReturn

from journal.errors import PoraError
from ledger.errors import InvalidArgument
from netio import frames as f
from netio.codec import encode_add_run
from netio.errors import RequestTimeout
from pora.client.coalescer import AddCall, QueuedAdd
from pora.client.connection import NodeConnection
from pora.client.frame_cuts import RUN_FRAME_BASE, cut_frames
from pora.client.ledger_frames import BatchCall, Outcomes, encode_batches, entry_sizes
from pora.client.node_channel import AddRequest
from pora.client.remote_errors import clone_error
from pora.client.requests import call, key_of
from pora.client.runs import run_outcomes
from pora.client.session import Session
from pora.client.waiting import Event


async def add_coalesced(
    connection: NodeConnection,
    ledger_id: int,
    entries: Sequence[tuple[int, bytes]],
    *,
    master_key: bytes = b"",
    last_add_confirmed: int = -1,
    recovery: bool = False,
    timeout_s: float | None = None,
    instance_id: str | None = None,
) -> list[PoraError | None]:
    """`NodeClient.add_coalesced`."""
    timeout = connection.timeout_s if timeout_s is None else timeout_s
    count = len(entries)
    size = sum([len(payload) for _, payload in entries])
    session, left_s = await connection.room(count, size, timeout)
    try:
        if instance_id is not None:
            await connection.check_instance(session, instance_id, left_s)
        add_call = connection.new_add_call(count, connection.now() + left_s)
        queue = session.add_queue
        for index, (entry_id, payload) in enumerate(entries):
            queue.append(
                QueuedAdd(
                    ledger_id,
                    master_key,
                    recovery,
                    entry_id,
                    payload,
                    last_add_confirmed,
                    add_call,
                    index,
                )
            )
        if connection.deadlines.idle:
            connection.deadlines.wake()
        ready = session.outbox_ready
        if not ready.is_set():
            ready.set()
        await add_call.wait()
    finally:
        connection.admission.release(count, size)
    if add_call.timed_out or add_call.error is not None:
        raise_failed(connection, add_call, timeout)
    return add_call.outcomes


def raise_failed(
    connection: NodeConnection, add_call: AddCall | BatchCall, timeout: float
) -> NoReturn:
    """Raise why `add_call` ended without outcomes: its timeout, or the connection's
    loss (each caller its own copy of the error)."""
    raise failure_of(connection, add_call, timeout)


def failure_of(
    connection: NodeConnection, add_call: AddCall | BatchCall, timeout: float
) -> PoraError:
    """Why `add_call` ended without outcomes, as its caller is given it."""
    if add_call.timed_out:
        return RequestTimeout(
            f"no response from node {connection.address} within {timeout} s; the adds may "
            "or may not have been performed (retrying with the same bytes is safe)"
        )
    assert add_call.error is not None
    return clone_error(add_call.error)


async def add_batches_many(
    connection: NodeConnection,
    requests: Sequence[AddRequest],
    *,
    timeout_s: float | None = None,
    instance_id: str | None = None,
) -> list[Outcomes]:
    """`NodeClient.add_batches_many`."""
    timeout = connection.timeout_s if timeout_s is None else timeout_s
    count, size, sizes = entry_sizes(requests)
    session, left_s = await connection.room(count, size, timeout)
    try:
        if instance_id is None:
            await connection.await_identity(session, left_s)  # frames fit the node's limits
        else:
            await connection.check_instance(session, instance_id, left_s)
        batch_call = _AwaitedBatches(requests, connection.now() + left_s, connection.new_event())
        request_ids = _send_batches(connection, session, batch_call, sizes)
        if not request_ids:
            return batch_call.answers
        try:
            await batch_call.event.wait()
        finally:
            if batch_call.remaining:  # given up: a late answer finds nobody
                pending = session.pending
                for request_id in request_ids:
                    pending.pop(request_id, None)
    finally:
        connection.admission.release(count, size)
    if batch_call.timed_out or batch_call.error is not None:
        raise_failed(connection, batch_call, timeout)
    return batch_call.answers


def post_batches(
    connection: NodeConnection,
    requests: Sequence[AddRequest],
    *,
    timeout_s: float | None,
    instance_id: str | None,
    on_answers: Callable[[list[Outcomes] | PoraError], object],
) -> bool:
    """`add_batches_many` without waiting (`TcpChannel.post_adds`), when nothing in
    it would wait: the connection is live, the node said who it is (and is
    `instance_id`, when given) and there is room (`Admission.try_admit`). Then the
    frames are queued and True returned; `on_answers` gets the answers (or the
    error that leaves them all unknown) from the reader, the connection's loss or
    the deadline sweep, once, after the room is given back. Else nothing is done
    and False returned: the caller waits with `add_batches_many` (which raises
    InstanceMismatch for another instance)."""
    session = connection.session
    if (
        session is None
        or not session.alive
        or not session.identified.is_set()
        or (instance_id is not None and session.instance_id != instance_id)
    ):
        return False
    count, size, sizes = entry_sizes(requests)
    admission = connection.admission
    if not admission.try_admit(count, size):
        return False
    timeout = connection.timeout_s if timeout_s is None else timeout_s
    posted = _PostedBatches(requests, connection, session, count, size, timeout, on_answers)
    try:
        posted.request_ids = _send_batches(connection, session, posted, sizes)
    except BaseException:
        admission.release(count, size)
        raise
    if not posted.request_ids:
        admission.release(count, size)
        return False
    return True


def _send_batches(
    connection: NodeConnection, session: Session, batch_call: BatchCall, sizes: list[list[int]]
) -> range:
    """Cut `batch_call`'s requests (of these entry sizes, `entry_sizes`) into frames,
    put each in the session's pending map, wake the deadline sweep and send them
    (`NodeConnection.send_soon`); returns the frames' request ids (none: nothing to
    send). They are consecutive: the connection's ids count up, and nothing else
    takes one while they are made."""
    frames = encode_batches(
        batch_call,
        connection.new_id,
        connection.frame_limit(session),
        session.node_entry_bytes_max,
        sizes,
    )
    if not frames:
        return range(0)
    pending = session.pending
    for request_id, _frame, batch_frame in frames:
        pending[request_id] = (batch_frame, 0)
    count = batch_call.remaining = len(frames)
    if connection.deadlines.idle:
        connection.deadlines.wake()
    if count == 1:
        connection.send_soon(session, [frames[0][1]])
    else:
        connection.send_soon(session, [frame for _, frame, _ in frames])
    first = frames[0][0]
    return range(first, first + count)


class _AwaitedBatches(BatchCall):
    """A `BatchCall` its caller waits for (`add_batches_many`): its end sets `event`."""

    __slots__ = ("event",)

    def __init__(self, requests: Sequence[AddRequest], deadline: float, event: Event) -> None:
        super().__init__(requests, deadline)
        self.event = event

    def ended(self) -> None:
        self.event.set()


class _PostedBatches(BatchCall):
    """A posted `BatchCall` (`post_batches`): its end gives the room back, forgets
    what is still pending of it (a late answer finds nobody), then tells its
    caller (`on_answers`)."""

    __slots__ = ("connection", "count", "on_answers", "request_ids", "session", "size", "timeout")

    def __init__(
        self,
        requests: Sequence[AddRequest],
        connection: NodeConnection,
        session: Session,
        count: int,
        size: int,
        timeout: float,
        on_answers: Callable[[list[Outcomes] | PoraError], object],
    ) -> None:
        super().__init__(requests, connection.now() + timeout)
        self.connection = connection
        self.session = session
        self.count = count
        self.size = size
        self.timeout = timeout
        self.on_answers = on_answers
        self.request_ids = range(0)  # of its frames

    def ended(self) -> None:
        connection = self.connection
        connection.admission.release(self.count, self.size)
        if self.remaining:  # timed out or failed: forget the frames not answered
            pending = self.session.pending
            for request_id in self.request_ids:
                pending.pop(request_id, None)
            self.on_answers(failure_of(connection, self, self.timeout))
        else:
            self.on_answers(self.answers)


async def add_run(
    connection: NodeConnection,
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
    """`NodeClient.add_run`."""
    count = len(payloads)
    if not 1 <= count <= f.RUN_ENTRIES_MAX:
        raise InvalidArgument(
            f"a run carries 1 to {f.RUN_ENTRIES_MAX} entries, got {count}; "
            "add_entries takes any number"
        )
    request_id = connection.new_id()
    frame = encode_add_run(
        request_id,
        ledger_id,
        first_entry_id,
        payloads,
        master_key=key_of(master_key, password),
        last_add_confirmed=last_add_confirmed,
        recovery=recovery,
    )
    (result,) = await call(connection, [frame], [request_id], timeout_s)
    if isinstance(result, PoraError):
        raise result
    return run_outcomes(result, ledger_id, first_entry_id, count)


async def add_entries(
    connection: NodeConnection,
    ledger_id: int,
    entries: Sequence[tuple[int, bytes]],
    *,
    master_key: bytes = b"",
    password: str | bytes | None = None,
    last_add_confirmed: int = -1,
    recovery: bool = False,
    timeout_s: float | None = None,
) -> list[PoraError | None]:
    """`NodeClient.add_entries`."""
    if not entries:
        return []
    key = key_of(master_key, password)
    room = await _frame_limit(connection, timeout_s) - RUN_FRAME_BASE - len(key)
    sizes = [len(payload) for _, payload in entries]
    runs = cut_frames(
        [entry_id for entry_id, _ in entries],
        sizes,
        room,
        runs=True,
        entry_bytes_max=None,  # (an unfit entry refuses its run, as documented)
    )
    request_ids = connection.ids(len(runs))
    frames = [
        encode_add_run(
            request_id,
            ledger_id,
            entries[start][0],
            [payload for _, payload in entries[start:stop]],
            master_key=key,
            last_add_confirmed=last_add_confirmed,
            recovery=recovery,
            sizes=sizes[start:stop],
        )
        for request_id, (start, stop) in zip(request_ids, runs, strict=True)
    ]
    results = await call(connection, frames, request_ids, timeout_s)
    outcomes: list[PoraError | None] = []
    for result, (start, stop) in zip(results, runs, strict=True):
        outcomes += run_outcomes(result, ledger_id, entries[start][0], stop - start)
    return outcomes


async def _frame_limit(connection: NodeConnection, timeout_s: float | None) -> int:
    """The size runs are packed to: this client's frame_bytes_max, or the node's if
    it is lower (its answer to the connection's first request, an INFO)."""
    session = await connection.connected()
    timeout = connection.timeout_s if timeout_s is None else timeout_s
    await connection.await_identity(session, timeout)
    return connection.frame_limit(session)


__all__ = [
    "add_batches_many",
    "add_coalesced",
    "add_entries",
    "add_run",
    "failure_of",
    "post_batches",
    "raise_failed",
]
