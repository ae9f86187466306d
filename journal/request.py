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

from collections.abc import Callable, Iterable, Sequence
from typing import Final

import crc32c

from journal.errors import PoraError
from journal.format import (
    BODY_CRC_FIELD,
    BODY_FIELDS,
    BODY_HEADER_SIZE,
    MASTER_KEY_BYTES_MAX,
    RecordBody,
    RecordFlag,
    RecordKind,
    encode_body,
)

_NO_TAGS: Final[list[int]] = []

#: the largest ledger or entry id (ids are signed 64-bit on disk, never negative)
ID_MAX: Final = 2**63 - 1
#: the most adds one run request carries: runs are what one connection read or one
#: `add_entries` call brings, so this only bounds a record's size in odd cases
RUN_ENTRIES_MAX: Final = 1024

#: an add as the network decoder gives it: `(tag, ledger_id, entry_id,
#: last_add_confirmed, master_key, payload, recovery)`, the tag being the submitter's
#: (the wire request id)
Add = tuple[int, int, int, int, bytes, bytes, bool]


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
        "settled",
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
        self.bodies: Sequence[RecordBody] = [
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
        #: completed or failed: each happens once (asserted)
        self.settled = False
        self.on_done = on_done

    @classmethod
    def entry_run(
        cls,
        ledger_id: int,
        first_entry_id: int,
        bodies: Sequence[RecordBody],
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
        request.settled = False
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
        assert not self.settled, f"{self!r} completed after it was settled"
        self.settled = True
        self.result = result
        if self.on_done is not None:
            self.on_done(self)

    def fail(self, error: BaseException) -> None:
        """Mark the request failed with `error` and notify its owner."""
        assert not self.settled, f"{self!r} failed after it was settled"
        self.settled = True
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


class LedgerPart(list[Request]):
    """One ledger's requests replayed from the journal (journal/replay_runs.py), in
    journal order. A request there may merge several records into one run, so its
    `seq` is only its first record's: `last_seq` is the seq of the last record the
    part holds, which the ledger is durable through once the part is flushed."""

    __slots__ = ("last_seq",)

    def __init__(self, requests: Iterable[Request], last_seq: int) -> None:
        super().__init__(requests)
        self.last_seq = last_seq


def add_is_plain(
    ledger_id: int,
    entry_id: int,
    lac: int,
    master_key: bytes,
    payload: bytes,
    entry_bytes_max: int,
) -> bool:
    """Whether an add keeps every rule a node takes adds by: integer ids in
    [0, ID_MAX], a lac in [-1, ID_MAX], a `bytes` payload of at most
    `entry_bytes_max`, a key of at most MASTER_KEY_BYTES_MAX bytes. When it does not,
    the node's typed checks say what is wrong (an add of another bytes-like payload
    is still taken, copied). `entry_runs` states the same rules inline, a call per
    add being a tenth of its cost; a test holds the two to the same answers."""
    return (
        type(ledger_id) is int
        and type(entry_id) is int
        and type(payload) is bytes
        and 0 <= ledger_id <= ID_MAX
        and 0 <= entry_id <= ID_MAX
        and -1 <= lac <= ID_MAX
        and len(payload) <= entry_bytes_max
        and len(master_key) <= MASTER_KEY_BYTES_MAX
    )


def entry_run_request(
    ledger_id: int,
    first_entry_id: int,
    payloads: Iterable[bytes],
    lac: int,
    flags: RecordFlag,
    master_key: bytes,
    on_done: Callable[[Request], None] | None,
) -> Request:
    """An ENTRY request for the run of entries first_entry_id, first_entry_id + 1,
    ... with these payloads (ids, lac and sizes checked by the caller), its bodies
    encoded here. One request answers the whole run: it has no per-entry tags."""
    pack_fields = BODY_FIELDS.pack
    pack_crc = BODY_CRC_FIELD.pack
    checksum = crc32c.crc32c
    join = b"".join
    bodies: list[bytes] = []
    append = bodies.append
    entry_id = first_entry_id
    for payload in payloads:
        # encode_body, inlined (as in entry_runs): the call would cost a tenth
        fields = pack_fields(len(payload), ledger_id, entry_id, lac)
        append(join((pack_crc(checksum(payload, checksum(fields))), fields, payload)))
        entry_id += 1
    return Request.entry_run(
        ledger_id, first_entry_id, bodies, lac, flags, master_key, on_done, _NO_TAGS
    )


def entry_runs(
    adds: Sequence[Add],
    entry_bytes_max: int,
    on_done: Callable[[Request], None],
    refusal: Callable[[Add], PoraError | None],
) -> tuple[list[Request], list[tuple[int, PoraError]]]:
    """Add requests made from many adds at once: the served node's hot path.

    Adds in a row to one ledger with consecutive entry ids (and the same key and
    flags) become one run request, their tags in `Request.tags` in order: the journal
    and the ledger then handle the run, not each add. An add that fails the quick
    checks (ids in [0, ID_MAX], lac >= -1, sizes, bytes payload) is handed to
    `refusal`, which says what is wrong with it, or None to take it after all.
    Returns the requests, each completing through `on_done`, and the refused adds as
    `(tag, error)`.

    One loop with the body encoding inlined: a call per add is a tenth of its cost.
    """
    refused: list[tuple[int, PoraError]] = []
    new_run = Request.entry_run
    pack_fields = BODY_FIELDS.pack
    pack_crc = BODY_CRC_FIELD.pack
    checksum = crc32c.crc32c
    join = b"".join
    plain = RecordFlag.NONE
    recovering = RecordFlag.RECOVERY_ADD
    # each run: ledger, first entry id, key, flags, bodies, tags, lacs
    runs: list[tuple[int, int, bytes, RecordFlag, list[bytes], list[int], list[int]]] = []
    # the run being gathered: its ledger, the entry id that would extend it, ...
    run_ledger = run_next = -1
    run_key = b""
    run_recovery = False
    bodies: list[bytes] = []
    tags: list[int] = []
    lacs: list[int] = []
    for add in adds:
        tag, ledger_id, entry_id, lac, master_key, payload, recovery = add
        if not (
            ledger_id >= 0
            and entry_id >= 0
            and lac >= -1
            and len(payload) <= entry_bytes_max
            and len(master_key) <= MASTER_KEY_BYTES_MAX
            and type(payload) is bytes
            and type(ledger_id) is int
            and type(entry_id) is int
            and ledger_id <= ID_MAX
            and entry_id <= ID_MAX
            and lac <= ID_MAX
        ):
            # (add_is_plain, inlined) rare: the caller's typed checks find what is wrong
            error = refusal(add)
            if error is not None:
                refused.append((tag, error))
                continue
        if (
            entry_id != run_next
            or ledger_id != run_ledger
            or master_key != run_key
            or recovery != run_recovery
            or len(bodies) >= RUN_ENTRIES_MAX
        ):
            bodies, tags, lacs = [], [], []
            flags = recovering if recovery else plain
            runs.append((ledger_id, entry_id, master_key, flags, bodies, tags, lacs))
            run_ledger = ledger_id
            run_key = master_key
            run_recovery = recovery
        # encode_body, inlined
        fields = pack_fields(len(payload), ledger_id, entry_id, lac)
        bodies.append(join((pack_crc(checksum(payload, checksum(fields))), fields, payload)))
        tags.append(tag)
        lacs.append(lac)
        run_next = entry_id + 1
    requests = [
        new_run(ledger, first, bodies, max(lacs), flags, key, on_done, tags)
        for ledger, first, key, flags, bodies, tags, lacs in runs
    ]
    return requests, refused


def merged_runs(requests: list[Request]) -> list[Request]:
    """Single-entry requests, in order, with each stretch of consecutive entries of a
    ledger (same key and flags) merged into one run request."""
    runs: list[Request] = []
    stretch: list[Request] = []
    for request in requests:
        if stretch:
            head = stretch[-1]
            if (
                request.ledger_id == head.ledger_id
                and request.entry_id == head.entry_id + 1
                and request.flags == head.flags
                and request.master_key == head.master_key
                and len(stretch) < RUN_ENTRIES_MAX
            ):
                stretch.append(request)
                continue
            runs.append(_merged(stretch))
        stretch = [request]
    if stretch:
        runs.append(_merged(stretch))
    return runs


def _merged(stretch: list[Request]) -> Request:
    if len(stretch) == 1:
        return stretch[0]
    first = stretch[0]
    return Request.entry_run(
        first.ledger_id,
        first.entry_id,
        [request.bodies[0] for request in stretch],
        max([request.lac for request in stretch]),
        first.flags,
        first.master_key,
        None,
        [],
    )
