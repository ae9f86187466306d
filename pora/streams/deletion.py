"""Deleting a stream (docs/streams.md, "Deleting a stream"): mark the document, fence
and delete the ledgers a writer may still append to, delete the cursors, delete the
document, then what no writer writes, best effort. A writer appends to its OPEN
segment's ledger without touching the document, so only the fence of that ledger
stops it: the document goes only once every such ledger is fenced, and a fence that
cannot cover fails the delete with the stream left marked (gone for every client) for
a retry to finish."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from journal.errors import PoraError
from ledger.errors import NoSuchLedger
from pora.client.replication.errors import DeleteFailed
from pora.meta.errors import MetadataTimeout, MetadataVersionConflict, NoSuchDocument
from pora.meta.records import Versioned
from pora.streams.cursors import CURSORS_SPACE, cursor_document_name, cursor_states
from pora.streams.document import (
    PAGES_SPACE,
    STREAMS_SPACE,
    Segment,
    SegmentState,
    StreamDocument,
    check_stream_name,
    decode_page,
    mark_deleting,
    page_name,
)
from pora.streams.errors import NoSuchStream, StreamDeleteFailed
from pora.streams.records import StreamRecord
from pora.streams.removal import delete_owned_ledgers

if TYPE_CHECKING:
    from pora.streams.ledger_client import LedgerClient

_log = logging.getLogger("pora.streams")


def live_ledgers(doc: StreamDocument) -> list[tuple[int, str]]:
    """(ledger id, whose) of each ledger a writer may still append to: the OPEN
    segment's (the live writer's) and the pending transactions' segments. A CLOSED
    segment takes no appends: a rollover drains the writer's appends to it before its
    compare-and-set closes it."""
    live = [(s.ledger_id, f"segment {s.seq}") for s in doc.segments if s.state is SegmentState.OPEN]
    live += [
        (s.ledger_id, f"pending transaction {txn.id}'s segment")
        for txn in doc.transactions
        for s in txn.segments
    ]
    return live


async def delete_stream(client: LedgerClient, name: str) -> None:
    """Mark, fence the live ledgers, delete the cursors and the document, then the
    rest best effort.
    NoSuchStream when there is no stream (or another delete finished it first);
    StreamDeleteFailed (the stream left marked) when a live ledger cannot be fenced."""
    record = StreamRecord(client.store, check_stream_name(name))
    marked = await _mark(record)
    for ledger_id, whose in live_ledgers(marked.value):
        try:
            await client.delete_ledger(ledger_id)
        except NoSuchLedger:
            pass  # deleted already (an earlier attempt, or outside the stream)
        except DeleteFailed as failed:  # (another delete finishing first: NoSuchLedger)
            raise StreamDeleteFailed(name, whose, failed) from failed
    # the pages name the CLOSED segments the head no longer holds: read before they go
    segments, pages = await _paged_segments(client, marked.value)
    # before the document: once it is gone the name may be created again, and a
    # cursor left over would be the new stream's (its position from the old one)
    await _delete_cursors(client, name)
    try:
        await client.store.delete_document(STREAMS_SPACE, name, marked.version)
    except NoSuchDocument as gone:  # another delete finished it first
        raise NoSuchStream(name) from gone
    for document, version in pages:
        try:
            await client.store.delete_document(PAGES_SPACE, document, version)
        except PoraError as error:
            _log.warning("stream %r deleted, but not its page %s: %s", name, document, error)
    live = {ledger_id for ledger_id, _ in live_ledgers(marked.value)}
    rest = [(s.ledger_id, f"segment {s.seq}") for s in segments if s.ledger_id not in live]
    await delete_owned_ledgers(client, name, rest, "deleted")


async def _mark(record: StreamRecord) -> Versioned[StreamDocument]:
    """The document marked deleting (one compare-and-set; one already marked by an
    unfinished delete as it is). From then on no writer's compare-and-set takes."""
    while True:
        current = await record.read_marked()  # NoSuchStream
        if current.value.deleting:
            return current
        try:
            return await record.write(mark_deleting(current.value), current.version)
        except (MetadataVersionConflict, MetadataTimeout):
            continue  # a writer's change, or a write of ours that may have taken: re-read


async def _paged_segments(
    client: LedgerClient, doc: StreamDocument
) -> tuple[list[Segment], list[tuple[str, int]]]:
    """Every segment of the document, paged ones too, and each page's (document name,
    version); a page that cannot be read is logged and left (garbage for the tools)."""
    segments: list[Segment] = list(doc.segments)
    pages: list[tuple[str, int]] = []
    for ref in doc.pages:
        document = page_name(doc.name, ref.first_seq)
        try:
            page = await client.store.read_document(PAGES_SPACE, document)
        except PoraError as error:
            _log.warning("stream %r deleted, but not its page %s: %s", doc.name, document, error)
            continue
        segments.extend(decode_page(page.value).segments)
        pages.append((document, page.version))
    return segments, pages


async def _delete_cursors(client: LedgerClient, name: str) -> None:
    """Every cursor of the stream deleted; an error is raised (the stream stays marked
    for a retry), since a cursor left behind would outlive the document."""
    async for state in cursor_states(client.store, name):
        document = cursor_document_name(name, state.name)
        while True:
            try:
                cursor = await client.store.read_document(CURSORS_SPACE, document)
                await client.store.delete_document(CURSORS_SPACE, document, cursor.version)
            except NoSuchDocument:
                break  # deleted meanwhile (another delete of the stream)
            except MetadataVersionConflict:
                continue  # a reader's ack moved it: delete what it wrote
            break
