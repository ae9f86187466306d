"""Reading one input partition's entries as Arrow record batches (docs/spark.md,
"Reading"): the entries come through `stream.read(from_, to)`, range reads of up to
`read_range_entries_max` entries or 4 MiB from the nodes that together hold every
entry of the segment, fetched ahead of the decoding, `READ_AHEAD_ENTRIES` handed
over to Spark's thread at a time;
each is decoded with `EntryDecoder` and cast to the Arrow schema Spark expects
(columns the entry predates come back as nulls of their type)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from pora import Position
from spark.blocking import BlockingClient
from spark.encoding import EntryDecoder

#: entries per hand-over from the client's loop, which fetches two such chunks ahead
#: while the task decodes: a task holds at most four chunks (entries are about 1 MiB
#: of Arrow memory before zstd), and a hand-over's cost is spread over many entries
READ_AHEAD_ENTRIES = 16


def cast_to(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """The batch with exactly `schema` (what Spark checks before taking Arrow): the
    fields' nullability and metadata as `schema` says, and only the columns of
    another type cast (a column added after the entry was written is nulls of type
    null). A column of the same type is never cast: Arrow refuses to cast a struct
    with a non-nullable field whose rows include null structs, which Spark writes."""
    if batch.schema.equals(schema):
        return batch
    arrays = []
    for column, field in zip(batch.columns, schema, strict=True):
        arrays.append(column if column.type.equals(field.type) else column.cast(field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def read_batches(
    pora: BlockingClient,
    stream_name: str,
    start: Position,
    stop: Position,
    schema: pa.Schema,
) -> Iterator[tuple[Position, pa.RecordBatch]]:
    """(position, rows) of each entry in [start, stop), the rows in `schema`."""
    stream = pora.call(pora.client.open_stream, stream_name)
    decoder = EntryDecoder()
    columns: Sequence[str] = schema.names
    entries = pora.iterate_ahead(lambda: stream.read(from_=start, to=stop), READ_AHEAD_ENTRIES)
    for position, payload in entries:
        where = f"entry {position} of stream {stream_name!r}"
        yield position, cast_to(decoder.decode(payload, where, columns), schema)


def spark_arrow_schema(spark_schema: Any) -> pa.Schema:
    """The Arrow schema Spark's Python data source runner expects of a reader's
    batches for `spark_schema` (it compares them with `equals`)."""
    from pyspark.sql.pandas.types import to_arrow_schema  # noqa: PLC0415

    return to_arrow_schema(spark_schema, timezone="UTC")
