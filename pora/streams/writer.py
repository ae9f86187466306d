"""The live writer of a stream (docs/streams.md, "The writer").

Opening it takes the stream over: one compare-and-set bumps the writer epoch (from
then on the earlier writer's compare-and-sets are refused), the earlier writer's
OPEN segment is recovered (its ledger fenced: what it acknowledged stays, its later
appends fail) and, in one more compare-and-set, closed at its recovered last entry
with a new OPEN segment added after it.

Appends go straight to the open segment's `LedgerWriter`. The roller task rolls
over without a stall: it creates the next segment's ledger once the current one is
half full (or half its age), and when it is full it points new appends at that
ledger at once, waits only for the appends already issued to the old one, and closes
the old segment and adds the new one in one compare-and-set. Appends to the new
segment return their position once that compare-and-set took; the old ledger is
closed in the background.

A writer that loses a compare-and-set re-reads the document before deciding: a
moved epoch means it was fenced (WriterFenced, or StreamSealed after a seal);
otherwise it tries again on what it read.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from journal.errors import PoraError
from ledger.errors import LedgerDeleted, LedgerFenced, NoSuchLedger
from pora.client.replication.writer import LedgerWriter
from pora.meta.errors import MetadataTimeout, MetadataVersionConflict, NoSuchLedgerMetadata
from pora.meta.records import LedgerState, Versioned
from pora.streams.document import (
    Segment,
    StreamDocument,
    StreamState,
    add_segment,
    close_segment,
    lose_segments,
    page_out,
    roll,
    take_over,
)
from pora.streams.errors import NoSuchStream, StreamSealed, WriterFenced
from pora.streams.lost import ledger_deleted, log_lost
from pora.streams.position import Position
from pora.streams.records import StreamRecord
from pora.streams.removal import why_kept

if TYPE_CHECKING:
    from pora.streams.ledger_client import LedgerClient

_log = logging.getLogger("pora.streams.writer")

#: the custom metadata key naming the stream a segment's ledger belongs to (the
#: cluster tools can tell a stream's ledgers, and its orphans, from others)
STREAM_KEY = "pora.stream"
#: the next segment's ledger is created once the current one reaches this share of
#: its size or age
_PREPARE_AT = 0.5
#: what ends a writer for good: closing it then has nothing to do (a segment whose
#: ledger was deleted outside the stream has nothing left to close)
_ENDED = (WriterFenced, StreamSealed, NoSuchStream, LedgerDeleted)
#: how long a writer whose ledger was fenced watches the document for the reason (a
#: seal recovers the segment, then writes the document)
_FENCE_SETTLE_S = 10.0
#: after the next segment's ledger could not be created, the writer tries again after
_SPARE_RETRY_S = 1.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _holds(doc: StreamDocument, ledger: LedgerWriter) -> bool:
    return any(segment.ledger_id == ledger.ledger_id for segment in doc.segments)


@dataclass(eq=False)
class _Segment:
    """The writer's view of one of its segments."""

    seq: int
    writer: LedgerWriter
    opened_at: float
    #: set once the segment is in the document; None when it already was at creation
    visible: anyio.Event | None = None
    #: why appends waiting for `visible` fail (the compare-and-set adding it failed)
    error: PoraError | None = None
    appended: int = 0  # entries issued to it
    byte_length: int = 0  # payload bytes issued to it
    in_flight: int = 0  # append calls not returned yet
    drained: anyio.Event = field(default_factory=anyio.Event)
    draining: bool = False


async def recover_segment_ledger(client: LedgerClient, ledger_id: int) -> tuple[int, int]:
    """Recover (fence and close) a segment's ledger: its (last entry, byte length)."""
    reader = await client.open_ledger(ledger_id, recover=True)
    try:
        return reader.metadata.last_entry_id, reader.metadata.length
    finally:
        await reader.aclose()


async def recover_or_lost(
    client: LedgerClient, stream: str, seq: int, ledger_id: int
) -> tuple[int, int] | None:
    """Recover a segment's ledger: its (last entry, byte length), or None when the
    ledger was deleted outside the stream (the segment is LOST: docs/streams.md, "Lost
    segments"; logged). Any other failure is raised."""
    try:
        return await recover_segment_ledger(client, ledger_id)
    except NoSuchLedger:
        if not await ledger_deleted(client, ledger_id):
            raise
    log_lost(stream, seq, ledger_id)
    return None


class StreamWriter:
    """Returned by `Stream.open_writer()`; use it as an async context manager."""

    def __init__(self, client: LedgerClient, record: StreamRecord) -> None:
        self._client = client
        self._record = record
        self.stream = record.name
        self._doc: Versioned[StreamDocument] | None = None
        self.epoch = 0
        self._segment: _Segment | None = None
        self._spare: LedgerWriter | None = None
        self._error: PoraError | None = None
        #: set when the open segment's bytes pass `_threshold` (the roller waits on it)
        self._grew = anyio.Event()
        self._threshold = math.inf
        self._roll_lock = anyio.Lock()
        self._closed = False
        self._recovered: tuple[int, int] | None = None
        #: the earlier segments the takeover found LOST (their ledgers deleted)
        self._lost: tuple[int, ...] = ()
        self._tasks_cm: anyio.abc.TaskGroup | None = None
        self._tasks: anyio.abc.TaskGroup | None = None
        self._roller = anyio.CancelScope()

    # -- opening: the takeover ----------------------------------------------------------

    async def _open(self) -> None:
        doc = await self._record.read()
        while True:
            if doc.value.state is StreamState.SEALED:
                raise StreamSealed(self.stream)
            try:
                doc = await self._record.write(take_over(doc.value), doc.version)
                break
            except (MetadataVersionConflict, MetadataTimeout):
                doc = await self._record.read()
        self.epoch = doc.value.writer_epoch
        self._doc = doc
        await self._close_earlier_segments(doc.value)
        ledger = await self._new_ledger()
        try:
            await self._add_own_segment(ledger)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._discard_unless_named(ledger)
            raise
        assert self._doc is not None
        seq = self._doc.value.writer_segment
        assert seq is not None
        self._segment = _Segment(seq, ledger, time.monotonic())

    async def _close_earlier_segments(self, doc: StreamDocument) -> None:
        """Recover the earlier writer's OPEN segment, and the segment before it if its
        ledger was never closed (a writer that stopped right after a rollover): readers
        then find every ledger closed at the end the document names."""
        # the segments before the OPEN one (those of commits made meanwhile, after it,
        # were closed by their committer)
        before = doc.next_seq if doc.writer_segment is None else doc.writer_segment
        closed = [s for s in doc.segments if s.seq < before]
        if closed and not closed[-1].lost:
            last = closed[-1]
            try:
                record = await self._client.store.read_ledger(last.ledger_id)
                if record.value.state is not LedgerState.CLOSED:
                    await recover_segment_ledger(self._client, last.ledger_id)
            except (NoSuchLedgerMetadata, NoSuchLedger):
                if not await ledger_deleted(self._client, last.ledger_id):
                    raise
                await self._lost_unless_truncated(last)
        current = doc.open_segment
        if current is not None:
            self._recovered = await recover_or_lost(
                self._client, self.stream, current.seq, current.ledger_id
            )
            if self._recovered is None:
                self._lost += (current.seq,)

    async def _lost_unless_truncated(self, segment: Segment) -> None:
        """`segment`'s ledger has no record: LOST (deleted outside the stream), unless a
        truncation removed the segment meanwhile (it deletes the ledgers it removes,
        and this takeover does not hold it back)."""
        doc = (await self._record.read()).value
        if any(s.seq == segment.seq for s in doc.segments):
            log_lost(self.stream, segment.seq, segment.ledger_id)
            self._lost += (segment.seq,)

    async def _update(
        self,
        change: Callable[[StreamDocument], StreamDocument | None],
        took: Callable[[StreamDocument], bool] = lambda doc: False,
    ) -> None:
        """Compare-and-set `change(document)` (None: nothing to do); on a conflict or a
        timeout re-read first, then decide again (`change` raises when the epoch
        moved). `took(document)` says a timed-out write did take."""
        assert self._doc is not None
        doc = self._doc
        while True:
            new = change(doc.value)
            if new is None:
                return
            try:
                self._doc = await self._record.write(new, doc.version)
            except (MetadataVersionConflict, MetadataTimeout):
                doc = await self._record.read()
                if took(doc.value):
                    self._doc = doc
                    return
            else:
                return

    async def _add_own_segment(self, ledger: LedgerWriter) -> None:
        """The earlier OPEN segment (if any) closed at its recovered end, and `ledger`
        added as ours."""

        def change(doc: StreamDocument) -> StreamDocument:
            self._check_epoch(doc)
            if self._lost:  # the OPEN one among them is closed so
                doc = lose_segments(doc, self.epoch, self._lost, _now_ms())
            if doc.writer_segment is not None:
                assert self._recovered is not None  # only our epoch changes segments
                last, length = self._recovered
                doc = close_segment(doc, self.epoch, last, length, _now_ms())
            return add_segment(doc, self.epoch, ledger.ledger_id, _now_ms())

        await self._update(change, lambda doc: self._owns(doc, ledger))

    def _owns(self, doc: StreamDocument, ledger: LedgerWriter) -> bool:
        return doc.writer_epoch == self.epoch and _holds(doc, ledger)

    def _check_epoch(self, doc: StreamDocument) -> None:
        if doc.state is StreamState.SEALED:
            raise StreamSealed(self.stream)
        if doc.writer_epoch != self.epoch:
            raise WriterFenced(self.stream, self.epoch, doc.writer_epoch)

    async def _new_ledger(self) -> LedgerWriter:
        assert self._doc is not None
        config = self._doc.value.config
        return await self._client.create_ledger(
            config.ensemble_size,
            config.write_quorum,
            config.ack_quorum,
            custom_metadata={STREAM_KEY: self.stream.encode()},
        )

    async def _discard_unless_named(self, ledger: LedgerWriter) -> None:
        """A ledger whose adding failed: deleted unless the document may name it
        (`why_kept`); such a ledger is closed and left to the next takeover, or to
        `pora stream gc` when no document names it."""
        why = await why_kept(self._record, ledger.ledger_id)
        if why is None:
            await self._discard(ledger)
            return
        _log.warning(
            "stream %r: ledger %d is not deleted: %s; closed and left to the next "
            "takeover or `pora stream gc`",
            self.stream,
            ledger.ledger_id,
            why,
        )
        await self._close_in_background(ledger)

    async def _discard(self, ledger: LedgerWriter) -> None:
        """A ledger no document names (a spare, or one whose adding failed): deleted,
        best effort (what is left is garbage for the cluster tools)."""
        try:
            await ledger.close()
            await self._client.delete_ledger(ledger.ledger_id)
        except (PoraError, OSError) as error:
            _log.warning(
                "stream %r: ledger %d is in no segment and could not be deleted (%s): "
                "garbage for the cluster tools",
                self.stream,
                ledger.ledger_id,
                error,
            )

    # -- appending ----------------------------------------------------------------------

    async def append(self, payload: bytes) -> Position:
        """Append one entry; its position once acknowledged (Qa replicas). WriterFenced
        once a newer writer took over, StreamSealed once the stream is sealed."""
        segment = self._take(1, len(payload))
        try:
            entry_id = await segment.writer.append(payload)
        except LedgerFenced as fenced:
            raise await self._why_fenced(fenced) from fenced
        finally:
            self._returned(segment)
        if segment.visible is not None or segment.error is not None:
            await self._visible(segment)  # a segment added by a rollover
        return Position(segment.seq, entry_id)

    async def append_many(self, payloads: Sequence[bytes]) -> list[Position]:
        """Append entries in order (all to one segment); their positions once all are
        acknowledged."""
        segment = self._take(len(payloads), sum(len(payload) for payload in payloads))
        try:
            entry_ids = await segment.writer.append_many(payloads)
        except LedgerFenced as fenced:
            raise await self._why_fenced(fenced) from fenced
        finally:
            self._returned(segment)
        if segment.visible is not None or segment.error is not None:
            await self._visible(segment)  # a segment added by a rollover
        return [Position(segment.seq, entry_id) for entry_id in entry_ids]

    def _take(self, entries: int, payload_bytes: int) -> _Segment:
        """The segment the next `entries` appends go to, counted in flight there (a
        rollover waits for them) and toward its size (past the threshold, the roller
        makes the next segment ready)."""
        segment = self._segment
        if segment is None or self._error is not None:
            raise self._unusable()
        segment.in_flight += 1
        segment.appended += entries
        segment.byte_length += payload_bytes
        if segment.byte_length >= self._threshold:
            self._grew.set()
        return segment

    def _returned(self, segment: _Segment) -> None:
        segment.in_flight -= 1
        if segment.draining and segment.in_flight == 0:
            segment.drained.set()

    async def _visible(self, segment: _Segment) -> None:
        event = segment.visible
        if event is not None:
            await event.wait()
        if segment.error is not None:
            raise segment.error

    def _unusable(self) -> PoraError | RuntimeError:
        if self._error is not None:
            return self._error
        return RuntimeError(
            f"the writer of stream {self.stream!r} is not open: use it inside "
            "`async with stream.open_writer() as writer`"
        )

    async def _why_fenced(self, fenced: LedgerFenced) -> PoraError:
        """A segment's ledger was fenced: re-read the document to tell a takeover
        (WriterFenced), a seal (StreamSealed) or a delete (NoSuchStream) from anything
        else (LedgerFenced). A seal fences the ledger before its compare-and-set, so a
        document that shows neither yet is watched for a while before the answer is
        LedgerFenced. A ledger deleted under a stream that is still there was deleted
        outside the stream (no takeover nor seal deletes the ledger it fences): that
        ends the writer at once."""
        if self._error is not None:
            return self._error
        try:
            record = await self._record.read()
            if isinstance(fenced, LedgerDeleted) and self._why(record.value) is None:
                self._error = fenced
                _log.error(
                    "stream %r: the ledger of the writer's segment was deleted outside the "
                    "stream (%s); the writer ends, and its segment's entries are gone",
                    self.stream,
                    fenced,
                )
                return fenced
            with anyio.move_on_after(_FENCE_SETTLE_S):
                while self._why(record.value) is None:
                    record = await self._record.next_change(record.version)
        except NoSuchStream as gone:  # deleted: its ledgers go with it
            self._error = gone
            return gone
        except PoraError as error:
            _log.info("stream %r: re-reading after a fence: %s", self.stream, error)
            return fenced
        self._error = self._why(record.value)
        return self._error or fenced

    def _why(self, doc: StreamDocument) -> PoraError | None:
        if doc.state is StreamState.SEALED:
            return StreamSealed(self.stream)
        if doc.writer_epoch != self.epoch:
            return WriterFenced(self.stream, self.epoch, doc.writer_epoch)
        return None

    # -- rollover -----------------------------------------------------------------------

    async def _run_roller(self) -> None:
        """Prepare the next segment's ledger at half the limits, roll at the limits;
        forever (the writer's close cancels it between rollovers)."""
        assert self._doc is not None
        config = self._doc.value.config
        while True:
            segment = self._segment
            if segment is None:  # closed before the roller began
                return
            await self._wait_until(
                segment, _PREPARE_AT, config.segment_bytes_max, config.segment_age_s_max
            )
            while self._spare is None:
                await self._prepare_spare()
            await self._wait_until(segment, 1.0, config.segment_bytes_max, config.segment_age_s_max)
            if segment.appended == 0:
                # an idle writer does not leave a trail of empty segments behind it:
                # its segment's age counts from now
                segment.opened_at = time.monotonic()
                continue
            async with self._roll_lock:
                if self._closed or self._error is not None:
                    return
                await self._roll(segment)
                if self._error is not None:
                    return
                await self._page_out()

    async def _prepare_spare(self) -> None:
        """Create the next segment's ledger; after a failure (no nodes, no store) the
        writer goes on in its segment, past its limits, and tries again a little
        later."""
        try:
            # a close waits for a creation under way: no ledger is left unnamed
            with anyio.CancelScope(shield=True):
                self._spare = await self._new_ledger()
        except PoraError as error:
            _log.warning(
                "stream %r: the next segment's ledger could not be created (%s); "
                "trying again in %.1f s",
                self.stream,
                error,
                _SPARE_RETRY_S,
            )
            await anyio.sleep(_SPARE_RETRY_S)

    async def _wait_until(
        self, segment: _Segment, share: float, bytes_max: int, age_s_max: float
    ) -> None:
        """Until the segment holds `share` of its byte limit or reaches `share` of its
        age limit."""
        self._threshold = share * bytes_max
        deadline = segment.opened_at + share * age_s_max
        while segment.byte_length < self._threshold:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._grew = anyio.Event()
            with anyio.move_on_after(remaining):
                await self._grew.wait()
        self._threshold = math.inf

    async def _roll(self, old: _Segment) -> None:
        spare = self._spare
        assert spare is not None
        self._spare = None
        # its seq is known once the document names it: appends to it wait for that
        new = _Segment(old.seq + 1, spare, time.monotonic(), visible=anyio.Event())
        self._segment = new  # appends from here on go to the next segment's ledger
        old.draining = True
        if old.in_flight:
            await old.drained.wait()
        error: PoraError | None = None
        if old.writer.last_add_confirmed != old.appended - 1:
            # an append to it failed: the writer cannot say where the segment ends
            error = self._error or PoraError(
                f"stream {self.stream!r}: segment {old.seq} lost an append; open a new "
                "writer (its takeover recovers the segment)"
            )
        else:
            try:
                await self._roll_document(old, spare)
            except PoraError as failed:
                error = failed
            else:
                # the seq the document gave it: past old.seq + 1 when a transaction
                # committed while the old segment was OPEN (its segments came first)
                assert self._doc is not None
                seq = self._doc.value.writer_segment
                assert seq is not None
                new.seq = seq
        event = new.visible
        assert event is not None
        if error is not None:
            self._error = new.error = error
        new.visible = None
        event.set()
        if error is not None:
            # no document names the new segment: what was appended to it is not in
            # the stream (those appends fail with `error`), and its ledger goes
            self._client_tasks().start_soon(self._discard_unless_named, spare)
            return
        self._client_tasks().start_soon(self._close_in_background, old.writer)

    async def _roll_document(self, old: _Segment, spare: LedgerWriter) -> None:
        def change(doc: StreamDocument) -> StreamDocument:
            self._check_epoch(doc)
            last = old.appended - 1
            return roll(doc, self.epoch, last, old.byte_length, spare.ledger_id, _now_ms())

        await self._update(change, lambda doc: self._owns(doc, spare))

    async def _page_out(self) -> None:
        """Keep the head document small: once it holds more than HEAD_SEGMENTS_MAX
        segments, the oldest go to a page document (stored first), then the head drops
        them and names the page (compare-and-set). A failure leaves the head as it was
        (a page no head names is replaced on the next attempt)."""
        assert self._doc is not None
        split = page_out(self._doc.value)
        if split is None:
            return
        page = split[0]

        def change(doc: StreamDocument) -> StreamDocument | None:
            self._check_epoch(doc)
            again = page_out(doc)
            return None if again is None or again[0] != page else again[1]

        try:
            await self._record.store_page(page)
            await self._update(change)
        except (WriterFenced, StreamSealed):
            return  # the writer learns it on its next append
        except PoraError as error:
            _log.warning("stream %r: paging out old segments: %s", self.stream, error)

    def _client_tasks(self) -> anyio.abc.TaskGroup:
        assert self._tasks is not None
        return self._tasks

    async def _close_in_background(self, ledger: LedgerWriter) -> None:
        try:
            await ledger.close()
        except (PoraError, OSError) as error:
            # the document fixes its end already; a takeover recovers it if need be
            _log.info("stream %r: closing ledger %d: %s", self.stream, ledger.ledger_id, error)

    # -- the context manager --------------------------------------------------------------

    async def __aenter__(self) -> StreamWriter:
        await self._open()
        # the roller and the background closes run in the writer's own task group
        self._tasks_cm = anyio.create_task_group()
        self._tasks = await self._tasks_cm.__aenter__()
        self._tasks.start_soon(self._roller_in_scope)
        return self

    async def _roller_in_scope(self) -> None:
        with self._roller:
            await self._run_roller()

    async def __aexit__(self, *exc_info: object) -> bool:
        try:
            with anyio.CancelScope(shield=True):
                await self.close()
        finally:
            assert self._tasks_cm is not None
            await self._tasks_cm.__aexit__(None, None, None)
        return False

    async def close(self) -> None:
        """Close the open segment's ledger and mark it CLOSED in the document. A fenced
        writer has nothing to close (its segment belongs to the newer writer), nor has
        the writer of a sealed or deleted stream."""
        async with self._roll_lock:
            if self._closed:
                return
            self._closed = True
            self._roller.cancel()
        segment, self._segment = self._segment, None  # later appends: RuntimeError
        spare, self._spare = self._spare, None
        if spare is not None:
            await self._discard(spare)
        if segment is None or isinstance(self._error, _ENDED):
            return
        try:
            await segment.writer.close()
        except LedgerFenced as fenced:
            error = await self._why_fenced(fenced)
            if isinstance(error, _ENDED):
                return
            raise
        await self._close_document(segment)

    async def _close_document(self, segment: _Segment) -> None:
        metadata = segment.writer.metadata

        def change(doc: StreamDocument) -> StreamDocument | None:
            if doc.writer_epoch != self.epoch or doc.writer_segment != segment.seq:
                return None  # a newer writer (or a seal) closed it already
            return close_segment(
                doc, self.epoch, metadata.last_entry_id, metadata.length, _now_ms()
            )

        await self._update(change)
