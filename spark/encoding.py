"""Rows in stream entries (docs/spark.md, "Encoding"): each entry holds one batch of
rows, an Arrow record batch in the IPC stream format (its schema message first, so an
entry reads alone), compressed with zstd, behind one format byte:

    entry   = format row-count rows
    format  = 0x01
    row-count = uint32, little-endian    ; the batch's rows, readable without decoding
    rows    = a zstd frame of an Arrow IPC stream (schema, one batch), its content
              size in its header

Batches are cut so that each entry's rows take about `entry_bytes` in Arrow's memory
(compression makes them smaller still), and at most `rows_per_entry` rows. The
stream's attributes keep the table's schema, as Spark's JSON (`SPARK_SCHEMA_KEY`)
and as Arrow's (`ARROW_SCHEMA_KEY`), so a reader needs no schema argument.

No I/O and no Spark import: the writers and readers pass bytes in and out.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
import zstandard

ENTRY_FORMAT_ARROW_ZSTD = 1
#: the stream attributes holding the table's schema
SPARK_SCHEMA_KEY = "spark.schema"
ARROW_SCHEMA_KEY = "arrow.schema"
ENTRY_BYTES_DEFAULT = 1 << 20
#: zstd's level 1: on the benchmark's rows as small as level 3's output, a fifth faster
COMPRESSION_LEVEL_DEFAULT = 1
#: a decoded entry is refused past this (a corrupt or hostile header cannot make a
#: reader allocate more)
DECODED_BYTES_MAX = 1 << 30


class EntryFormatError(ValueError):
    """An entry that is not rows this module wrote; says where it came from."""


class RowTooLarge(ValueError):
    """One row encodes to more bytes than an entry may hold: it cannot be written;
    says which row and the sizes."""


def cut_batches(
    batches: Iterable[pa.RecordBatch], entry_bytes: int, rows_per_entry: int | None = None
) -> Iterator[pa.RecordBatch]:
    """The rows of `batches`, in order, re-cut into batches of about `entry_bytes` of
    Arrow memory each (at least one row) and at most `rows_per_entry` rows. Small
    batches are joined, so a task that gets rows a few at a time still writes entries
    near the size asked for."""
    if entry_bytes <= 0:
        raise ValueError(f"entry_bytes={entry_bytes} must be above 0")
    if rows_per_entry is not None and rows_per_entry <= 0:
        raise ValueError(f"rows_per_entry={rows_per_entry} must be above 0")
    held: list[pa.RecordBatch] = []
    held_bytes = 0
    held_rows = 0
    for batch in batches:
        offset = 0
        while offset < batch.num_rows:
            rest = batch.slice(offset)
            row_bytes = max(1, rest.nbytes // max(1, rest.num_rows))
            room_rows = max(1, (entry_bytes - held_bytes) // row_bytes)
            if rows_per_entry is not None:
                room_rows = min(room_rows, rows_per_entry - held_rows)
            piece = rest.slice(0, room_rows)
            held.append(piece)
            held_bytes += piece.num_rows * row_bytes
            held_rows += piece.num_rows
            offset += piece.num_rows
            full_rows = rows_per_entry is not None and held_rows >= rows_per_entry
            if held_bytes >= entry_bytes or full_rows:
                yield _joined(held)
                held, held_bytes, held_rows = [], 0, 0
    if held_rows:
        yield _joined(held)


def _joined(batches: Sequence[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


class EntryEncoder:
    """Encodes record batches into entries; one per writing task (it holds a zstd
    compressor, which is not thread-safe)."""

    def __init__(self, level: int = COMPRESSION_LEVEL_DEFAULT) -> None:
        if not -7 <= level <= 22:
            raise ValueError(f"compression level {level} must be in -7..22 (zstd's)")
        self._compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)

    def encode(self, batch: pa.RecordBatch) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as ipc:
            ipc.write_batch(batch)
        raw = sink.getvalue()
        rows: int = batch.num_rows
        header = bytes([ENTRY_FORMAT_ARROW_ZSTD]) + rows.to_bytes(4, "little")
        compressed: bytes = self._compressor.compress(raw)
        return header + compressed


_HEADER_BYTES = 5


def encode_within(
    encoder: EntryEncoder, batch: pa.RecordBatch, limit: int, where: str, first_row: int = 0
) -> Iterator[tuple[pa.RecordBatch, bytes]]:
    """`batch` as entries of at most `limit` bytes each, with the rows each holds: one
    entry when it fits (the usual case: one length compared), else the batch halved
    until each part fits (rows that compress little can take more than `entry_bytes`
    of Arrow memory encoded). RowTooLarge names the row (its index in the rows
    written, from `first_row`) that does not fit alone."""
    entry = encoder.encode(batch)
    if len(entry) <= limit:
        yield batch, entry
        return
    if batch.num_rows == 1:
        raise RowTooLarge(
            f"{where}: row {first_row} encodes to {len(entry)} bytes, more than a stream "
            f"entry holds ({limit} bytes, the client's payload_bytes_max, under the nodes' "
            "entry_bytes_max); a row is never split across entries: keep values this "
            "large outside the stream (write a reference to them)"
        )
    half = batch.num_rows // 2
    yield from encode_within(encoder, batch.slice(0, half), limit, where, first_row)
    yield from encode_within(encoder, batch.slice(half), limit, where, first_row + half)


def entry_rows(entry: bytes, where: str = "an entry") -> int:
    """The number of rows an entry holds, from its header (no decoding);
    EntryFormatError naming `where` for what is not such an entry."""
    if len(entry) < _HEADER_BYTES or entry[0] != ENTRY_FORMAT_ARROW_ZSTD:
        shown = entry[:1].hex() or "nothing"
        raise EntryFormatError(
            f"{where} is not rows written by the Pora Spark writer (format byte {shown}, "
            f"not {ENTRY_FORMAT_ARROW_ZSTD:02x}): read this stream with stream.read()"
        )
    return int.from_bytes(entry[1:_HEADER_BYTES], "little")


class EntryDecoder:
    """Decodes entries back into record batches; one per reading task."""

    def __init__(self) -> None:
        self._decompressor = zstandard.ZstdDecompressor()

    def decode(
        self, entry: bytes, where: str = "an entry", columns: Sequence[str] | None = None
    ) -> pa.RecordBatch:
        """The entry's rows (only `columns`, in that order, when given: a column the
        entry lacks, added to the table after it was written, comes back as nulls of
        the type `null`; the caller casts). EntryFormatError naming `where`."""
        rows = entry_rows(entry, where)
        frame = entry[_HEADER_BYTES:]
        try:
            size = zstandard.frame_content_size(frame)
            if size < 0 or size > DECODED_BYTES_MAX:
                raise EntryFormatError(
                    f"{where} is corrupt: its rows claim {size} bytes decoded (at most "
                    f"{DECODED_BYTES_MAX} are read)"
                )
            raw = self._decompressor.decompress(frame, max_output_size=size)
            with pa.ipc.open_stream(raw) as ipc:
                batches = list(ipc)
        except (zstandard.ZstdError, pa.ArrowInvalid) as error:
            raise EntryFormatError(f"{where} is corrupt: {error}") from error
        if len(batches) != 1 or batches[0].num_rows != rows:
            raise EntryFormatError(
                f"{where} is corrupt: it holds {len(batches)} batches of "
                f"{[b.num_rows for b in batches]} rows, not one of {rows}"
            )
        batch = batches[0]
        if columns is None:
            return batch
        arrays = [
            batch.column(name) if name in batch.schema.names else pa.nulls(batch.num_rows)
            for name in columns
        ]
        return pa.RecordBatch.from_arrays(arrays, names=list(columns))


def schema_to_attribute(schema: pa.Schema) -> str:
    """The Arrow schema as a stream attribute's value (base64 of its IPC form)."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_attribute(value: str) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(value, validate=True)))
    except (ValueError, pa.ArrowInvalid) as error:
        raise EntryFormatError(f"the stream's {ARROW_SCHEMA_KEY} attribute is corrupt") from error
