"""`PoraBatchReader`: `session.read.format("pora")` (docs/spark.md, "Batch reads").

Planned once on the driver: the stream's extents as of its latest commit (or
`as_of_commit`; with a live writer, its OPEN segment up to the LAC at planning
time), cut into entry ranges (spark/planning.py), one input partition each. Each
task then reads its range and yields Arrow record batches, which Spark takes as
they are.

No pushdown: PySpark 4.3 passes every column to `reader()` whatever the query
selects, and a reader with `pushFilters` is unsafe there: the reader planned for one
query's pushed filters stays with the loaded DataFrame, and a later query on it
that pushes nothing (`df.count()` after `df.filter(...).count()`) reads through it,
filtered (docs/spark.md, "Pushdown")."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from pora import Position
from spark.blocking import blocking_client
from spark.options import PoraOptions
from spark.planning import EntryRange, plan_ranges
from spark.range_read import read_batches, spark_arrow_schema


class PoraBatchReader(DataSourceReader):
    def __init__(self, options: PoraOptions, schema: Any) -> None:
        self._options = options
        self._schema = schema
        self._arrow_schema = spark_arrow_schema(schema)
        #: planned once: Spark asks for partitions more than once in some plans, and
        #: every ask must see the same commit
        self._planned: list[EntryRange] | None = None

    def partitions(self) -> Sequence[InputPartition]:
        if self._planned is None:
            options = self._options
            with blocking_client(options.metadata) as pora:
                stream = pora.call(pora.client.open_stream, options.stream)
                extents = pora.call(lambda: stream.extents(as_of_commit=options.as_of_commit))
            self._planned = plan_ranges(extents, options.partition_bytes)
        return self._planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, EntryRange):
            return  # Spark's stand-in partition for a plan of none: an empty stream
        with blocking_client(self._options.metadata) as pora:
            for _, batch in read_batches(
                pora,
                self._options.stream,
                Position(partition.segment, partition.first_entry),
                Position(partition.segment, partition.last_entry + 1),
                self._arrow_schema,
            ):
                yield batch
