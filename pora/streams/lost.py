"""LOST segments (docs/streams.md, "Lost segments"): a segment whose ledger was
deleted outside the stream (an operator's `delete_ledger`). A segment's ledger is
created with a record in the metadata store and ledger ids are never reused (R26), so
a ledger without a record was deleted, for good: takeovers and seals mark such a
segment LOST in the document, and readers that reach it raise `EntriesLost`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pora.meta.errors import NoSuchLedgerMetadata
from pora.streams.document import Segment
from pora.streams.errors import EntriesLost
from pora.streams.position import Position

if TYPE_CHECKING:
    from pora.streams.ledger_client import LedgerClient

_log = logging.getLogger("pora.streams")


async def ledger_deleted(client: LedgerClient, ledger_id: int) -> bool:
    """Whether the ledger has no record in the metadata store (deleted, for good)."""
    try:
        await client.store.read_ledger(ledger_id)
    except NoSuchLedgerMetadata:
        return True
    return False


def entries_lost(stream: str, segment: Segment) -> EntriesLost:
    """The error of a reader reaching `segment`, LOST: it resumes at the next one's
    first position."""
    return EntriesLost(stream, segment.seq, segment.ledger_id, Position(segment.seq + 1, 0))


async def raise_if_lost(client: LedgerClient, stream: str, segment: Segment) -> None:
    """EntriesLost when `segment` is LOST or its ledger has no record (deleted outside
    the stream before any takeover marked it); returns otherwise."""
    if segment.lost or await ledger_deleted(client, segment.ledger_id):
        raise entries_lost(stream, segment)


def log_lost(stream: str, seq: int, ledger_id: int) -> None:
    _log.warning(
        "stream %r: segment %d is LOST: its ledger %d was deleted outside the stream, and "
        "its entries with it; readers get EntriesLost there, and the stream is written on "
        "after it",
        stream,
        seq,
        ledger_id,
    )
