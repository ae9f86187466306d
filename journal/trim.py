"""Trimming: deleting the journal segments whose every record is durable elsewhere.

A segment's records run from its first_seq up to the next segment's first_seq - 1,
so only the next segment's name tells where a segment ends. The last segment has no
next one: it is (or may be) the open one, and is never trimmed.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from pathlib import Path

from journal.fileio import fsync_directory
from journal.segment import SegmentInfo
from journal.spares import SpareSegments
from journal.watermark import Watermark, write_watermark


def trimmable_segments(
    segments: Sequence[SegmentInfo], durable_before_seq: int
) -> list[SegmentInfo]:
    """The oldest segments all of whose records have seq < durable_before_seq.

    `segments` must be sorted by first_seq (as list_segments returns them). Segment i
    qualifies iff segments[i + 1].first_seq <= durable_before_seq; the result is a
    prefix, so the journal left behind has no holes.
    """
    trimmable: list[SegmentInfo] = []
    for segment, following in itertools.pairwise(segments):
        if following.first_seq < segment.first_seq:
            raise ValueError(
                f"segments out of order: {following.path.name} after {segment.path.name}"
            )
        if following.first_seq > durable_before_seq:
            break
        trimmable.append(segment)
    return trimmable


def delete_segments(
    directory: Path,
    segments: Sequence[SegmentInfo],
    *,
    watermark: Watermark,
    recycle_into: SpareSegments | None = None,
) -> int:
    """Write `watermark` (journal/watermark.py), then unlink `segments` oldest first,
    then fsync `directory`; returns the bytes freed.

    The watermark first, and durably: it says which seqs the segments left behind
    must hold, so that a segment lost later (or a crash part way through here) is
    told from one deleted on purpose. Its first seq must be at or below the first
    seq of every segment kept, and above the seqs of those deleted. Oldest first,
    so a crash part way leaves a journal without holes. A segment that is already
    gone (an earlier trim crashed after unlinking it) counts as freed.

    With `recycle_into`, a segment becomes a spare instead while that pool has room
    (`SpareSegments.recycle`), and frees nothing. Only for segments trimmed from a
    running journal: all their seqs are below the next segment's first seq, which
    is what lets readers tell their bytes from a later segment's. Not for what
    recovery replayed: a torn tail's dropped batches hold seqs the journal writes
    again.
    """
    write_watermark(directory, watermark)
    freed_bytes = 0
    for segment in segments:
        if recycle_into is not None and recycle_into.recycle(segment.path):
            continue
        try:
            size = os.stat(segment.path).st_size
            os.unlink(segment.path)
        except FileNotFoundError:
            continue
        freed_bytes += size
    if segments:
        fsync_directory(directory)
    return freed_bytes
