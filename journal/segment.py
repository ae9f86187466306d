"""Journal segment files: their names, their header block, and the one writer.

A segment is `<first_seq as 20 digits>-<created_ms>.journal`: a header block, then
block-aligned batches (docs/formats.md, "Journal"). The writer is synchronous: the
journal task runs it in a worker thread, one call at a time, so it needs no locks.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import crc32c

from journal import fileio
from journal.errors import JournalError, JournalFormatError
from journal.fileio import fsync_directory, pwrite_all, pwritev_all
from journal.format import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    BATCH_MAGIC,
    BLOCK_SIZE,
    BODY_CRC_FIELD_END,
    BODY_HEADER_SIZE,
    FORMAT_VERSION,
    RECORD_BODIES_MAX,
    RECORD_PAYLOAD_MAX,
    RECORD_PREFIX_SIZE,
    SEGMENT_HEADER,
    SEGMENT_HEADER_SIZE,
    SEGMENT_MAGIC,
    UNSYNCED_BATCHES_LIMIT,
    RecordBody,
    round_up_to_block,
)
from journal.request import Request
from journal.spares import SpareSegments

SEGMENT_SUFFIX: Final = ".journal"
_SEQ_DIGITS: Final = 20
#: the struct fields the segment header crc covers: all of them but the crc itself
_SEGMENT_HEADER_CRC_START: Final = SEGMENT_HEADER.size - 4
#: the batch header crc covers the fields after magic and crc
_BATCH_HEADER_CRC_START: Final = 8
_U32_MAX: Final = 0xFFFF_FFFF
_CRC_FIELD: Final = struct.Struct("<I")  # one u32, to patch a crc in place
#: a record prefix after its crc: kind, flags, body_count, seq
_PREFIX_TAIL: Final = struct.Struct("<BBHQ")

#: what the crc helpers read from: encoded buffers and mapped segment files
Buffer = bytes | bytearray | memoryview | mmap.mmap


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    path: Path
    first_seq: int
    created_ms: int


# --- names ------------------------------------------------------------------------------


def segment_file_name(first_seq: int, created_ms: int) -> str:
    """The file name of the segment whose first record has seq `first_seq`."""
    if first_seq < 0 or created_ms < 0:
        raise ValueError(f"first_seq ({first_seq}) and created_ms ({created_ms}) must be >= 0")
    return f"{first_seq:0{_SEQ_DIGITS}d}-{created_ms}{SEGMENT_SUFFIX}"


def parse_segment_path(path: Path) -> SegmentInfo:
    """Read first_seq and created_ms out of a segment's file name."""
    stem = path.name.removesuffix(SEGMENT_SUFFIX)
    seq_text, dash, ms_text = stem.partition("-")
    if not (
        dash
        and len(seq_text) == _SEQ_DIGITS
        and seq_text.isascii()
        and seq_text.isdigit()
        and ms_text.isascii()
        and ms_text.isdigit()
    ):
        raise JournalFormatError(
            path,
            f"not a journal segment name (expected <first_seq as {_SEQ_DIGITS} digits>-"
            f"<created_ms>{SEGMENT_SUFFIX}); move the file out of the journal directory",
        )
    return SegmentInfo(path, int(seq_text), int(ms_text))


def list_segments(directory: Path) -> list[SegmentInfo]:
    """The segments in `directory`, oldest first; a missing directory holds none."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    segments = [
        parse_segment_path(directory / name) for name in names if name.endswith(SEGMENT_SUFFIX)
    ]
    # an empty segment and its successor share a first_seq: creation time breaks the tie
    segments.sort(key=lambda s: (s.first_seq, s.created_ms))
    return segments


# --- encoding -------------------------------------------------------------------------


def encode_segment_header(first_seq: int, created_ms: int, unsynced_batches_max: int = 1) -> bytes:
    """The whole header block of a new segment. `unsynced_batches_max`: how many
    batches the writer may have written and not yet synced at once (it tells the
    reader how many whole batches may follow a torn one after a crash)."""
    fields = SEGMENT_HEADER.pack(
        SEGMENT_MAGIC,
        FORMAT_VERSION,
        unsynced_batches_max,
        BLOCK_SIZE,
        first_seq,
        created_ms,
        0,
    )
    crc = crc32c.crc32c(fields[:_SEGMENT_HEADER_CRC_START])
    block = bytearray(SEGMENT_HEADER_SIZE)
    block[:_SEGMENT_HEADER_CRC_START] = fields[:_SEGMENT_HEADER_CRC_START]
    _CRC_FIELD.pack_into(block, _SEGMENT_HEADER_CRC_START, crc)
    return bytes(block)


def segment_header_crc(header: Buffer) -> int:
    """The crc a segment header struct (at the start of `header`) must carry."""
    return int(crc32c.crc32c(memoryview(header)[:_SEGMENT_HEADER_CRC_START]))


def batch_header_crc(buf: Buffer, offset: int) -> int:
    """The crc the batch header at `offset` of `buf` must carry."""
    view = memoryview(buf)
    start = offset + _BATCH_HEADER_CRC_START
    return int(crc32c.crc32c(view[start : offset + BATCH_HEADER_SIZE]))


def encode_batch_parts(requests: Sequence[Request], first_seq: int) -> list[RecordBody]:
    """One batch as the buffers that make it, one after another: batch header,
    then each record's prefix and bodies, then zeros to the block end. Sets each
    request's seq.

    Hot path: each request's bodies were encoded when the request was made, so a
    record (a whole run of entries) costs one 16-byte prefix here. (The journal
    task joins the parts before writing: see `Journal._commit`.)
    """
    count = len(requests)
    if count == 0:
        raise ValueError("a journal batch holds at least one record")
    body_bytes = sum([request.body_bytes for request in requests])
    for request in requests:
        if not 0 < len(request.bodies) <= RECORD_BODIES_MAX:
            raise ValueError(
                f"a record carries 1 to {RECORD_BODIES_MAX} bodies, not {len(request.bodies)}"
            )
    if body_bytes > RECORD_PAYLOAD_MAX:
        for request in requests:  # only then can one payload be too large
            for body in request.bodies:
                if len(body) - BODY_HEADER_SIZE > RECORD_PAYLOAD_MAX:
                    raise ValueError(
                        f"payload of {len(body) - BODY_HEADER_SIZE} bytes exceeds the "
                        f"journal's limit of {RECORD_PAYLOAD_MAX}"
                    )
    records_length = count * RECORD_PREFIX_SIZE + body_bytes
    if records_length > _U32_MAX:
        raise ValueError(f"a batch of {records_length} record bytes exceeds 4 GiB: split it")
    header = bytearray(BATCH_HEADER.pack(BATCH_MAGIC, 0, records_length, count, first_seq))
    _CRC_FIELD.pack_into(header, 4, crc32c.crc32c(memoryview(header)[_BATCH_HEADER_CRC_START:]))
    parts: list[RecordBody] = [bytes(header)]
    append = parts.append
    extend = parts.extend
    pack_tail = _PREFIX_TAIL.pack
    pack_crc = _CRC_FIELD.pack
    checksum = crc32c.crc32c
    seq = first_seq
    for request in requests:
        bodies = request.bodies
        # the prefix crc covers the prefix fields after it and every body's crc field
        tail = pack_tail(request.kind, request.flags, len(bodies), seq)
        if len(bodies) == 1:
            crc = checksum(bodies[0][:BODY_CRC_FIELD_END], checksum(tail))
        else:
            crc = checksum(b"".join([body[:BODY_CRC_FIELD_END] for body in bodies]), checksum(tail))
        append(pack_crc(crc) + tail)
        extend(bodies)
        request.seq = seq
        seq += 1
    padding = round_up_to_block(BATCH_HEADER_SIZE + records_length) - (
        BATCH_HEADER_SIZE + records_length
    )
    if padding:
        append(bytes(padding))
    return parts


def encode_batch(requests: Sequence[Request], first_seq: int) -> bytes:
    """One batch as one buffer (see `encode_batch_parts`); sets each request's seq."""
    return b"".join(encode_batch_parts(requests, first_seq))


# --- files ----------------------------------------------------------------------------


#: written after every batch in a segment made from a spare: see `write_encoded`
_END_OF_DATA_BLOCK: Final = bytes(BLOCK_SIZE)


class SegmentWriter:
    """Appends batches to the one open segment. Sync code, called from one worker thread
    at a time."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int,
        first_seq: int,
        preallocate: bool = True,
        fsync: bool = True,
        spares: SpareSegments | None = None,
        unsynced_batches_max: int = 1,
    ) -> None:
        if segment_bytes < SEGMENT_HEADER_SIZE + BLOCK_SIZE:
            raise ValueError(f"segment_bytes ({segment_bytes}) must hold a header and a batch")
        if not 1 <= unsynced_batches_max <= UNSYNCED_BATCHES_LIMIT:
            raise ValueError(
                f"unsynced_batches_max ({unsynced_batches_max}) must be in "
                f"[1, {UNSYNCED_BATCHES_LIMIT}]"
            )
        if first_seq < 0:
            raise ValueError(f"first_seq ({first_seq}) must be >= 0")
        self._directory = directory
        self._segment_bytes = segment_bytes
        self._preallocate = preallocate
        self._fsync = fsync
        #: recorded in every segment header: the caller promises never to have more
        #: batches written and not yet synced (`sync`) than this
        self._unsynced_batches_max = unsynced_batches_max
        #: zero-filled files to make new segments from (journal/spares.py)
        self._spares = spares
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            if fsync:
                fsync_directory(directory.parent)
        newer = [s for s in list_segments(directory) if s.first_seq > first_seq]
        if newer:
            # writing here would put records out of order: the next replay would fail
            raise JournalError(
                f"cannot start the journal at seq {first_seq} in {directory}: segment "
                f"{newer[0].path.name} already starts at seq {newer[0].first_seq}. "
                "Recovery must replay the journal first"
            )
        #: whether the open segment was a spare (maybe a recycled one: see write_encoded)
        self._fd, self._segment, self._from_spare = self._create_segment(first_seq)
        self._offset = SEGMENT_HEADER_SIZE  # where the next batch goes
        self._next_seq = first_seq

    @property
    def open_segment(self) -> SegmentInfo:
        return self._segment

    @property
    def next_seq(self) -> int:
        """The seq the next record gets."""
        return self._next_seq

    @property
    def open_segment_bytes_used(self) -> int:
        """How far the open segment is written (header included)."""
        return self._offset

    def write_batch(self, requests: Sequence[Request], first_seq: int) -> int:
        """Encode and write one batch (rolling first when it does not fit); no sync.

        Returns the bytes written. A batch larger than a whole segment gets a fresh
        segment to itself, which grows past its preallocation.
        """
        if self._fd < 0:
            raise JournalError(f"the journal writer of {self._directory} is closed")
        parts = encode_batch_parts(requests, first_seq)
        return self.write_encoded(parts, len(requests), first_seq)

    def fits(self, parts: Sequence[RecordBody]) -> bool:
        """Whether `write_encoded(parts, ...)` goes into the open segment (no roll)."""
        length = sum([len(part) for part in parts])
        return self._offset <= SEGMENT_HEADER_SIZE or self._offset + length <= self._segment_bytes

    def write_encoded(self, parts: Sequence[RecordBody], record_count: int, first_seq: int) -> int:
        """Write a batch made by `encode_batch_parts` (rolling first when it does not fit)."""
        if self._fd < 0:
            raise JournalError(f"the journal writer of {self._directory} is closed")
        if first_seq != self._next_seq:
            # a gap or an overlap would make the journal unreadable at the next replay
            raise ValueError(f"batch starts at seq {first_seq}, expected {self._next_seq}")
        length = sum([len(part) for part in parts])
        holds_a_batch = self._offset > SEGMENT_HEADER_SIZE
        if holds_a_batch and self._offset + length > self._segment_bytes:
            self._roll(first_seq)
        if self._from_spare and self._offset + length + BLOCK_SIZE <= self._segment_bytes:
            # a zero block after the batch marks the end of the data (the next batch
            # overwrites it): a recycled spare holds its earlier life's bytes there,
            # and a reader must not take them for a torn batch (journal/spares.py)
            parts = [*parts, _END_OF_DATA_BLOCK]
        # before writing (cheap, once per batch): the batch fills whole blocks from a
        # block boundary, and its header claims the seqs the writer is at; the
        # reader's torn-tail rule counts on both
        assert self._offset % BLOCK_SIZE == 0 and length % BLOCK_SIZE == 0, (self._offset, length)
        assert BATCH_HEADER.unpack_from(parts[0])[3:] == (record_count, first_seq), first_seq
        pwritev_all(self._fd, parts, self._offset)
        # only now: after a failed write the next batch goes to the same place
        self._offset += length
        self._next_seq += record_count
        return length

    def sync(self) -> None:
        """Make every batch written so far durable."""
        if self._fsync:
            fileio.fdatasync(self._fd)

    def close(self) -> None:
        """Close the open segment (without syncing). Idempotent."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def _roll(self, first_seq: int) -> None:
        # create the new segment first: if that fails, the open one stays usable
        fd, segment, from_spare = self._create_segment(first_seq)
        old_fd = self._fd
        self._fd, self._segment, self._offset = fd, segment, SEGMENT_HEADER_SIZE
        self._from_spare = from_spare
        try:
            # the caller synced after the last batch; this costs nothing then, and an
            # unsynced batch in a segment that is no longer last would be corruption
            if self._fsync:
                fileio.fdatasync(old_fd)
        finally:
            os.close(old_fd)

    def _create_segment(self, first_seq: int) -> tuple[int, SegmentInfo, bool]:
        """A new segment with its header durable: (fd, info, whether from a spare)."""
        created_ms = time.time_ns() // 1_000_000
        path = self._directory / segment_file_name(first_seq, created_ms)
        header = encode_segment_header(first_seq, created_ms, self._unsynced_batches_max)
        fd = self._open_from_spare(path, header)
        from_spare = fd >= 0
        if fd < 0:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                raise _segment_exists(path) from None
            try:
                if self._preallocate and os.fstat(fd).st_size < self._segment_bytes:
                    fileio.posix_fallocate(fd, 0, self._segment_bytes)
                pwrite_all(fd, header, 0)
                if self._fsync:
                    fileio.fdatasync(fd)
            except BaseException:
                # a half-made segment would read as a torn tail; better not to leave it
                os.close(fd)
                with contextlib.suppress(OSError):
                    path.unlink()
                raise
        if self._fsync:
            try:
                fsync_directory(self._directory)
            except BaseException:
                os.close(fd)
                raise
        return fd, SegmentInfo(path, first_seq, created_ms), from_spare

    def _open_from_spare(self, path: Path, header: bytes) -> int:
        """Give a ready spare `header` and the name `path`, and open it; -1 when there
        is none.

        The header is written and synced while the file still has its spare name: a
        recycled spare holds an earlier segment's header, which must never be seen
        under the new name. Then a hard link, not a rename: a link never replaces an
        existing file, as O_EXCL never opens one. A crash between link and unlink
        leaves the spare linked twice, which the next start's `SpareSegments.adopt`
        deletes.
        """
        spare = None if self._spares is None else self._spares.take()
        if spare is None:
            return -1
        try:
            fd = os.open(spare, os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            return -1  # the spare is gone: make a segment anew
        try:
            pwrite_all(fd, header, 0)
            if self._fsync:
                fileio.fdatasync(fd)
            os.link(spare, path)
        except BaseException as error:
            os.close(fd)
            if isinstance(error, FileExistsError):
                raise _segment_exists(path) from None
            if isinstance(error, OSError):
                return -1  # a write error or no links here: make a segment anew
            raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spare)
        return fd


def _segment_exists(path: Path) -> JournalError:
    return JournalError(
        f"journal segment {path} already exists: segments are never appended to. "
        "Another node may be using this data directory"
    )
