"""`df.foreachPartition(partition_writer(url, name))` on real Spark (`local[2,4]`):
every row once when every partition's first attempt fails after its commit (the
retry's commit finds the key and deletes its ledgers), the schema given, recorded or
inferred, and a failure inside a partition leaving nothing behind."""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from typing import Any

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

from spark import partition_writer
from spark.schema import SchemaMismatch

__all__ = ["spark_cluster", "spark_session"]

ship_by_value(__name__)

pytestmark = pytest.mark.slow


def events(session: Any, rows: int, partitions: int = 4, first: int = 0) -> Any:
    return session.range(first, first + rows, 1, partitions).selectExpr(
        "id", "concat('k', cast(id as string)) as key", "cast(id as timestamp) as ts"
    )


def failing_after(write: Any, after_commit: bool) -> Any:
    """`write` on each partition, with the first attempt failing (after the commit,
    or during the write: the rows consumed, then an error)."""

    def run(rows: Iterable[Any]) -> None:
        from pyspark import TaskContext  # noqa: PLC0415

        first = TaskContext.get().attemptNumber() == 0  # type: ignore[union-attr]

        def rows_then_fail() -> Iterable[Any]:
            yield from rows
            raise RuntimeError("the attempt fails while writing")

        if first and not after_commit:
            write(rows_then_fail())
        write(rows)
        if first:
            raise RuntimeError("the attempt fails after its commit")

    return run


def test_every_row_once_when_first_attempts_fail_after_committing(
    spark_session: Any, spark_cluster: str
) -> None:
    name = stream_name("parts")
    df = events(spark_session, 1000, 2)
    write = partition_writer(spark_cluster, name, df.schema, rows_per_entry=200)
    assert pickle.loads(pickle.dumps(write)) == write  # nothing captured
    df.foreachPartition(failing_after(write, after_commit=True))
    assert sorted(column(spark_cluster, name, "id")) == list(range(1000))
    assert len(segment_ledgers(spark_cluster, name)) == 2
    assert stream_ledgers(spark_cluster, name) == segment_ledgers(spark_cluster, name)
    assert pending_transactions(spark_cluster, name) == 0


def test_a_failure_while_writing_leaves_nothing(spark_session: Any, spark_cluster: str) -> None:
    name = stream_name("parts")
    df = events(spark_session, 400, 2)
    df.foreachPartition(failing_after(partition_writer(spark_cluster, name), after_commit=False))
    table = stream_table(spark_cluster, name)
    assert sorted(table.column("id").to_pylist()) == list(range(400))
    assert stream_ledgers(spark_cluster, name) == segment_ledgers(spark_cluster, name)
    assert pending_transactions(spark_cluster, name) == 0


def test_the_schema_inferred_or_the_streams(spark_session: Any, spark_cluster: str) -> None:
    name = stream_name("parts")
    df = events(spark_session, 50, 2)
    # no schema given, none recorded: inferred from the rows (all nullable)
    df.foreachPartition(partition_writer(spark_cluster, name))
    table = stream_table(spark_cluster, name)
    assert sorted(table.column("id").to_pylist()) == list(range(50))
    assert str(table.schema.field("ts").type) == "timestamp[us, tz=UTC]"
    # the stream's recorded schema serves the next job; another given one is refused
    df.foreachPartition(partition_writer(spark_cluster, name))
    assert len(column(spark_cluster, name, "id")) == 100
    other = spark_session.range(0, 3).selectExpr("cast(id as string) as id")
    with pytest.raises(SchemaMismatch, match="'id' type string"):
        partition_writer(spark_cluster, name, other.schema)


def test_one_writer_used_for_two_actions_writes_both(
    spark_session: Any, spark_cluster: str
) -> None:
    """The commit key holds Spark's stage id: a second action through the same writer
    object is not taken for a retry of the first (its rows were dropped when the key
    was (job, partition))."""
    name = stream_name("parts")
    first, second = events(spark_session, 100, 2), events(spark_session, 100, 2, first=100)
    write = partition_writer(spark_cluster, name, first.schema)
    first.foreachPartition(write)
    second.foreachPartition(write)
    first.foreachPartition(write)  # the same DataFrame again: written again
    assert sorted(column(spark_cluster, name, "id")) == sorted([*range(200), *range(100)])
    tags = segment_tags(spark_cluster, name)
    assert len({(tag["stage"], tag["partition"]) for tag in tags}) == len(tags) == 6
