"""The journal's on-disk format: the one constants module shared by writer and reader.

The grammar is in docs/formats.md. In short::

    segment      := segment-header-block batch* zero-fill
    batch        := batch-header record* zero-pad-to-block
    record       := record-header payload

All integers are little-endian. A batch is what one group commit writes and syncs;
it always starts on a BLOCK_SIZE boundary so that, after a crash, a reader can look
for valid batches past a damaged one at block granularity (torn tail vs corruption).

Format versions (bump on any change of layout, keep readers for old ones):
    1: initial format.
"""

from __future__ import annotations

import enum
import struct
from typing import Final

import crc32c

FORMAT_VERSION: Final = 1
BLOCK_SIZE: Final = 512

# --- segment header: the whole first block of every segment file -----------------
SEGMENT_MAGIC: Final = b"PORAJNL\x00"
# magic, format_version, reserved, block_size, first_seq, created_ms, crc32c
SEGMENT_HEADER: Final = struct.Struct("<8sHHIQQI")
SEGMENT_HEADER_SIZE: Final = BLOCK_SIZE  # the header struct, then zeros to the block end

# --- batch header: one per group commit ----------------------------------------------
BATCH_MAGIC: Final = 0x54414250  # b"PBAT" read as little-endian u32
# magic, crc32c (of the fields after it), records_length, record_count, first_seq
BATCH_HEADER: Final = struct.Struct("<IIIIQ")
BATCH_HEADER_SIZE: Final = BATCH_HEADER.size  # 24

# --- record header: one per journalled operation --------------------------------------
# crc32c (of everything after it: the header's other fields and the payload),
# payload_length, kind, flags, reserved, seq, ledger_id, entry_id
RECORD_HEADER: Final = struct.Struct("<IIBBHQQq")
RECORD_HEADER_SIZE: Final = RECORD_HEADER.size  # 36

#: the largest payload one record may carry; a node's own limit is lower (config)
RECORD_PAYLOAD_MAX: Final = 64 * 1024 * 1024


class RecordKind(enum.IntEnum):
    """What a journal record asks the ledger to do. Values are on disk: never reuse."""

    ENTRY = 1  # add (ledger_id, entry_id, payload)
    FENCE = 2  # fence ledger_id: its writer is shut out; recovery adds still pass
    CLOSE = 3  # close ledger_id; entry_id is the last entry id it keeps (see CLOSE_KEEP_ALL)
    DELETE = 4  # delete ledger_id and all its entries
    # 5 is reserved for KEY (the ledger's master key), added with the network layer.


#: CLOSE's entry_id when the ledger keeps every entry it stores (-1 would mean "sealed
#: empty", which recovery may legitimately decide)
CLOSE_KEEP_ALL: Final = -(2**63)


class RecordFlag(enum.IntFlag):
    """Bits of a record's flags byte. Values are on disk: never reuse."""

    NONE = 0
    RECOVERY_ADD = 0x01  # an add by a recovering client: allowed on a fenced ledger


def round_up_to_block(n: int) -> int:
    """The smallest multiple of BLOCK_SIZE that is >= n."""
    return (n + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE


def record_crc(buf: bytes | bytearray | memoryview, start: int, end: int) -> int:
    """CRC32C of a record from just after its crc field up to its end."""
    return int(crc32c.crc32c(memoryview(buf)[start + 4 : end]))
