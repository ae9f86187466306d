"""A stream's orphan ledgers (docs/streams.md, "Garbage"; `pora stream gc`): ledgers
whose record names the stream (custom key `pora.stream`) that the stream no longer
holds and never will: a transaction's segment whose process died between creating
its ledger and recording it, a losing or failed attempt's segment whose deletion did
not go through, a dead writer's next segment created ahead of a rollover, a
truncated segment a node missed. No I/O here but reading the stream's pages:
`pora/cli/stream.py` lists the ledgers and deletes what this finds.

A ledger younger than the grace period is never an orphan: between creating a
ledger and the compare-and-set that records it (a takeover, `open_segment`) it is
named by no document. The live writer may hold its next segment's ledger for longer
(created at half the roll limits), so a ledger of no transaction created after the
live writer's OPEN segment is never an orphan either.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pora.meta.records import LedgerMetadata
from pora.streams.document import StreamDocument
from pora.streams.records import StreamRecord
from pora.streams.transaction import TRANSACTION_KEY
from pora.streams.writer import STREAM_KEY

#: how old a ledger must be before gc may call it an orphan, by default
GRACE_S_DEFAULT = 3600.0


@dataclass(frozen=True)
class Orphan:
    """A ledger naming `stream` that the stream does not hold."""

    stream: str
    ledger_id: int
    created_ms: int
    #: the transaction its record names (`pora.txn`), or None: a writer's ledger
    transaction: str | None


def ledger_stream(ledger: LedgerMetadata) -> str | None:
    """The stream a ledger's record names, or None for a ledger of no stream."""
    raw = ledger.custom.get(STREAM_KEY)
    return None if raw is None else raw.decode(errors="replace")


async def held_ledger_ids(record: StreamRecord, doc: StreamDocument) -> set[int]:
    """The ledgers of the stream's held segments (paged ones too) and of its pending
    transactions' segments."""
    held = {segment.ledger_id async for segment in record.segments_from(doc, doc.first_seq)}
    held.update(s.ledger_id for txn in doc.transactions for s in txn.segments)
    return held


def orphan_ledgers(
    name: str,
    doc: StreamDocument | None,
    held: set[int],
    ledgers: Iterable[LedgerMetadata],
    now_ms: int,
    grace_ms: int,
) -> list[Orphan]:
    """Of `ledgers`, those naming the stream `name` that are orphans, by ledger id:
    older than `grace_ms`, not in `held`, and not what may be the live writer's next
    segment. `doc` None: the stream does not exist (every ledger naming it older than
    the grace period is an orphan)."""
    open_segment = None if doc is None else doc.open_segment
    found = []
    for ledger in ledgers:
        if ledger_stream(ledger) != name or ledger.ledger_id in held:
            continue
        if now_ms - ledger.created_ms < grace_ms:
            continue  # perhaps created a moment ago by a writer or a transaction
        txn = ledger.custom.get(TRANSACTION_KEY)
        if txn is None and open_segment is not None:
            newer = (
                ledger.created_ms >= open_segment.created_ms
                or ledger.ledger_id > open_segment.ledger_id
            )
            if newer:
                continue  # perhaps the live writer's next segment, made ahead of a roll
        transaction = None if txn is None else txn.decode(errors="replace")
        found.append(Orphan(name, ledger.ledger_id, ledger.created_ms, transaction))
    return sorted(found, key=lambda orphan: orphan.ledger_id)
