"""Reading the journal back, batch by batch, telling a torn tail from corruption.

The reader is four layers, each in a module of its own; this one composes them:

- journal/continuity.py: which segments to read, their headers, and that they hold
  every seq from the watermark on without a gap (`SegmentChain`);
- journal/framing.py: where batches lie in a segment and whether a batch's header
  and extent are whole (`check_batch`, `BatchDamage`);
- journal/torn_tail.py: where a segment's data stops early, whether that is a torn
  tail (`TornTail`, dropped) or corruption (`JournalCorruption`, never skipped);
- journal/records.py: the records inside a whole batch, every one checked, and
  what each kind of reader makes of them.

Two entry points, one per kind of reader, both verifying every record the same way:

- `JournalScanner.replay`, for crash recovery at start: the records to apply
  again (past their ledger's durable seq), gathered into each ledger's runs
  (journal/replay_runs.py);
- `JournalScanner.batches`, for the offline tools (`pora journal`, `pora verify`)
  and tests: per batch, a `JournalRecord` per entry.

Segments are read through a read-only mmap: the kernel pages them in as the scan
goes, so a 1 GiB segment never sits in memory at once.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from journal.continuity import SegmentChain, check_segment_header
from journal.errors import JournalCorruption, JournalGap
from journal.format import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    BLOCK_SIZE,
    SEGMENT_HEADER_SIZE,
    round_up_to_block,
)
from journal.framing import (
    ZERO_BATCH_HEADER,
    BatchDamage,
    Extent,
    TornKind,
    check_batch,
    stale_batch_at,
    valid_batches_at,
)
from journal.records import (
    Framed,
    JournalRecord,
    frame_records,
    journal_records,
)
from journal.replay_runs import ReplayRuns, ReplayTally
from journal.segment import SegmentInfo
from journal.torn_tail import (
    SegmentEnd,
    TornTail,
    check_no_batch_after,
    torn_at_damage,
    torn_at_end_of_data,
)
from journal.watermark import Watermark

__all__ = [
    "JournalRecord",
    "JournalScanner",
    "ReplayRuns",
    "ReplayTally",
    "ScanSummary",
    "TornKind",
    "TornTail",
]

#: what a reader makes of a whole batch's framed records
_Item = TypeVar("_Item")
_Decode = Callable[[list[Framed], memoryview, Path], list[_Item]]


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
        self.summary = ScanSummary()

    def batches(self) -> Iterator[list[JournalRecord]]:
        """One list per journal batch, in order; batches wholly below from_seq are left
        out. `summary` is complete once this is exhausted."""
        return self._scan(journal_records, yield_empty=False)

    def replay(self, runs: ReplayRuns) -> Iterator[None]:
        """For crash recovery: gathers into `runs` (journal/replay_runs.py) the
        records past their ledger's durable seq, merged into each ledger's runs,
        ready for `LedgerRegistry.dispatch_parts`. Yields once per journal batch
        read, so that the caller takes what was gathered in chunks of its choosing.
        Every batch is verified, also one wholly durable already, so a torn tail and
        corruption are found exactly as by `batches()`; `summary` as for
        `batches()`."""

        def gather(framed: list[Framed], mapped: memoryview, _path: Path) -> list[None]:
            runs.add(framed, mapped)
            return []

        for _ in self._scan(gather, yield_empty=True):
            yield

    def _scan(self, decode: _Decode[_Item], *, yield_empty: bool) -> Iterator[list[_Item]]:
        summary = self.summary = ScanSummary()
        chain = SegmentChain(
            self._directory,
            require_watermark=self._require_watermark,
            accept_gaps=self._accept_gaps,
        )
        summary.gaps_accepted = chain.gaps
        to_read = chain.segments_to_read()
        # all of them, also when damage stops the scan before the last
        summary.segments = to_read.segments_on_disk
        summary.watermark = to_read.watermark
        summary.below_watermark = to_read.below_watermark
        segments = to_read.segments
        for index, segment in enumerate(segments):
            reading = _SegmentReading(
                segment, chain, summary, self._from_seq, is_last=index == len(segments) - 1
            )
            yield from reading.batches(decode, yield_empty=yield_empty)


class _SegmentReading:
    """One segment's batches, in order, until its data ends (which may be a torn
    tail, noted in the summary) or damage is found (raised)."""

    def __init__(
        self,
        segment: SegmentInfo,
        chain: SegmentChain,
        summary: ScanSummary,
        from_seq: int,
        *,
        is_last: bool,
    ) -> None:
        self._segment = segment
        self._chain = chain
        self._summary = summary
        self._from_seq = from_seq
        self._is_last = is_last
        #: the segment header's promise: batches written and not yet synced at once
        self._unsynced_batches_max = 1
        #: the segment's first seq: a valid batch header below it is stale, left
        #: from the file's life as an earlier segment (recycled, journal/spares.py)
        self._floor_seq = segment.first_seq

    def batches(self, decode: _Decode[_Item], *, yield_empty: bool) -> Iterator[list[_Item]]:
        segment = self._segment
        with open(segment.path, "rb") as file:
            fd = file.fileno()
            header = file.read(SEGMENT_HEADER_SIZE)
            if len(header) < SEGMENT_HEADER_SIZE or not any(header):
                self._end_in_segment_header(fd, len(header) < SEGMENT_HEADER_SIZE)
                return
            first_seq, self._unsynced_batches_max = check_segment_header(segment, header)
            self._chain.start_segment(segment.path, first_seq)
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            if hasattr(mmap, "MADV_SEQUENTIAL"):
                mapped.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mapped)
            try:
                yield from self._batches_in(mapped, view, fd, decode, yield_empty)
            finally:
                view.release()
                # replayed bodies are views of the mapping (no copy) until their
                # ledgers flush and drop them: then the last one unmaps it
                with contextlib.suppress(BufferError):
                    mapped.close()

    def _end_in_segment_header(self, fd: int, incomplete: bool) -> None:
        """The crash came while the segment was being created: its header block is
        cut short or zeros. A torn tail if nothing follows it in the last segment."""
        segment = self._segment
        path = segment.path
        self._chain.start_segment(path, segment.first_seq)
        size = os.fstat(fd).st_size
        if incomplete:
            reason = f"segment header incomplete: the file has only {size} bytes"
        else:
            reason = "segment header block is all zeros"
        if not self._is_last:
            raise JournalCorruption(path, 0, f"{reason}, but later segments follow it")
        if size > SEGMENT_HEADER_SIZE:
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
                check_no_batch_after(self._end(mapped, fd), SEGMENT_HEADER_SIZE, 0, reason)
        self._summary.torn_tail = TornTail(
            path,
            0,
            reason,
            kind="incomplete" if incomplete else "zeroed",
            first_seq_dropped=segment.first_seq,
        )

    def _end(self, mapped: mmap.mmap, fd: int) -> SegmentEnd:
        next_seq = self._chain.next_seq
        assert next_seq is not None  # set by the segment's start
        return SegmentEnd(
            self._segment.path,
            mapped,
            fd,
            self._is_last,
            next_seq,
            self._unsynced_batches_max,
            self._floor_seq,
        )

    def _batches_in(
        self,
        mapped: mmap.mmap,
        view: memoryview,
        fd: int,
        decode: _Decode[_Item],
        yield_empty: bool,
    ) -> Iterator[list[_Item]]:
        path = self._segment.path
        chain = self._chain
        summary = self._summary
        from_seq = self._from_seq
        size = len(mapped)
        offset = SEGMENT_HEADER_SIZE
        while offset < size:  # a batch boundary at the end of the file ends the data
            assert offset % BLOCK_SIZE == 0, offset
            if offset + BATCH_HEADER_SIZE > size:
                if any(mapped[offset:size]):
                    reason = "batch header cut short by the end of the file"
                    # nothing can follow it
                    summary.torn_tail = torn_at_damage(
                        self._end(mapped, fd), offset, reason, None, "incomplete"
                    )
                return
            fields = BATCH_HEADER.unpack_from(mapped, offset)
            stale = fields[4] < self._floor_seq and stale_batch_at(mapped, offset)
            if fields == ZERO_BATCH_HEADER or stale:
                # end of data: segments roll before they are full, preallocated space is
                # zeros, and a writer ends each batch with a zero block in a recycled one
                # (a batch of the file's earlier life here is a fallback). Or a batch none
                # of which reached the disk, with batches written while it synced after it
                what = "a stale batch header" if stale else "an all-zero batch header"
                kind: TornKind = "stale" if stale else "zeroed"
                summary.torn_tail = torn_at_end_of_data(self._end(mapped, fd), offset, what, kind)
                return
            _magic, _crc, records_length, count, first_seq = fields
            records_start = offset + BATCH_HEADER_SIZE
            next_offset = round_up_to_block(records_start + records_length)
            try:
                check_batch(path, view, offset, fields, chain.next_seq)
                if first_seq + count <= from_seq and valid_batches_at(
                    mapped, next_offset, self._unsynced_batches_max, self._floor_seq
                ):
                    # all below from_seq, and enough valid batches follow that it was
                    # synced: not a possible torn tail, so skip it by its header, unread
                    framed: list[Framed] = []
                else:
                    # it may be one of the last batches written: verify it like any other
                    framed = frame_records(
                        mapped,
                        view,
                        records_start,
                        records_start + records_length,
                        first_seq,
                        count,
                        from_seq,
                    )
            except BatchDamage as damage:
                # with a valid header, its length and seqs are right: the next batch
                # is right after its records, and starts right after its seqs
                damaged = (
                    Extent(offset, records_length, first_seq, count)
                    if damage.valid_header
                    else None
                )
                summary.torn_tail = torn_at_damage(
                    self._end(mapped, fd), offset, damage.reason, damaged, damage.kind
                )
                return
            summary.batches += 1
            summary.records += count
            summary.record_bytes += records_length
            if summary.first_seq < 0:
                summary.first_seq = first_seq
            summary.last_seq = first_seq + count - 1
            chain.advance(first_seq + count)
            items = decode(framed, view, path) if framed else []
            if items or yield_empty:
                yield items
            offset = next_offset
