"""Input partitions of a Pora read (docs/spark.md, "Partitions"): one per segment,
a large segment cut into entry ranges of about `target_bytes` of payload each, so
Spark reads a big stream with as many tasks as it has cores and no task holds more
than a bounded range. Pure: the readers pass in `stream.extents()`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from pora import Position, SegmentExtent

#: an OPEN segment's size is not recorded: its entries are taken at this size (a
#: writer's entries are about 1 MiB of Arrow memory before zstd)
OPEN_ENTRY_BYTES_GUESS = 512 << 10


@dataclass(frozen=True)
class EntryRange(InputPartition):
    """Entries `first_entry..last_entry` (inclusive) of segment `segment`."""

    segment: int
    first_entry: int
    last_entry: int

    @property
    def start(self) -> Position:
        return Position(self.segment, self.first_entry)

    @property
    def stop(self) -> Position:
        """The position after the range (exclusive)."""
        return Position(self.segment, self.last_entry + 1)


def entry_bytes_of(extent: SegmentExtent) -> int:
    """The mean payload bytes of the segment's entries (a guess for the OPEN one)."""
    if extent.segment_bytes is None or not extent.segment_entries:
        return OPEN_ENTRY_BYTES_GUESS
    return max(1, extent.segment_bytes // extent.segment_entries)


def plan_ranges(extents: Sequence[SegmentExtent], target_bytes: int) -> list[EntryRange]:
    """The extents cut into ranges of about `target_bytes` each (at least one entry),
    in stream order."""
    ranges: list[EntryRange] = []
    for extent in extents:
        per_range = max(1, target_bytes // entry_bytes_of(extent))
        for first in range(extent.first_entry, extent.last_entry + 1, per_range):
            last = min(extent.last_entry, first + per_range - 1)
            ranges.append(EntryRange(extent.seq, first, last))
    return ranges
