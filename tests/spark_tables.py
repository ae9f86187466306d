"""Table rows put into a stream from the test process, as the Pora Spark writer
puts them (docs/spark.md, "Encoding"), so the readers are tested on their own:
rows converted to Arrow by pyspark's own StructType -> Arrow conversion, cut and
encoded with spark.encoding, written by a transaction or by the live writer, and
the schema recorded in the stream's `spark.schema` / `arrow.schema` attributes.

    with table_client(url) as pora:
        create_table_stream(pora, name, schema)
        commit_rows(pora, name, schema, rows, rows_per_entry=100)
        with live_writer(pora, name) as append:
            append(entries_of(schema, rows))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from anyio.from_thread import start_blocking_portal

import pora
from spark.blocking import BlockingClient
from spark.encoding import (
    ARROW_SCHEMA_KEY,
    SPARK_SCHEMA_KEY,
    EntryEncoder,
    cut_batches,
    schema_to_attribute,
)
from spark.range_read import spark_arrow_schema


@contextmanager
def table_client(url: str) -> Iterator[BlockingClient]:
    with start_blocking_portal(backend="asyncio") as portal:  # noqa: SIM117 (order)
        with portal.wrap_async_context_manager(pora.connect(url)) as client:
            yield BlockingClient(portal, client)


def create_table_stream(client: BlockingClient, name: str, schema: Any, **config: Any) -> None:
    """A new stream whose attributes record `schema` (a pyspark StructType)."""
    client.call(lambda: client.client.create_stream(name, **config))
    record_schema(client, name, schema)


def record_schema(client: BlockingClient, name: str, schema: Any) -> None:
    """`schema` recorded as the stream's table schema, as the writer records it."""

    async def record() -> None:
        stream = await client.client.open_stream(name)
        await stream.set_attributes(
            {
                SPARK_SCHEMA_KEY: schema.json(),
                ARROW_SCHEMA_KEY: schema_to_attribute(spark_arrow_schema(schema)),
            }
        )

    client.call(record)


def arrow_table(schema: Any, rows: Sequence[Any]) -> pa.Table:
    """`rows` (tuples in the schema's field order) as Arrow, by pyspark's own local
    data conversion (what createDataFrame does), in the schema the writer records."""
    from pyspark.sql.conversion import LocalDataToArrowConversion  # noqa: PLC0415

    table = LocalDataToArrowConversion.convert(list(rows), schema, use_large_var_types=False)
    return table.cast(spark_arrow_schema(schema))


def entries_of(
    schema: Any, rows: Sequence[Sequence[Any]], rows_per_entry: int = 1000
) -> list[bytes]:
    table = arrow_table(schema, rows)
    encoder = EntryEncoder()
    batches = cut_batches(table.to_batches(), 1 << 20, rows_per_entry)
    return [encoder.encode(batch) for batch in batches]


def commit_entries(
    client: BlockingClient, name: str, entries: Sequence[bytes], segments: int = 1
) -> int:
    """One committed transaction of `segments` segments sharing `entries` in order;
    its commit number."""

    async def commit() -> int:
        stream = await client.client.open_stream(name)
        async with stream.begin() as txn:
            share = -(-len(entries) // segments)
            for first in range(0, len(entries), share):
                segment = await txn.open_segment()
                await segment.append_many(list(entries[first : first + share]))
        info = await stream.info()
        commit: int = info.commit
        return commit

    return client.call(commit)


@contextmanager
def live_writer(
    client: BlockingClient, name: str, create: Any = None
) -> Iterator[Callable[[Sequence[bytes]], list[pora.Position]]]:
    """The stream's live writer (the stream created first for the schema `create`
    when given): `append(entries)` returns once they are acknowledged."""
    if create is not None:
        create_table_stream(client, name, create)
    stream = client.call(client.client.open_stream, name)
    portal = client._portal  # the test's own client: its loop runs the writer too

    async def open_writer() -> Any:
        return stream.open_writer()  # made in the loop (it holds the loop's primitives)

    with portal.wrap_async_context_manager(portal.call(open_writer)) as writer:

        def append(entries: Sequence[bytes]) -> list[pora.Position]:
            return portal.call(writer.append_many, list(entries))

        yield append


def wait_readable(client: BlockingClient, name: str, position: pora.Position) -> None:
    """Until readers see the entry at `position` (a live writer's last entries reach
    them with the LAC, a moment after their acknowledgement)."""

    async def wait() -> None:
        stream = await client.client.open_stream(name)
        async for _ in stream.subscribe(from_=position):
            return

    client.call(wait)
