"""The batch reader, `session.read.format("pora")`, on real Spark (local mode) and a
3-node cluster of `pora serve` processes: rows of every common type come back equal,
schema and nullability included; `as_of_commit`; a live writer's OPEN segment; a
segment split into many partitions reads every row once; projection and pushed
filters give the right rows; columns added later read as nulls."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pytest
from spark_support import spark_cluster, spark_session, stream_name
from spark_tables import commit_entries, create_table_stream, entries_of, table_client

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
