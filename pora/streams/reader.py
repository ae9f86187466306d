"""Reading a stream (docs/streams.md, "Reading"): `read` crosses the segments of the
document as it is when the call starts, `subscribe` follows it as it changes. Both
use range reads underneath and never return an entry past what is acknowledged: a
CLOSED segment up to the last entry the document fixes, the OPEN one up to its
ledger's LAC (R23).

Positions run from a segment's entry 0 to its last entry, then to the next
segment's entry 0. A start past a segment's last entry means the next segment's
first; `to` is exclusive.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import anyio

from journal.errors import PoraError
from ledger.errors import InvalidArgument, NoSuchLedger
from pora.client.replication.reader import LedgerReader
from pora.client.replication.tail import wait_for_progress
from pora.meta.records import Versioned
from pora.streams.document import Segment, SegmentPage, SegmentState, StreamDocument
from pora.streams.errors import EntriesLost, EntriesTruncated, NoSuchStream
from pora.streams.lost import entries_lost, raise_if_lost
from pora.streams.position import Position
from pora.streams.records import StreamRecord

if TYPE_CHECKING:
    from pora.streams.ledger_client import LedgerClient

_log = logging.getLogger("pora.streams.reader")

Start = Position | Literal["end"] | None


def _first_position(doc: StreamDocument) -> Position:
    return Position(doc.first_seq, 0)


async def _open_reader(client: LedgerClient, segment: Segment) -> LedgerReader:
    """A reader of the segment's ledger that never fences it; a CLOSED segment's
    entries, up to the end the document fixes, were acknowledged, whatever LAC the
    nodes know of yet."""
    reader = await client.open_ledger(segment.ledger_id, recover=False)
    if segment.state is SegmentState.CLOSED:
        reader.learn_lac(segment.last_entry_id)
    return reader


async def end_position(client: LedgerClient, doc: StreamDocument) -> Position:
    """The position the next acknowledged entry will have (for all the writer
    knows): after the OPEN segment's LAC, or the next segment's first."""
    current = doc.open_segment
    if current is None:
        return Position(doc.next_seq, 0)
    reader = await _open_reader(client, current)
    try:
        return Position(current.seq, reader.last_add_confirmed + 1)
    finally:
        await reader.aclose()


async def _bounds(
    client: LedgerClient,
    doc: StreamDocument,
    from_: Start,
    to: Position | None,
    as_of_commit: int | None,
) -> tuple[Position, Position]:
    """Where a read of `doc` starts and stops (exclusive)."""
    if as_of_commit is not None and as_of_commit > doc.commit:
        raise InvalidArgument(
            f"as_of_commit={as_of_commit} is past stream {doc.name!r}'s commit {doc.commit}"
        )
    start = await _resolve(client, doc, from_)
    stop = to if to is not None else await end_position(client, doc)
    return start, stop


async def read_stream(
    client: LedgerClient,
    record: StreamRecord,
    from_: Start,
    to: Position | None,
    as_of_commit: int | None = None,
) -> AsyncIterator[tuple[Position, bytes]]:
    doc = (await record.read()).value
    start, stop = await _bounds(client, doc, from_, to, as_of_commit)
    position = start
    at: Segment | None = None  # the segment being read
    try:
        async for segment in record.segments_from(doc, start.segment):
            # segment commits increase with seq: those of commits up to n are a prefix
            if Position(segment.seq, 0) >= stop or (
                as_of_commit is not None and segment.commit > as_of_commit
            ):
                break
            first = start.entry if segment.seq == start.segment else 0
            position = Position(segment.seq, first)
            at = segment
            if segment.lost:
                raise entries_lost(record.name, segment)
            reader = await _open_reader(client, segment)
            try:
                last = segment.last_entry_id
                if segment.state is SegmentState.OPEN:
                    last = reader.last_add_confirmed
                if segment.seq == stop.segment:
                    last = min(last, stop.entry - 1)
                if first > last:
                    continue
                async for entry_id, payload in reader.read_entries(first, last):
                    position = Position(segment.seq, entry_id + 1)
                    yield Position(segment.seq, entry_id), payload
            finally:
                await reader.aclose()
    except (NoSuchLedger, NoSuchStream) as error:
        await _raise_if_truncated(record, position, error)
        if isinstance(error, NoSuchLedger) and at is not None:
            await _raise_if_lost(client, record, at, error)
        raise


@dataclass(frozen=True)
class SegmentExtent:
    """The entries `first_entry..last_entry` (inclusive) of segment `seq` that a read
    would return, with the whole segment's size as the document records it, for a
    reader planning parallel range reads (the Spark reader's partitions)."""

    seq: int
    first_entry: int
    last_entry: int
    #: a CLOSED segment's entries and payload bytes; None for the OPEN one (growing)
    segment_entries: int | None
    segment_bytes: int | None

    @property
    def entries(self) -> int:
        return self.last_entry - self.first_entry + 1


async def stream_extents(
    client: LedgerClient,
    record: StreamRecord,
    from_: Start,
    to: Position | None,
    as_of_commit: int | None = None,
) -> list[SegmentExtent]:
    """What `read_stream` with the same arguments would read, segment by segment,
    without reading it: the same start (EntriesTruncated for a removed one), the same
    end (the OPEN segment's LAC as of the call), empty segments left out."""
    doc = (await record.read()).value
    start, stop = await _bounds(client, doc, from_, to, as_of_commit)
    extents: list[SegmentExtent] = []
    async for segment in record.segments_from(doc, start.segment):
        if Position(segment.seq, 0) >= stop or (
            as_of_commit is not None and segment.commit > as_of_commit
        ):
            break
        first = start.entry if segment.seq == start.segment else 0
        if segment.lost:
            raise entries_lost(record.name, segment)
        if segment.state is SegmentState.CLOSED:
            last = segment.last_entry_id
            entries: int | None = segment.last_entry_id + 1
            size: int | None = segment.byte_length
        else:
            try:
                reader = await _open_reader(client, segment)
            except NoSuchLedger as error:
                await _raise_if_lost(client, record, segment, error)
                raise
            try:
                last = reader.last_add_confirmed
            finally:
                await reader.aclose()
            entries = size = None
        if segment.seq == stop.segment:
            last = min(last, stop.entry - 1)
        if first <= last:
            extents.append(SegmentExtent(segment.seq, first, last, entries, size))
    return extents


async def _raise_if_truncated(record: StreamRecord, position: Position, error: Exception) -> None:
    """EntriesTruncated when `position` was removed while it was being read (its
    segment's ledger or page deleted by a truncation); returns otherwise."""
    try:
        doc = (await record.read()).value
    except NoSuchStream:
        return
    if doc.is_removed(position):
        raise EntriesTruncated(record.name, position, doc.first_held) from error


async def _raise_if_lost(
    client: LedgerClient, record: StreamRecord, segment: Segment, error: Exception
) -> None:
    """EntriesLost when `segment`'s ledger was deleted outside the stream (its record
    is gone, whether or not a takeover marked it LOST yet) while the stream is still
    there (NoSuchStream when it is not: a stream delete takes its ledgers with it);
    returns otherwise."""
    await record.read()
    try:
        await raise_if_lost(client, record.name, segment)
    except EntriesLost as lost:
        raise lost from error


def _held_start(name: str, doc: StreamDocument, position: Position) -> Position:
    """`position`, or the first held one when it lies just past the removed segments;
    EntriesTruncated when truncation removed it."""
    if doc.is_removed(position):
        raise EntriesTruncated(name, position, doc.first_held)
    return max(position, doc.first_held)


async def _resolve(client: LedgerClient, doc: StreamDocument, from_: Start) -> Position:
    if from_ is None:
        return _first_position(doc)
    if from_ == "end":
        return await end_position(client, doc)
    return _held_start(doc.name, doc, from_)


async def subscribe_stream(
    client: LedgerClient, record: StreamRecord, from_: Start
) -> AsyncIterator[tuple[Position, bytes]]:
    """Every acknowledged entry from `from_` on, in position order, exactly once;
    never ends (NoSuchStream when the stream is deleted)."""
    doc = await record.read()
    next_position = await _resolve(client, doc.value, from_)
    reader: LedgerReader | None = None
    pages = _PageCache(record)
    try:
        while True:
            next_position = _held_start(doc.value.name, doc.value, next_position)
            try:
                segment, reader = await _segment_and_reader(
                    client, pages, doc.value, next_position, reader
                )
            except (NoSuchLedger, NoSuchStream) as error:  # its ledger or page truncated?
                await _raise_if_truncated(record, next_position, error)
                if isinstance(error, NoSuchLedger):
                    await _raise_if_lost_at(client, record, pages, doc.value, next_position, error)
                raise
            if segment is None:
                # a segment not there yet (every held seq below next_seq is listed)
                doc = await record.next_change(doc.version)
                continue
            assert reader is not None  # opened with its segment
            try:
                async for item in _read_segment(segment, reader, next_position):
                    next_position = Position(segment.seq, item[0].entry + 1)
                    yield item
            except NoSuchLedger as error:
                await _raise_if_truncated(record, next_position, error)
                await _raise_if_lost(client, record, segment, error)
                raise
            if next_position.entry <= _readable_through(segment, reader):
                continue
            if segment.state is SegmentState.CLOSED:
                next_position = Position(segment.seq + 1, 0)
                continue
            try:
                doc = await _wait(record, doc, reader, next_position.entry)
            except NoSuchLedger as error:
                await _raise_if_truncated(record, next_position, error)
                await _raise_if_lost(client, record, segment, error)
                raise
    finally:
        if reader is not None:
            with anyio.CancelScope(shield=True):
                await reader.aclose()


async def _segment_and_reader(
    client: LedgerClient,
    pages: _PageCache,
    doc: StreamDocument,
    position: Position,
    reader: LedgerReader | None,
) -> tuple[Segment | None, LedgerReader | None]:
    """The segment holding `position` (None: not there yet) and a reader of its
    ledger (the one given when it reads that ledger)."""
    segment = await pages.segment_at(doc, position.segment)
    if segment is None:
        return None, reader
    if segment.lost:
        raise entries_lost(doc.name, segment)
    if reader is None or reader.ledger_id != segment.ledger_id:
        if reader is not None:
            await reader.aclose()
        reader = None  # closed: not to be closed again if the next open fails
        reader = await _open_reader(client, segment)
    elif segment.state is SegmentState.CLOSED:
        reader.learn_lac(segment.last_entry_id)
    return segment, reader


async def _read_segment(
    segment: Segment, reader: LedgerReader, position: Position
) -> AsyncIterator[tuple[Position, bytes]]:
    last = _readable_through(segment, reader)
    if position.segment == segment.seq and position.entry <= last:
        async for entry_id, payload in reader.read_entries(position.entry, last):
            yield Position(segment.seq, entry_id), payload


class _PageCache:
    """The page a subscriber is reading through (pages never change once named)."""

    def __init__(self, record: StreamRecord) -> None:
        self._record = record
        self._page: SegmentPage | None = None

    async def segment_at(self, doc: StreamDocument, seq: int) -> Segment | None:
        if doc.head_first_seq <= seq < doc.next_seq:
            return doc.segment(seq)
        for ref in doc.pages:
            if ref.first_seq <= seq <= ref.last_seq:
                page = self._page
                if page is None or page.segments[0].seq != ref.first_seq:
                    page = self._page = await self._record.read_page(ref.first_seq)
                return page.segments[seq - ref.first_seq]
        return None


async def _raise_if_lost_at(
    client: LedgerClient,
    record: StreamRecord,
    pages: _PageCache,
    doc: StreamDocument,
    position: Position,
    error: Exception,
) -> None:
    """As `_raise_if_lost`, for the segment holding `position` (if listed)."""
    try:
        segment = await pages.segment_at(doc, position.segment)
    except PoraError:
        return
    if segment is not None:
        await _raise_if_lost(client, record, segment, error)


def _readable_through(segment: Segment, reader: LedgerReader) -> int:
    if segment.state is SegmentState.CLOSED:
        return segment.last_entry_id
    return reader.last_add_confirmed  # a recovery closing it fixes the same end


async def _wait(
    record: StreamRecord, doc: Versioned[StreamDocument], reader: LedgerReader, entry_id: int
) -> Versioned[StreamDocument]:
    """Until the OPEN segment's LAC reaches `entry_id`, its ledger's record changes,
    or the document changes (the segment closed: a rollover, a takeover, a seal)."""
    changed: list[Versioned[StreamDocument]] = []
    #: the first of the two waits to fail (raised alone, not in an ExceptionGroup)
    failed: list[PoraError] = []

    async def watch_document() -> None:
        try:
            changed.append(await record.next_change(doc.version))
        except PoraError as error:  # NoSuchStream: the stream was deleted
            failed.append(error)
        group.cancel_scope.cancel()

    async def watch_ledger() -> None:
        try:
            await wait_for_progress(reader, entry_id, {})
        except PoraError as error:  # LedgerDeleted: the stream is being deleted
            failed.append(error)
        group.cancel_scope.cancel()

    async with anyio.create_task_group() as group:
        group.start_soon(watch_document)
        group.start_soon(watch_ledger)
    if changed:
        return changed[0]
    if failed:
        if isinstance(failed[0], NoSuchLedger):  # its ledger went first: say which
            await record.read()  # NoSuchStream once the document is gone
        raise failed[0]
    return doc
