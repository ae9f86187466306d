"""The batch reader, `session.read.format("pora")`, on real Spark (local mode) and a
3-node cluster of `pora serve` processes: rows of every common type come back equal,
schema and nullability included; `as_of_commit`; a live writer's OPEN segment; a
segment split into many partitions reads every row once; projection and pushed
filters give the right rows; columns added later read as nulls; a schema given to
the reader that does not read the stream as recorded is refused by field."""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable
from typing import Any

import pytest
from spark_support import spark_cluster, spark_session, stream_name
from spark_tables import (
    commit_entries,
    create_table_stream,
    entries_of,
    live_writer,
    record_schema,
    table_client,
    wait_readable,
)

from spark import PoraDataSource

__all__ = ["spark_cluster", "spark_session"]  # the fixtures, used by name

pytestmark = pytest.mark.slow


def every_type_schema() -> Any:
    from pyspark.sql import types as T  # noqa: N812, PLC0415

    return T.StructType(
        [
            T.StructField("byte", T.ByteType(), True),
            T.StructField("short", T.ShortType(), True),
            T.StructField("int", T.IntegerType(), False),
            T.StructField("long", T.LongType(), True),
            T.StructField("float", T.FloatType(), True),
            T.StructField("double", T.DoubleType(), True),
            T.StructField("decimal", T.DecimalType(12, 3), True),
            T.StructField("string", T.StringType(), True),
            T.StructField("binary", T.BinaryType(), True),
            T.StructField("bool", T.BooleanType(), True),
            T.StructField("date", T.DateType(), True),
            T.StructField("ts", T.TimestampType(), True),
            T.StructField("ts_ntz", T.TimestampNTZType(), True),
            T.StructField("array", T.ArrayType(T.LongType(), True), True),
            T.StructField(
                "struct",
                T.StructType(
                    [
                        T.StructField("a", T.IntegerType(), False),
                        T.StructField("b", T.StringType(), True),
                    ]
                ),
                True,
            ),
            T.StructField("map", T.MapType(T.StringType(), T.DoubleType(), True), True),
        ]
    )


def every_type_rows(count: int) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    utc = datetime.UTC
    for i in range(count):
        if i % 5 == 4:  # a row of nulls wherever nulls are allowed
            rows.append((None, None, i, *([None] * 13)))
            continue
        rows.append(
            (
                i % 128 - 64,
                i * 7 - 300,
                i,
                i * 10_000_000_000,
                i / 4,
                i / 3,
                decimal.Decimal(i) / 1000,
                f"row {i} ü",
                bytes([i % 256, 0, 255]),
                i % 2 == 0,
                datetime.date(2020, 1, 1) + datetime.timedelta(days=i),
                datetime.datetime(2024, 5, 1, 12, 0, tzinfo=utc) + datetime.timedelta(seconds=i),
                datetime.datetime(2024, 5, 1, 12, 0) + datetime.timedelta(microseconds=i),
                [i, None, -i],
                (i, f"s{i}"),
                {"k": float(i), "n": None},
            )
        )
    return rows


def reader(session: Any, url: str) -> Any:
    session.dataSource.register(PoraDataSource)
    return session.read.format("pora").option("metadata", url)


def test_every_common_type_round_trips(spark_session: Any, spark_cluster: str) -> None:
    name = stream_name("read-types")
    schema = every_type_schema()
    rows = every_type_rows(60)
    with table_client(spark_cluster) as pora:
        create_table_stream(pora, name, schema)
        commit_entries(pora, name, entries_of(schema, rows, rows_per_entry=7), segments=3)
    df = reader(spark_session, spark_cluster).load(name)
    assert df.schema == schema  # nullability included
    got = sorted(df.collect(), key=lambda row: row["int"])
    expected = spark_session.createDataFrame(rows, schema).collect()
    assert got == expected


def small_schema(extra: bool = False) -> Any:
    from pyspark.sql import types as T  # noqa: N812, PLC0415

    fields = [
        T.StructField("id", T.LongType(), False),
        T.StructField("name", T.StringType(), True),
        T.StructField("score", T.DoubleType(), True),
    ]
    if extra:
        fields.append(T.StructField("extra", T.ArrayType(T.IntegerType()), True))
    return T.StructType(fields)


def small_rows(first: int, count: int) -> list[tuple[Any, ...]]:
    return [
        (i, None if i % 7 == 0 else f"name {i}", float("nan") if i % 9 == 0 else i / 2)
        for i in range(first, first + count)
    ]


def test_as_of_commit_and_a_live_writers_open_segment(
    spark_session: Any, spark_cluster: str
) -> None:
    name = stream_name("read-commits")
    schema = small_schema()
    with table_client(spark_cluster) as pora:
        create_table_stream(pora, name, schema)
        first = commit_entries(pora, name, entries_of(schema, small_rows(0, 30), 10))
        commit_entries(pora, name, entries_of(schema, small_rows(30, 30), 10))
        with live_writer(pora, name) as append:
            last = append(entries_of(schema, small_rows(60, 25), rows_per_entry=10))[-1]
            wait_readable(pora, name, last)
            df = reader(spark_session, spark_cluster).load(name)
            assert sorted(row.id for row in df.collect()) == list(range(85))
    at_first = reader(spark_session, spark_cluster).option("as_of_commit", first).load(name)
    assert sorted(row.id for row in at_first.collect()) == list(range(30))


def test_a_segment_cut_into_partitions_reads_every_row_once(
    spark_session: Any, spark_cluster: str
) -> None:
    name = stream_name("read-split")
    schema = small_schema()
    with table_client(spark_cluster) as pora:
        create_table_stream(pora, name, schema)
        entries = entries_of(schema, small_rows(0, 400), rows_per_entry=10)
        commit_entries(pora, name, entries)  # one segment of 40 entries
    per_partition = 3 * max(len(entry) for entry in entries)  # 3 entries each, or more
    df = reader(spark_session, spark_cluster).option("partition_bytes", per_partition).load(name)
    assert df.rdd.getNumPartitions() >= 40 // 3
    assert sorted(row.id for row in df.collect()) == list(range(400))
    assert df.count() == 400


@pytest.mark.parametrize("pushdown", [True, False])
def test_projection_and_filters_give_the_right_rows(
    spark_session: Any, spark_cluster: str, pushdown: bool
) -> None:
    name = stream_name("read-filters")
    schema = small_schema()
    rows = small_rows(0, 200)
    with table_client(spark_cluster) as pora:
        create_table_stream(pora, name, schema)
        commit_entries(pora, name, entries_of(schema, rows, rows_per_entry=20), segments=2)
    spark_session.conf.set("spark.sql.python.filterPushdown.enabled", str(pushdown).lower())
    try:
        df = reader(spark_session, spark_cluster).load(name)
        cases: dict[str, Callable[[tuple[Any, ...]], bool]] = {
            # what Spark would push were pushdown safe (spark/batch_reader.py)
            "id >= 150 AND name LIKE 'name 1%'": lambda r: r[0] >= 150 and _like(r[1], "name 1"),
            "id IN (3, 5, 7, 700) OR id < 2": lambda r: r[0] in (3, 5, 7) or r[0] < 2,
            "name IS NULL": lambda r: r[1] is None,
            "NOT (id < 190) AND name IS NOT NULL": lambda r: r[0] >= 190 and r[1] is not None,
            "name > 'name 98'": lambda r: r[1] is not None and r[1] > "name 98",
            # NaN is above every double in Spark
            "score > 95.0": lambda r: r[2] != r[2] or r[2] > 95.0,
        }
        for condition, keep in cases.items():  # one DataFrame, filtered many ways
            got = sorted(row.id for row in df.filter(condition).select("id").collect())
            assert got == [r[0] for r in rows if keep(r)], condition
    finally:
        spark_session.conf.unset("spark.sql.python.filterPushdown.enabled")


def _like(value: str | None, prefix: str) -> bool:
    return value is not None and value.startswith(prefix)


def test_columns_added_later_read_as_nulls(spark_session: Any, spark_cluster: str) -> None:
    name = stream_name("read-merged")
    before, after = small_schema(), small_schema(extra=True)
    with table_client(spark_cluster) as pora:
        create_table_stream(pora, name, before)
        commit_entries(pora, name, entries_of(before, small_rows(0, 10)))
        record_schema(pora, name, after)  # what the writer's merge_schema records
        widened = [(*row, [row[0]]) for row in small_rows(10, 10)]
        commit_entries(pora, name, entries_of(after, widened))
    df = reader(spark_session, spark_cluster).load(name)
    assert df.schema == after
    got = {row.id: row.extra for row in df.collect()}
    assert got == {**{i: None for i in range(10)}, **{i: [i] for i in range(10, 20)}}


def test_what_the_writer_wrote_reads_back_equal(spark_session: Any, spark_cluster: str) -> None:
    name = stream_name("read-written")
    schema = every_type_schema()
    spark_session.dataSource.register(PoraDataSource)
    written = spark_session.createDataFrame(every_type_rows(40), schema).repartition(3)
    written.write.format("pora").option("metadata", spark_cluster).mode("append").save(name)
    written.write.format("pora").option("metadata", spark_cluster).mode("append").save(name)
    df = reader(spark_session, spark_cluster).load(name)
    assert df.schema == schema
    expected = sorted(written.collect() * 2, key=lambda row: row["int"])
    assert sorted(df.collect(), key=lambda row: row["int"]) == expected
    as_of_first = reader(spark_session, spark_cluster).option("as_of_commit", 1).load(name)
    assert as_of_first.count() == 40


def test_a_given_schema_that_misreads_the_stream_is_refused(
    spark_session: Any, spark_cluster: str
) -> None:
    """`.schema(...)` naming a column the stream lacks read it as nulls, and another
    type cast every value, silently; a subset of its columns is a projection."""
    name = stream_name("read-given")
    with table_client(spark_cluster) as pora:
        create_table_stream(pora, name, small_schema())
        commit_entries(pora, name, entries_of(small_schema(), small_rows(0, 5)))
    projected = reader(spark_session, spark_cluster).schema("score double, id long").load(name)
    assert sorted(row.id for row in projected.collect()) == list(range(5))
    for given, named in (
        ("id long, nmae string", "'nmae' is not a column of the stream"),
        ("id string", "'id' type string, the stream's is bigint"),
    ):
        with pytest.raises(Exception, match="not stream") as raised:
            reader(spark_session, spark_cluster).schema(given).load(name).collect()
        assert named in str(raised.value) and "Leave .schema(...) out" in str(raised.value)
    stream_reader = spark_session.readStream.format("pora").option("metadata", spark_cluster)
    query = stream_reader.schema("id long, name int").load(name).writeStream.format("noop")
    with pytest.raises(Exception, match="'name' type int, the stream's is string"):
        query.trigger(availableNow=True).start().awaitTermination(60)
