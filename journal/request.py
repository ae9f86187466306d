"""The unit of work on the write path: one journalled operation and its completion.

A `Request` is made, its record body encoded, by whoever wants something durable
(a network worker, the in-process API). It travels in batches (lists) through the
journal channel, gets its journal sequence number from the journal task, and is
completed by the ledger worker that applies it, which calls `on_done` exactly
once. `__slots__` and no dataclass machinery: millions of these are made per
minute on the hot path.
"""

from __future__ import annotations

from collections.abc import Callable

from journal.format import RecordFlag, RecordKind, encode_body


class Request:
    __slots__ = (
        "body",
        "entry_id",
        "error",
        "flags",
        "kind",
        "lac",
        "ledger_id",
        "master_key",
        "on_done",
        "payload",
        "result",
        "seq",
        "tag",
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
        self.entry_id = entry_id
        self.payload = payload
        #: the last-add-confirmed the writer piggybacked on this add (-1: none)
        self.lac = lac
        #: the ledger's master key this request claims to know (None: not checked,
        #: for records replayed from the journal, which were checked when written)
        self.master_key = master_key
        #: the record's body as journalled (an entry-log record: header, crc and
        #: payload), made here unless given (replay has it already): the journal
        #: writes it and a flush copies it into the entry log, both as it is
        self.body: bytes = encode_body(ledger_id, entry_id, lac, payload) if body is None else body
        #: the submitter's own value, untouched by the node (a network worker keeps
        #: the wire request id here)
        self.tag = 0
        #: journal sequence number, set by the journal task (-1 until then)
        self.seq = -1
        #: the error the request failed with, or None on success
        self.error: BaseException | None = None
        #: an operation's result where it has one (the last entry id, for a fence)
        self.result: int | None = None
        self.on_done = on_done

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

    def __repr__(self) -> str:
        return (
            f"Request({self.kind.name}, ledger={self.ledger_id}, entry={self.entry_id}, "
            f"seq={self.seq}, {len(self.payload)} bytes)"
        )
