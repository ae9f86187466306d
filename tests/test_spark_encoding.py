"""Rows in stream entries: record batches cut near the entry size asked for, through
zstd and back with every column and null intact; a column added to the table after an
entry was written reads as nulls; what is not such an entry is refused by name; rows
that compress too little for one entry are spread over several, and a row no entry
can hold is refused by its index."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from spark.encoding import (
    EntryDecoder,
    EntryEncoder,
    EntryFormatError,
    RowTooLarge,
    cut_batches,
    encode_within,
    entry_rows,
    schema_from_attribute,
    schema_to_attribute,
)


def table(rows: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "id": pa.array(range(rows), pa.int64()),
            "body": pa.array([None if i % 7 == 0 else "x" * 100 for i in range(rows)]),
        }
    )


def test_batches_are_cut_near_the_entry_size_and_keep_every_row() -> None:
    source = [table(1000), table(3), table(5000)]
    cut = list(cut_batches(source, entry_bytes=32 * 1024))
    assert sum(b.num_rows for b in cut) == 6003
    assert [v for b in cut for v in b.column("id").to_pylist()] == [
        *range(1000),
        *range(3),
        *range(5000),
    ]
    sizes = [b.nbytes for b in cut[:-1]]
    assert all(16 * 1024 <= size <= 48 * 1024 for size in sizes), sizes
    by_rows = list(cut_batches(source, entry_bytes=1 << 30, rows_per_entry=1000))
    assert [b.num_rows for b in by_rows] == [1000] * 6 + [3]


def test_an_entry_round_trips_and_reads_some_columns() -> None:
    batch = table(2000)
    entry = EntryEncoder(level=3).encode(batch)
    assert entry[0] == 1 and len(entry) < batch.nbytes // 4
    assert entry_rows(entry) == 2000
    decoder = EntryDecoder()
    assert decoder.decode(entry).equals(batch)
    only = decoder.decode(entry, columns=["body", "added_later"])
    assert only.schema.names == ["body", "added_later"]
    assert only.column("body").equals(batch.column("body"))
    assert only.column("added_later").null_count == 2000


def test_what_is_not_an_entry_is_refused_by_name() -> None:
    decoder = EntryDecoder()
    with pytest.raises(EntryFormatError, match=r"position 3:7 is not rows"):
        decoder.decode(b"plain text", where="position 3:7")
    with pytest.raises(EntryFormatError, match="corrupt"):
        decoder.decode(b"\x01\x01\x00\x00\x00\x28\xb5\x2f\xfd" + b"\x00" * 20, where="0:0")
    with pytest.raises(ValueError, match="level"):
        EntryEncoder(level=99)


def test_the_schema_round_trips_through_an_attribute() -> None:
    schema = table(1).schema
    assert schema_from_attribute(schema_to_attribute(schema)).equals(schema)
    with pytest.raises(EntryFormatError):
        schema_from_attribute("not base64!")


def test_an_entry_over_the_limit_is_halved_until_each_part_fits() -> None:
    bodies = [os.urandom(100_000) for _ in range(5)]  # incompressible
    batch = pa.RecordBatch.from_pydict({"id": list(range(5)), "body": bodies})
    encoder, decoder = EntryEncoder(), EntryDecoder()
    assert len(list(encode_within(encoder, batch, 1 << 20, "here"))) == 1  # fits: as is
    parts = list(encode_within(encoder, batch, 250_000, "here"))
    assert [len(part) for part, _ in parts] == [2, 1, 2]  # 5 -> 2 + 3 -> 2 + (1 + 2)
    assert all(len(entry) <= 250_000 for _, entry in parts)
    decoded = [decoder.decode(entry, "entry") for _, entry in parts]
    assert [row for b in decoded for row in b.column("body").to_pylist()] == bodies
    with pytest.raises(RowTooLarge) as raised:
        list(encode_within(encoder, batch, 90_000, "stream 'e', partition 3", first_row=40))
    assert str(raised.value).startswith("stream 'e', partition 3: row 40 encodes to 100")
    assert "more than a stream entry holds (90000 bytes" in str(raised.value)
