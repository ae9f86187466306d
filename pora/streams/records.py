"""Reading and compare-and-setting one stream's document in the metadata store."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

from pora.meta.errors import (
    DocumentExists,
    MetadataStalled,
    MetadataTimeout,
    MetadataVersionConflict,
    NoSuchDocument,
)
from pora.meta.records import Versioned
from pora.meta.store import MetadataStore
from pora.streams.document import (
    PAGES_SPACE,
    STREAMS_SPACE,
    Segment,
    SegmentPage,
    StreamDocument,
    decode_document,
    decode_page,
    encode_document,
    encode_page,
    page_name,
)
from pora.streams.errors import NoSuchStream

#: a change of a stream gives up when its writes have timed out this long in a row
STALL_S_DEFAULT = 30.0


class StreamRecord:
    """One stream's document: reads decode it, writes are compare-and-sets naming the
    version read (MetadataVersionConflict when another client changed it first)."""

    def __init__(self, store: MetadataStore, name: str, stall_s: float = STALL_S_DEFAULT) -> None:
        self.store = store
        self.name = name
        #: writes that time out in a row for this long end in MetadataStalled
        self.stall_s = stall_s
        self._timing_out_since: float | None = None

    async def read(self) -> Versioned[StreamDocument]:
        """The document; NoSuchStream when there is none or a delete marked it (every
        reader, writer, cursor and transaction reads through here, so a marked stream
        is gone for all of them, and their compare-and-sets end with this after a
        conflict)."""
        record = await self.read_marked()
        if record.value.deleting:
            raise NoSuchStream(self.name)
        return record

    async def read_marked(self) -> Versioned[StreamDocument]:
        """The document, also one a delete marked (for the delete that finishes it);
        NoSuchStream when there is none."""
        try:
            record = await self.store.read_document(STREAMS_SPACE, self.name)
        except NoSuchDocument as gone:
            raise NoSuchStream(self.name) from gone
        return Versioned(decode_document(record.value), record.version)

    async def write(self, doc: StreamDocument, expected_version: int) -> Versioned[StreamDocument]:
        """MetadataStalled once writes have timed out for `stall_s` in a row: the retry
        loops around this (which re-read and decide again after a MetadataTimeout) end
        then, rather than wait for a stalled store forever."""
        try:
            record = await self.store.update_document(
                STREAMS_SPACE, self.name, encode_document(doc), expected_version
            )
        except NoSuchDocument as gone:
            raise NoSuchStream(self.name) from gone
        except MetadataTimeout as timeout:
            now = time.monotonic()
            if self._timing_out_since is None:
                self._timing_out_since = now
            elif now - self._timing_out_since >= self.stall_s:
                self._timing_out_since = None
                raise MetadataStalled(
                    timeout.url,
                    f"every write of stream {self.name!r} timed out for {self.stall_s:.0f} s",
                    "a process frozen while it holds SQLite's write lock? nothing more of "
                    "this change was made: retry once the store answers",
                ) from timeout
            raise
        self._timing_out_since = None
        return Versioned(doc, record.version)

    async def change(
        self, change: Callable[[StreamDocument], StreamDocument | None]
    ) -> Versioned[StreamDocument]:
        """Compare-and-set `change(document)` (None: nothing to write), re-reading and
        deciding again after a conflict or a timeout (a timed-out write that took is
        seen on the re-read: `change` then finds its work done)."""
        doc = await self.read()
        while True:
            new = change(doc.value)
            if new is None:
                return doc
            try:
                return await self.write(new, doc.version)
            except (MetadataVersionConflict, MetadataTimeout):
                doc = await self.read()

    async def next_change(self, after_version: int) -> Versioned[StreamDocument]:
        """The document once its version moves past `after_version` (at once if it
        has); NoSuchStream when it is deleted."""
        changes = self.store.watch_document(STREAMS_SPACE, self.name, after_version)
        try:
            async for record in changes:
                doc = decode_document(record.value)
                if doc.deleting:
                    break  # marked by a delete: gone
                return Versioned(doc, record.version)
        except NoSuchDocument as gone:
            raise NoSuchStream(self.name) from gone
        finally:
            await _close(changes)
        raise NoSuchStream(self.name)

    async def read_page(self, first_seq: int) -> SegmentPage:
        """The page of segments from `first_seq` (NoSuchStream when it is gone: the
        stream was deleted)."""
        try:
            record = await self.store.read_document(PAGES_SPACE, page_name(self.name, first_seq))
        except NoSuchDocument as gone:
            raise NoSuchStream(self.name) from gone
        return decode_page(record.value)

    async def store_page(self, page: SegmentPage) -> None:
        """Write the page; one left by an attempt whose head change failed is no page
        of the head's, and is replaced."""
        data = encode_page(page)
        try:
            await self.store.create_document(PAGES_SPACE, page.name, data)
        except DocumentExists:
            stale = await self.store.read_document(PAGES_SPACE, page.name)
            if stale.value != data:
                await self.store.update_document(PAGES_SPACE, page.name, data, stale.version)

    async def segments_from(self, doc: StreamDocument, seq: int) -> AsyncIterator[Segment]:
        """The document's held segments from `seq` on, paged ones first."""
        seq = max(seq, doc.first_seq)
        for ref in doc.pages:
            if ref.last_seq >= seq:
                for segment in (await self.read_page(ref.first_seq)).segments:
                    if segment.seq >= seq:
                        yield segment
        for segment in doc.segments:
            if segment.seq >= seq:
                yield segment


async def _close(changes: AsyncIterator[object]) -> None:
    close = getattr(changes, "aclose", None)
    if close is not None:
        await close()
