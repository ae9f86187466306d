"""The entry log's on-disk format: the one constants module shared by writer and reader.

The grammar is in docs/formats.md. In short::

    entrylog     := header-block record* zero-fill
    header-block := header-struct, then zeros up to HEADER_SIZE
    record       := record-header payload

All integers are little-endian. Records are packed back to back (not block aligned):
an entry log is only ever read at positions the index recorded, or scanned from the
start by `pora verify` and index rebuild, so alignment would only waste space.

Format versions (bump on any change of layout, keep readers for old ones):
    1: initial format.
"""

from __future__ import annotations

import struct
from typing import Final

import crc32c

FORMAT_VERSION: Final = 1
MAGIC: Final = b"PORAELOG"

# --- header block: the first HEADER_SIZE bytes of every entry log --------------------
# magic, format_version, reserved, ledger_id, created_ms, crc32c (of the fields before it)
HEADER: Final = struct.Struct("<8sHHQQI")
HEADER_CRC_COVERED: Final = HEADER.size - 4  # the crc covers every field before it
HEADER_SIZE: Final = 512  # the header struct, then zeros to here
#: where the first record of a ledger goes; a LedgerMeta.log_end below this is "no log yet"
FIRST_RECORD_OFFSET: Final = HEADER_SIZE

# --- record: one per entry ------------------------------------------------------------
# crc32c (of everything after it: the header's other fields and the payload),
# payload_length, ledger_id, entry_id
RECORD_HEADER: Final = struct.Struct("<IIQq")
RECORD_HEADER_SIZE: Final = RECORD_HEADER.size  # 24
#: the fields a record's crc covers start here, relative to the record
RECORD_CRC_START: Final = 4

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
