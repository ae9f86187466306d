"""The unit of work on the write path: one journalled operation and its completion.

A `Request` is made, its record bodies encoded, by whoever wants something durable
(a network worker, the in-process API). It travels in batches (lists) through the
journal channel, gets its journal sequence number from the journal task, and is
completed by the ledger worker that applies it, which calls `on_done` exactly
once. `__slots__` and no dataclass machinery: millions of these are made per
minute on the hot path.

An ENTRY request may carry a run of entries: consecutive entry ids of one ledger,
one body each, journalled as one record and applied at once. A pipelining writer's
adds arrive that way, and making them one request instead of one each is what
keeps the node's Python work per add small. The run succeeds or fails as a whole,
except where `entry_errors` says otherwise (retries of entries already stored).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from journal.format import BODY_HEADER_SIZE, RecordFlag, RecordKind, encode_body

_NO_TAGS: Final[list[int]] = []


class Request:
    __slots__ = (
        "bodies",
        "body_bytes",
        "entry_errors",
        "entry_id",
        "error",
        "flags",
        "kind",
        "lac",
        "ledger_id",
        "master_key",
        "on_done",
        "result",
        "seq",
        "tag",
        "tags",
    )

    def __init__(
        self,
        kind: RecordKind,
        ledger_id: int,
        entry_id: int,
        payload: bytes = b"",
        flags: RecordFlag = RecordFlag.NONE,
        on_done: Callable[[Request], None] | None = None,
        lac: int = -1,
        master_key: bytes | None = None,
        body: bytes | None = None,
    ) -> None:
        self.kind = kind
        self.flags = flags
        self.ledger_id = ledger_id
        #: the (first) entry id; an ENTRY run covers entry_id .. entry_id + len(bodies) - 1
        self.entry_id = entry_id
        #: the last-add-confirmed the writer piggybacked (the largest of a run; -1: none)
        self.lac = lac
        #: the ledger's master key this request claims to know (None: not checked,
        #: for records replayed from the journal, which were checked when written)
        self.master_key = master_key
        #: the record's bodies as journalled (entry-log records: header, crc and
        #: payload), made here unless given (replay has them already): the journal
        #: writes them after its prefix and a flush copies them into the entry log,
        #: both as they are. One body, except for an ENTRY run.
        self.bodies: list[bytes] = [
            encode_body(ledger_id, entry_id, lac, payload) if body is None else body
        ]
        self.body_bytes = len(self.bodies[0])
        #: the submitter's own value, untouched by the node (a network worker keeps
        #: the wire request id here)
        self.tag = 0
        #: per entry of a run, the submitter's values (wire request ids); empty if unused
        self.tags = _NO_TAGS
        #: journal sequence number, set by the journal task (-1 until then)
        self.seq = -1
        #: the error the whole request failed with, or None
        self.error: BaseException | None = None
        #: per entry of a run, its error or None, when they differ (else None)
        self.entry_errors: list[BaseException | None] | None = None
        #: an operation's result where it has one (the last entry id, for a fence)
        self.result: int | None = None
        self.on_done = on_done

    @classmethod
    def entry_run(
        cls,
        ledger_id: int,
        first_entry_id: int,
        bodies: list[bytes],
        lac: int,
        flags: RecordFlag,
        master_key: bytes | None,
        on_done: Callable[[Request], None] | None,
        tags: list[int],
    ) -> Request:
        """An ENTRY request for a run of encoded bodies (`encode_body`), entry ids
        first_entry_id, first_entry_id + 1, ... The caller has checked the ids."""
        request = cls.__new__(cls)
        request.kind = RecordKind.ENTRY
        request.flags = flags
        request.ledger_id = ledger_id
        request.entry_id = first_entry_id
        request.lac = lac
        request.master_key = master_key
        request.bodies = bodies
        request.body_bytes = sum(map(len, bodies))  # (C loops: a run has up to 1024)
        request.tag = 0
        request.tags = tags
        request.seq = -1
        request.error = None
        request.entry_errors = None
        request.result = None
        request.on_done = on_done
        return request

    @property
    def count(self) -> int:
        """How many bodies (entries, for an ENTRY run) the request carries."""
        return len(self.bodies)

    @property
    def last_entry_id(self) -> int:
        return self.entry_id + len(self.bodies) - 1

    @property
    def payload(self) -> memoryview:
        """The payload of the (first) body."""
        return memoryview(self.bodies[0])[BODY_HEADER_SIZE:]

    @property
    def payload_bytes(self) -> int:
        """Payload bytes over all bodies."""
        return self.body_bytes - len(self.bodies) * BODY_HEADER_SIZE

    def complete(self, result: int | None = None) -> None:
        """Mark the request done successfully and notify its owner."""
        self.result = result
        if self.on_done is not None:
            self.on_done(self)

    def fail(self, error: BaseException) -> None:
        """Mark the request failed with `error` and notify its owner."""
        self.error = error
        if self.on_done is not None:
            self.on_done(self)

    def error_of(self, index: int) -> BaseException | None:
        """The outcome of the run's `index`-th entry: its error, or None if stored."""
        if self.error is not None:
            return self.error
        if self.entry_errors is not None:
            return self.entry_errors[index]
        return None

    def __repr__(self) -> str:
        return (
            f"Request({self.kind.name}, ledger={self.ledger_id}, entry={self.entry_id}, "
            f"count={len(self.bodies)}, seq={self.seq}, {self.payload_bytes} bytes)"
        )
