"""The Structured Streaming source, `session.readStream.format("pora")`, on real
Spark and a 3-node cluster: a query reads what a live writer appends (and nothing of
a pending transaction), stopped and
restarted from its checkpoint it reads every entry once; admission limits bound each
micro-batch; the query's cursor pins what it still needs against retention; past a
hard limit failOnDataLoss fails the query naming the positions, or skips them, and so
it does at a LOST segment (its ledger deleted outside the stream)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from spark_support import spark_cluster, spark_session, stream_name
from spark_tables import (
    commit_entries,
    create_table_stream,
    entries_of,
    live_writer,
    table_client,
    wait_readable,
)

import pora
from pora import Position
from spark import PoraDataSource

__all__ = ["spark_cluster", "spark_session"]  # the fixtures, used by name

pytestmark = pytest.mark.slow


def table_schema() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType  # noqa: PLC0415

    return StructType(
        [StructField("id", LongType(), False), StructField("name", StringType(), True)]
    )


def rows(first: int, count: int) -> list[tuple[int, str]]:
    return [(i, f"name {i}") for i in range(first, first + count)]


def run_available_now(session: Any, url: str, name: str, out: Path, **options: str) -> list[int]:
    """One Trigger.AvailableNow run of a query from `name` into Parquet at `out`
    (checkpoint beside it); the rows each of its micro-batches read."""
    session.dataSource.register(PoraDataSource)
    source = session.readStream.format("pora").option("metadata", url)
    for key, value in options.items():
        source = source.option(key, value)
    query = (
        source.load(name)
        .writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def ids_written(session: Any, out: Path) -> list[int]:
    return sorted(row.id for row in session.read.parquet(str(out / "data")).collect())


def test_restart_from_the_checkpoint_reads_every_entry_once(
    spark_session: Any, spark_cluster: str, tmp_path: Path
) -> None:
    name = stream_name("stream-restart")
    schema = table_schema()
    with table_client(spark_cluster) as pora, live_writer(pora, name, create=schema) as append:
        wait_readable(pora, name, append(entries_of(schema, rows(0, 50), rows_per_entry=10))[-1])
        assert run_available_now(spark_session, spark_cluster, name, tmp_path) == [50]
        assert ids_written(spark_session, tmp_path) == list(range(50))
        # appended while the query is stopped, and a transaction's commit after them
        wait_readable(pora, name, append(entries_of(schema, rows(50, 30), rows_per_entry=10))[-1])
        run_available_now(spark_session, spark_cluster, name, tmp_path)
        assert ids_written(spark_session, tmp_path) == list(range(80))
        # nothing new: a restart reads nothing
        assert run_available_now(spark_session, spark_cluster, name, tmp_path) == []
        assert ids_written(spark_session, tmp_path) == list(range(80))


def test_a_running_query_follows_a_live_writer(
    spark_session: Any, spark_cluster: str, tmp_path: Path
) -> None:
    name = stream_name("stream-live")
    schema = table_schema()
    spark_session.dataSource.register(PoraDataSource)
    with table_client(spark_cluster) as pora, live_writer(pora, name, create=schema) as append:
        query = (
            spark_session.readStream.format("pora")
            .option("metadata", spark_cluster)
            .option("starting_position", "latest")
            .load(name)
            .writeStream.format("memory")
            .queryName("pora_live")
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        pending = entries_of(schema, rows(1000, 10))
        pora.call(lambda: _leave_pending(pora, name, pending))  # never offered
        try:
            query.processAllAvailable()  # started: "latest" is fixed before any append
            for first in range(0, 60, 20):
                last = append(entries_of(schema, rows(first, 20), rows_per_entry=5))[-1]
                wait_readable(pora, name, last)
                read_up_to(spark_session, query, first + 20)
            got = sorted(r.id for r in spark_session.sql("select id from pora_live").collect())
            assert got == list(range(60))
        finally:
            query.stop()
        cursors = pora.call(lambda: _cursors(pora, name))
        assert len(cursors) == 1 and cursors[0].name.startswith("spark-")


def read_up_to(session: Any, query: Any, count: int) -> None:
    """Until the memory sink holds `count` rows. processAllAvailable returns once a
    trigger finds nothing new, which one that began before the last append may do:
    it is asked again until the rows are there."""
    deadline = time.monotonic() + 60
    while session.sql("select count(*) from pora_live").collect()[0][0] < count:
        assert time.monotonic() < deadline, f"the query did not read {count} rows in 60 s"
        query.processAllAvailable()


async def _leave_pending(pora: Any, name: str, entries: list[bytes]) -> None:
    stream = await pora.client.open_stream(name)
    txn = stream.begin()
    await txn.begin()
    await (await txn.open_segment()).append_many(entries)


async def _cursors(pora: Any, name: str) -> list[Any]:
    stream = await pora.client.open_stream(name)
    cursors: list[Any] = await stream.cursors()
    return cursors


def test_admission_limits_bound_each_micro_batch(
    spark_session: Any, spark_cluster: str, tmp_path: Path
) -> None:
    name = stream_name("stream-limits")
    schema = table_schema()
    with table_client(spark_cluster) as pora:
        create_table_stream(pora, name, schema)
        entries = entries_of(schema, rows(0, 100), rows_per_entry=10)
        commit_entries(pora, name, entries)
    by_rows = run_available_now(
        spark_session, spark_cluster, name, tmp_path / "rows", maxRecordsPerTrigger="25"
    )
    assert by_rows == [20] * 5  # whole entries of 10 rows, at most 25 a batch
    entry_bytes = max(len(entry) for entry in entries)
    by_bytes = run_available_now(
        spark_session,
        spark_cluster,
        name,
        tmp_path / "bytes",
        maxBytesPerTrigger=str(3 * entry_bytes),
    )
    assert sum(by_bytes) == 100 and all(count <= 30 for count in by_bytes)
    assert ids_written(spark_session, tmp_path / "bytes") == list(range(100))


def held_segments(pora: Any, name: str) -> list[int]:
    async def segments() -> list[int]:
        stream = await pora.client.open_stream(name)
        return [extent.seq for extent in await stream.extents()]

    return pora.call(segments)  # type: ignore[no-any-return]


def trim(pora: Any, name: str) -> None:
    async def trim() -> None:
        stream = await pora.client.open_stream(name)
        await stream.trim()

    pora.call(trim)


def test_the_cursor_pins_what_the_query_still_needs(
    spark_session: Any, spark_cluster: str, tmp_path: Path
) -> None:
    name = stream_name("stream-pin")
    schema = table_schema()
    with table_client(spark_cluster) as pora:
        create_table_stream(pora, name, schema, retention_bytes=1)  # keep nothing unpinned
        for first in (0, 10):
            commit_entries(pora, name, entries_of(schema, rows(first, 10)))
        assert run_available_now(spark_session, spark_cluster, name, tmp_path) == [20]
        for first in (20, 30):
            commit_entries(pora, name, entries_of(schema, rows(first, 10)))
        trim(pora, name)
        # Spark commits a batch's offsets to the source when it plans the next one,
        # so the cursor may still be before the last batch read: pinned either way
        assert {2, 3} <= set(held_segments(pora, name))
        run_available_now(spark_session, spark_cluster, name, tmp_path)
        assert ids_written(spark_session, tmp_path) == list(range(40))
        (cursor,) = pora.call(lambda: _cursors(pora, name))
        assert cursor.next_position >= Position(1, 1)  # the first run's batch, acked
        trim(pora, name)
        # each segment holds one entry: those wholly before the cursor went
        needed = [seq for seq in range(4) if Position(seq, 1) > cursor.next_position]
        assert held_segments(pora, name) == needed


def test_data_lost_past_a_hard_limit_fails_or_is_skipped(
    spark_session: Any, spark_cluster: str, tmp_path: Path
) -> None:
    from pyspark.errors import StreamingQueryException  # noqa: PLC0415

    name = stream_name("stream-loss")
    schema = table_schema()
    with table_client(spark_cluster) as pora:
        create_table_stream(pora, name, schema, retention_bytes_max=1)  # cursors or not
        commit_entries(pora, name, entries_of(schema, rows(0, 10)))
        assert run_available_now(spark_session, spark_cluster, name, tmp_path) == [10]
        for first in (10, 20):
            commit_entries(pora, name, entries_of(schema, rows(first, 10)))
        trim(pora, name)  # removes segments 1 and 2, which the query has not read
        commit_entries(pora, name, entries_of(schema, rows(30, 10)))
        with pytest.raises(StreamingQueryException) as failed:
            run_available_now(spark_session, spark_cluster, name, tmp_path)
        message = str(failed.value)
        assert "from position 0:1 up to 3:0" in message and "failOnDataLoss" in message
        assert ids_written(spark_session, tmp_path) == list(range(10))
        run_available_now(spark_session, spark_cluster, name, tmp_path, failOnDataLoss="false")
        assert ids_written(spark_session, tmp_path) == [*range(10), *range(30, 40)]


def lose_a_segment(pora_client: Any, name: str, lost: bytes, after: bytes) -> None:
    """A live writer appends `lost`, its segment's ledger is deleted outside the
    stream, and the next writer (taking over: the segment is LOST) appends `after`."""

    async def lose() -> None:
        stream = await pora_client.client.open_stream(name)
        async with stream.open_writer() as writer:
            await writer.append(lost)
            await pora_client.client.delete_ledger((await stream.info()).segments[-1].ledger_id)
            with pytest.raises(pora.LedgerDeleted):
                await writer.append(lost)
        async with stream.open_writer() as writer:
            await writer.append(after)

    pora_client.call(lose)


def test_a_lost_segment_fails_the_query_or_is_skipped(
    spark_session: Any, spark_cluster: str, tmp_path: Path
) -> None:
    from pyspark.errors import StreamingQueryException  # noqa: PLC0415

    name = stream_name("stream-lost")
    schema = table_schema()
    with table_client(spark_cluster) as pora_client:
        create_table_stream(pora_client, name, schema)
        commit_entries(pora_client, name, entries_of(schema, rows(0, 10)))
        assert run_available_now(spark_session, spark_cluster, name, tmp_path) == [10]
        (lost,) = entries_of(schema, rows(10, 10))
        (after,) = entries_of(schema, rows(20, 10))
        lose_a_segment(pora_client, name, lost, after)
        with pytest.raises(StreamingQueryException) as failed:
            run_available_now(spark_session, spark_cluster, name, tmp_path)
        message = str(failed.value)
        assert "segment 1 is LOST" in message and "failOnDataLoss" in message
        assert ids_written(spark_session, tmp_path) == list(range(10))
        run_available_now(spark_session, spark_cluster, name, tmp_path, failOnDataLoss="false")
        assert ids_written(spark_session, tmp_path) == [*range(10), *range(20, 30)]


def test_a_checkpoint_of_a_stream_deleted_and_created_again_is_refused(
    spark_session: Any, spark_cluster: str, tmp_path: Path
) -> None:
    """The checkpoint's offsets name positions of the stream it read: in a stream
    created again under the same name they would skip its first entries unseen."""
    from pyspark.errors import StreamingQueryException  # noqa: PLC0415

    name = stream_name("stream-again")
    schema = table_schema()
    with table_client(spark_cluster) as pora:
        create_table_stream(pora, name, schema)
        for first in (0, 10, 20):
            commit_entries(pora, name, entries_of(schema, rows(first, 10)))
        assert run_available_now(spark_session, spark_cluster, name, tmp_path) == [30]
        pora.call(pora.client.delete_stream, name)
        create_table_stream(pora, name, schema)
        for first in range(100, 140, 10):
            commit_entries(pora, name, entries_of(schema, rows(first, 10)))
        with pytest.raises(StreamingQueryException) as failed:
            run_available_now(spark_session, spark_cluster, name, tmp_path)
        assert "created again" in str(failed.value) and "new checkpoint" in str(failed.value)
        assert ids_written(spark_session, tmp_path) == list(range(30))
        # told to go on: the new stream is read from its first position, whole
        run_available_now(spark_session, spark_cluster, name, tmp_path, failOnDataLoss="false")
        assert ids_written(spark_session, tmp_path) == [*range(30), *range(100, 140)]
