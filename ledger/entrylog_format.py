"""The entry log's on-disk format: the one constants module shared by writer and reader.

The grammar is in docs/formats.md. In short::

    entrylog     := header-block record* zero-fill
    header-block := header-struct, then zeros up to HEADER_SIZE
    record       := record-header payload

All integers are little-endian. Records are packed back to back (not block aligned):
an entry log is only ever read at positions the index recorded, or scanned from the
start by `pora verify` and index rebuild, so alignment would only waste space.

A record is byte for byte the body of the journal record that carried the entry
(`journal.format.BODY_HEADER`): a flush copies bodies from the journal's buffers, so
the payload is checksummed once, when it is journalled. Records with entry id
STATE_ENTRY_ID carry the ledger's state (see `encode_state_record`), so that the index
and the ledger metadata can be rebuilt from the entry logs alone.

Format versions (bump on any change of layout, keep readers for old ones):
    1: initial format.
    2: records carry the entry's last-add-confirmed; state records.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import crc32c

from journal.format import BODY_CRC_START, BODY_HEADER, BODY_HEADER_SIZE
from ledger.state import LedgerState

FORMAT_VERSION: Final = 2
MAGIC: Final = b"PORAELOG"

# --- header block: the first HEADER_SIZE bytes of every entry log --------------------
# magic, format_version, reserved, ledger_id, created_ms, crc32c (of the fields before it)
HEADER: Final = struct.Struct("<8sHHQQI")
HEADER_CRC_COVERED: Final = HEADER.size - 4  # the crc covers every field before it
HEADER_SIZE: Final = 512  # the header struct, then zeros to here
#: where the first record of a ledger goes; a LedgerMeta.log_end below this is "no log yet"
FIRST_RECORD_OFFSET: Final = HEADER_SIZE

# --- record: one per entry: a journal record's body ----------------------------------
# crc32c (of everything after it: the header's other fields and the payload),
# payload_length, ledger_id, entry_id, last_add_confirmed
RECORD_HEADER: Final = BODY_HEADER
RECORD_HEADER_SIZE: Final = BODY_HEADER_SIZE  # 32
#: the fields a record's crc covers start here, relative to the record
RECORD_CRC_START: Final = BODY_CRC_START

#: the entry id of a state record: not an entry, the ledger's state as of this point
#: in the log (the last one wins). Entry ids are otherwise >= 0.
STATE_ENTRY_ID: Final = -1
# state record payload: version u8, state u8 (LedgerState), fenced u8, has_key u8,
# sealed_last_entry_id i64, key_length u8, then the master key
_STATE: Final = struct.Struct("<BBBBqB")
_STATE_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class LedgerStateRecord:
    state: LedgerState
    fenced: bool
    sealed_last_entry_id: int
    master_key: bytes | None


def encode_state_record(state: LedgerStateRecord) -> bytes:
    """The payload of a state record."""
    key = state.master_key
    return _STATE.pack(
        _STATE_VERSION,
        int(state.state),
        1 if state.fenced else 0,
        0 if key is None else 1,
        state.sealed_last_entry_id,
        0 if key is None else len(key),
    ) + (key or b"")


def decode_state_record(payload: bytes | memoryview) -> LedgerStateRecord:
    """Read a state record's payload; ValueError if it is not one this build knows."""
    if len(payload) < _STATE.size:
        raise ValueError(f"state record of {len(payload)} bytes is shorter than {_STATE.size}")
    version, state, fenced, has_key, sealed, key_length = _STATE.unpack_from(payload)
    if version != _STATE_VERSION:
        raise ValueError(f"state record version {version}; this build reads {_STATE_VERSION}")
    if len(payload) != _STATE.size + key_length:
        raise ValueError(f"state record of {len(payload)} bytes, key length {key_length}")
    return LedgerStateRecord(
        state=LedgerState(state),
        fenced=bool(fenced),
        sealed_last_entry_id=sealed,
        master_key=bytes(payload[_STATE.size :]) if has_key else None,
    )


def encode_record(ledger_id: int, entry_id: int, payload: bytes, lac: int = -1) -> bytes:
    """One record, header and payload (off the hot path: state records, tests)."""
    header = bytearray(RECORD_HEADER.pack(0, len(payload), ledger_id, entry_id, lac))
    record = header + payload
    struct.pack_into("<I", record, 0, record_crc(record, 0, len(record)))
    return bytes(record)


#: the largest payload one record may carry. Entries reach the log through the journal,
#: whose own limit is the same; a scan treats a larger length as damage rather than
#: reading gigabytes on the word of one unverified header.
RECORD_PAYLOAD_MAX: Final = 64 * 1024 * 1024

#: an all-zero record header is preallocated space, never a record: its crc field (0)
#: differs from the crc32c of its 20 zero bytes, which tests assert
ZERO_RECORD_HEADER: Final = bytes(RECORD_HEADER_SIZE)


def header_crc(buf: bytes | bytearray | memoryview) -> int:
    """CRC32C of the header fields before the crc field."""
    return int(crc32c.crc32c(memoryview(buf)[:HEADER_CRC_COVERED]))


def record_crc(buf: bytes | bytearray | memoryview, start: int, end: int) -> int:
    """CRC32C of a record from just after its crc field up to its end."""
    return int(crc32c.crc32c(memoryview(buf)[start + RECORD_CRC_START : end]))


#: the first preallocation of a new entry log; later ones double the file up to the
#: configured chunk size (most ledgers on a busy node are small)
FIRST_CHUNK_BYTES: Final = 64 * 1024
