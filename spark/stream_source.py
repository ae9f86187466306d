"""`PoraStreamReader`: `session.readStream.format("pora")` (docs/spark.md,
"Streaming reads").

An offset is the position the next micro-batch reads from, with the name of the
query's durable cursor and the stream's creation time: `{"position": {"segment": 3,
"entry": 120}, "cursor": "spark-…", "stream_created_ms": 1795…}`. Spark checkpoints
offsets, so a query restarted from its checkpoint resumes at the position it stopped
at and advances the same cursor; an offset of another stream (one deleted and
created again under the name, whose positions name other entries) or past the
stream's end is refused, never read from. Only
acknowledged entries of committed segments are offered: a batch ends at most at the
live writer's LAC (what `stream.extents()` reports).

The driver keeps one client for the query's life (Spark keeps this object in one
Python worker from start to stop); the tasks open their own to read their ranges.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

import pora
from pora import Position
from spark.admission import Limits, admitted_end
from spark.blocking import BlockingClient, blocking_client
from spark.options import PoraOptions
from spark.planning import EntryRange, plan_ranges
from spark.range_read import read_batches, spark_arrow_schema

_log = logging.getLogger("spark.pora.stream_source")


class PoraDataLoss(RuntimeError):
    """Entries a streaming query had yet to read were removed by retention (or a
    truncation), or are in a LOST segment, and failOnDataLoss is true."""


class PoraOffsetMismatch(PoraDataLoss):
    """A streaming query's offset does not name a position of the stream as it is: the
    stream was deleted and created again since the checkpoint was written, or the
    offset lies past its end (a checkpoint of another stream); failOnDataLoss is
    true."""


#: the offset's field holding the creation time of the stream its position is of
CREATED_KEY = "stream_created_ms"


def offset_of(position: Position, cursor: str, created_ms: int) -> dict[str, Any]:
    return {"position": position.to_dict(), "cursor": cursor, CREATED_KEY: created_ms}


def position_of(offset: dict[str, Any]) -> Position:
    return Position.from_dict(offset["position"])


def _end_of(extents: Sequence[pora.SegmentExtent]) -> Position:
    last = extents[-1]
    return Position(last.seq, last.last_entry + 1)


def past_end(position: Position, info: pora.StreamInfo) -> bool:
    """Whether `position` lies past any end the stream has had: beyond the next
    segment's first position, or past a CLOSED segment's end (one of the head's: a
    paged segment is not read for this)."""
    if position > Position(info.next_seq, 0):
        return True
    for segment in info.segments:
        if segment.seq == position.segment:
            closed = segment.state.name == "CLOSED"  # (SegmentState is not public)
            return closed and position.entry > segment.last_entry_id + 1
    return False


class PoraStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: PoraOptions, schema: Any) -> None:
        self._options = options
        self._arrow_schema = spark_arrow_schema(schema)
        self._resources = ExitStack()
        self._pora: BlockingClient | None = None
        self._stream: Any = None
        #: Trigger.AvailableNow: the end as of the query's start (None: the stream
        #: was empty); unset otherwise
        self._available_now: tuple[Position | None] | None = None
        self._cursor_name = options.cursor

    # -- the driver's client ------------------------------------------------------

    def _client(self) -> tuple[BlockingClient, Any]:
        if self._pora is None:
            self._pora = self._resources.enter_context(blocking_client(self._options.metadata))
            self._stream = self._pora.call(self._pora.client.open_stream, self._options.stream)
        return self._pora, self._stream

    def _extents(
        self, start: Position | None, stop: Position | None = None
    ) -> list[pora.SegmentExtent]:
        """The stream's extents from `start` to `stop`; a LOST segment among them fails
        the query (PoraDataLoss) or, with failOnDataLoss=false, is left out with a
        warning."""
        pora_client, stream = self._client()
        extents: list[pora.SegmentExtent] = []
        while True:
            try:
                more: list[pora.SegmentExtent] = pora_client.call(stream.extents, start, stop)
                return extents + more
            except pora.EntriesLost as error:
                segment_lost(self._options, error)
                before = Position(error.segment, 0)
                extents += pora_client.call(stream.extents, start, before)
                start = error.resume_at
                if stop is not None and error.resume_at >= stop:
                    return extents

    def _entries(self, first: Position, stop: Position) -> Iterator[tuple[Position, bytes]]:
        """The entries from `first` to `stop`, past LOST segments as `_extents` goes."""
        pora_client, stream = self._client()
        while True:
            try:
                yield from pora_client.iterate(partial(stream.read, first, stop), chunk=16)
            except pora.EntriesLost as error:
                segment_lost(self._options, error)
                first = error.resume_at
            else:
                return

    def __getstate__(self) -> dict[str, Any]:
        """The reader as pickled for the tasks: the options, not the driver's client."""
        state = dict(self.__dict__)
        state.update(_resources=ExitStack(), _pora=None, _stream=None)
        return state

    def stop(self) -> None:
        self._resources.close()
        self._pora = None

    # -- offsets ------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 (Spark's)
        """Where a query without a checkpoint starts (option starting_position), its
        cursor created (pinning retention from there on)."""
        name = self._cursor_name or f"spark-{uuid.uuid4().hex}"
        self._cursor_name = name
        pora_client, stream = self._client()
        cursor = pora_client.call(stream.cursor, name)
        info = pora_client.call(stream.info)
        if self._options.starting_position == "earliest":
            start = pora_client.call(cursor.position)
        else:
            start = info.first_held
            extents = self._extents(start)
            if extents:
                start = _end_of(extents)
                pora_client.call(cursor.ack, Position(start.segment, start.entry - 1))
        return offset_of(start, name, info.created_ms)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 (Spark's)
        """One limit from the options (Spark takes one kind); latestOffset applies
        both options whenever Spark does not ask for everything."""
        if self._options.max_records_per_trigger is not None:
            return ReadMaxRows(self._options.max_records_per_trigger)
        if self._options.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self._options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 (Spark's)
        extents = self._extents(None)
        self._available_now = (_end_of(extents) if extents else None,)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        name = self._named(start)
        first, created_ms = self._checked(start)
        stop: Position | None = None
        if self._available_now is not None:
            stop = self._available_now[0]
            if stop is None or stop <= first:
                return start
        extents = self._extents(first, stop)
        if not extents:
            return start
        limits = self._limits(limit)
        if limits.unlimited:
            return offset_of(_end_of(extents), name, created_ms)
        end = admitted_end(self._entries(first, _end_of(extents)), limits)
        return start if end is None else offset_of(end, name, created_ms)

    def reportLatestOffset(self) -> dict[str, Any] | None:  # noqa: N802 (Spark's)
        if self._cursor_name is None:
            return None
        pora_client, stream = self._client()
        created_ms = pora_client.call(stream.info).created_ms
        extents = self._extents(None)
        return offset_of(_end_of(extents), self._cursor_name, created_ms) if extents else None

    def _named(self, offset: dict[str, Any]) -> str:
        name: str = offset["cursor"]
        self._cursor_name = name
        return name

    def _limits(self, limit: ReadLimit) -> Limits:
        """What `limit` and the options allow (Spark's ReadAllAvailable: everything,
        as Trigger.AvailableNow and Once ask)."""
        if isinstance(limit, ReadAllAvailable):
            return Limits()
        rows = self._options.max_records_per_trigger
        size = self._options.max_bytes_per_trigger
        if isinstance(limit, ReadMaxRows):
            rows = limit.max_rows if rows is None else min(rows, limit.max_rows)
        if isinstance(limit, ReadMaxBytes):
            size = limit.max_bytes if size is None else min(size, limit.max_bytes)
        return Limits(rows, size)

    def _checked(self, offset: dict[str, Any]) -> tuple[Position, int]:
        """The position `offset` reads from and the stream's creation time: the
        offset's own position, or with failOnDataLoss=false the first position held
        when retention removed it or when the offset is not of this stream (created
        again since, or past its end); PoraDataLoss / PoraOffsetMismatch otherwise."""
        pora_client, stream = self._client()
        info: pora.StreamInfo = pora_client.call(stream.info)
        position = position_of(offset)
        created_ms = offset.get(CREATED_KEY)  # absent from offsets written before it
        if created_ms is not None and created_ms != info.created_ms:
            why = (
                f"was deleted and created again (the offset's stream was created at "
                f"{created_ms} ms since the epoch, this one at {info.created_ms})"
            )
            mismatched(self._options, position, info.first_held, why)
            return info.first_held, info.created_ms
        if past_end(position, info):
            why = f"ends before it (its next segment is {info.next_seq})"
            mismatched(self._options, position, info.first_held, why)
            return info.first_held, info.created_ms
        if position < info.first_held and self._removed(position, info.first_held):
            lost(self._options, position, info.first_held)
            return info.first_held, info.created_ms
        return position, info.created_ms

    def _removed(self, position: Position, first_held: Position) -> bool:
        try:
            self._extents(position, first_held)
        except pora.EntriesTruncated:
            return True
        return False

    # -- micro-batches --------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        (first, created_ms), stop = self._checked(start), position_of(end)
        if first >= stop or end.get(CREATED_KEY, created_ms) != created_ms:
            # (the second: a batch planned on the stream before it was created again,
            # run again after a restart with failOnDataLoss=false: none of its
            # positions is this stream's; the next batch reads it from its start)
            return []
        return plan_ranges(self._extents(first, stop), self._options.partition_bytes)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, EntryRange), partition
        with blocking_client(self._options.metadata) as pora_client:
            try:
                for _, batch in read_batches(
                    pora_client,
                    self._options.stream,
                    partition.start,
                    partition.stop,
                    self._arrow_schema,
                ):
                    yield batch
            except pora.EntriesTruncated as error:
                lost(self._options, error.requested, error.first_held)  # type: ignore[arg-type]
            except pora.EntriesLost as error:  # deleted after the batch was planned
                segment_lost(self._options, error)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark has processed everything before `end`: the cursor moves there, and
        retention may remove what is before it."""
        position = position_of(end)
        if position.entry == 0:
            return  # nothing read yet in this segment: the cursor stays before it
        pora_client, stream = self._client()
        cursor = pora_client.call(stream.cursor, self._named(end))
        pora_client.call(cursor.ack, Position(position.segment, position.entry - 1))


def lost(options: PoraOptions, requested: Position, first_held: Position) -> None:
    """Entries from `requested` up to `first_held` are gone: PoraDataLoss, or with
    failOnDataLoss=false a warning naming the positions (the query goes on)."""
    message = (
        f"stream {options.stream!r}: the entries from position {requested} up to "
        f"{first_held} were removed by retention or truncation before this query read "
        "them"
    )
    if options.fail_on_data_loss:
        raise PoraDataLoss(
            f"{message}; to skip them and go on from {first_held}, set option "
            'failOnDataLoss to "false"'
        )
    _log.warning("%s; skipped (failOnDataLoss=false), reading on from %s", message, first_held)


def segment_lost(options: PoraOptions, error: pora.EntriesLost) -> None:
    """The query reached a LOST segment (its ledger deleted outside the stream, its
    entries gone): PoraDataLoss, or with failOnDataLoss=false a warning (the query
    reads on from the first position after it)."""
    message = (
        f"stream {options.stream!r}: segment {error.segment} is LOST (its ledger "
        f"{error.ledger_id} was deleted outside the stream) before this query read it"
    )
    if options.fail_on_data_loss:
        raise PoraDataLoss(
            f"{message}; to skip it and go on from {error.resume_at}, set option "
            'failOnDataLoss to "false"'
        ) from error
    _log.warning("%s; skipped (failOnDataLoss=false), reading on from %s", message, error.resume_at)


def mismatched(options: PoraOptions, offset: Position, first_held: Position, why: str) -> None:
    """The query's offset `offset` is not a position of the stream as it is (`why`):
    PoraOffsetMismatch, or with failOnDataLoss=false a warning (the query reads on
    from the stream's first position held)."""
    message = (
        f"stream {options.stream!r}: the query's checkpoint holds position {offset}, "
        f"but the stream {why}: that position names no entry this query has yet to read"
    )
    if options.fail_on_data_loss:
        raise PoraOffsetMismatch(
            f"{message}; start the query with a new checkpoint location (to read this "
            f"stream from its first position {first_held} instead, set option "
            'failOnDataLoss to "false")'
        )
    _log.warning(
        "%s; reading on from the stream's first position %s (failOnDataLoss=false)",
        message,
        first_held,
    )
