"""The journal reader's torn-tail rule: where a segment's data stops before its end,
is that a torn tail (dropped, as the crash dropped it) or corruption (reported,
never skipped)?

Only the batches written and not yet synced can be partly on disk after a crash. The
writer keeps at most `unsynced_batches_max` of them (each segment header says how
many; 1 means it syncs a batch before it writes the next), all at the end of the
last segment, since a roll syncs the old segment first. So a damaged batch is a
torn tail only in the last segment, followed by at most `unsynced_batches_max - 1`
valid batches, each right after the one before, in seq order. Those were written
while it synced and, if a crash cut it, were never acknowledged either (acks go in
journal order): they are dropped with it. A flipped bit in the last batch looks the
same, and its records may have been acknowledged: `TornTail` claims neither.
Anything else that is damaged is corruption, reported with file and offset. The
rules, as a grammar, are in docs/formats.md ("Journal").
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from journal.errors import JournalCorruption
from journal.format import BATCH_HEADER, BLOCK_SIZE, SEGMENT_HEADER_SIZE
from journal.framing import Extent, TornKind, find_valid_batch

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


@dataclass(frozen=True, slots=True)
class SegmentEnd:
    """What the torn-tail rule needs to know of the segment whose data stopped."""

    path: Path
    mapped: mmap.mmap
    fd: int
    #: only the last segment may end torn
    is_last: bool
    #: the seq the batch where the data stopped would start with
    next_seq: int
    #: the segment header's promise: batches written and not yet synced at once
    unsynced_batches_max: int
    #: the segment's first seq: valid batch headers below it are stale
    floor_seq: int


def torn_at_damage(
    end: SegmentEnd, offset: int, reason: str, damaged: Extent | None, kind: TornKind
) -> TornTail:
    """A batch at `offset` is not whole (`damaged`: its extent when its header is
    valid): the torn tail it is, or JournalCorruption raised."""
    if not end.is_last:
        raise JournalCorruption(
            end.path,
            offset,
            f"{reason}, in a segment that later segments follow (only the last "
            "segment can end with a torn write)",
        )
    try:
        after = _batches_written_while_syncing(end, offset, damaged)
    except _NotATornTail as not_torn:
        raise JournalCorruption(
            end.path,
            offset,
            f"{reason}; a valid batch follows at byte {not_torn.later}{not_torn.why}",
        ) from None
    return _torn_tail(end, offset, reason, after, kind, damaged)


def torn_at_end_of_data(end: SegmentEnd, offset: int, what: str, kind: TornKind) -> TornTail | None:
    """An all-zero (or stale) batch header at `offset`, `what`: the end of the
    segment's data (None), or, in the last segment, a batch that never reached the
    disk with batches written while it synced after it (a torn tail). Raises
    JournalCorruption for a hole: valid data past the end."""
    if not end.is_last:
        check_no_batch_after(end, offset + BLOCK_SIZE, offset, what)
        return None
    try:
        after = _batches_written_while_syncing(end, offset, None)
    except _NotATornTail as not_torn:
        raise JournalCorruption(
            end.path,
            offset,
            f"{what} marks the end of the data, but a valid batch starts at byte "
            f"{not_torn.later}: a hole in the journal{not_torn.why}",
        ) from None
    if not after:  # nothing follows: a plain end of data
        return None
    return _torn_tail(end, offset, what, after, kind, None)


def check_no_batch_after(end: SegmentEnd, start: int, end_of_data: int, what: str) -> None:
    """Raise JournalCorruption if a valid batch (from the segment's first seq on)
    starts at or after `start`: the data ended at `end_of_data`, for `what`."""
    later = find_valid_batch(end.mapped, end.fd, start, end.floor_seq)
    if later is not None:
        raise JournalCorruption(
            end.path,
            end_of_data,
            f"{what} marks the end of the data, but a valid batch starts at byte "
            f"{later}: a hole in the journal",
        )


def _torn_tail(
    end: SegmentEnd,
    offset: int,
    reason: str,
    after: list[Extent],
    kind: TornKind,
    damaged: Extent | None,
) -> TornTail:
    first_dropped = end.next_seq
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
    return TornTail(end.path, offset, reason, len(after), kind, records_dropped, first_dropped)


class _NotATornTail(Exception):
    def __init__(self, later: int, why: str) -> None:
        super().__init__(later, why)
        self.later = later  # the offset of the first valid batch after the damage
        self.why = why  # "" or ", and <why the rule does not hold>"


def _batches_written_while_syncing(
    end: SegmentEnd, offset: int, damaged: Extent | None
) -> list[Extent]:
    """The valid batches after a batch at `offset` that is not whole (`damaged`: its
    extent if its header is valid; its seqs start at `end.next_seq`), when they may
    all have been written while it synced: at most `unsynced_batches_max - 1`, each
    right after the one before in place and seq. Raises _NotATornTail otherwise.
    Stale batches (below the segment's first seq) are not looked at."""
    mapped, fd, floor_seq = end.mapped, end.fd, end.floor_seq
    position: int | None
    if damaged is not None:
        # its length and seqs are right: skip its own payload bytes, which may
        # hold anything, and know exactly where and at which seq the next one starts
        place, least_seq, exact = damaged.end, damaged.first_seq + damaged.record_count, True
        position = find_valid_batch(mapped, fd, place, floor_seq)
    else:
        # at least one seq and one block are the damaged batch's
        place, least_seq, exact = -1, end.next_seq + 1, False
        position = find_valid_batch(mapped, fd, offset + BLOCK_SIZE, floor_seq)
    if position is None:
        return []
    first_later = position
    allowed = end.unsynced_batches_max - 1
    after: list[Extent] = []
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
        extent = Extent(position, records_length, first_seq, count)
        after.append(extent)
        place, least_seq, exact = extent.end, first_seq + count, True
        position = find_valid_batch(mapped, fd, place, floor_seq)
    return after
