"""Constants of the wire protocol, shared by encoder and decoder.

docs/protocol.md gives the grammar; this module must agree with it. All integers
are big-endian (network order). Every frame is

    length u32 | version u8 | opcode u8 | flags u8 | status u8 | request_id u64 | body

where `length` counts the bytes after itself (header rest + body). The structs
below are precompiled once: encoding and decoding are the hot path of every add.
"""

from __future__ import annotations

import enum
import struct
from typing import Final

#: Protocol version of this implementation; docs/protocol.md is version 4. Version 3
#: had no ADD_BATCH, WRITE_LAC, instance id in INFO, long-polling or fencing READ_LAC,
#: or fencing READ_RANGE; version 2 had a DELETE without the ledger's master key;
#: version 1 had no ADD_RUN.
PROTOCOL_VERSION: Final = 4
#: Versions a node serves. A connection speaks the version of its first frame, and
#: is answered in it; a version-2 DELETE is refused (it carries no key).
PROTOCOL_VERSIONS_SERVED: Final = (2, 3, 4)

#: length u32, version u8, opcode u8, flags u8, status u8, request_id u64
HEADER: Final = struct.Struct(">IBBBBQ")
HEADER_BYTES: Final = HEADER.size  # 16
#: what `length` counts at least: the header after the length field
LENGTH_MIN: Final = HEADER_BYTES - 4  # 12
#: where the status byte lies in a frame: after length u32, version, opcode, flags
STATUS_OFFSET: Final = 7


def status_byte(frame: bytes | bytearray) -> int:
    """The status of an encoded frame, read without decoding it (a server counts
    its responses by status as it sends them)."""
    return frame[STATUS_OFFSET]


#: A frame's `length` may not exceed this unless configured otherwise: 4 MiB of
#: payload (the engine's default entry_bytes_max) plus room for the headers.
FRAME_BYTES_MAX_DEFAULT: Final = 4 * 1024 * 1024 + 64 * 1024

#: An error response's message is cut to this many bytes of UTF-8.
ERROR_MESSAGE_BYTES_MAX: Final = 1024

#: `last_entry_id` of a close request that seals at the last entry stored.
CLOSE_AT_LAST_STORED: Final = -2


class Opcode(enum.IntEnum):
    """What a frame asks for. A response carries its request's opcode. Values are
    on the wire: never reuse one."""

    ADD_ENTRY = 1
    READ_ENTRY = 2
    READ_RANGE = 3
    READ_LAC = 4
    FENCE = 5
    CLOSE = 6
    DELETE = 7
    LIST_LEDGERS = 8
    INFO = 9
    #: version 2: a run of adds to one ledger in one frame
    ADD_RUN = 10
    #: version 4: adds of one ledger with explicit, strictly increasing ids
    ADD_BATCH = 11
    #: version 4: the writer tells the node its last-add-confirmed
    WRITE_LAC = 12


class Flag(enum.IntFlag):
    """Bits of the flags byte. Meanings of the low bits depend on the opcode."""

    NONE = 0
    #: ADD_ENTRY, ADD_RUN, ADD_BATCH: recovery adds (accepted by a fenced ledger)
    RECOVERY = 0x01
    #: READ_ENTRY (and, version 4, READ_LAC and READ_RANGE): fence the ledger before
    #: reading (a recovery read)
    FENCE = 0x01
    #: LIST_LEDGERS response: more ledgers follow the last one listed; READ_RANGE
    #: response (version 4): the node stopped before the range's last id
    MORE = 0x01
    #: READ_LAC request (version 4): answer with the entry at `known_lac + 1` too,
    #: when the node holds it; READ_LAC response: the entry follows the fixed body
    ENTRY = 0x02
    #: set on every response, clear on every request
    RESPONSE = 0x80


class Status(enum.IntEnum):
    """Outcome of a request, in a response's status byte. Requests carry OK (0)."""

    OK = 0
    NO_SUCH_LEDGER = 1
    NO_SUCH_ENTRY = 2
    FENCED = 3
    CLOSED = 4
    BAD_REQUEST = 5
    UNAUTHORIZED = 6
    TOO_LARGE = 7
    READ_ONLY = 8
    OVERLOADED = 9
    INTERNAL_ERROR = 10
    ENTRY_CONFLICT = 11
    INVALID_ARGUMENT = 12
    SHUTTING_DOWN = 13
    #: version 3: the node found its stored copy of the data damaged (a checksum
    #: failed); read it from another replica. Version-2 peers get INTERNAL_ERROR.
    CORRUPT = 14


# --- bodies (after the 16-byte header) ---------------------------------------------------------

#: ADD_ENTRY request: ledger_id i64, entry_id i64, last_add_confirmed i64, key_len u8
#: (then key, then payload to the end of the frame). Decoded with the header in one call.
ADD_REQUEST: Final = struct.Struct(">IBBBBQqqqB")
ADD_REQUEST_FIXED: Final = struct.Struct(">qqqB")
#: ADD_ENTRY response, whole frame: header + ledger_id i64, entry_id i64
ADD_RESPONSE: Final = struct.Struct(">IBBBBQqq")
ADD_RESPONSE_BYTES: Final = ADD_RESPONSE.size  # 32

#: ADD_RUN request: header + ledger_id i64, first_entry_id i64, last_add_confirmed i64,
#: count u32, key_len u8; then the key, count payload sizes (u32 each), and the
#: payloads back to back to the end of the frame. Decoded with the header in one call.
ADD_RUN_REQUEST: Final = struct.Struct(">IBBBBQqqqIB")
ADD_RUN_REQUEST_FIXED: Final = struct.Struct(">qqqIB")
#: the most entries one ADD_RUN carries (the node journals a run as one record)
RUN_ENTRIES_MAX: Final = 1024
#: ADD_RUN OK response: ledger_id, first_entry_id, count u32, failure_count u32, then
#: failure_count x RUN_FAILURE
ADD_RUN_RESPONSE: Final = struct.Struct(">qqII")
#: one entry of a run that failed alone: entry_id i64, status u8, message_len u16
#: (then the message, UTF-8, at most ERROR_MESSAGE_BYTES_MAX bytes)
RUN_FAILURE: Final = struct.Struct(">qBH")

#: READ_ENTRY request: ledger_id, entry_id, wait_ms u32, key_len u8 (then key)
READ_ENTRY_REQUEST: Final = struct.Struct(">qqIB")
#: READ_ENTRY response: ledger_id, entry_id, last_add_confirmed (then payload)
READ_ENTRY_RESPONSE: Final = struct.Struct(">qqq")
#: READ_RANGE request: ledger_id, first_entry_id, last_entry_id, max_entries u32, max_bytes u32
READ_RANGE_REQUEST: Final = struct.Struct(">qqqII")
#: READ_RANGE response: ledger_id, last_add_confirmed, count u32, then count x RANGE_ITEM
READ_RANGE_RESPONSE: Final = struct.Struct(">qqI")
#: one entry of a READ_RANGE response: entry_id i64, payload_len u32 (then payload)
RANGE_ITEM: Final = struct.Struct(">qI")
#: ADD_BATCH request (version 4): ledger_id i64, last_add_confirmed i64, count u32,
#: key_len u8; then the key, count x BATCH_ITEM, and the payloads back to back to the
#: end of the frame. Answered as ADD_RUN (ADD_RUN_RESPONSE, first_entry_id = the
#: first id of the batch).
ADD_BATCH_REQUEST_FIXED: Final = struct.Struct(">qqIB")
#: one entry of an ADD_BATCH: entry_id i64, payload size u32
BATCH_ITEM: Final = struct.Struct(">qI")
#: READ_LAC request (version 4): ledger_id, known_lac, wait_ms u32, key_len u8 (then key)
READ_LAC_REQUEST_V4: Final = struct.Struct(">qqIB")
#: READ_LAC response (version 4): ledger_id, last_add_confirmed, last_entry_id
READ_LAC_RESPONSE_V4: Final = struct.Struct(">qqq")
#: WRITE_LAC request (version 4): ledger_id, last_add_confirmed, key_len u8 (then key)
WRITE_LAC_REQUEST: Final = struct.Struct(">qqB")
#: READ_RANGE request (version 4): READ_RANGE_REQUEST then key_len u8 (then key)
READ_RANGE_REQUEST_V4: Final = struct.Struct(">qqqIIB")
#: READ_LAC request: ledger_id. DELETE response (and version-2 request): ledger_id.
LEDGER_ONLY: Final = struct.Struct(">q")
#: DELETE request (version 3): ledger_id, key_len u8 (then key)
DELETE_REQUEST: Final = struct.Struct(">qB")
#: READ_LAC response: ledger_id, last_add_confirmed. FENCE/CLOSE response: ledger_id,
#: last_entry_id.
LEDGER_AND_VALUE: Final = struct.Struct(">qq")
#: FENCE request: ledger_id, key_len u8 (then key)
FENCE_REQUEST: Final = struct.Struct(">qB")
#: CLOSE request: ledger_id, last_entry_id (CLOSE_AT_LAST_STORED: at the last stored), key_len
CLOSE_REQUEST: Final = struct.Struct(">qqB")
#: LIST_LEDGERS request: after_ledger_id i64 (exclusive; -1 from the start), max_count u32
LIST_REQUEST: Final = struct.Struct(">qI")
#: LIST_LEDGERS response: count u32, then count x LEDGER_SUMMARY
LIST_RESPONSE: Final = struct.Struct(">I")
#: ledger_id, state u8, first_entry_id, last_entry_id, entry_count u64, payload_bytes u64,
#: created_ms u64
LEDGER_SUMMARY: Final = struct.Struct(">qBqqQQQ")
#: INFO response: protocol_version u8, read_only u8, frame_bytes_max u32, entry_bytes_max u32,
#: ledger_count u64, version_len u8 (then server version UTF-8, then read-only reason UTF-8)
INFO_RESPONSE: Final = struct.Struct(">BBIIQB")
#: error response (any opcode, status != OK): ledger_id i64, entry_id i64 (-1 where
#: none applies), then the message, UTF-8, to the end of the frame
ERROR_RESPONSE: Final = struct.Struct(">qq")

#: ledger states in a LEDGER_SUMMARY
LEDGER_STATES: Final = {"open": 1, "closed": 2, "fenced": 3}
LEDGER_STATE_NAMES: Final = {v: k for k, v in LEDGER_STATES.items()}
