"""The journal reader's outer layer: which segments to read, and that together they
hold every seq from the watermark on, without a gap.

Before any record is read, the segments are checked against the journal's
watermark (journal/watermark.py): a segment that should start at the watermark and
does not raises JournalGap. As the segments are read, each must start exactly
where the one before ended (`SegmentChain.start_segment`). A segment's own header
is checked here too (`check_segment_header`): its magic, version, crc and name.

With `accept_gaps` (the operator's `pora recover --accept-journal-gap`), a gap, and
a missing or damaged watermark, is noted in `gaps` instead of raised, and the
reading goes on past it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from journal.errors import JournalCorruption, JournalError, JournalFormatError, JournalGap
from journal.format import BLOCK_SIZE, FORMAT_VERSION, SEGMENT_HEADER, SEGMENT_MAGIC
from journal.segment import SegmentInfo, list_segments, segment_header_crc
from journal.watermark import JournalState, Watermark, read_watermark, watermark_path


@dataclass(slots=True)
class SegmentsToRead:
    """The segments a scan reads, in order, and what it leaves out."""

    segments: list[SegmentInfo]
    #: how many segments the directory holds, read or not
    segments_on_disk: int
    #: the journal's watermark; None for a journal without one (or when a damaged
    #: one was accepted as a gap)
    watermark: Watermark | None
    #: segments wholly below the watermark: durable elsewhere, not read
    below_watermark: list[Path] = field(default_factory=list)


class SegmentChain:
    """The seq continuity of one scan: the segments' order against the watermark and
    each other, and the seq the next batch must start with (`next_seq`), which the
    batch layer moves on (`advance`)."""

    def __init__(self, directory: Path, *, require_watermark: bool, accept_gaps: bool) -> None:
        self._directory = directory
        self._require_watermark = require_watermark
        self._accept_gaps = accept_gaps
        #: gaps gone past, with `accept_gaps`
        self.gaps: list[JournalGap] = []
        #: the seq the next batch must start with; None until the first segment starts
        self.next_seq: int | None = None
        #: the segment started before the current one (for a gap's message)
        self._previous: Path | None = None
        self._current: Path | None = None

    def segments_to_read(self) -> SegmentsToRead:
        """List the directory's segments and check them against the watermark."""
        segments = list_segments(self._directory)
        watermark = self._read_watermark()
        selected = SegmentsToRead(segments, len(segments), watermark)
        if watermark is None:
            return selected
        try:
            _check_covers_watermark(self._directory, segments, watermark)
        except JournalGap as gap:
            self._accept_or_raise(gap)
        # a segment below the watermark holds only seqs that were durable elsewhere
        # (or deleted on purpose) when the watermark was written: left by a trim cut
        # short before its unlinks, or put back by hand. Replaying it would bring
        # back ledgers deleted since, and its seqs may not join the kept ones.
        selected.below_watermark = [s.path for s in segments if s.first_seq < watermark.first_seq]
        selected.segments = [s for s in segments if s.first_seq >= watermark.first_seq]
        return selected

    def start_segment(self, path: Path, first_seq: int) -> None:
        """The segment at `path` starts at `first_seq`: it must be where the journal
        read so far ends. Raises JournalGap (a segment missing between them) or
        JournalCorruption (a segment starting inside the ones before it)."""
        expected = self.next_seq
        self._previous, self._current = self._current, path
        if expected is not None and first_seq > expected:
            previous = "?" if self._previous is None else self._previous.name
            self._accept_or_raise(
                JournalGap(
                    path,
                    expected,
                    first_seq - 1,
                    f"{seqs_are(expected, first_seq - 1)} in no segment: {previous} ends at "
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
        self.next_seq = first_seq

    def advance(self, next_seq: int) -> None:
        """A whole batch was read: the next one starts at `next_seq`."""
        assert self.next_seq is not None and next_seq > self.next_seq, (next_seq, self.next_seq)
        self.next_seq = next_seq

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
        self.gaps.append(gap)


def check_segment_header(segment: SegmentInfo, header: bytes) -> tuple[int, int]:
    """Validate a (non-zero) segment header block; return its first_seq and
    unsynced_batches_max. Raises JournalFormatError."""
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


def _check_covers_watermark(
    directory: Path, segments: list[SegmentInfo], watermark: Watermark
) -> None:
    """Raise JournalGap unless the segments hold every seq from the watermark on.

    A journal HOLDING from seq W always has a segment starting at W: the watermark
    is only ever set to a segment's first seq, before the segments below it go.
    Whether the segments then follow each other without a gap is checked as they
    are read (`SegmentChain.start_segment`).
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
        f"{holds}, but {seqs_are(seq, first_after.first_seq - 1)} in no segment: "
        f"missing {where} (the segment holding them was deleted or lost)",
    )


def seqs_are(first: int, last: int) -> str:
    return f"seq {first} is" if first == last else f"seqs {first}-{last} are"
