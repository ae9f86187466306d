"""`df.foreachPartition(partition_writer(url, "events"))` (docs/spark.md,
"foreachPartition"): each partition's rows in a transaction of their own, committed
with the key (job, stage, partition), so a retried or speculative attempt of a
partition that was committed already changes nothing (its commit finds the key and
deletes its ledgers). The stage is Spark's: the same for every attempt of one
`foreachPartition` action, another for each action, so one writer object used for
two actions (two DataFrames, or one written twice) writes both.

`partition_writer` runs on the driver: it fixes the job's id and creates the stream if
absent (recording `schema` when given). What it returns is a plain picklable object
holding the options, the job id and the schema's JSON, importable by name in a
cluster's executors: nothing connected, no closure.

The rows arrive as `pyspark.sql.Row`s, without types: the schema is `schema=` when
given, else the stream's recorded one, else inferred from the partition's first rows
the way `createDataFrame` infers it (and recorded, as the data source's writers do).
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from spark.blocking import blocking_client
from spark.encoding import SPARK_SCHEMA_KEY
from spark.options import PoraOptions, parse_options
from spark.schema import SchemaMismatch, record_schema, spark_schema_of
from spark.task_writes import open_or_create, task_identity, write_segment

if TYPE_CHECKING:
    import pyarrow as pa

    from pora import Stream
    from spark.blocking import BlockingClient

#: rows turned into Arrow at a time (a partition's rows are never all held)
ROWS_PER_CONVERSION = 8192
#: rows the schema is inferred from when there is no other (as createDataFrame does)
ROWS_INFERRED_FROM = 100


def partition_writer(
    url: str, stream: str, schema: Any = None, **options: object
) -> PartitionWriter:
    """A callable for `df.foreachPartition` writing each partition into `stream`
    exactly once (see the module). `schema` (a StructType, say `df.schema`) is
    checked against the stream's and recorded; `options` are the data source's
    (docs/spark.md, "Options"), as keywords: `partition_writer(url, "events",
    ack_quorum=2, merge_schema=True)`."""
    strings = {
        key: str(value).lower() if isinstance(value, bool) else str(value)
        for key, value in options.items()
    }
    parsed = parse_options({**strings, "metadata": url}, stream)
    with blocking_client(parsed.metadata) as pora:
        opened = open_or_create(pora, parsed)
        if schema is not None:
            schema = record_schema(pora, opened, schema, parsed.merge_schema)
    return PartitionWriter(parsed, uuid.uuid4().hex, None if schema is None else schema.json())


@dataclass(frozen=True)
class PartitionWriter:
    """What `partition_writer` returns: call it with a partition's rows."""

    options: PoraOptions
    #: fixed on the driver: with the stage and partition ids, each commit's key
    job: str
    #: the StructType's JSON (None: the stream's, or inferred)
    schema_json: str | None = None

    def __call__(self, rows: Iterable[Any]) -> None:
        stage, partition, attempt = task_identity()
        rows = iter(rows)
        first = next(rows, None)
        if first is None:
            return  # nothing to write: no transaction
        rows = itertools.chain([first], rows)
        tags = {"job": self.job, "stage": str(stage), "partition": str(partition)}
        tags["attempt"] = str(attempt)
        with blocking_client(self.options.metadata) as pora:
            stream = pora.call(pora.client.open_stream, self.options.stream)
            schema, rows = self._schema(pora, stream, rows)
            txn = stream.begin()
            pora.call(txn.begin)
            try:
                write_segment(pora, txn, _arrow_batches(rows, schema), self.options, tags)
                pora.call(partial(txn.commit, key=partition_key(self.job, stage, partition)))
            except BaseException:
                if txn.committed is None:
                    pora.call(txn.abort)  # its ledgers deleted
                raise

    def _schema(
        self, pora: BlockingClient, stream: Stream, rows: Iterator[Any]
    ) -> tuple[Any, Iterator[Any]]:
        """The schema to write `rows` with, and the rows (some read to infer it)."""
        from pyspark.sql.types import StructType  # noqa: PLC0415

        if self.schema_json is not None:
            return StructType.fromJson(json.loads(self.schema_json)), rows
        attributes = pora.call(stream.attributes)
        if SPARK_SCHEMA_KEY in attributes:
            return spark_schema_of(stream.name, attributes), rows
        sample = list(itertools.islice(rows, ROWS_INFERRED_FROM))
        inferred = _inferred(sample)
        try:
            schema = record_schema(pora, stream, inferred, self.options.merge_schema)
        except SchemaMismatch:
            # another partition recorded its guess first: the recorded schema is the
            # stream's; rows that do not fit it fail to convert, naming the field
            schema = spark_schema_of(stream.name, pora.call(stream.attributes))
        return schema, itertools.chain(sample, rows)


def partition_key(job: str, stage: int, partition: int) -> str:
    """The commit key of one partition of one `foreachPartition` action: every attempt
    of it (retried, speculative, its stage resubmitted) has the same stage id, and
    every other action of the application another one. The partition id alone would
    make a second action through the same writer find the first's keys recorded and
    drop its rows."""
    return f"{job}:{stage}:{partition}"


def _inferred(rows: list[Any]) -> Any:
    """The schema `createDataFrame(rows)` would infer (all fields nullable)."""
    from functools import reduce  # noqa: PLC0415

    from pyspark.sql.types import _infer_schema, _merge_type  # noqa: PLC0415

    schemas = [_infer_schema(row, getattr(row, "__fields__", None)) for row in rows]
    return reduce(_merge_type, schemas)


def _arrow_batches(rows: Iterator[Any], schema: Any) -> Iterator[pa.RecordBatch]:
    """The rows as Arrow record batches of `schema` (pyspark's own conversion of local
    data, so values convert as `createDataFrame` converts them); Rows whose fields are
    in another order are matched by name."""
    from pyspark.sql.conversion import LocalDataToArrowConversion  # noqa: PLC0415

    names = schema.fieldNames()
    while True:
        chunk = list(itertools.islice(rows, ROWS_PER_CONVERSION))
        if not chunk:
            return
        fields = getattr(chunk[0], "__fields__", None)
        if fields is not None and list(fields) != names:
            chunk = [row.asDict() for row in chunk]
        table = LocalDataToArrowConversion.convert(chunk, schema, use_large_var_types=False)
        yield from table.to_batches()
