"""The journal reader's batch layer: where batches lie in a segment, and whether a
batch's header and extent are whole.

A segment is a header block, then batches, each starting on a block boundary: a
24-byte header (magic, crc, records_length, record_count, first_seq), its records,
zeros to the block end (docs/formats.md, "Journal"). The data ends at an all-zero
batch header, at a stale one (a recycled file's earlier life, below the segment's
first seq), or at the end of the file.

`check_batch` says whether the batch at an offset is whole as far as its header
can tell (its records are the record layer's, journal/records.py); a batch that is
not raises `BatchDamage`, and the torn-tail layer (journal/torn_tail.py) decides
whether that is a torn tail or corruption. The search for valid batches past damage
(`find_valid_batch`) lives here too: it is the same header check at every block.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
from pathlib import Path
from typing import Final, Literal, NamedTuple

from journal.errors import JournalCorruption
from journal.format import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    BATCH_MAGIC,
    BLOCK_SIZE,
    RECORD_HEADER_SIZE,
    round_up_to_block,
)
from journal.segment import batch_header_crc

#: why the data at a torn tail is not a whole batch (`TornTail.kind`):
#: "incomplete": cut short by the end of the file (a write cut off, a truncated file);
#: "zeroed": zeros where data should be (blocks that never reached the disk, or zeroed);
#: "stale": a recycled segment's older bytes there (blocks that never reached the disk);
#: "checksum": a checksum, magic or length fails (a write cut off, or damaged media)
TornKind = Literal["incomplete", "zeroed", "stale", "checksum"]

#: a batch header's fields: magic, crc, records_length, record_count, first_seq
BatchFields = tuple[int, int, int, int, int]
ZERO_BATCH_HEADER: Final[BatchFields] = (0, 0, 0, 0, 0)
_BATCH_MAGIC_BYTES: Final = struct.pack("<I", BATCH_MAGIC)


class BatchDamage(Exception):
    """A batch that is not whole; whether it is a torn tail is the torn-tail layer's
    to decide."""

    def __init__(self, reason: str, valid_header: bool, *, incomplete: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        #: the header's magic and crc are right, so its length can be trusted
        self.valid_header = valid_header
        #: the file ends inside the batch (else its bytes are inconsistent)
        self.kind: TornKind = "incomplete" if incomplete else "checksum"


class Extent(NamedTuple):
    """Where a batch with a valid header lies, and the seqs it holds."""

    offset: int
    records_length: int
    first_seq: int
    record_count: int

    @property
    def end(self) -> int:
        """Where the next batch starts."""
        return round_up_to_block(self.offset + BATCH_HEADER_SIZE + self.records_length)


def check_batch(
    path: Path, buffer: memoryview, offset: int, fields: BatchFields, expected_seq: int | None
) -> None:
    """Whether the batch at `offset` of `buffer` (a segment, `fields` its header) is
    whole as far as its header tells: magic, crc, the seq it must start with, a
    record count and length that fit each other and the file. Raises BatchDamage,
    or JournalCorruption for an intact header with the wrong seq."""
    magic, crc, records_length, count, first_seq = fields
    if magic != BATCH_MAGIC:
        raise BatchDamage(f"bad batch magic {magic:#010x}", valid_header=False)
    expected_crc = batch_header_crc(buffer, offset)
    if crc != expected_crc:
        raise BatchDamage(
            f"batch header crc is {crc:#010x}, its fields give {expected_crc:#010x}",
            valid_header=False,
        )
    if first_seq != expected_seq:
        # an intact header with the wrong seq was never a torn write
        raise JournalCorruption(
            path,
            offset,
            f"the batch starts at seq {first_seq}, expected {expected_seq}: records "
            "are missing or out of order. Restore the node from its replicas",
        )
    if count == 0 or records_length < count * RECORD_HEADER_SIZE:
        raise BatchDamage(
            f"batch header says {count} records in {records_length} bytes", valid_header=True
        )
    size = len(buffer)
    if offset + BATCH_HEADER_SIZE + records_length > size:
        raise BatchDamage(
            f"batch of {records_length} record bytes runs past the end of the file ({size} bytes)",
            valid_header=True,
            incomplete=True,
        )


def valid_batches_at(mapped: mmap.mmap, offset: int, how_many: int, floor_seq: int) -> bool:
    """Whether `how_many` valid batch headers start at `offset`, each right after the
    one before."""
    for _ in range(how_many):
        if not valid_batch_at(mapped, offset, floor_seq):
            return False
        records_length: int = BATCH_HEADER.unpack_from(mapped, offset)[2]
        offset = round_up_to_block(offset + BATCH_HEADER_SIZE + records_length)
    return True


def valid_batch_at(mapped: mmap.mmap, offset: int, floor_seq: int) -> bool:
    """Whether a batch header with the right magic and crc, and a first seq of at least
    `floor_seq` (the segment's), starts at `offset`.

    One below it is stale: the segment's file was recycled (journal/spares.py) and
    still holds batches of its earlier life after its data, all of seqs the journal
    had trimmed before this segment began. They are none of this segment's.
    """
    if offset + BATCH_HEADER_SIZE > len(mapped):
        return False
    magic, crc, _length, _count, first_seq = BATCH_HEADER.unpack_from(mapped, offset)
    return bool(
        magic == BATCH_MAGIC and first_seq >= floor_seq and crc == batch_header_crc(mapped, offset)
    )


def stale_batch_at(mapped: mmap.mmap, offset: int) -> bool:
    """Whether the batch header at `offset`, whose first seq is below its segment's,
    is one of a recycled file's earlier life: the right magic and crc."""
    magic, crc, _length, _count, _first_seq = BATCH_HEADER.unpack_from(mapped, offset)
    return bool(magic == BATCH_MAGIC and crc == batch_header_crc(mapped, offset))


def find_valid_batch(mapped: mmap.mmap, fd: int, start: int, floor_seq: int) -> int | None:
    """The offset of the first valid batch header at a block boundary >= start.

    Only the file's data regions are searched: the preallocated, never written rest
    of a segment is a hole to SEEK_DATA (ext4, xfs), so checking the end of a
    1 GiB segment does not read 1 GiB of zeros.
    """
    size = len(mapped)
    position = round_up_to_block(start)
    while position < size:
        try:
            data_start = os.lseek(fd, position, os.SEEK_DATA)
            data_end = min(os.lseek(fd, data_start, os.SEEK_HOLE), size)
        except OSError as error:
            if error.errno == errno.ENXIO:  # no data past position
                return None
            data_start, data_end = position, size  # no SEEK_DATA here: search it all
        found = _find_valid_batch_in(mapped, round_up_to_block(data_start), data_end, floor_seq)
        if found is not None:
            return found
        position = data_end
    return None


def _find_valid_batch_in(mapped: mmap.mmap, start: int, end: int, floor_seq: int) -> int | None:
    # find() runs in C: over zeros or payload bytes it is far faster than unpacking
    # every block boundary in Python
    position = mapped.find(_BATCH_MAGIC_BYTES, start, end)
    while position >= 0:
        if position % BLOCK_SIZE == 0 and valid_batch_at(mapped, position, floor_seq):
            return position
        # only block boundaries count: jump to the next one
        position = mapped.find(_BATCH_MAGIC_BYTES, round_up_to_block(position + 1), end)
    return None
