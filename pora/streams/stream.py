"""`Stream` and the client's stream calls (create, open, list, delete); see
docs/streams.md. The decisions are in document.py; this module reads and writes the
documents and the segments' ledgers."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ledger.errors import InvalidArgument, InvalidArgumentType
from pora.client.replication.arguments import is_int
from pora.meta.errors import DocumentExists, MetadataVersionConflict, NoSuchDocument
from pora.streams.cursors import (
    Cursor,
    CursorRecord,
    CursorState,
    cursor_states,
)
from pora.streams.document import (
    STREAMS_SPACE,
    PageRef,
    Segment,
    StreamConfig,
    StreamDocument,
    StreamState,
    change_attributes,
    check_stream_name,
    close_segment,
    decode_document,
    encode_document,
    lose_segments,
    new_stream,
    seal,
    take_over,
    truncate,
)
from pora.streams.errors import NoSuchStream, StreamDeleting, StreamExists
from pora.streams.position import Position
from pora.streams.reader import (
    SegmentExtent,
    Start,
    read_stream,
    stream_extents,
    subscribe_stream,
)
from pora.streams.records import StreamRecord
from pora.streams.removal import delete_removed
from pora.streams.retention import trim_count, wholly_before
from pora.streams.stream_attributes import check_changes
from pora.streams.transaction import Transaction, collect_abandoned, resume_transaction
from pora.streams.transaction_fields import PendingTransaction, check_transaction_id
from pora.streams.writer import StreamWriter, recover_or_lost

if TYPE_CHECKING:
    from pora.streams.ledger_client import LedgerClient

#: stream names read per page by `list_streams`
_LIST_PAGE = 1000


@dataclass(frozen=True)
class StreamInfo:
    """What `Client.list_streams` and `Stream.info` tell of a stream."""

    name: str
    config: StreamConfig
    state: StreamState
    commit: int
    #: the recent segments (the head's); older ones are in `pages`
    segments: tuple[Segment, ...]
    pages: tuple[PageRef, ...]
    writer_epoch: int
    #: the first position the stream still holds (truncation removed what is before)
    first_held: Position
    #: the pending transactions, by creation (their segments invisible until committed)
    transactions: tuple[PendingTransaction, ...] = ()
    #: when the stream was created (ms since the epoch): a stream deleted and created
    #: again under its name has another, so a position kept from the first (a
    #: reader's checkpoint) can be told from one of the second
    created_ms: int = 0
    #: the seq the next segment will get: every position of the stream is below
    #: Position(next_seq, 0)
    next_seq: int = 0

    @classmethod
    def of(cls, doc: StreamDocument) -> StreamInfo:
        return cls(
            doc.name,
            doc.config,
            doc.state,
            doc.commit,
            doc.segments,
            doc.pages,
            doc.writer_epoch,
            doc.first_held,
            doc.transactions,
            doc.created_ms,
            doc.next_seq,
        )


class Stream:
    """A named stream: `open_writer`, `read`, `subscribe`, `seal`."""

    def __init__(self, client: LedgerClient, name: str) -> None:
        self._client = client
        self.name = name
        self._record = StreamRecord(client.store, name)

    def __repr__(self) -> str:
        return f"Stream({self.name!r})"

    async def info(self) -> StreamInfo:
        return StreamInfo.of((await self._record.read()).value)

    def open_writer(self) -> StreamWriter:
        """The stream's live writer, for an `async with` block: entering it fences any
        earlier writer (its open segment recovered and closed: what it acknowledged
        stays; its later appends fail with WriterFenced); leaving it closes the
        writer's segment. StreamSealed for a sealed stream."""
        return StreamWriter(self._client, self._record)

    def read(
        self, from_: Start = None, to: Position | None = None, as_of_commit: int | None = None
    ) -> AsyncIterator[tuple[Position, bytes]]:
        """(position, payload) from `from_` (None: the beginning, "end": the end) up to
        `to` (exclusive; None: the end as of the call), acknowledged entries only; with
        `as_of_commit=n`, only the segments of commits up to n."""
        self._check_read_arguments(to, as_of_commit)
        return read_stream(self._client, self._record, _checked_start(from_), to, as_of_commit)

    @staticmethod
    def _check_read_arguments(to: object, as_of_commit: object) -> None:
        if to is not None and not isinstance(to, Position):
            raise InvalidArgumentType(
                f"to must be a pora.Position or None, not {type(to).__name__}"
            )
        if as_of_commit is not None:
            if not is_int(as_of_commit):
                raise InvalidArgumentType(
                    f"as_of_commit must be an int or None, not {type(as_of_commit).__name__}"
                )
            assert isinstance(as_of_commit, int)
            if as_of_commit < 0:
                raise InvalidArgument(f"as_of_commit={as_of_commit} must be 0 or above")

    async def extents(
        self, from_: Start = None, to: Position | None = None, as_of_commit: int | None = None
    ) -> list[SegmentExtent]:
        """What `read` with these arguments would read, per segment (seq, its first and
        last entry, the segment's entries and bytes when CLOSED), without reading it:
        for planning range reads in parallel, each then a `read(from_, to)`."""
        self._check_read_arguments(to, as_of_commit)
        return await stream_extents(
            self._client, self._record, _checked_start(from_), to, as_of_commit
        )

    def begin(self, txn_id: str | None = None) -> Transaction:
        """A new transaction, for `async with` (it begins on entry; `await
        txn.begin()` without the block): commits on a clean exit, aborts on an
        exception. `txn_id` (32 hex digits) lets cooperating processes that cannot
        pass an id around derive the same one: beginning a transaction already pending
        joins it."""
        if txn_id is not None:
            txn_id = check_transaction_id(txn_id)
        return Transaction(self._client, self._record, txn_id, begun=False)

    async def attributes(self) -> dict[str, str]:
        """The stream's attributes: the application's own strings by key."""
        return dict((await self._record.read()).value.attributes)

    async def set_attributes(
        self,
        changes: Mapping[str, str | None],
        expected: Mapping[str, str | None] | None = None,
    ) -> dict[str, str]:
        """Apply `changes` (a value of None removes the key) with one compare-and-set,
        if each key of `expected` has the value given (None: absent), and return the
        attributes after; AttributesChanged when one differs (nothing is changed)."""
        checked = check_changes(changes, "changes")
        wanted = check_changes(expected or {}, "expected")
        doc = await self._record.change(lambda d: change_attributes(d, checked, wanted))
        return dict(doc.value.attributes)

    async def resume(self, txn_id: str) -> Transaction:
        """The pending transaction `txn_id` (its `id`, from any process);
        TransactionAborted when it is not pending."""
        return await resume_transaction(self._client, self._record, txn_id)

    async def collect_abandoned_transactions(self, idle_s: float | None = None) -> list[str]:
        """Abort the pending transactions idle (no open_segment or commit attempt) for
        `idle_s` seconds (None: the stream's txn_idle_s_max); their ids."""
        return await collect_abandoned(self._client, self._record, idle_s)

    def subscribe(self, from_: Start = None) -> AsyncIterator[tuple[Position, bytes]]:
        """(position, payload) from `from_` on as they are acknowledged, across
        rollovers and takeovers, each once and in order; never ends (NoSuchStream when
        the stream is deleted)."""
        return subscribe_stream(self._client, self._record, _checked_start(from_))

    async def seal(self) -> None:
        """End the stream for writers: the live writer's segment is recovered and
        closed first (that writer then gets StreamSealed); sealing a sealed stream
        returns."""
        record = await self._record.read()
        while record.value.state is StreamState.ACTIVE:
            doc = take_over(record.value)  # the live writer's changes are refused from now
            current = doc.open_segment
            if current is not None:
                now_ms = int(time.time() * 1000)
                end = await recover_or_lost(self._client, self.name, current.seq, current.ledger_id)
                if end is None:  # its ledger was deleted outside the stream
                    doc = lose_segments(doc, doc.writer_epoch, (current.seq,), now_ms)
                else:
                    doc = close_segment(doc, doc.writer_epoch, *end, now_ms)
            try:
                await self._record.write(seal(doc), record.version)
            except MetadataVersionConflict:
                record = await self._record.read()
            else:
                return

    async def cursor(self, name: str) -> Cursor:
        """The cursor `name` of this stream, created when there is none: a durable
        reader position that starts at the first position the stream holds and pins
        retention from there (NoSuchStream when the stream does not exist)."""
        record = CursorRecord(self._client.store, self.name, check_stream_name(name, "cursor name"))
        while True:
            doc = (await self._record.read()).value
            made = await record.create(doc.first_held)
            if made is None:
                return Cursor(self, record)
            # a delete that marked the stream meanwhile may have listed the cursors
            # before this one was made, and a stream created again meanwhile starts
            # elsewhere: a cursor made so would outlive its stream or start wrong
            try:
                again = (await self._record.read()).value
            except NoSuchStream:
                await record.delete_made(made)
                raise
            if again.created_ms == doc.created_ms:
                return Cursor(self, record)
            await record.delete_made(made)  # made again from the new stream

    async def cursors(self) -> list[CursorState]:
        """Every cursor of this stream (its name and the position it reads next), by
        name."""
        return [state async for state in cursor_states(self._client.store, self.name)]

    async def truncate(self, before: Position) -> Position:
        """Remove the whole segments wholly before `before` (never the open one):
        the document first, by compare-and-set, then their ledgers, best effort.
        Readers asking for what was removed get EntriesTruncated. Returns the first
        position still held. Cursors do not hold a truncation back."""
        if not isinstance(before, Position):
            raise InvalidArgumentType(
                f"before must be a pora.Position, not {type(before).__name__}"
            )
        return await self._remove(lambda doc, held, cursors: wholly_before(held, before))

    async def trim(self) -> Position:
        """Apply the stream's retention (`retention_s`, `retention_bytes`): remove the
        oldest CLOSED segments past them, but none a cursor still needs unless the hard
        limits (`retention_s_max`, `retention_bytes_max`) say so. Returns the first
        position still held."""

        def count(doc: StreamDocument, held: tuple[Segment, ...], cursors: list[Position]) -> int:
            return trim_count(held, doc.config, _now_ms(), cursors)

        return await self._remove(count, read_cursors=True)

    async def _remove(
        self,
        count: Callable[[StreamDocument, tuple[Segment, ...], list[Position]], int],
        read_cursors: bool = False,
    ) -> Position:
        while True:
            record = await self._record.read()
            doc = record.value
            held = tuple([s async for s in self._record.segments_from(doc, doc.first_seq)])
            cursors = []
            if read_cursors:
                states = cursor_states(self._client.store, self.name)
                cursors = [state.next_position async for state in states]
            removed = held[: count(doc, held, cursors)]
            if not removed:
                return doc.first_held
            changed = truncate(doc, removed)
            try:
                await self._record.write(changed, record.version)
            except MetadataVersionConflict:
                continue  # a writer or another trim changed it: decide again
            break
        await delete_removed(self._client, doc, changed, removed)
        return changed.first_held


def _now_ms() -> int:
    """The wall clock in ms: segments' close times are wall-clock times."""
    return int(time.time() * 1000)


def _checked_start(from_: object) -> Start:
    if from_ is None or isinstance(from_, Position):
        return from_
    if isinstance(from_, str):
        if from_ == "end":
            return "end"
        raise InvalidArgument(
            f"from_={from_!r}: give a pora.Position, 'end' or None (the beginning); "
            "a position as text goes through Position.parse"
        )
    raise InvalidArgumentType(
        f"from_ must be a pora.Position, 'end' or None, not {type(from_).__name__}"
    )


async def create_stream(client: LedgerClient, name: str, config: StreamConfig) -> Stream:
    doc = new_stream(check_stream_name(name), config, int(time.time() * 1000))
    try:
        await client.store.create_document(STREAMS_SPACE, name, encode_document(doc))
    except DocumentExists as taken:
        if await _delete_unfinished(client, name):
            raise StreamDeleting(name) from taken
        raise StreamExists(name) from taken
    return Stream(client, name)


async def _delete_unfinished(client: LedgerClient, name: str) -> bool:
    """Whether the document holding `name` is one a delete marked and did not finish."""
    try:
        return (await StreamRecord(client.store, name).read_marked()).value.deleting
    except NoSuchStream:
        return False  # deleted meanwhile: the name is free, but this create lost its race


async def open_stream(client: LedgerClient, name: str) -> Stream:
    await StreamRecord(client.store, check_stream_name(name)).read()  # NoSuchStream
    return Stream(client, name)


async def list_streams(client: LedgerClient) -> AsyncIterator[StreamInfo]:
    """Every stream, by name (a page of names at a time; one deleted meanwhile is
    left out)."""
    after = ""
    while True:
        names = await client.store.list_documents(STREAMS_SPACE, after=after, limit=_LIST_PAGE)
        for name in names:
            try:
                record = await client.store.read_document(STREAMS_SPACE, name)
            except NoSuchDocument:
                continue
            doc = decode_document(record.value)
            if not doc.deleting:  # a marked stream is gone
                yield StreamInfo.of(doc)
        if len(names) < _LIST_PAGE:
            return
        after = names[-1]
