"""`PoraBatchReader`: `session.read.format("pora")` (docs/spark.md, "Batch reads").

Planned once on the driver: the stream's extents as of its latest commit (or
`as_of_commit`; with a live writer, its OPEN segment up to the LAC at planning
time), cut into entry ranges (spark/planning.py), one input partition each. Each
task then reads its range and yields Arrow record batches, which Spark takes as
they are. Filters it can evaluate exactly are pushed (spark/filters.py) when the
session enables Python filter pushdown."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition

from pora import Position
from spark.blocking import blocking_client
from spark.filters import split_filters
from spark.options import PoraOptions
from spark.planning import EntryRange, plan_ranges
from spark.range_read import read_batches, spark_arrow_schema

#: the PySpark worker that plans a read with filter pushdown (the session's
#: spark.sql.python.filterPushdown.enabled is true); without it, PySpark refuses a
#: reader that implements pushFilters
_PUSHDOWN_WORKER = "data_source_pushdown_filters.py"


def batch_reader(options: PoraOptions, schema: Any) -> PoraBatchReader:
    """The reader for this plan: one that takes filters when PySpark's pushdown
    worker asks (the frame that calls is that worker's), the plain one otherwise. Not
    recognizing the worker only costs the pushdown: Spark then filters every row."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_PUSHDOWN_WORKER):
            return PoraFilteringBatchReader(options, schema)
        frame = frame.f_back  # type: ignore[assignment]
    return PoraBatchReader(options, schema)


class PoraBatchReader(DataSourceReader):
    def __init__(self, options: PoraOptions, schema: Any) -> None:
        self._options = options
        self._schema = schema
        self._arrow_schema = spark_arrow_schema(schema)
        #: the AND of the pushed filters (None: none)
        self._predicate: pc.Expression | None = None
        #: planned once: Spark asks for partitions more than once in some plans, and
        #: every ask must see the same commit
        self._planned: list[EntryRange] | None = None

    def partitions(self) -> Sequence[InputPartition]:
        if self._planned is None:
            options = self._options
            with blocking_client(options.metadata) as pora:
                stream = pora.call(pora.client.open_stream, options.stream)
                extents = pora.call(lambda: stream.extents(as_of_commit=options.as_of_commit))
            self._planned = plan_ranges(extents)
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
                self._predicate,
            ):
                yield batch


class PoraFilteringBatchReader(PoraBatchReader):
    """The reader with filter pushdown (spark/filters.py says which are taken)."""

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:  # noqa: N802 (Spark's)
        self._predicate, rest = split_filters(self._schema, filters)
        return rest
