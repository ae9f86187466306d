"""The messages of the wire protocol, as plain slotted records.

A decoder makes exactly one of these per frame; the server's decoder makes a plain
`WireAdd` tuple for each add instead (adds are the hot path). Field meanings are in
docs/protocol.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# --- requests ----------------------------------------------------------------------------------


@dataclass(slots=True)
class AddEntry:
    request_id: int
    ledger_id: int
    entry_id: int
    last_add_confirmed: int
    master_key: bytes
    payload: bytes
    recovery: bool = False


@dataclass(slots=True)
class AddRun:
    """A run of adds to one ledger in one frame: entries first_entry_id,
    first_entry_id + 1, ... with these payloads, answered by one response."""

    request_id: int
    ledger_id: int
    first_entry_id: int
    last_add_confirmed: int
    master_key: bytes
    payloads: list[bytes]
    recovery: bool = False


@dataclass(slots=True)
class AddBatch:
    """Adds to one ledger in one frame with explicit, strictly increasing (not
    necessarily consecutive) ids (version 4), answered by one response."""

    request_id: int
    ledger_id: int
    last_add_confirmed: int
    master_key: bytes
    entry_ids: list[int]
    payloads: list[bytes]
    recovery: bool = False


@dataclass(slots=True)
class WriteLac:
    """The writer's last-add-confirmed, told to the node while idle (version 4)."""

    request_id: int
    ledger_id: int
    last_add_confirmed: int
    master_key: bytes = b""


@dataclass(slots=True)
class ReadEntry:
    request_id: int
    ledger_id: int
    entry_id: int
    #: long poll: wait up to this long for the entry to arrive (0: answer at once)
    wait_ms: int = 0
    #: fence the ledger before reading (a recovery read); needs the master key
    fence: bool = False
    master_key: bytes = b""


@dataclass(slots=True)
class ReadRange:
    request_id: int
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    max_entries: int
    max_bytes: int
    #: version 4: fence the ledger before reading; needs the master key
    fence: bool = False
    master_key: bytes = b""


@dataclass(slots=True)
class ReadLac:
    request_id: int
    ledger_id: int
    #: version 4: a long poll answers once the node's LAC exceeds this (or the
    #: ledger is closed or fenced, or the wait passes)
    known_lac: int = -1
    wait_ms: int = 0
    #: version 4: fence the ledger before answering; needs the master key
    fence: bool = False
    master_key: bytes = b""
    #: version 4: answer with the entry at `known_lac + 1` too, when the node holds it
    with_entry: bool = False


@dataclass(slots=True)
class Fence:
    request_id: int
    ledger_id: int
    master_key: bytes = b""


@dataclass(slots=True)
class Close:
    request_id: int
    ledger_id: int
    #: seal here; None seals at the last entry stored on the node
    last_entry_id: int | None = None
    master_key: bytes = b""


@dataclass(slots=True)
class Delete:
    request_id: int
    ledger_id: int
    #: the ledger's master key: only its owner may delete it
    master_key: bytes = b""


@dataclass(slots=True)
class Refused:
    """A well-framed request the decoder refuses by itself, keeping the stream in
    step (a version-2 DELETE, say): answered with `status` and `message`, and the
    connection goes on. Not a request anyone sends: no encoder takes it."""

    request_id: int
    opcode: int
    status: int
    message: str


@dataclass(slots=True)
class ListLedgers:
    request_id: int
    #: list ledgers with ids above this one (-1: from the first)
    after_ledger_id: int = -1
    max_count: int = 1000


@dataclass(slots=True)
class Info:
    request_id: int


RequestMessage = (
    AddEntry
    | AddRun
    | AddBatch
    | WriteLac
    | ReadEntry
    | ReadRange
    | ReadLac
    | Fence
    | Close
    | Delete
    | ListLedgers
    | Info
)

#: An ADD_ENTRY as `RequestDecoder.next_requests_raw` gives it: the fields of `AddEntry`
#: in the same order (request_id, ledger_id, entry_id, last_add_confirmed, master_key,
#: payload, recovery), as a plain tuple, which costs a fraction of an object to make.
WireAdd = tuple[int, int, int, int, bytes, bytes, bool]

# --- responses ---------------------------------------------------------------------------------


@dataclass(slots=True)
class AddEntryResponse:
    request_id: int
    ledger_id: int
    entry_id: int


@dataclass(slots=True)
class AddRunResponse:
    """The answer to an ADD_RUN whose run was taken: every entry of it is stored
    except those in `failures`, each `(entry_id, status, message)` (an entry already
    stored with other bytes, say)."""

    request_id: int
    ledger_id: int
    first_entry_id: int
    count: int
    failures: list[tuple[int, int, str]] = field(default_factory=list)


@dataclass(slots=True)
class AddBatchResponse:
    """The answer to an ADD_BATCH that was taken: every entry stored except those in
    `failures`, as `AddRunResponse` (`first_entry_id` is the batch's first id)."""

    request_id: int
    ledger_id: int
    first_entry_id: int
    count: int
    failures: list[tuple[int, int, str]] = field(default_factory=list)


@dataclass(slots=True)
class WriteLacResponse:
    request_id: int
    ledger_id: int
    last_add_confirmed: int


@dataclass(slots=True)
class ReadEntryResponse:
    request_id: int
    ledger_id: int
    entry_id: int
    #: the ledger's last-add-confirmed as this node knows it (piggybacked by adds)
    last_add_confirmed: int
    payload: bytes


@dataclass(slots=True)
class ReadRangeResponse:
    request_id: int
    ledger_id: int
    last_add_confirmed: int
    entries: list[tuple[int, bytes]]
    #: version 4: the node stopped before the range's last id (entry or byte cap):
    #: the answer is complete through the last entry returned only
    more: bool = False


@dataclass(slots=True)
class LacResponse:
    request_id: int
    ledger_id: int
    last_add_confirmed: int
    #: version 4: the highest entry id stored on the node (-1 if none)
    last_entry_id: int = -1
    #: version 4, asked `with_entry`: the stored bytes of entry `known_lac + 1`, or
    #: None when the node does not hold it
    entry: bytes | None = None


@dataclass(slots=True)
class FenceResponse:
    request_id: int
    ledger_id: int
    last_entry_id: int


@dataclass(slots=True)
class CloseResponse:
    request_id: int
    ledger_id: int
    last_entry_id: int


@dataclass(slots=True)
class DeleteResponse:
    request_id: int
    ledger_id: int


@dataclass(frozen=True, slots=True)
class LedgerSummary:
    ledger_id: int
    state: str  # "open", "closed" or "fenced"
    first_entry_id: int
    last_entry_id: int
    entry_count: int
    payload_bytes: int
    created_ms: int


@dataclass(slots=True)
class ListLedgersResponse:
    request_id: int
    ledgers: list[LedgerSummary]
    #: more ledgers follow the last one listed: ask again after its id
    more: bool = False


@dataclass(slots=True)
class InfoResponse:
    request_id: int
    protocol_version: int
    #: why the node refuses writes, or None when it takes them
    read_only_reason: str | None
    frame_bytes_max: int
    entry_bytes_max: int
    ledger_count: int
    server_version: str
    #: version 4: the instance id of the node's data dir ("" from older nodes)
    instance_id: str = ""


@dataclass(slots=True)
class ErrorResponse:
    """Any request's failure: `status` says what kind, `message` says what, where and
    what to do. `ledger_id`/`entry_id` are -1 where none applies."""

    request_id: int
    opcode: int
    status: int
    ledger_id: int
    entry_id: int
    message: str


ResponseMessage = (
    AddEntryResponse
    | AddRunResponse
    | AddBatchResponse
    | WriteLacResponse
    | ReadEntryResponse
    | ReadRangeResponse
    | LacResponse
    | FenceResponse
    | CloseResponse
    | DeleteResponse
    | ListLedgersResponse
    | InfoResponse
    | ErrorResponse
)
