"""The journal's on-disk format: the one constants module shared by writer and reader.

The grammar is in docs/formats.md. In short::

    segment      := segment-header-block batch* zero-fill
    batch        := batch-header record* zero-pad-to-block
    record       := record-prefix body{count}
    body         := body-header payload

The body is exactly an entry-log record: a flush copies the bodies of ENTRY records
into the ledger's entry log verbatim, with no re-encoding and no second checksum
over the payload. The prefix adds what only the journal needs (kind, flags, how many
bodies, seq) and its crc also covers every body's crc, so one chain of checksums
protects them all. An ENTRY record carries a run of entries of one ledger with
consecutive ids (what one pipelining writer sends in a row): the journal's and the
ledgers' Python work is then per run, not per entry. Other kinds carry one body.

All integers are little-endian. A batch is what one group commit writes and syncs;
it always starts on a BLOCK_SIZE boundary so that, after a crash, a reader can look
for valid batches past a damaged one at block granularity (torn tail vs corruption).

Format versions (bump on any change of layout, keep readers for old ones):
    1: initial format (one 36-byte record header, one crc over header and payload).
    2: record = prefix + body; the body is an entry-log record (with the entry's
       last-add-confirmed); KEY records.
    3: an ENTRY record carries a run of bodies (the prefix's reserved u16 became the
       body count; its crc covers every body's crc).
"""

from __future__ import annotations

import enum
import struct
from typing import Final, TypeAlias

import crc32c

from journal import errors as _errors

FORMAT_VERSION: Final = 3
BLOCK_SIZE: Final = 512

# --- segment header: the whole first block of every segment file -----------------
SEGMENT_MAGIC: Final = b"PORAJNL\x00"
# magic, format_version, unsynced_batches_max, block_size, first_seq, created_ms, crc32c
SEGMENT_HEADER: Final = struct.Struct("<8sHHIQQI")
#: the most batches a writer may have written and not yet synced at once, as a
#: segment header's u16 records it (the reader's torn-tail rule depends on it)
UNSYNCED_BATCHES_LIMIT: Final = 0xFFFF
SEGMENT_HEADER_SIZE: Final = BLOCK_SIZE  # the header struct, then zeros to the block end

# --- batch header: one per group commit ----------------------------------------------
BATCH_MAGIC: Final = 0x54414250  # b"PBAT" read as little-endian u32
# magic, crc32c (of the fields after it), records_length, record_count, first_seq
BATCH_HEADER: Final = struct.Struct("<IIIIQ")
BATCH_HEADER_SIZE: Final = BATCH_HEADER.size  # 24

# --- record prefix: what only the journal needs ------------------------------------
# crc32c (of the prefix fields after it, then of each body's crc field in order),
# kind, flags, body_count, seq
RECORD_PREFIX: Final = struct.Struct("<IBBHQ")
RECORD_PREFIX_SIZE: Final = RECORD_PREFIX.size  # 16
#: the most bodies (entries) one record carries: body_count is a u16
RECORD_BODIES_MAX: Final = 0xFFFF

# --- body header: an entry-log record header ---------------------------------------
# crc32c (of everything after it: the header's other fields and the payload),
# payload_length, ledger_id, entry_id, last_add_confirmed
BODY_HEADER: Final = struct.Struct("<IIQqq")
BODY_HEADER_SIZE: Final = BODY_HEADER.size  # 32
#: a body's crc covers its bytes from here on, relative to the body
BODY_CRC_START: Final = 4
#: a body's crc field is its bytes [0, BODY_CRC_FIELD_END)
BODY_CRC_FIELD_END: Final = 4

#: prefix and body header as one struct, for packing and unpacking a record at once
RECORD_HEADER: Final = struct.Struct("<IBBHQIIQqq")
RECORD_HEADER_SIZE: Final = RECORD_HEADER.size  # 48
assert RECORD_HEADER_SIZE == RECORD_PREFIX_SIZE + BODY_HEADER_SIZE
#: the prefix crc starts with record bytes [4, RECORD_PREFIX_SIZE): kind .. seq
PREFIX_CRC_START: Final = 4

#: the largest payload one record may carry; a node's own limit is lower (config)
RECORD_PAYLOAD_MAX: Final = 64 * 1024 * 1024
#: the longest master key a KEY record may carry (defined with the errors that refuse
#: longer ones, where the wire codec can see it too)
MASTER_KEY_BYTES_MAX: Final = _errors.MASTER_KEY_BYTES_MAX


class RecordKind(enum.IntEnum):
    """What a journal record asks the ledger to do. Values are on disk: never reuse."""

    ENTRY = 1  # add (ledger_id, entry_id, payload)
    FENCE = 2  # fence ledger_id: its writer is shut out; recovery adds still pass
    CLOSE = 3  # close ledger_id; entry_id is the last entry id it keeps (see CLOSE_KEEP_ALL)
    DELETE = 4  # delete ledger_id and all its entries
    KEY = 5  # ledger_id's master key is the payload; the first one journalled wins


#: CLOSE's entry_id when the ledger keeps every entry it stores (-1 would mean "sealed
#: empty", which recovery may legitimately decide)
CLOSE_KEEP_ALL: Final = -(2**63)


class RecordFlag(enum.IntFlag):
    """Bits of a record's flags byte. Values are on disk: never reuse."""

    NONE = 0
    RECOVERY_ADD = 0x01  # an add by a recovering client: allowed on a fenced ledger


#: a record body as a request or memtable holds it: bytes the request encoded, or a
#: view of a journal segment's mapping that replay read (never copied)
RecordBody: TypeAlias = bytes | bytearray | memoryview

#: BODY_HEADER after its crc (for encoders that inline `encode_body`)
BODY_FIELDS: Final = struct.Struct("<IQqq")
#: a body's crc field
BODY_CRC_FIELD: Final = struct.Struct("<I")


def encode_body(ledger_id: int, entry_id: int, lac: int, payload: bytes) -> bytes:
    """A record body (an entry-log record): header, crc over the rest, payload.

    Made once per request, when the request is made: the journal writes it after its
    prefix and the ledger's flush copies it into the entry log, both as it is.
    """
    try:
        fields = BODY_FIELDS.pack(len(payload), ledger_id, entry_id, lac)
    except struct.error as error:
        raise ValueError(
            f"ledger {ledger_id} entry {entry_id} (lac {lac}, {len(payload)} bytes) "
            f"cannot be a record: {error}"
        ) from None
    crc = crc32c.crc32c(payload, crc32c.crc32c(fields))
    return b"".join((BODY_CRC_FIELD.pack(crc), fields, payload))


def round_up_to_block(n: int) -> int:
    """The smallest multiple of BLOCK_SIZE that is >= n."""
    return (n + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE


def body_crc(buf: bytes | bytearray | memoryview, start: int, end: int) -> int:
    """CRC32C of the body at buf[start:end], from just after its crc field to its end."""
    return int(crc32c.crc32c(memoryview(buf)[start + BODY_CRC_START : end]))


def prefix_crc(prefix_fields: bytes | memoryview, body_crc_fields: bytes | memoryview) -> int:
    """CRC32C of a record's prefix fields after its crc, then of its bodies' crc fields
    (each body's first 4 bytes, in order, side by side)."""
    return int(crc32c.crc32c(body_crc_fields, crc32c.crc32c(prefix_fields)))
