"""`df.write.format("pora")` on real Spark (`local[2,4]`) and a real 3-node cluster:
every row once when every task fails its first attempt (the failed attempts'
segments dropped and their ledgers deleted), nothing visible and no ledger after a
job that fails as a whole, overwrite replaces, and the stream's schema recorded,
checked (the fields that differ named) and widened with `merge_schema`; entries
that would pass the nodes' entry limit are split."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from spark_support import spark_cluster, spark_session, stream_name
from spark_write_support import (
    column,
    pending_transactions,
    segment_ledgers,
    segment_tags,
    ship_by_value,
    stream_ledgers,
    stream_table,
)

from spark import PoraDataSource
from spark.blocking import blocking_client
from spark.encoding import ARROW_SCHEMA_KEY, SPARK_SCHEMA_KEY, schema_from_attribute

__all__ = ["spark_cluster", "spark_session"]

ship_by_value(__name__)

pytestmark = pytest.mark.slow


def events(session: Any, rows: int, partitions: int = 4) -> Any:
    return session.range(0, rows, 1, partitions).selectExpr(
        "id", "cast(id * 1.5 as double) as value", "concat('k', cast(id as string)) as key"
    )


def save(df: Any, url: str, name: str, mode: str = "append", **options: str) -> None:
    writer = df.write.format("pora").option("metadata", url).mode(mode)
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save(name)


def fail_first_attempts(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Every row through, then a failure on a task's first attempt: the write has
    appended them all when the attempt fails."""
    from pyspark import TaskContext  # noqa: PLC0415

    yield from batches
    context = TaskContext.get()
    if context is not None and context.attemptNumber() == 0:
        raise RuntimeError("first attempt fails on purpose")


def always_fail(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches
    raise RuntimeError("the job fails on purpose")


@pytest.fixture(scope="module")
def session(spark_session: Any) -> Any:
    spark_session.dataSource.register(PoraDataSource)
    return spark_session


def test_every_row_once_when_every_first_attempt_fails(session: Any, spark_cluster: str) -> None:
    name = stream_name()
    df = events(session, 2000, 2)
    save(df.mapInArrow(fail_first_attempts, df.schema), spark_cluster, name, rows_per_entry="300")
    assert sorted(column(spark_cluster, name, "id")) == list(range(2000))
    # the first attempts' segments were dropped at the commit, their ledgers deleted
    assert stream_ledgers(spark_cluster, name) == segment_ledgers(spark_cluster, name)
    tags = segment_tags(spark_cluster, name)
    assert sorted((t["partition"], t["attempt"]) for t in tags) == [("0", "1"), ("1", "1")]
    assert len({t["job"] for t in tags}) == 1
    assert pending_transactions(spark_cluster, name) == 0
    # a second job appends
    save(events(session, 10, 2), spark_cluster, name)
    assert len(column(spark_cluster, name, "id")) == 2010


def test_the_schema_is_recorded_for_readers(session: Any, spark_cluster: str) -> None:
    name = stream_name()
    df = events(session, 10, 2)
    save(df, spark_cluster, name)
    with blocking_client(spark_cluster) as pora:
        stream = pora.call(pora.client.open_stream, name)
        attributes = pora.call(stream.attributes)
    from pyspark.sql.types import StructType  # noqa: PLC0415

    assert StructType.fromJson(json.loads(attributes[SPARK_SCHEMA_KEY])) == df.schema
    arrow = schema_from_attribute(attributes[ARROW_SCHEMA_KEY])
    assert arrow.names == ["id", "value", "key"]
    table = stream_table(spark_cluster, name)
    assert table.schema.field("id").type == pa.int64()


def test_a_job_that_fails_leaves_nothing(session: Any, spark_cluster: str) -> None:
    name = stream_name()
    save(events(session, 10, 2), spark_cluster, name)
    before = segment_ledgers(spark_cluster, name)
    df = events(session, 500, 1)  # its one task fails all four attempts
    with pytest.raises(Exception, match="the job fails on purpose"):
        save(df.mapInArrow(always_fail, df.schema), spark_cluster, name)
    assert sorted(column(spark_cluster, name, "id")) == list(range(10))
    assert stream_ledgers(spark_cluster, name) == before
    assert pending_transactions(spark_cluster, name) == 0


def test_overwrite_replaces_the_contents(session: Any, spark_cluster: str) -> None:
    name = stream_name()
    save(events(session, 100), spark_cluster, name)
    old = segment_ledgers(spark_cluster, name)
    save(events(session, 7, 2), spark_cluster, name, mode="overwrite")
    assert sorted(column(spark_cluster, name, "id")) == list(range(7))
    assert not old & stream_ledgers(spark_cluster, name)
    assert stream_ledgers(spark_cluster, name) == segment_ledgers(spark_cluster, name)


def test_another_schema_fails_naming_the_fields(session: Any, spark_cluster: str) -> None:
    name = stream_name()
    save(events(session, 10, 2), spark_cluster, name)
    other = session.range(0, 5, 1, 1).selectExpr(
        "cast(id as int) as id", "concat('k', cast(id as string)) as key", "1 as extra"
    )
    with pytest.raises(Exception, match="schema is not stream") as failed:
        save(other, spark_cluster, name)
    message = str(failed.value)
    assert "'value' missing" in message
    assert "'id' type int, the stream's is bigint" in message
    assert "'extra' added (int, not nullable)" in message
    assert len(column(spark_cluster, name, "id")) == 10


def test_merge_schema_widens_with_added_nullable_columns(session: Any, spark_cluster: str) -> None:
    name = stream_name()
    save(events(session, 10, 2), spark_cluster, name)
    wider = events(session, 5, 1).selectExpr("*", "cast(null as string) as note")
    with pytest.raises(Exception, match="'note' added"):
        save(wider, spark_cluster, name)
    save(wider, spark_cluster, name, merge_schema="true")
    with blocking_client(spark_cluster) as pora:
        stream = pora.call(pora.client.open_stream, name)
        attributes = pora.call(stream.attributes)
    assert schema_from_attribute(attributes[ARROW_SCHEMA_KEY]).names == [
        "id",
        "value",
        "key",
        "note",
    ]
    table = stream_table(spark_cluster, name)
    assert table.num_rows == 15
    # the earlier rows lack the column: null once read together
    assert table.column("note").null_count == 15
    # rows of the recorded (narrower) schema are refused: a column is missing
    with pytest.raises(Exception, match="'note' missing"):
        save(events(session, 5, 1), spark_cluster, name)


def test_rows_past_an_entrys_limit_are_split(session: Any, spark_cluster: str) -> None:
    """(A row no entry can hold fails each attempt with RowTooLarge naming the stream,
    partition and row: tests/test_spark_encoding.py, as four failing attempts of
    megabytes take seconds.)"""
    # 3 incompressible rows of 1.5 MiB in one batch of entry_bytes: over the nodes'
    # 4 MiB encoded, so written as several entries
    name = stream_name("batch-big")
    rows = [(i, bytearray(os.urandom(3 << 19))) for i in range(3)]
    df = session.createDataFrame(rows, "id long, body binary").coalesce(1)
    save(df, spark_cluster, name, entry_bytes=str(16 << 20))
    table = stream_table(spark_cluster, name)
    assert table.column("body").to_pylist() == [bytes(body) for _, body in rows]
    assert sorted(column(spark_cluster, name, "id")) == [0, 1, 2]
