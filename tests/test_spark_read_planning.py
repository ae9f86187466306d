"""The readers' pure parts: segments cut into entry ranges of about the bytes asked
for, and the end of a micro-batch under row and byte limits (whole entries, at
least one), and an offset past a stream's end."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from pora import Position, SegmentExtent
from spark.admission import Limits, admitted_end
from spark.encoding import EntryEncoder
from spark.planning import OPEN_ENTRY_BYTES_GUESS, EntryRange, plan_ranges


def test_segments_are_cut_into_ranges_of_about_the_target() -> None:
    extents = [
        SegmentExtent(3, 2, 9, 10, 10_000),  # 1,000 bytes an entry, entries 2..9
        SegmentExtent(4, 0, 0, 1, 50_000_000),  # one entry over the target: alone
        SegmentExtent(5, 0, 99, None, None),  # OPEN: entries taken at the guess
    ]
    ranges = plan_ranges(extents, target_bytes=3_000)
    assert ranges[:4] == [
        EntryRange(3, 2, 4),
        EntryRange(3, 5, 7),
        EntryRange(3, 8, 9),
        EntryRange(4, 0, 0),
    ]
    assert ranges[4:] == [EntryRange(5, entry, entry) for entry in range(100)]
    per_range = 10 * OPEN_ENTRY_BYTES_GUESS
    assert plan_ranges(extents[2:], per_range) == [
        EntryRange(5, f, f + 9) for f in range(0, 100, 10)
    ]
    covered = [
        Position(r.segment, entry)
        for r in ranges
        for entry in range(r.first_entry, r.last_entry + 1)
    ]
    assert len(covered) == len(set(covered)) == 8 + 1 + 100
    assert EntryRange(3, 2, 4).start == Position(3, 2) and EntryRange(3, 2, 4).stop == Position(
        3, 5
    )


def entry(rows: int) -> bytes:
    return EntryEncoder().encode(pa.record_batch({"x": list(range(rows))}))


def test_a_batch_ends_before_the_entry_that_would_pass_a_limit() -> None:
    entries = [(Position(0, i), entry(10)) for i in range(5)] + [(Position(1, 0), entry(10))]
    assert admitted_end(entries, Limits(max_rows=25)) == Position(0, 2)
    assert admitted_end(entries, Limits(max_rows=30)) == Position(0, 3)
    assert admitted_end(entries, Limits(max_rows=1)) == Position(0, 1)  # at least one
    assert admitted_end(entries, Limits(max_rows=1000)) == Position(1, 1)
    size = len(entries[0][1])
    assert admitted_end(entries, Limits(max_bytes=2 * size + 1)) == Position(0, 2)
    assert admitted_end(entries, Limits(max_rows=100, max_bytes=size)) == Position(0, 1)
    assert admitted_end([], Limits(max_rows=5)) is None


def test_a_stream_reader_pickles_without_its_client() -> None:
    import pickle  # noqa: PLC0415

    from pyspark.sql.types import LongType, StructField, StructType  # noqa: PLC0415

    from spark.options import parse_options  # noqa: PLC0415
    from spark.stream_source import PoraStreamReader  # noqa: PLC0415

    options = parse_options({"metadata": "sqlite:///nowhere.db", "path": "events"})
    reader = PoraStreamReader(options, StructType([StructField("id", LongType())]))
    reader._pora = object()  # type: ignore[assignment]  # as once the driver connected
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._pora is None and copy._options == options


def test_a_batch_takes_the_schema_spark_expects_without_casting_equal_types() -> None:
    from spark.range_read import cast_to  # noqa: PLC0415

    inner = pa.struct([pa.field("a", pa.int32(), nullable=False)])
    # a null struct row whose non-nullable child is null underneath, as Spark writes
    structs = pa.StructArray.from_arrays(
        [pa.array([1, None], pa.int32())], fields=list(inner), mask=pa.array([False, True])
    )
    batch = pa.record_batch([pa.array([1, 2]), structs], names=["id", "s"])
    expected = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", inner)])
    cast = cast_to(batch, expected)
    assert cast.schema.equals(expected) and cast.column(1).to_pylist() == [{"a": 1}, None]
    added = cast_to(pa.record_batch([pa.nulls(2)], names=["x"]), pa.schema([("x", pa.string())]))
    assert added.column(0).type == pa.string() and added.column(0).null_count == 2


def test_an_offset_past_the_streams_end_is_told_from_one_at_it() -> None:
    from types import SimpleNamespace  # noqa: PLC0415

    from spark.stream_source import past_end  # noqa: PLC0415

    closed = SimpleNamespace(seq=3, state=SimpleNamespace(name="CLOSED"), last_entry_id=9)
    open_ = SimpleNamespace(seq=4, state=SimpleNamespace(name="OPEN"), last_entry_id=-1)
    info: Any = SimpleNamespace(next_seq=5, segments=(closed, open_))
    assert not past_end(Position(3, 10), info)  # a CLOSED segment's end
    assert past_end(Position(3, 11), info)
    assert not past_end(Position(4, 500), info)  # the OPEN one's end is not known here
    assert not past_end(Position(5, 0), info)  # the next segment's first position
    assert past_end(Position(5, 1), info) and past_end(Position(9, 0), info)
    assert not past_end(Position(1, 70), info)  # a paged segment: not read for this


def test_a_batch_planned_on_a_stream_since_created_again_reads_nothing() -> None:
    """Run again after a restart with failOnDataLoss=false, such a batch's end is a
    position of the former stream: reading up to it would read part of the new stream,
    which the next batch then reads from its start again."""
    from pyspark.sql.types import LongType, StructField, StructType  # noqa: PLC0415

    from spark.options import parse_options  # noqa: PLC0415
    from spark.stream_source import PoraStreamReader, offset_of  # noqa: PLC0415

    options = parse_options({"metadata": "sqlite:///nowhere.db", "failOnDataLoss": "false"}, "e")
    reader = PoraStreamReader(options, StructType([StructField("id", LongType())]))
    reader._checked = lambda offset: (Position(0, 0), 2000)  # type: ignore[method-assign]
    start, end = offset_of(Position(0, 0), "c", 1000), offset_of(Position(2, 1), "c", 1000)
    assert reader.partitions(start, end) == []
