"""Deleting what a change to a stream left behind: the pages its head no longer
names and the ledgers of its removed segments, best effort (what is left is
garbage for the cluster tools). Truncation and deletion (stream.py) and a
replacing commit (transaction.py) all end with it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from journal.errors import PoraError
from ledger.errors import NoSuchLedger
from pora.streams.document import PAGES_SPACE, Segment, StreamDocument, page_name
from pora.streams.errors import NoSuchStream
from pora.streams.ledger_client import LedgerClient
from pora.streams.records import StreamRecord

_log = logging.getLogger("pora.streams")


async def delete_removed(
    client: LedgerClient,
    before: StreamDocument,
    after: StreamDocument,
    removed: tuple[Segment, ...],
) -> None:
    """The pages the head no longer names and the removed segments' ledgers, best
    effort (what is left is garbage for the cluster tools)."""
    kept = {ref.first_seq for ref in after.pages}
    for ref in before.pages:
        if ref.first_seq in kept:
            continue
        name = page_name(before.name, ref.first_seq)
        try:
            page = await client.store.read_document(PAGES_SPACE, name)
            await client.store.delete_document(PAGES_SPACE, name, page.version)
        except (PoraError, OSError) as error:
            _log.warning("stream %r truncated, but not its page %s: %s", before.name, name, error)
    # (a LOST segment's ledger is gone already)
    owned = [(s.ledger_id, f"segment {s.seq}") for s in removed if not s.lost]
    await delete_owned_ledgers(client, before.name, owned, "truncated")


async def delete_owned_ledgers(
    client: LedgerClient, name: str, owned: Iterable[tuple[int, str]], what: str
) -> None:
    """Delete each (ledger id, what owned it) of the stream, best effort."""
    for ledger_id, owner in owned:
        try:
            await client.delete_ledger(ledger_id)
        except NoSuchLedger:
            pass
        except (PoraError, OSError) as error:
            _log.warning(
                "stream %r %s, but ledger %d of its %s was not (%s): garbage for the cluster tools",
                name,
                what,
                ledger_id,
                owner,
                error,
            )


async def why_kept(record: StreamRecord, ledger_id: int) -> str | None:
    """Why a ledger whose recording compare-and-set failed must not be deleted, or
    None when it may be. A compare-and-set whose reply was lost and whose re-read
    failed may have taken: the document then names the ledger, and a ledger the
    document names that is deleted looks deleted outside the stream (a takeover marks
    its segment LOST, a commit cannot close it). So the document is read again: one
    that names the ledger (a segment or a pending transaction's), or no answer, keeps
    it; a stream deleted or marked does not (its delete deletes what it names)."""
    try:
        doc = (await record.read()).value
    except NoSuchStream:
        return None
    except (PoraError, OSError) as error:
        return f"the document may name it (it could not be read: {error})"
    named = any(s.ledger_id == ledger_id for s in doc.segments) or any(
        s.ledger_id == ledger_id for txn in doc.transactions for s in txn.segments
    )
    return "the document names it" if named else None
