"""Replay: read the journal back, batch by batch, telling a torn tail from corruption.

Only the batches written and not yet synced can be partly on disk after a crash. The
writer keeps at most `unsynced_batches_max` of them (each segment header says how
many; 1 means it syncs a batch before it writes the next), all at the end of the
last segment, since a roll syncs the old segment first. So a damaged batch is a
torn tail only in the last segment, followed by at most `unsynced_batches_max - 1`
valid batches, each right after the one before, in seq order. Those were written
while it synced and, if a crash cut it, were never acknowledged either (acks go in
journal order): they are dropped with it. A flipped bit in the last batch looks the
same, and its records may have been acknowledged: `TornTail` claims neither.
Anything else that is damaged is corruption, reported with file and offset and
never skipped. The rules, as a grammar, are in
docs/formats.md ("Journal").

Segments are read through a read-only mmap: the kernel pages them in as the scan
goes, so a 1 GiB segment never sits in memory at once.

Two ways to read: `batches()` gives `JournalRecord`s (inspection, tools);
`replay_requests()` gives, for crash recovery, only the records replay applies, as
the `Request`s the ledger workers take, built straight from the mapped bytes (one
object per record instead of two; replay is bound by per-record Python work).
Both verify every record the same way.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, NamedTuple

import crc32c

from journal.errors import JournalCorruption, JournalError, JournalFormatError, JournalGap
from journal.format import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    BATCH_MAGIC,
    BLOCK_SIZE,
    BODY_CRC_FIELD_END,
    BODY_CRC_START,
    BODY_HEADER,
    BODY_HEADER_SIZE,
    FORMAT_VERSION,
    PREFIX_CRC_START,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    RECORD_PREFIX,
    RECORD_PREFIX_SIZE,
    SEGMENT_HEADER,
    SEGMENT_HEADER_SIZE,
    SEGMENT_MAGIC,
    RecordFlag,
    RecordKind,
    round_up_to_block,
)
from journal.request import Request
from journal.segment import SegmentInfo, batch_header_crc, list_segments, segment_header_crc
from journal.watermark import JournalState, Watermark, read_watermark, watermark_path


class JournalRecord(NamedTuple):
    seq: int
    kind: RecordKind
    flags: RecordFlag
    ledger_id: int
    entry_id: int
    payload: bytes
    segment: Path
    offset: int  # byte offset of the record (its prefix) holding it, within its segment
    lac: int  # the last-add-confirmed an ENTRY carried (-1 for none and other kinds)
    body: bytes  # the record's body: an entry-log record, header and payload


#: why the data at a torn tail is not a whole batch (`TornTail.kind`):
#: "incomplete": cut short by the end of the file (a write cut off, a truncated file);
#: "zeroed": zeros where data should be (blocks that never reached the disk, or zeroed);
#: "stale": a recycled segment's older bytes there (blocks that never reached the disk);
#: "checksum": a checksum, magic or length fails (a write cut off, or damaged media)
TornKind = Literal["incomplete", "zeroed", "stale", "checksum"]

_TORN_KIND_MEANS: Final[dict[str, str]] = {
    "incomplete": "is cut short by the end of the file: a write cut by a crash, or a "
    "truncated file",
    "zeroed": "is zeros: a write that had not reached the disk when the node crashed, "
    "or zeroed media",
    "stale": "holds a recycled segment's older bytes: a write that had not reached the "
    "disk when the node crashed",
    "checksum": "fails its checksum: a write cut by a crash, or damaged media",
}


@dataclass(frozen=True, slots=True)
class TornTail:
    """Where the last segment's data ends in a batch that is not whole (and, at most,
    the batches written while it synced). A crash cutting the last write short and
    media damage to the last batch look alike here: the tool cannot tell them
    apart, so nothing here claims which it was."""

    segment: Path
    offset: int  # where the valid data ends
    reason: str
    #: valid batches after the damaged one, written while it synced, dropped with it
    batches_after: int = 0
    kind: TornKind = "checksum"
    #: journal records (a run of entries is one) not replayed: the damaged batch's
    #: and those after it; None when the damaged batch's header is unreadable and
    #: nothing follows it, so its record count is unknown
    records_dropped: int | None = 0
    #: the seq of the first record not replayed
    first_seq_dropped: int = 0

    def describe(self) -> str:
        """What the operator is told: what is known, and only that."""
        if self.offset < SEGMENT_HEADER_SIZE:
            where = f"the segment header of {self.segment}"
        else:
            where = f"the last batch at byte {self.offset} of {self.segment}"
        if self.records_dropped is None:
            dropped = (
                f"its records, from seq {self.first_seq_dropped} on, were not replayed "
                "(how many is unknown: its header is damaged)"
            )
        elif self.records_dropped == 0:
            dropped = "no record was lost with it"
        else:
            last = self.first_seq_dropped + self.records_dropped - 1
            dropped = (
                f"{self.records_dropped} record(s), seqs {self.first_seq_dropped}-{last}, "
                "were not replayed"
            )
        return f"{where} {_TORN_KIND_MEANS[self.kind]} ({self.reason}); {dropped}"


@dataclass(slots=True)
class ScanSummary:
    """What a scan found. Counts cover every valid record, also those below from_seq."""

    segments: int = 0  # in the journal directory, whether or not the scan reached them
    batches: int = 0
    records: int = 0
    record_bytes: int = 0  # bytes of valid records incl. headers
    first_seq: int = -1
    last_seq: int = -1
    torn_tail: TornTail | None = None
    #: the journal's watermark (journal/watermark.py), None for a journal without one
    watermark: Watermark | None = None
    #: gaps the scan went past (only with `accept_gaps`)
    gaps_accepted: list[JournalGap] = field(default_factory=list)
    #: segments wholly below the watermark, left out of the scan (already durable)
    below_watermark: list[Path] = field(default_factory=list)


@dataclass(slots=True)
class ReplayTally:
    """What `JournalScanner.replay_requests` read and what it selected for replay.
    Records are counted as operations: each entry of a run counts."""

    records_scanned: int = 0
    payload_bytes_scanned: int = 0
    records_selected: int = 0
    payload_bytes_selected: int = 0
    ledgers_selected: set[int] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class _ReplaySelection:
    #: per ledger, the last seq already durable in its entry log and index
    durable_seqs: Mapping[int, int]
    tally: ReplayTally


_BATCH_MAGIC_BYTES: Final = struct.pack("<I", BATCH_MAGIC)
_ZERO_BATCH_HEADER: Final = (0, 0, 0, 0, 0)
_KINDS: Final = {kind.value: kind for kind in RecordKind}
# flags are a byte: look them up rather than build an IntFlag per record (hot path);
# unknown bits are kept, the record's crc vouches for them
_FLAGS: Final = tuple(RecordFlag(bits) for bits in range(256))
# tuple.__new__ skips NamedTuple's Python-level __new__: a third of a record's cost
_new_record: Final = tuple.__new__


class _Damage(Exception):
    """A batch that is not intact; whether it is a torn tail is decided by the caller."""

    def __init__(self, reason: str, valid_header: bool, *, incomplete: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        #: the header's magic and crc are right, so its length can be trusted
        self.valid_header = valid_header
        #: the file ends inside the batch (else its bytes are inconsistent)
        self.kind: TornKind = "incomplete" if incomplete else "checksum"


class JournalScanner:
    """Reads a journal directory's records in seq order, from `from_seq` on.

    Before any record, the segments are checked against the journal's watermark
    (journal/watermark.py): a missing one raises JournalGap. With
    `require_watermark` (a data dir whose format keeps one), a journal without a
    watermark raises JournalFormatError; otherwise (older dirs, bare journals) only
    the segments' continuity is checked.

    `accept_gaps` is the operator's explicit override (`pora recover
    --accept-journal-gap`): gaps, and a missing or damaged watermark, are put in
    `summary.gaps_accepted` instead of raised, and the scan goes on.
    """

    def __init__(
        self,
        directory: Path,
        *,
        from_seq: int = 0,
        require_watermark: bool = False,
        accept_gaps: bool = False,
    ) -> None:
        self._directory = directory
        self._from_seq = from_seq
        self._require_watermark = require_watermark
        self._accept_gaps = accept_gaps
        #: the segment scanned before the current one (for a gap's message)
        self._previous_segment: Path | None = None
        #: the seq the next batch must start with; None until the first segment header
        self._next_seq: int | None = None
        #: the open segment header's promise: batches written and not yet synced
        self._unsynced_batches_max = 1
        #: the open segment's first seq: a valid batch header below it is stale, left
        #: from the file's life as an earlier segment (recycled, journal/spares.py)
        self._floor_seq = 0
        #: set while replay_requests() runs: records become Requests, durable ones skipped
        self._selection: _ReplaySelection | None = None
        self.summary = ScanSummary()

    def batches(self) -> Iterator[list[JournalRecord]]:
        """One list per journal batch, in order; batches wholly below from_seq are left
        out. `summary` is complete once this is exhausted."""
        self._selection = None
        return self._all_batches()

    def replay_requests(
        self, durable_seqs: Mapping[int, int], tally: ReplayTally
    ) -> Iterator[list[Request]]:
        """For crash recovery: one list per journal batch, in order, of the records
        whose seq is above their ledger's entry in `durable_seqs` (-1 if absent), as
        Requests ready for `LedgerRegistry.dispatch` (seq and body set, no on_done).
        The list is empty when every record of the batch is durable already: every
        batch is still verified, so a torn tail and corruption are found exactly as
        by `batches()`. Counts go to `tally`; `summary` as for `batches()`."""
        self._selection = _ReplaySelection(durable_seqs, tally)
        return self._all_batches()

    def _all_batches(self) -> Iterator[list[Any]]:
        self._next_seq = None
        self._previous_segment = None
        self.summary = ScanSummary()
        segments = list_segments(self._directory)
        # all of them, also when damage stops the scan before the last
        self.summary.segments = len(segments)
        watermark = self._read_watermark()
        self.summary.watermark = watermark
        if watermark is not None:
            try:
                _check_covers_watermark(self._directory, segments, watermark)
            except JournalGap as gap:
                self._accept_or_raise(gap)
            # a segment below the watermark holds only seqs that were durable elsewhere
            # (or deleted on purpose) when the watermark was written: left by a trim cut
            # short before its unlinks, or put back by hand. Replaying it would bring
            # back ledgers deleted since, and its seqs may not join the kept ones.
            self.summary.below_watermark = [
                segment.path for segment in segments if segment.first_seq < watermark.first_seq
            ]
            segments = [s for s in segments if s.first_seq >= watermark.first_seq]
        for index, segment in enumerate(segments):
            yield from self._scan_segment(segment, is_last=index == len(segments) - 1)
            self._previous_segment = segment.path

    def _read_watermark(self) -> Watermark | None:
        try:
            watermark = read_watermark(self._directory)
        except JournalFormatError as error:
            self._accept_or_raise(JournalGap(error.path, 0, None, error.reason), error)
            return None
        if watermark is None and self._require_watermark:
            missing = JournalFormatError(
                watermark_path(self._directory),
                "the journal watermark is missing, and this data dir's format keeps "
                "one: without it a lost journal segment cannot be told from a trimmed "
                "one. Restore the file from a backup of this node, or see "
                "docs/operations.md, 'The journal watermark is missing or damaged'",
            )
            self._accept_or_raise(JournalGap(missing.path, 0, None, missing.reason), missing)
        return watermark

    def _accept_or_raise(self, gap: JournalGap, error: JournalError | None = None) -> None:
        """With `accept_gaps`, note `gap` and go on; else raise `error` (or `gap`).
        A watermark that is missing or damaged is a gap of unknown extent: any seq
        might be missing."""
        if not self._accept_gaps:
            raise gap if error is None else error
        self.summary.gaps_accepted.append(gap)

    # --- segments -------------------------------------------------------------------

    def _scan_segment(self, segment: SegmentInfo, *, is_last: bool) -> Iterator[list[Any]]:
        path = segment.path
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            header = file.read(SEGMENT_HEADER_SIZE)
            if len(header) < SEGMENT_HEADER_SIZE or not any(header):
                # the crash came while the segment was being created
                self._start_segment(path, segment.first_seq)
                self._floor_seq = segment.first_seq
                if len(header) < SEGMENT_HEADER_SIZE:
                    reason = f"segment header incomplete: the file has only {size} bytes"
                else:
                    reason = "segment header block is all zeros"
                if not is_last:
                    raise JournalCorruption(path, 0, f"{reason}, but later segments follow it")
                if size > SEGMENT_HEADER_SIZE:
                    with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                        _check_no_batch_after(
                            path,
                            mapped,
                            file.fileno(),
                            SEGMENT_HEADER_SIZE,
                            0,
                            reason,
                            segment.first_seq,
                        )
                self.summary.torn_tail = TornTail(
                    path,
                    0,
                    reason,
                    kind="incomplete" if len(header) < SEGMENT_HEADER_SIZE else "zeroed",
                    first_seq_dropped=segment.first_seq,
                )
                return
            first_seq, unsynced_batches_max = self._check_segment_header(segment, header)
            self._start_segment(path, first_seq)
            self._unsynced_batches_max = unsynced_batches_max
            self._floor_seq = first_seq
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                if hasattr(mmap, "MADV_SEQUENTIAL"):
                    mapped.madvise(mmap.MADV_SEQUENTIAL)
                view = memoryview(mapped)
                try:
                    yield from self._scan_batches(
                        path, mapped, view, file.fileno(), is_last=is_last
                    )
                finally:
                    view.release()

    def _check_segment_header(self, segment: SegmentInfo, header: bytes) -> tuple[int, int]:
        """Validate a (non-zero) segment header; return its first_seq and
        unsynced_batches_max."""
        path = segment.path
        magic, version, unsynced_batches_max, block_size, first_seq, created_ms, crc = (
            SEGMENT_HEADER.unpack_from(header)
        )
        if magic != SEGMENT_MAGIC:
            raise JournalFormatError(
                path,
                f"not a journal segment: magic {magic!r}, expected {SEGMENT_MAGIC!r}; "
                "move the file out of the journal directory",
            )
        expected_crc = segment_header_crc(header)
        # the version before the crc: another version may checksum its header differently
        if version != FORMAT_VERSION:
            doubt = "" if crc == expected_crc else " (its header crc does not match either)"
            raise JournalFormatError(
                path,
                f"format version {version}; this build reads version {FORMAT_VERSION}"
                f"{doubt}. Replay it with a Pora release that reads version {version}",
            )
        if crc != expected_crc:
            raise JournalFormatError(
                path,
                f"segment header crc is {crc:#010x}, the header's bytes give "
                f"{expected_crc:#010x}: the header is damaged. Restore the node from its "
                "replicas",
            )
        if block_size != BLOCK_SIZE:
            raise JournalFormatError(
                path, f"block size {block_size}; this build reads block size {BLOCK_SIZE}"
            )
        if (first_seq, created_ms) != (segment.first_seq, segment.created_ms):
            raise JournalFormatError(
                path,
                f"the header says first seq {first_seq}, created {created_ms} ms, but the "
                f"file name says first seq {segment.first_seq}, created {segment.created_ms}"
                " ms: the file was renamed. Give it back its name",
            )
        # 0 in segments written before the field was: their writers synced every batch
        return int(first_seq), max(int(unsynced_batches_max), 1)

    def _start_segment(self, path: Path, first_seq: int) -> None:
        expected = self._next_seq
        if expected is not None and first_seq > expected:
            previous = "?" if self._previous_segment is None else self._previous_segment.name
            self._accept_or_raise(
                JournalGap(
                    path,
                    expected,
                    first_seq - 1,
                    f"{_seqs_are(expected, first_seq - 1)} in no segment: {previous} ends at "
                    f"seq {expected - 1} and {path.name} starts at seq {first_seq}, so a "
                    "segment between them was deleted or lost",
                )
            )
            expected = None  # accepted: the journal goes on from this segment
        if expected is not None and first_seq != expected:
            raise JournalCorruption(
                path,
                0,
                f"the segment starts at seq {first_seq} but the journal before it ends at "
                f"seq {expected - 1}: a segment may be missing (deleted or lost) or be a "
                "stray copy. Put back the missing segment, or restore the node from its "
                "replicas",
            )
        self._next_seq = first_seq

    # --- batches ---------------------------------------------------------------------

    def _scan_batches(
        self, path: Path, mapped: mmap.mmap, view: memoryview, fd: int, *, is_last: bool
    ) -> Iterator[list[Any]]:
        summary = self.summary
        # replay wants a (maybe empty) list per batch, to bound its chunks by bytes read
        yield_empty = self._selection is not None
        size = len(mapped)
        offset = SEGMENT_HEADER_SIZE
        while offset < size:  # a batch boundary at the end of the file ends the data
            if offset + BATCH_HEADER_SIZE > size:
                if any(mapped[offset:size]):
                    self._end_at_damage(
                        path,
                        mapped,
                        fd,
                        offset,
                        "batch header cut short by the end of the file",
                        None,  # nothing can follow it
                        "incomplete",
                        is_last=is_last,
                    )
                return
            fields = BATCH_HEADER.unpack_from(mapped, offset)
            stale = fields[4] < self._floor_seq and _stale_batch_at(mapped, offset)
            if fields == _ZERO_BATCH_HEADER or stale:
                # end of data: segments roll before they are full, preallocated space is
                # zeros, and a writer ends each batch with a zero block in a recycled one
                # (a batch of the file's earlier life here is a fallback). Or a batch none
                # of which reached the disk, with batches written while it synced after it
                what = "a stale batch header" if stale else "an all-zero batch header"
                kind: TornKind = "stale" if stale else "zeroed"
                self._end_of_data(path, mapped, fd, offset, what, kind, is_last=is_last)
                return
            _magic, _crc, records_length, count, first_seq = fields
            try:
                records = self._read_batch(path, mapped, view, offset, size, fields)
            except _Damage as damage:
                # with a valid header, its length and seqs are right: the next batch
                # is right after its records, and starts right after its seqs
                self._end_at_damage(
                    path,
                    mapped,
                    fd,
                    offset,
                    damage.reason,
                    (
                        _Extent(offset, records_length, first_seq, count)
                        if damage.valid_header
                        else None
                    ),
                    damage.kind,
                    is_last=is_last,
                )
                return
            summary.batches += 1
            summary.records += count
            summary.record_bytes += records_length
            if summary.first_seq < 0:
                summary.first_seq = first_seq
            summary.last_seq = first_seq + count - 1
            self._next_seq = first_seq + count
            if records or yield_empty:
                yield records
            offset = round_up_to_block(offset + BATCH_HEADER_SIZE + records_length)

    def _read_batch(
        self,
        path: Path,
        mapped: mmap.mmap,
        view: memoryview,
        offset: int,
        size: int,
        fields: tuple[int, int, int, int, int],
    ) -> list[Any]:
        """The batch's records at or above from_seq (JournalRecords, or Requests while
        replay_requests runs); raises _Damage if it is not intact."""
        magic, crc, records_length, count, first_seq = fields
        if magic != BATCH_MAGIC:
            raise _Damage(f"bad batch magic {magic:#010x}", valid_header=False)
        expected_crc = batch_header_crc(view, offset)
        if crc != expected_crc:
            raise _Damage(
                f"batch header crc is {crc:#010x}, its fields give {expected_crc:#010x}",
                valid_header=False,
            )
        if first_seq != self._next_seq:
            # an intact header with the wrong seq was never a torn write
            raise JournalCorruption(
                path,
                offset,
                f"the batch starts at seq {first_seq}, expected {self._next_seq}: records "
                "are missing or out of order. Restore the node from its replicas",
            )
        records_start = offset + BATCH_HEADER_SIZE
        records_end = records_start + records_length
        if count == 0 or records_length < count * RECORD_HEADER_SIZE:
            raise _Damage(
                f"batch header says {count} records in {records_length} bytes", valid_header=True
            )
        if records_end > size:
            raise _Damage(
                f"batch of {records_length} record bytes runs past the end of the file "
                f"({size} bytes)",
                valid_header=True,
                incomplete=True,
            )
        from_seq = self._from_seq
        if first_seq + count <= from_seq:
            next_offset = round_up_to_block(records_end)
            if _valid_batches_at(mapped, next_offset, self._unsynced_batches_max, self._floor_seq):
                # all below from_seq, and enough valid batches follow that it was
                # synced: not a possible torn tail, so skip it by its header, unread
                return []
            # it may be one of the last batches written: verify it like any other
        return self._decode_records(path, mapped, view, records_start, records_end, fields)

    def _decode_records(
        self,
        path: Path,
        mapped: mmap.mmap,
        view: memoryview,
        records_start: int,
        records_end: int,
        fields: tuple[int, int, int, int, int],
    ) -> list[Any]:
        """The batch's records at or above from_seq, checked: Requests to replay
        while replay_requests runs, JournalRecords otherwise."""
        framed = _frame_records(
            mapped, view, records_start, records_end, fields[4], fields[3], self._from_seq
        )
        if self._selection is not None:
            return _replay_requests(framed, mapped, self._selection)
        return _journal_records(framed, mapped, path)

    # --- where the data ends ---------------------------------------------------------

    def _end_at_damage(
        self,
        path: Path,
        mapped: mmap.mmap,
        fd: int,
        offset: int,
        reason: str,
        damaged: _Extent | None,
        kind: TornKind,
        *,
        is_last: bool,
    ) -> None:
        """A damaged batch at `offset` (`damaged`: its extent when its header is
        valid): record a torn tail, or raise JournalCorruption."""
        if not is_last:
            raise JournalCorruption(
                path,
                offset,
                f"{reason}, in a segment that later segments follow (only the last "
                "segment can end with a torn write)",
            )
        try:
            after = self._batches_after(mapped, fd, offset, damaged)
        except _NotATornTail as not_torn:
            raise JournalCorruption(
                path,
                offset,
                f"{reason}; a valid batch follows at byte {not_torn.later}{not_torn.why}",
            ) from None
        self._torn_tail(path, offset, reason, after, kind, damaged)

    def _end_of_data(
        self,
        path: Path,
        mapped: mmap.mmap,
        fd: int,
        offset: int,
        what: str,
        kind: TornKind,
        *,
        is_last: bool,
    ) -> None:
        """An all-zero (or stale) batch header at `offset`, `what`: the end of the
        segment's data, or, in the last segment, a batch that never reached the disk
        with batches written while it synced after it (a torn tail); raises
        JournalCorruption for a hole."""
        if not is_last:
            _check_no_batch_after(
                path, mapped, fd, offset + BLOCK_SIZE, offset, what, self._floor_seq
            )
            return
        try:
            after = self._batches_after(mapped, fd, offset, None)
        except _NotATornTail as not_torn:
            raise JournalCorruption(
                path,
                offset,
                f"{what} marks the end of the data, but a valid batch starts at byte "
                f"{not_torn.later}: a hole in the journal{not_torn.why}",
            ) from None
        if after:  # else nothing follows: a plain end of data
            self._torn_tail(path, offset, what, after, kind, None)

    def _batches_after(
        self, mapped: mmap.mmap, fd: int, offset: int, damaged: _Extent | None
    ) -> list[_Extent]:
        assert self._next_seq is not None  # set by the segment header
        return _batches_written_while_syncing(
            mapped,
            fd,
            offset,
            damaged,
            self._next_seq,
            self._unsynced_batches_max,
            self._floor_seq,
        )

    def _torn_tail(
        self,
        path: Path,
        offset: int,
        reason: str,
        after: list[_Extent],
        kind: TornKind,
        damaged: _Extent | None,
    ) -> None:
        assert self._next_seq is not None  # set by the segment header
        first_dropped = self._next_seq
        # the damaged batch's records: its header says, or the next batch's first seq
        damaged_records: int | None = None
        if damaged is not None:
            damaged_records = damaged.record_count
        elif after:
            damaged_records = after[0].first_seq - first_dropped
        if after:
            first, last = after[0], after[-1]
            reason = (
                f"{reason}; the {len(after)} batch(es) after it (seqs {first.first_seq}-"
                f"{last.first_seq + last.record_count - 1}) were written while it synced and are "
                "dropped with it"
            )
        records_dropped = (
            None
            if damaged_records is None
            else damaged_records + sum(extent.record_count for extent in after)
        )
        self.summary.torn_tail = TornTail(
            path, offset, reason, len(after), kind, records_dropped, first_dropped
        )


class _Extent(NamedTuple):
    """Where a batch with a valid header lies, and the seqs it holds."""

    offset: int
    records_length: int
    first_seq: int
    record_count: int

    @property
    def end(self) -> int:
        """Where the next batch starts."""
        return round_up_to_block(self.offset + BATCH_HEADER_SIZE + self.records_length)


class _NotATornTail(Exception):
    def __init__(self, later: int, why: str) -> None:
        super().__init__(later, why)
        self.later = later  # the offset of the first valid batch after the damage
        self.why = why  # "" or ", and <why the rule does not hold>"


def _batches_written_while_syncing(
    mapped: mmap.mmap,
    fd: int,
    offset: int,
    damaged: _Extent | None,
    expected_seq: int,
    unsynced_batches_max: int,
    floor_seq: int,
) -> list[_Extent]:
    """The valid batches after a batch at `offset` that is not intact (`damaged`: its
    extent if its header is valid; its seqs start at `expected_seq`), when they may
    all have been written while it synced: at most `unsynced_batches_max - 1`, each
    right after the one before in place and seq. Raises _NotATornTail otherwise.
    Batches below `floor_seq` (stale, see `_valid_batch_at`) are not looked at."""
    position: int | None
    if damaged is not None:
        # its length and seqs are right: skip its own payload bytes, which may
        # hold anything, and know exactly where and at which seq the next one starts
        place, least_seq, exact = damaged.end, damaged.first_seq + damaged.record_count, True
        position = _find_valid_batch(mapped, fd, place, floor_seq)
    else:
        # at least one seq and one block are the damaged batch's
        place, least_seq, exact = -1, expected_seq + 1, False
        position = _find_valid_batch(mapped, fd, offset + BLOCK_SIZE, floor_seq)
    if position is None:
        return []
    first_later = position
    allowed = unsynced_batches_max - 1
    after: list[_Extent] = []
    while position is not None:
        _magic, _crc, records_length, count, first_seq = BATCH_HEADER.unpack_from(mapped, position)
        if len(after) == allowed:
            why = (
                ""
                if allowed == 0
                else f", and more than the {allowed} batch(es) that may be written while "
                "one syncs follow it"
            )
            raise _NotATornTail(first_later, why)
        if (
            (exact and (position != place or first_seq != least_seq))
            or (not exact and first_seq < least_seq)
            or count == 0
        ):
            raise _NotATornTail(
                first_later,
                f", and the batch at byte {position} (seq {first_seq}) is not the one written next",
            )
        extent = _Extent(position, records_length, first_seq, count)
        after.append(extent)
        place, least_seq, exact = extent.end, first_seq + count, True
        position = _find_valid_batch(mapped, fd, place, floor_seq)
    return after


def _check_no_batch_after(
    path: Path,
    mapped: mmap.mmap,
    fd: int,
    start: int,
    end_of_data: int,
    what: str,
    floor_seq: int,
) -> None:
    """Raise JournalCorruption if a valid batch (from `floor_seq` on) starts at or
    after `start`."""
    later = _find_valid_batch(mapped, fd, start, floor_seq)
    if later is not None:
        raise JournalCorruption(
            path,
            end_of_data,
            f"{what} marks the end of the data, but a valid batch starts at byte "
            f"{later}: a hole in the journal",
        )


def _valid_batches_at(mapped: mmap.mmap, offset: int, how_many: int, floor_seq: int) -> bool:
    """Whether `how_many` valid batch headers start at `offset`, each right after the
    one before."""
    for _ in range(how_many):
        if not _valid_batch_at(mapped, offset, floor_seq):
            return False
        records_length: int = BATCH_HEADER.unpack_from(mapped, offset)[2]
        offset = round_up_to_block(offset + BATCH_HEADER_SIZE + records_length)
    return True


def _valid_batch_at(mapped: mmap.mmap, offset: int, floor_seq: int) -> bool:
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


def _stale_batch_at(mapped: mmap.mmap, offset: int) -> bool:
    """Whether the batch header at `offset`, whose first seq is below its segment's,
    is one of a recycled file's earlier life: the right magic and crc."""
    magic, crc, _length, _count, _first_seq = BATCH_HEADER.unpack_from(mapped, offset)
    return bool(magic == BATCH_MAGIC and crc == batch_header_crc(mapped, offset))


def _find_valid_batch(mapped: mmap.mmap, fd: int, start: int, floor_seq: int) -> int | None:
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
        if position % BLOCK_SIZE == 0 and _valid_batch_at(mapped, position, floor_seq):
            return position
        # only block boundaries count: jump to the next one
        position = mapped.find(_BATCH_MAGIC_BYTES, round_up_to_block(position + 1), end)
    return None


#: one record as `_frame_records` read and checked it: seq, kind, flags, ledger id,
#: (first) entry id, lac, the record's offset, where its one body starts and where
#: the record ends, its bodies when it carries a run (else None), payload bytes and
#: how many bodies it carries
_Framed = tuple[
    int, RecordKind, RecordFlag, int, int, int, int, int, int, list[bytes] | None, int, int
]


def _frame_records(
    mapped: mmap.mmap,
    view: memoryview,
    records_start: int,
    records_end: int,
    first_seq: int,
    count: int,
    from_seq: int,
) -> list[_Framed]:
    """The batch's records at or above from_seq, framed; every record of it checked
    (bounds, crcs, seqs, kinds), those below from_seq too. Raises _Damage.

    The hot loop of replay: locals only, no per-record method calls."""
    unpack_single = RECORD_HEADER.unpack_from
    unpack_prefix = RECORD_PREFIX.unpack_from
    checksum = crc32c.crc32c
    kinds = _KINDS
    flags_by_bits = _FLAGS
    framed: list[_Framed] = []
    append = framed.append
    position = records_start
    seq = first_seq
    for _ in range(count):
        if position + RECORD_HEADER_SIZE > records_end:
            raise _Damage(
                f"record {seq} at byte {position}: its header runs past the batch end",
                valid_header=True,
            )
        crc, kind, flags, body_count, record_seq = unpack_prefix(mapped, position)
        body_start = position + RECORD_PREFIX_SIZE
        if body_count == 1:  # the one-body record: header fields in one call
            (_, _, _, _, _, body_crc, length, ledger_id, entry_id, lac) = unpack_single(
                mapped, position
            )
            end = body_start + BODY_HEADER_SIZE + length
            if end > records_end:
                raise _Damage(
                    f"record {seq} at byte {position}: its {length} payload bytes run "
                    "past the batch end",
                    valid_header=True,
                )
            if checksum(view[body_start + BODY_CRC_START : end]) != body_crc:
                raise _Damage(
                    f"record {seq} at byte {position}: body crc mismatch", valid_header=True
                )
            crc_fields = mapped[body_start : body_start + BODY_CRC_FIELD_END]
            bodies = None
            payload_bytes = length
        else:
            ledger_id, entry_id, lac, bodies, end = _read_run(
                view, mapped, position, records_end, seq, body_count
            )
            crc_fields = b"".join([body[:BODY_CRC_FIELD_END] for body in bodies])
            payload_bytes = end - body_start - body_count * BODY_HEADER_SIZE
        prefix_fields = mapped[position + PREFIX_CRC_START : body_start]
        if checksum(crc_fields, checksum(prefix_fields)) != crc:
            raise _Damage(
                f"record {seq} at byte {position}: prefix crc mismatch", valid_header=True
            )
        # checked only now: a damaged prefix is reported as such, not by its fields
        if record_seq != seq:
            raise _Damage(
                f"record at byte {position} has seq {record_seq}, expected {seq}",
                valid_header=True,
            )
        record_kind = kinds.get(kind)
        if record_kind is None:
            raise _Damage(
                f"record {seq} at byte {position}: unknown kind {kind}", valid_header=True
            )
        if body_count == 0 or (body_count > 1 and record_kind is not RecordKind.ENTRY):
            raise _Damage(
                f"record {seq} at byte {position}: a {record_kind.name} record with "
                f"{body_count} bodies",
                valid_header=True,
            )
        if seq >= from_seq:
            append(
                (
                    seq,
                    record_kind,
                    flags_by_bits[flags],
                    ledger_id,
                    entry_id,
                    lac,
                    position,
                    body_start,
                    end,
                    bodies,
                    payload_bytes,
                    body_count,
                )
            )
        position = end
        seq += 1
    if position != records_end:
        raise _Damage(
            f"the batch header says its records take {records_end - records_start} bytes, "
            f"they take {position - records_start}",
            valid_header=True,
        )
    return framed


def _replay_requests(
    framed: list[_Framed], mapped: mmap.mmap, selection: _ReplaySelection
) -> list[Request]:
    """The requests to replay of an intact batch: records past their ledger's durable
    seq. Counts what it scanned and selected in the selection's tally."""
    new_request = Request
    new_run = Request.entry_run
    durable_seq = selection.durable_seqs.get
    replayed_ledgers = set[int]()
    add_replayed_ledger = replayed_ledgers.add
    scanned = scanned_bytes = selected = selected_bytes = 0
    requests: list[Request] = []
    append = requests.append
    for (
        seq,
        kind,
        flags,
        ledger_id,
        entry_id,
        lac,
        _position,
        body_start,
        end,
        bodies,
        payload_bytes,
        body_count,
    ) in framed:
        scanned += body_count
        scanned_bytes += payload_bytes
        if seq <= durable_seq(ledger_id, -1):
            continue
        if bodies is None:
            # the payload is not copied out: the ledger workers take the body, and
            # the few that look at the payload take a view of it
            request = new_request(
                kind, ledger_id, entry_id, b"", flags, None, lac, None, mapped[body_start:end]
            )
        else:
            request = new_run(ledger_id, entry_id, bodies, lac, flags, None, None, [])
        request.seq = seq
        append(request)
        selected += body_count
        selected_bytes += payload_bytes
        add_replayed_ledger(ledger_id)
    tally = selection.tally
    tally.records_scanned += scanned
    tally.payload_bytes_scanned += scanned_bytes
    tally.records_selected += selected
    tally.payload_bytes_selected += selected_bytes
    tally.ledgers_selected |= replayed_ledgers
    return requests


def _journal_records(framed: list[_Framed], mapped: mmap.mmap, path: Path) -> list[JournalRecord]:
    """An intact batch's records as JournalRecords, one per body (a run's entries
    each get one)."""
    new_record = _new_record
    records: list[JournalRecord] = []
    append = records.append
    for (
        seq,
        kind,
        flags,
        ledger_id,
        entry_id,
        lac,
        position,
        body_start,
        end,
        bodies,
        _payload_bytes,
        _body_count,
    ) in framed:
        single = bodies is None
        for index, body in enumerate([mapped[body_start:end]] if bodies is None else bodies):
            append(
                new_record(
                    JournalRecord,
                    (
                        seq,
                        kind,
                        flags,
                        ledger_id,
                        entry_id + index,
                        body[BODY_HEADER_SIZE:],
                        path,
                        position,
                        lac if single else _body_lac(body),
                        body,
                    ),
                )
            )
    return records


def _read_run(
    view: memoryview,
    mapped: mmap.mmap,
    position: int,
    records_end: int,
    seq: int,
    body_count: int,
) -> tuple[int, int, int, list[bytes], int]:
    """The bodies of the run record at `position` (its prefix crc not yet checked):
    (ledger_id, first entry id, largest lac, bodies, end). Raises _Damage. With no
    bodies (a zeroed prefix, say) it returns none: the prefix crc then decides."""
    unpack_body = BODY_HEADER.unpack_from
    checksum = crc32c.crc32c
    bodies: list[bytes] = []
    start = position + RECORD_PREFIX_SIZE
    first_ledger = first_entry = -1
    lac_max = -1
    for index in range(body_count):
        if start + BODY_HEADER_SIZE > records_end:
            raise _Damage(
                f"record {seq} at byte {position}: body {index} runs past the batch end",
                valid_header=True,
            )
        body_crc, length, ledger_id, entry_id, lac = unpack_body(mapped, start)
        end = start + BODY_HEADER_SIZE + length
        if end > records_end:
            raise _Damage(
                f"record {seq} at byte {position}: body {index}'s {length} payload bytes run "
                "past the batch end",
                valid_header=True,
            )
        if checksum(view[start + BODY_CRC_START : end]) != body_crc:
            raise _Damage(
                f"record {seq} at byte {position}: body {index} crc mismatch", valid_header=True
            )
        if index == 0:
            first_ledger, first_entry = ledger_id, entry_id
        elif ledger_id != first_ledger or entry_id != first_entry + index:
            raise _Damage(
                f"record {seq} at byte {position}: body {index} is ledger {ledger_id} entry "
                f"{entry_id} in a run of ledger {first_ledger} from entry {first_entry}",
                valid_header=True,
            )
        if lac > lac_max:  # noqa: PLR1730 (a compare is cheaper than max())
            lac_max = lac
        bodies.append(mapped[start:end])
        start = end
    return first_ledger, first_entry, lac_max, bodies, start


def _body_lac(body: bytes) -> int:
    """The last-add-confirmed field of a body."""
    lac: int = BODY_HEADER.unpack_from(body)[4]
    return lac


def _check_covers_watermark(
    directory: Path, segments: list[SegmentInfo], watermark: Watermark
) -> None:
    """Raise JournalGap unless the segments hold every seq from the watermark on.

    A journal HOLDING from seq W always has a segment starting at W: the watermark
    is only ever set to a segment's first seq, before the segments below it go.
    Whether the segments then follow each other without a gap is checked as they
    are scanned (`_start_segment`).
    """
    if watermark.state is not JournalState.HOLDING:
        return  # EMPTY: nothing from first_seq on was written
    seq = watermark.first_seq
    if any(segment.first_seq == seq for segment in segments):
        return
    source = watermark_path(directory)
    holds = f"{source} says the journal holds every seq from {seq} on"
    below = [segment for segment in segments if segment.first_seq < seq]
    above = [segment for segment in segments if segment.first_seq > seq]
    if not segments:
        raise JournalGap(
            directory,
            seq,
            None,
            f"{holds}, but {directory} holds no journal segment: seqs from {seq} on are "
            "missing (the segments were deleted or lost)",
        )
    if not above:
        last = below[-1]
        raise JournalGap(
            last.path,
            seq,
            None,
            f"{holds}, but no segment starts at seq {seq}: the last one, {last.path.name}, "
            f"starts at seq {last.first_seq}, so seqs from {seq} on are missing (the "
            "segments holding them were deleted or lost)",
        )
    first_after = above[0]
    where = (
        f"before {first_after.path.name}, the first segment"
        if not below
        else f"between {below[-1].path.name} and {first_after.path.name}"
    )
    raise JournalGap(
        first_after.path,
        seq,
        first_after.first_seq - 1,
        f"{holds}, but {_seqs_are(seq, first_after.first_seq - 1)} in no segment: "
        f"missing {where} (the segment holding them was deleted or lost)",
    )


def _seqs_are(first: int, last: int) -> str:
    return f"seq {first} is" if first == last else f"seqs {first}-{last} are"
