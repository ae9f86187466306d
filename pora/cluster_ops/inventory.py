"""What the audit and the workers read from the metadata store: the live
registrations, the draining marks (A14), every ledger record a page at a time, and
which ledgers belong to streams (A1's note: segments are found as ledgers; the stream
documents only name them and tell the OPEN ones)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pora.meta.documents import NODE_DRAINING_SPACE
from pora.meta.errors import DocumentExists, NoSuchDocument
from pora.meta.records import LedgerMetadata, NodeRegistration, Versioned
from pora.meta.store import MetadataStore
from pora.streams.document_codec import decode_document
from pora.streams.document_model import STREAMS_SPACE, SegmentState

log = logging.getLogger("pora.cluster_ops")

#: the document space of draining marks: one document per address (A14)
DRAINING_SPACE = NODE_DRAINING_SPACE
_PAGE = 1000


@dataclass(frozen=True)
class StreamLedger:
    stream: str
    #: the segment's sequence number (None: a pending transaction's segment)
    seq: int | None
    #: the stream's live writer's OPEN segment, or a pending transaction's: never
    #: fenced by a worker (A11)
    open: bool

    def describe(self) -> str:
        what = "transaction segment" if self.seq is None else f"segment {self.seq}"
        return f"stream {self.stream} {what}{' (open)' if self.open else ''}"


async def live_nodes(store: MetadataStore) -> dict[str, NodeRegistration]:
    return {node.address: node for node in await store.list_nodes()}


async def draining_addresses(store: MetadataStore) -> set[str]:
    found: set[str] = set()
    after = ""
    while True:
        names = await store.list_documents(DRAINING_SPACE, after=after, limit=_PAGE)
        found.update(names)
        if len(names) < _PAGE:
            return found
        after = names[-1]


async def mark_draining(store: MetadataStore, address: str, by: str, now_ms: int) -> None:
    """A14: put the draining mark on `address` (nothing if it has one)."""
    data = json.dumps({"address": address, "since_ms": now_ms, "by": by}).encode()
    with contextlib.suppress(DocumentExists):
        await store.create_document(DRAINING_SPACE, address, data)


async def unmark_draining(store: MetadataStore, address: str) -> bool:
    """Remove the draining mark; False when there was none."""
    try:
        mark = await store.read_document(DRAINING_SPACE, address)
        await store.delete_document(DRAINING_SPACE, address, mark.version)
    except NoSuchDocument:
        return False
    return True


async def stream_ledgers(store: MetadataStore) -> dict[int, StreamLedger]:
    """Ledger id -> its stream, for every head segment and pending transaction
    segment of every stream (segments in pages are CLOSED: they need no naming to be
    repaired, and are listed as plain ledgers)."""
    found: dict[int, StreamLedger] = {}
    after = ""
    while True:
        names = await store.list_documents(STREAMS_SPACE, after=after, limit=_PAGE)
        for name in names:
            try:
                doc = decode_document((await store.read_document(STREAMS_SPACE, name)).value)
            except NoSuchDocument:
                continue  # deleted since the listing
            for segment in doc.segments:
                is_open = segment.state is SegmentState.OPEN
                found[segment.ledger_id] = StreamLedger(name, segment.seq, is_open)
            for transaction in doc.transactions:
                for pending in transaction.segments:
                    found[pending.ledger_id] = StreamLedger(name, None, True)
        if len(names) < _PAGE:
            return found
        after = names[-1]


async def all_ledgers(store: MetadataStore) -> AsyncIterator[Versioned[LedgerMetadata]]:
    after = -1
    while True:
        page = await store.list_ledgers(after_id=after, limit=_PAGE)
        for record in page:
            yield record
        if len(page) < _PAGE:
            return
        after = page[-1].value.ledger_id
