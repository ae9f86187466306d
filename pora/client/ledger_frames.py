"""Adds already grouped per ledger (the replicating writer's batches), encoded
straight into frames.

A writer's batch for a node is one ledger's entries in increasing id order:
consecutive ids (E=1, or Qw=E) or strided ones (Qw<E). So a batch needs no queue
of single adds, no sort and no regrouping (`coalescer.frames_for` does that for
`add_entry` callers): it becomes one ADD_RUN or ADD_BATCH frame when it fits (cut
into several when not), and its answer is one fact per frame: a frame stored
whole leaves its request's answer at None ("every entry stored"); only a refusal
or an entry failing alone makes a list of outcomes for that request.

`BatchCall` is one caller's call (several ledgers' batches, one wait); each frame
in flight is a `BatchFrame` in the connection's pending map, a
`pending.PendingOperation` like every other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter

from journal.errors import PoraError
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
from pora.client.node_channel import AddRequest
from pora.client.remote_errors import clone_error, error_from_response

#: one request's outcomes: None when every entry of it was stored, else one each
Outcomes = list[PoraError | None] | None


class BatchCall:
    """One caller's batches, ended once: when every frame is answered, or by the
    connection's loss (`fail`) or the deadline sweep (`time_out`), as the
    client's other waiters. `ended` is then called, once, in the reader, the loss
    or the sweep: each kind of call says what its end does (`adds.py`: the caller
    that waits is woken, a posted call's callback is given the answers). A kind is
    a subclass, not a callable given: a posted call is one object, with no bound
    method made per call."""

    __slots__ = ("answers", "deadline", "error", "remaining", "requests", "timed_out")

    def __init__(self, requests: Sequence[AddRequest], deadline: float) -> None:
        self.requests = requests
        self.deadline = deadline
        self.answers: list[Outcomes] = [None] * len(requests)
        self.remaining = 0  # frames not answered
        self.error: PoraError | None = None
        self.timed_out = False

    def ended(self) -> None:
        """The call is over (answered, failed or timed out): its kind's end."""
        raise NotImplementedError

    def frame_answered(self) -> None:
        self.remaining -= 1
        if self.remaining == 0 and self.error is None and not self.timed_out:
            self.ended()

    def fail(self, error: PoraError) -> None:
        if self.error is None and self.remaining and not self.timed_out:
            self.error = error
            self.ended()

    def time_out(self) -> None:
        if self.error is None and self.remaining and not self.timed_out:
            self.timed_out = True
            self.ended()

    def outcomes_of(self, index: int) -> list[PoraError | None]:
        """Request `index`'s outcomes, one per entry (made at its first failure)."""
        outcomes = self.answers[index]
        if outcomes is None:
            outcomes = self.answers[index] = [None] * len(self.requests[index].entries)
        return outcomes


class BatchFrame:
    """One frame in flight of a `BatchCall`: entries [start, stop) of request `index`."""

    __slots__ = ("call", "deadline", "index", "ledger_id", "opcode", "start", "stop")

    def __init__(
        self, call: BatchCall, index: int, ledger_id: int, opcode: int, start: int, stop: int
    ) -> None:
        self.call = call
        #: the call's (a plain attribute: the sweep reads it every tick)
        self.deadline = call.deadline
        self.index = index
        self.ledger_id = ledger_id
        self.opcode = opcode
        self.start = start
        self.stop = stop

    def deliver(self, response: ResponseMessage, _index: int) -> None:
        kind = type(response)
        if kind is AddRunResponse or kind is AddBatchResponse:
            assert isinstance(response, AddRunResponse | AddBatchResponse)
            if response.ledger_id != self.ledger_id or response.count != self.stop - self.start:
                self._mismatch(response)
                return
            if response.failures:
                self._entries_failed(response.request_id, response.failures)
        elif kind is ErrorResponse:
            assert isinstance(response, ErrorResponse)
            error = error_from_response(response)
            outcomes = self.call.outcomes_of(self.index)
            for position in range(self.start, self.stop):
                outcomes[position] = error if position == self.start else clone_error(error)
        elif kind is not AddEntryResponse or self.stop - self.start != 1:
            self._mismatch(response)
            return
        self.call.frame_answered()

    def fail(self, error: PoraError) -> None:
        self.call.fail(error)

    def time_out(self, now: float) -> None:
        if self.deadline <= now:
            self.call.time_out()

    def _entries_failed(self, request_id: int, failures: list[tuple[int, int, str]]) -> None:
        entries = self.call.requests[self.index].entries
        where = {entries[p][0]: p for p in range(self.start, self.stop)}
        outcomes = self.call.outcomes_of(self.index)
        for entry_id, status, message in failures:
            position = where.get(entry_id)
            if position is not None:
                outcomes[position] = error_from_response(
                    ErrorResponse(
                        request_id, self.opcode, status, self.ledger_id, entry_id, message
                    )
                )

    def _mismatch(self, response: ResponseMessage) -> None:
        self.call.fail(
            ProtocolError(
                f"response {response.request_id} does not answer its frame of "
                f"{self.stop - self.start} adds to ledger {self.ledger_id}: {response!r}"[:300],
                status=Status.BAD_REQUEST,
                request_id=response.request_id,
            )
        )


_ID = itemgetter(0)
_PAYLOAD = itemgetter(1)


def entry_sizes(requests: Sequence[AddRequest]) -> tuple[int, int, list[list[int]]]:
    """The entries of `requests` and their bytes, the room their call takes, with
    each request's entry sizes, which cut its frames (`encode_batches`)."""
    count = 0
    size = 0
    sizes = []
    for request in requests:
        mine = list(map(len, map(_PAYLOAD, request.entries)))
        sizes.append(mine)
        count += len(mine)
        size += sum(mine)
    return count, size, sizes


def encode_batches(
    call: BatchCall,
    new_id: Callable[[], int],
    frame_bytes_max: int,
    entry_bytes_max: int,
    sizes: Sequence[list[int]],
) -> list[tuple[int, bytes, BatchFrame]]:
    """The frames of every request of `call`, as `(request_id, frame, BatchFrame)`;
    `sizes` holds each request's entry sizes (`entry_sizes`: its caller counted the
    call's bytes with them)."""
    out: list[tuple[int, bytes, BatchFrame]] = []
    for index, request in enumerate(call.requests):
        entries = request.entries
        if not entries:
            continue
        # (map, not comprehensions: under Python 3.11 each of those makes a function)
        ids = list(map(_ID, entries))
        payloads = list(map(_PAYLOAD, entries))
        room = frame_bytes_max - BATCH_FRAME_BASE - len(request.master_key)
        mine = sizes[index]
        chunks = cut_frames(ids, mine, room, runs=False, entry_bytes_max=entry_bytes_max)
        for start, stop in chunks:
            out.append(_frame(call, index, request, ids, payloads, mine, start, stop, new_id()))
    return out


def _frame(
    call: BatchCall,
    index: int,
    request: AddRequest,
    ids: list[int],
    payloads: list[bytes],
    sizes: list[int],
    start: int,
    stop: int,
    request_id: int,
) -> tuple[int, bytes, BatchFrame]:
    ledger_id, key, lac = request.ledger_id, request.master_key, request.last_add_confirmed
    first = ids[start]
    if stop - start == 1:
        opcode: int = f.Opcode.ADD_ENTRY
        frame = encode_add_entry(
            request_id, ledger_id, first, payloads[start], master_key=key, last_add_confirmed=lac
        )
    else:
        if start == 0 and stop == len(payloads):
            chunk, chunk_sizes = payloads, sizes
        else:
            chunk, chunk_sizes = payloads[start:stop], sizes[start:stop]
        if ids[stop - 1] - first == stop - start - 1:  # increasing ids: consecutive
            opcode = f.Opcode.ADD_RUN
            frame = encode_add_run(
                request_id,
                ledger_id,
                first,
                chunk,
                master_key=key,
                last_add_confirmed=lac,
                sizes=chunk_sizes,
            )
        else:
            opcode = f.Opcode.ADD_BATCH
            frame = encode_add_batch(
                request_id,
                ledger_id,
                ids[start:stop],
                chunk,
                master_key=key,
                last_add_confirmed=lac,
                sizes=chunk_sizes,
            )
    return request_id, frame, BatchFrame(call, index, ledger_id, opcode, start, stop)


__all__ = ["BatchCall", "BatchFrame", "Outcomes", "encode_batches", "entry_sizes"]
