"""Coalesced adds: many callers' adds to a node share few frames.

Python costs per message, not per byte: a frame, a socket write and a wake-up per
add bound a client of many tasks that each await one add. So `NodeClient` queues
each caller's adds (an `AddCall`) on the connection, and its writer task turns
everything queued in one scheduler turn into frames with `frames_for`: per
(ledger, key, recovery flag), entries by id, cut by `frame_cuts.cut_frames` into
ADD_RUN frames (consecutive ids), ADD_BATCH frames (other increasing ids) or a lone
ADD_ENTRY, each within RUN_ENTRIES_MAX entries and the frame limit. Each frame's response is matched
once (`AddFrame.deliver`) and completes every caller it holds: each its own
outcome, an entry's failure going to the caller of that entry only.
"""

from __future__ import annotations

import operator
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import anyio

from journal.errors import PoraError
from journal.parking import OneParked
from netio import frames as f
from netio.codec import encode_add_batch, encode_add_entry, encode_add_run
from netio.errors import ProtocolError
from netio.frames import Status
from netio.messages import (
    AddBatchResponse,
    AddEntryResponse,
    AddRunResponse,
    ErrorResponse,
    ResponseMessage,
)
from pora.client.frame_cuts import BATCH_FRAME_BASE, cut_frames
from pora.client.remote_errors import clone_error, error_from_response
from pora.client.waiting import Event, trio_running


class AddCall:
    """One caller's adds (one, for `add_entry`), waiting for an outcome each, woken
    through an event (any event loop; `ParkedAddCall` is trio's cheaper kind).

    Shaped as the client's other waiters (`remaining`, `error`, `timed_out`) so
    that its deadline sweep and a lost connection fail it alike. `deadline` is
    on the event loop's clock: the sweep of the frames in flight times it out."""

    __slots__ = ("deadline", "error", "event", "outcomes", "remaining", "timed_out")

    def __init__(self, count: int, deadline: float, event: Event) -> None:
        self.event = event
        self.remaining = count
        self.deadline = deadline
        #: per entry: None (stored) or its error, once answered
        self.outcomes: list[PoraError | None] = [None] * count
        #: what failed every entry at once (a lost connection), else None
        self.error: PoraError | None = None
        self.timed_out = False

    def settle(self, index: int, outcome: PoraError | None) -> None:
        self.outcomes[index] = outcome
        self.remaining -= 1
        if self.remaining == 0:
            self._wake()

    def fail(self, error: PoraError) -> None:
        if self.error is None and self.remaining:
            self.error = error
            self._wake()

    def time_out(self) -> None:
        if self.error is None and self.remaining and not self.timed_out:
            self.timed_out = True
            self._wake()

    def _wake(self) -> None:
        self.event.set()

    def wait(self) -> Awaitable[object]:
        """What to await for the outcomes: an awaitable, not a coroutine of its own
        (each level of coroutines is resumed again at every wake-up)."""
        return self.event.wait()


class ParkedAddCall(OneParked, AddCall):
    """An `AddCall` under trio: the caller's task parks on the call itself and is
    rescheduled directly by its last outcome (no event object per call: with one
    add per task, the wake-up is most of what an add costs the client)."""

    __slots__ = ("_task", "_woken")

    def __init__(self, count: int, deadline: float) -> None:
        self.remaining = count
        self.deadline = deadline
        self.outcomes = [None] * count
        self.error = None
        self.timed_out = False
        self._task = None
        self._woken = False

    wait = OneParked._park


def add_call_type() -> Callable[[int, float], AddCall]:
    """How this event loop's callers wait for their adds, chosen once per client:
    parked tasks under trio, an event each elsewhere (asyncio, through anyio)."""
    if trio_running():
        return ParkedAddCall

    def evented(count: int, deadline: float) -> AddCall:
        return AddCall(count, deadline, anyio.Event())

    return evented


class QueuedAdd(NamedTuple):
    """One entry waiting for the writer: its ledger, key and flags choose its frame."""

    ledger_id: int
    master_key: bytes
    recovery: bool
    entry_id: int
    payload: bytes
    last_add_confirmed: int
    call: AddCall
    #: of the entry among its call's
    position: int


class AddFrame:
    """One sent frame of coalesced adds: which caller holds each of its entries."""

    __slots__ = ("deadline", "entry_ids", "ledger_id", "members", "opcode")

    def __init__(self, ledger_id: int, opcode: int, adds: list[QueuedAdd]) -> None:
        self.ledger_id = ledger_id
        self.opcode = opcode
        self.entry_ids = [add.entry_id for add in adds]
        self.members = [(add.call, add.position) for add in adds]
        #: the earliest deadline of its callers: the sweep looks no further before
        self.deadline = min([add.call.deadline for add in adds])

    def time_out(self, now: float) -> None:
        """Time out the callers whose deadline has passed (the others wait on)."""
        deadline = float("inf")
        for call, _index in self.members:
            if call.deadline <= now:
                call.time_out()
            elif call.remaining and call.error is None and call.deadline < deadline:
                deadline = call.deadline
        self.deadline = deadline

    def deliver(self, response: ResponseMessage, _index: int) -> None:
        """Settle every caller of the frame from its one response."""
        members = self.members
        if isinstance(response, ErrorResponse):
            error = error_from_response(response)
            for position, (call, index) in enumerate(members):
                call.settle(index, error if position == 0 else clone_error(error))
            return
        if type(response) is AddEntryResponse and len(members) == 1:
            call, index = members[0]
            call.settle(index, None)
            return
        if not (
            isinstance(response, AddRunResponse | AddBatchResponse)
            and response.ledger_id == self.ledger_id
            and response.count == len(members)
        ):
            self.fail(
                ProtocolError(
                    f"response {response.request_id} does not answer its frame of "
                    f"{len(members)} adds to ledger {self.ledger_id}: {response!r}"[:300],
                    status=Status.BAD_REQUEST,
                    request_id=response.request_id,
                )
            )
            return
        failed: dict[int, PoraError] = {}
        for entry_id, status, message in response.failures:
            failed[entry_id] = error_from_response(
                ErrorResponse(
                    response.request_id, self.opcode, status, self.ledger_id, entry_id, message
                )
            )
        for entry_id, (call, index) in zip(self.entry_ids, members, strict=True):
            call.settle(index, failed.get(entry_id) if failed else None)

    def fail(self, error: PoraError) -> None:
        for call, _index in self.members:
            call.fail(error)


def frames_for(
    queued: list[QueuedAdd],
    new_id: Callable[[], int],
    frame_bytes_max: int,
    entry_bytes_max: int,
) -> list[tuple[int, bytes, AddFrame]]:
    """The frames that carry `queued`, as `(request_id, frame, AddFrame)`: per ledger,
    key and recovery flag, entries in id order, cut by `frame_cuts.cut_frames`. Two
    adds of one id (a retry racing its original) go in separate frames; an entry the
    node refuses by itself goes alone, so that its refusal refuses none of its
    neighbours, other callers' entries."""
    groups: dict[tuple[int, bytes, bool], list[QueuedAdd]] = {}
    for add in queued:
        key = (add.ledger_id, add.master_key, add.recovery)
        group = groups.get(key)
        if group is None:
            groups[key] = [add]
        else:
            group.append(add)
    out: list[tuple[int, bytes, AddFrame]] = []
    for (ledger_id, master_key, recovery), group in groups.items():
        if len(group) == 1:  # a lone add is one frame, however it is cut
            out.append(_frame(new_id(), ledger_id, master_key, recovery, group))
            continue
        group.sort(key=_entry_id_of)
        sizes = [len(add.payload) for add in group]
        chunks = cut_frames(
            list(map(_entry_id_of, group)),
            sizes,
            frame_bytes_max - BATCH_FRAME_BASE - len(master_key),
            runs=False,
            entry_bytes_max=entry_bytes_max,
        )
        for start, stop in chunks:
            chunk, chunk_sizes = group[start:stop], sizes[start:stop]
            out.append(_frame(new_id(), ledger_id, master_key, recovery, chunk, chunk_sizes))
    return out


#: (a C key function: a Python one costs a call per add of the turn)
_entry_id_of = operator.attrgetter("entry_id")


def _frame(
    request_id: int,
    ledger_id: int,
    master_key: bytes,
    recovery: bool,
    chunk: list[QueuedAdd],
    sizes: list[int] | None = None,
) -> tuple[int, bytes, AddFrame]:
    """`chunk`'s frame; `sizes`: its payloads' lengths, when the caller measured them."""
    lac = max([add.last_add_confirmed for add in chunk])
    first = chunk[0].entry_id
    if len(chunk) == 1:
        frame = encode_add_entry(
            request_id,
            ledger_id,
            first,
            chunk[0].payload,
            master_key=master_key,
            last_add_confirmed=lac,
            recovery=recovery,
        )
        return request_id, frame, AddFrame(ledger_id, f.Opcode.ADD_ENTRY, chunk)
    payloads = [add.payload for add in chunk]
    if chunk[-1].entry_id - first == len(chunk) - 1:  # ids increase: consecutive
        frame = encode_add_run(
            request_id,
            ledger_id,
            first,
            payloads,
            master_key=master_key,
            last_add_confirmed=lac,
            recovery=recovery,
            sizes=sizes,
        )
        return request_id, frame, AddFrame(ledger_id, f.Opcode.ADD_RUN, chunk)
    frame = encode_add_batch(
        request_id,
        ledger_id,
        [add.entry_id for add in chunk],
        payloads,
        master_key=master_key,
        last_add_confirmed=lac,
        recovery=recovery,
        sizes=sizes,
    )
    return request_id, frame, AddFrame(ledger_id, f.Opcode.ADD_BATCH, chunk)
