"""Cursors: durable, named reader positions of a stream (docs/streams.md, "Cursors").

Each cursor is a document of its own in space "stream-cursors", named
"STREAM/CURSOR", not a field of the stream's document: acks are frequent, and in
the stream document each would contend with the live writer's compare-and-sets on
the head (and grow it). A cursor holds the position it reads from next: acking moves
it forward by compare-and-set, never back. `trim` reads every cursor of the stream
to learn what they still need.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from journal.errors import PoraError
from ledger.errors import InvalidArgumentType
from pora.meta.errors import (
    DocumentExists,
    InvalidMetadata,
    MetadataVersionConflict,
    NoSuchDocument,
)
from pora.meta.records import Versioned
from pora.meta.store import MetadataStore
from pora.streams.document import check_stream_name
from pora.streams.document_codec import decoded_int
from pora.streams.errors import NoSuchCursor
from pora.streams.position import Position
from pora.streams.reader import Start

#: the metadata store's space for cursors (named "STREAM/CURSOR")
CURSORS_SPACE = "stream-cursors"
CURSOR_FORMAT_VERSION = 1
_LIST_PAGE = 1000


@dataclass(frozen=True)
class CursorState:
    """A cursor as stored: it reads next from `next_position` (everything before it
    was acked, or was there before the cursor was created)."""

    stream: str
    name: str
    next_position: Position
    created_ms: int


def ack_forward(state: CursorState, position: Position) -> CursorState | None:
    """The cursor after acking `position` (it reads next from just after it); None
    when that is not forward (an older ack is ignored, never an error)."""
    return moved_forward(state, Position(position.segment, position.entry + 1))


def moved_forward(state: CursorState, next_position: Position) -> CursorState | None:
    """The cursor reading next from `next_position`; None when that is not forward."""
    if next_position <= state.next_position:
        return None
    return CursorState(state.stream, state.name, next_position, state.created_ms)


def cursor_document_name(stream: str, cursor: str) -> str:
    return f"{stream}/{cursor}"


def encode_cursor(state: CursorState) -> bytes:
    data = {
        "format_version": CURSOR_FORMAT_VERSION,
        "stream": state.stream,
        "name": state.name,
        "next": state.next_position.to_dict(),
        "created_ms": state.created_ms,
    }
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def decode_cursor(data: bytes) -> CursorState:
    try:
        raw: Any = json.loads(data)
        _check_cursor_version(raw["format_version"])
        created = decoded_int(raw["created_ms"])
        return CursorState(
            check_stream_name(raw["stream"]),
            check_stream_name(raw["name"]),
            Position.from_dict(raw["next"]),
            created,
        )
    except InvalidMetadata:
        raise
    except (ValueError, TypeError, KeyError, ArithmeticError) as error:
        raise InvalidMetadata(f"cursor document is malformed: {error!r}") from error
    except PoraError as error:  # InvalidArgument from the position or a name
        raise InvalidMetadata(f"cursor document is malformed: {error}") from error


def _check_cursor_version(version: object) -> None:
    if version != CURSOR_FORMAT_VERSION:
        raise InvalidMetadata(
            f"cursor format version {version!r} is not {CURSOR_FORMAT_VERSION}: "
            "a newer Pora wrote it; upgrade this client"
        )


class CursorRecord:
    """One cursor's document: reads decode it, writes are compare-and-sets."""

    def __init__(self, store: MetadataStore, stream: str, name: str) -> None:
        self.store = store
        self.stream = stream
        self.name = name
        self.document = cursor_document_name(stream, name)

    async def read(self) -> Versioned[CursorState]:
        try:
            record = await self.store.read_document(CURSORS_SPACE, self.document)
        except NoSuchDocument as gone:
            raise NoSuchCursor(self.stream, self.name) from gone
        return Versioned(decode_cursor(record.value), record.version)

    async def create(self, start: Position) -> int | None:
        """The cursor created at `start`: its version, or None when it exists."""
        state = CursorState(self.stream, self.name, start, int(time.time() * 1000))
        try:
            record = await self.store.create_document(
                CURSORS_SPACE, self.document, encode_cursor(state)
            )
        except DocumentExists:
            return None
        return record.version

    async def delete_made(self, version: int) -> None:
        """The cursor this process created (at `version`) deleted, unless it moved
        since or is gone (someone else's then)."""
        with contextlib.suppress(NoSuchDocument, MetadataVersionConflict):
            await self.store.delete_document(CURSORS_SPACE, self.document, version)


async def cursor_states(store: MetadataStore, stream: str) -> AsyncIterator[CursorState]:
    """Every cursor of `stream`, by name (one deleted meanwhile is left out)."""
    prefix = cursor_document_name(stream, "")
    after = prefix
    while True:
        names = await store.list_documents(CURSORS_SPACE, after=after, limit=_LIST_PAGE)
        for name in names:
            if not name.startswith(prefix):
                return
            try:
                record = await store.read_document(CURSORS_SPACE, name)
            except NoSuchDocument:
                continue
            yield decode_cursor(record.value)
        if len(names) < _LIST_PAGE:
            return
        after = names[-1]


class CursorStream(Protocol):
    """What a cursor reads through: its `Stream` (stream.py, which makes cursors
    and so is named here rather than imported)."""

    name: str

    def read(
        self, from_: Start = None, to: Position | None = None, as_of_commit: int | None = None
    ) -> AsyncIterator[tuple[Position, bytes]]: ...

    def subscribe(self, from_: Start = None) -> AsyncIterator[tuple[Position, bytes]]: ...


class Cursor:
    """A durable, named reader position of a stream: `read` (or `subscribe`) from
    just after what was acked, `ack` to move it forward; it pins retention."""

    def __init__(self, stream: CursorStream, record: CursorRecord) -> None:
        self.stream = stream
        self.name = record.name
        self._record = record

    def __repr__(self) -> str:
        return f"Cursor({self.stream.name!r}, {self.name!r})"

    async def position(self) -> Position:
        """The position this cursor reads from next (NoSuchCursor once deleted)."""
        return (await self._record.read()).value.next_position

    async def read(self) -> AsyncGenerator[tuple[Position, bytes]]:
        """(position, payload) from just after the acked position up to the end as of
        the call; EntriesTruncated when retention removed some of that."""
        start = await self.position()
        async for item in self.stream.read(from_=start):
            yield item

    async def subscribe(self) -> AsyncGenerator[tuple[Position, bytes]]:
        """As `read`, then following live appends (never ends)."""
        start = await self.position()
        async for item in self.stream.subscribe(from_=start):
            yield item

    async def ack(self, position: Position) -> None:
        """Everything up to `position` is done: the cursor moves forward to just
        after it, durably; an ack at or before what was acked changes nothing."""
        if not isinstance(position, Position):
            raise InvalidArgumentType(f"ack takes a pora.Position, not {type(position).__name__}")
        await self._move(position, ack_forward)

    async def move_to(self, position: Position) -> None:
        """The cursor reads next from `position`, durably, when that is forward
        (else nothing changes): to go on at an error's `resume_at` (EntriesLost) or
        `first_held` (EntriesTruncated), knowing what was skipped."""
        if not isinstance(position, Position):
            raise InvalidArgumentType(
                f"move_to takes a pora.Position, not {type(position).__name__}"
            )
        await self._move(position, moved_forward)

    async def _move(
        self, position: Position, forward: Callable[[CursorState, Position], CursorState | None]
    ) -> None:
        while True:
            current = await self._record.read()
            moved = forward(current.value, position)
            if moved is None:
                return
            try:
                await self._record.store.update_document(
                    CURSORS_SPACE, self._record.document, encode_cursor(moved), current.version
                )
            except MetadataVersionConflict:
                continue  # another ack took first: decide again on what it wrote
            except NoSuchDocument as gone:
                raise NoSuchCursor(self.stream.name, self.name) from gone
            return

    async def delete(self) -> None:
        """Remove the cursor: it pins nothing from now on (NoSuchCursor if gone)."""
        while True:
            current = await self._record.read()
            try:
                await self._record.store.delete_document(
                    CURSORS_SPACE, self._record.document, current.version
                )
            except MetadataVersionConflict:
                continue
            except NoSuchDocument as gone:
                raise NoSuchCursor(self.stream.name, self.name) from gone
            return
