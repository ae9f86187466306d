"""What the Spark writers' tests check a stream with, through the pora API (not the
Spark reader): its rows decoded entry by entry, its visible segments, and every
ledger of the cluster that names it (a writer left none behind when these are the
segments' only)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from spark.blocking import blocking_client
from spark.encoding import EntryDecoder


def ship_by_value(module: str) -> None:
    """Spark's workers cannot import a test module: the functions of `module` that
    its jobs run travel by value (cloudpickle's way)."""
    from pyspark import cloudpickle  # noqa: PLC0415

    cloudpickle.register_pickle_by_value(sys.modules[module])  # type: ignore[no-untyped-call]


def stream_table(url: str, name: str) -> pa.Table:
    """Every row the stream holds, in stream order (columns by name, sorted)."""
    decoder = EntryDecoder()
    with blocking_client(url) as pora:
        stream = pora.call(pora.client.open_stream, name)
        batches = [
            decoder.decode(payload, f"entry {position}")
            for position, payload in pora.iterate(stream.read, chunk=64)
        ]
    if not batches:
        return pa.table({})
    tables = [pa.Table.from_batches([batch]) for batch in batches]
    table = pa.concat_tables(tables, promote_options="default")
    return table.select(sorted(table.column_names))


def column(url: str, name: str, field: str) -> list[Any]:
    table = stream_table(url, name)
    return table.column(field).to_pylist() if table.num_rows else []


def segment_ledgers(url: str, name: str) -> set[int]:
    with blocking_client(url) as pora:
        stream = pora.call(pora.client.open_stream, name)
        info = pora.call(stream.info)
    return {segment.ledger_id for segment in info.segments}


def stream_ledgers(url: str, name: str) -> set[int]:
    """Every ledger in the cluster whose record names the stream (its segments',
    pending transactions' and any left behind)."""

    def named() -> Iterator[int]:
        with blocking_client(url) as pora:
            for ledger in pora.iterate(pora.client.list_ledgers, chunk=256):
                if ledger.custom.get("pora.stream") == name.encode():
                    yield ledger.ledger_id

    return set(named())


def segment_tags(url: str, name: str) -> list[dict[str, str]]:
    """The `tag.` custom metadata of each visible segment's ledger, by seq."""
    with blocking_client(url) as pora:
        stream = pora.call(pora.client.open_stream, name)
        info = pora.call(stream.info)
        ledgers = {ledger.ledger_id: ledger for ledger in pora.iterate(pora.client.list_ledgers)}
    return [
        {
            key.removeprefix("tag."): value.decode()
            for key, value in ledgers[segment.ledger_id].custom.items()
            if key.startswith("tag.")
        }
        for segment in info.segments
    ]


def pending_transactions(url: str, name: str) -> int:
    with blocking_client(url) as pora:
        stream = pora.call(pora.client.open_stream, name)
        info = pora.call(stream.info)
    return len(info.transactions)
