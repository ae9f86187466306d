"""Benchmark of the Pora Spark reader against Parquet, in one run.

A 3-node local cluster (E=3 Qw=3 Qa=2, SQLite metadata) and a `local[2]` Spark:
`--rows` rows of (id long, ts timestamp, key string of 8-16 chars, value double,
body string of 100 bytes) are put into a stream the way the Pora Spark writer puts
them (Arrow batches of about 1 MiB, zstd level 3, in the segments of one committed
transaction), and the same rows into Parquet on local disk. Then, alternated in the
same session, each round: a full count and a sum over `value` through
`spark.read.format("pora")`, through `spark.read.parquet`, and through `arrow`, a
Python data source whose tasks read the Parquet files with pyarrow and hand Spark
their record batches: what any PySpark 4 Python data source costs to deliver these
rows (Spark takes every column from it, whatever the query uses). Each figure is
the median round; rows/s and each rate as a multiple of Parquet's are printed.

    python scripts/bench_spark_read.py [--rows 3000000] [--rounds 3] [--segments 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import trio
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_client import local_cluster  # a sibling script, found through the line above

from spark import PoraDataSource
from spark.blocking import blocking_client
from spark.encoding import (
    ARROW_SCHEMA_KEY,
    ENTRY_BYTES_DEFAULT,
    SPARK_SCHEMA_KEY,
    EntryEncoder,
    cut_batches,
    schema_to_attribute,
)
from spark.range_read import spark_arrow_schema

STREAM = "bench-read"


def spark_schema() -> Any:
    from pyspark.sql import types as T  # noqa: N812, PLC0415

    return T.StructType(
        [
            T.StructField("id", T.LongType(), False),
            T.StructField("ts", T.TimestampType(), True),
            T.StructField("key", T.StringType(), True),
            T.StructField("value", T.DoubleType(), True),
            T.StructField("body", T.StringType(), True),
        ]
    )


def make_rows(count: int, schema: pa.Schema) -> pa.Table:
    generator = np.random.default_rng(7)
    ids = np.arange(count, dtype=np.int64)
    micros = 1_700_000_000_000_000 + ids * 1000
    lengths = generator.integers(8, 17, count)
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8)
    letters = alphabet[generator.integers(0, len(alphabet), 16 * count)].tobytes().decode()
    keys = [letters[16 * i : 16 * i + int(n)] for i, n in enumerate(lengths)]
    body_pool = [letters[i : i + 100] for i in range(0, 100 * 1024, 100)]
    bodies = [body_pool[i % 1024] for i in range(count)]
    return pa.Table.from_arrays(
        [
            pa.array(ids),
            pa.array(micros, type=pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            pa.array(keys),
            pa.array(generator.random(count) * 1000),
            pa.array(bodies),
        ],
        schema=schema,
    )


def write_stream(url: str, table: pa.Table, spark_schema_: Any, segments: int) -> int:
    """The rows into a new stream in one committed transaction; the bytes stored
    (one replica's payloads)."""
    encoder = EntryEncoder()
    entries = [encoder.encode(b) for b in cut_batches(table.to_batches(), ENTRY_BYTES_DEFAULT)]
    share = -(-len(entries) // segments)

    async def write(client: Any) -> None:
        stream = await client.create_stream(STREAM)
        await stream.set_attributes(
            {
                SPARK_SCHEMA_KEY: spark_schema_.json(),
                ARROW_SCHEMA_KEY: schema_to_attribute(table.schema),
            }
        )
        async with stream.begin() as txn:
            for first in range(0, len(entries), share):
                segment = await txn.open_segment()
                for start in range(first, min(first + share, len(entries)), 32):
                    await segment.append_many(entries[start : min(start + 32, first + share)])

    with blocking_client(url) as pora:
        pora.call(write, pora.client)
    return sum(len(entry) for entry in entries)


class ArrowFilesSource(DataSource):
    """Parquet files read by pyarrow in Python tasks, one file a partition, handed to
    Spark as Arrow: the floor of a Python data source's read."""

    @classmethod
    def name(cls) -> str:
        return "arrow-files"

    def schema(self) -> Any:
        return spark_schema()

    def reader(self, schema: Any) -> DataSourceReader:
        return ArrowFilesReader(self.options["path"])


class ArrowFilesReader(DataSourceReader):
    def __init__(self, folder: str) -> None:
        self.folder = folder

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(str(path)) for path in sorted(Path(self.folder).iterdir())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from pq.read_table(partition.value).to_batches(max_chunksize=8192)


def counting(frame: Callable[[], Any], rows: int) -> Callable[[], object]:
    def count() -> object:
        counted = frame().count()
        assert counted == rows, f"{counted} rows read, not {rows}"
        return counted

    return count


def summing(frame: Callable[[], Any], functions: Any) -> Callable[[], object]:
    return lambda: frame().agg(functions.sum("value")).collect()[0][0]


def timed(action: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def run(url: str, rows: int, rounds: int, segments: int, folder: Path) -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession  # noqa: PLC0415
    from pyspark.sql import functions as F  # noqa: N812, PLC0415

    schema = spark_schema()
    table = make_rows(rows, spark_arrow_schema(schema))
    stored = write_stream(url, table, schema, segments)
    parquet = folder / "rows.parquet"
    parquet.mkdir()
    part_rows = -(-rows // segments)
    for index, start in enumerate(range(0, rows, part_rows)):
        pq.write_table(table.slice(start, part_rows), parquet / f"part-{index}.parquet")
    parquet_bytes = sum(f.stat().st_size for f in parquet.iterdir())
    del table
    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(PoraDataSource)
    session.dataSource.register(ArrowFilesSource)

    def pora_df() -> Any:
        return session.read.format("pora").option("metadata", url).load(STREAM)

    def parquet_df() -> Any:
        return session.read.parquet(str(parquet))

    def arrow_df() -> Any:
        return session.read.format("arrow-files").option("path", str(parquet)).load()

    frames = {"pora": pora_df, "parquet": parquet_df, "arrow": arrow_df}
    loads: dict[str, Callable[[], object]] = {}
    for kind, frame in frames.items():
        loads[f"{kind} count"] = counting(frame, rows)
    for kind, frame in frames.items():
        loads[f"{kind} sum(value)"] = summing(frame, F)

    for load in loads.values():  # warm up: the JVM's classes, the Python workers
        load()
    times: dict[str, list[float]] = {name: [] for name in loads}
    for _ in range(rounds):
        for name, load in loads.items():
            seconds, _ = timed(load)
            times[name].append(seconds)
    session.stop()
    median = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"{rows} rows; stream {stored / 1e6:.1f} MB a replica, Parquet {parquet_bytes / 1e6:.1f} MB"
    )
    print(f"{'read':<20}{'seconds':>10}{'rows/s':>14}{'x Parquet':>12}")
    for name, seconds in median.items():
        base = median["parquet " + name.split(" ", 1)[1]]
        print(f"{name:<20}{seconds:>10.2f}{rows / seconds:>14,.0f}{base / seconds:>12.2f}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--segments", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pora-bench-spark-read-") as directory:
        async with local_cluster(Path(directory), 3) as url:
            await trio.to_thread.run_sync(
                run, url, args.rows, args.rounds, args.segments, Path(directory)
            )


if __name__ == "__main__":
    trio.run(main)
