"""What every Pora writer's Spark task does (docs/spark.md, "Writers"): open or
create the stream, then write its rows into one segment of a transaction, entries cut
and encoded here while earlier appends are in flight, and report the segment to the
driver in a commit message.

The appends are bounded: at most APPEND_ENTRIES_MAX entries (and about
APPEND_BYTES_MAX bytes) per `append_many`, at most APPENDS_IN_FLIGHT_MAX of them
unacknowledged; the task encodes the next while the nodes store the last, and waits
for the oldest when the window is full.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from pyspark.sql.datasource import WriterCommitMessage

from pora import NoSuchStream, StreamExists
from spark.encoding import EntryEncoder, cut_batches, encode_within

if TYPE_CHECKING:
    import pyarrow as pa

    from pora import Stream, Transaction, TransactionSegment
    from spark.blocking import BlockingClient
    from spark.options import PoraOptions

APPEND_ENTRIES_MAX = 16
APPEND_BYTES_MAX = 8 << 20
APPENDS_IN_FLIGHT_MAX = 4


def open_or_create(pora: BlockingClient, options: PoraOptions) -> Stream:
    """The stream named by the options, created with their quorums when absent (two
    jobs creating it at once: one creates, the other opens)."""
    try:
        return cast("Stream", pora.call(pora.client.open_stream, options.stream))
    except NoSuchStream:
        pass
    create = partial(
        pora.client.create_stream,
        options.stream,
        ensemble_size=options.ensemble_size,
        write_quorum=options.write_quorum,
        ack_quorum=options.ack_quorum,
        segment_bytes_max=options.segment_bytes_max,
    )
    try:
        return cast("Stream", pora.call(create))
    except StreamExists:
        return cast("Stream", pora.call(pora.client.open_stream, options.stream))


@dataclass(frozen=True)
class SegmentWritten(WriterCommitMessage):
    """A task's commit message: the segment it wrote (None: it had no rows) and what
    is in it. `txn_id` names the transaction (the streaming sink's driver derives
    nothing without it)."""

    txn_id: str
    ledger_id: int | None
    partition: int
    attempt: int
    rows: int = 0
    entries: int = 0
    bytes: int = 0
    #: the streaming sink's: the query the batch belongs to
    query_id: str | None = None


@dataclass
class Written:
    """What `write_segment` wrote."""

    ledger_id: int | None = None
    rows: int = 0
    entries: int = 0
    bytes: int = 0

    def message(
        self, txn_id: str, partition: int, attempt: int, query_id: str | None = None
    ) -> SegmentWritten:
        """The task's commit message reporting this segment."""
        return SegmentWritten(
            txn_id,
            self.ledger_id,
            partition,
            attempt,
            self.rows,
            self.entries,
            self.bytes,
            query_id,
        )


def write_segment(
    pora: BlockingClient,
    txn: Transaction,
    batches: Iterable[pa.RecordBatch],
    options: PoraOptions,
    tags: dict[str, str],
) -> Written:
    """The rows of `batches` in one new segment of `txn` (tagged with `tags`), closed
    once all are acknowledged; no segment for no rows."""
    encoder = EntryEncoder(options.compression_level)
    limit = pora.client.config.payload_bytes_max
    where = f"stream {options.stream!r}, partition {tags.get('partition')}"
    written = Written()
    segment: TransactionSegment | None = None
    in_flight: deque[Future[list[int]]] = deque()
    chunk: list[bytes] = []
    chunk_bytes = 0

    def send() -> None:
        nonlocal chunk, chunk_bytes
        assert segment is not None
        if len(in_flight) >= APPENDS_IN_FLIGHT_MAX:
            in_flight.popleft().result()
        in_flight.append(pora.start(segment.append_many, chunk))
        chunk, chunk_bytes = [], 0

    try:
        for cut in cut_batches(batches, options.entry_bytes, options.rows_per_entry):
            for batch, entry in encode_within(encoder, cut, limit, where, written.rows):
                if segment is None:
                    segment = pora.call(txn.open_segment, tags)
                    written.ledger_id = segment.ledger_id
                chunk.append(entry)
                chunk_bytes += len(entry)
                written.rows += batch.num_rows
                written.entries += 1
                written.bytes += len(entry)
                if len(chunk) >= APPEND_ENTRIES_MAX or chunk_bytes >= APPEND_BYTES_MAX:
                    send()
        if chunk:
            send()
        while in_flight:
            in_flight.popleft().result()
    finally:
        for future in in_flight:  # a failed task: nothing it wrote is reported
            future.cancel()
    if segment is not None:
        pora.call(segment.close)
    return written


def task_identity() -> tuple[int, int, int]:
    """(stage id, partition id, attempt number) of the running Spark task."""
    from pyspark import TaskContext  # noqa: PLC0415

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("a Pora writer's task runs in a Spark task (no TaskContext here)")
    return context.stageId(), context.partitionId(), context.attemptNumber()


def local_property(name: str) -> Any:
    """A local property of the running Spark task's job (None when unset)."""
    from pyspark import TaskContext  # noqa: PLC0415

    context = TaskContext.get()
    return None if context is None else context.getLocalProperty(name)
