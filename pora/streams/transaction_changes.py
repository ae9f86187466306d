"""Transactions as pure changes to the stream document (docs/streams.md,
"Transactions"): begin, add a segment, commit, remove; and the decision whether a
commit with a key or an app version was applied already. No I/O: transaction.py does
the ledgers and the compare-and-sets around these.

A commit adds the transaction's segments, CLOSED at the ends the committer fixed,
after every segment visible at that moment, all with one new commit number, and
records its key and app version in the same change: whoever reads the document sees
all of the commit or none of it, and the record of it with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ledger.errors import InvalidArgument
from pora.streams.document import (
    Segment,
    SegmentState,
    StreamChangeRefused,
    StreamDocument,
    StreamState,
    checked_document,
    pending_segment_count,
)
from pora.streams.errors import StreamSealed, TransactionAborted, WriterActive
from pora.streams.transaction_fields import (
    AppVersion,
    CommitKey,
    PendingSegment,
    PendingTransaction,
)


def pending(doc: StreamDocument, txn_id: str) -> PendingTransaction | None:
    for txn in doc.transactions:
        if txn.id == txn_id:
            return txn
    return None


def _pending(doc: StreamDocument, txn_id: str) -> PendingTransaction:
    txn = pending(doc, txn_id)
    if txn is None:
        raise TransactionAborted(doc.name, txn_id, "is not pending (aborted, collected or ended)")
    return txn


def _check_active(doc: StreamDocument) -> None:
    if doc.state is StreamState.SEALED:
        raise StreamSealed(doc.name)


def _with_txn(doc: StreamDocument, new: PendingTransaction) -> StreamDocument:
    return replace(doc, transactions=tuple(new if t.id == new.id else t for t in doc.transactions))


def begin_transaction(doc: StreamDocument, txn_id: str, now_ms: int) -> StreamDocument:
    """A new pending transaction without segments (StreamSealed on a sealed stream)."""
    _check_active(doc)
    if pending(doc, txn_id) is not None:
        raise StreamChangeRefused(f"stream {doc.name!r}: transaction {txn_id} exists")
    limit = doc.config.txn_pending_max
    if len(doc.transactions) >= limit:
        raise StreamChangeRefused(
            f"stream {doc.name!r} has {limit} pending transactions, the most its config "
            f"(txn_pending_max={limit}) lets it hold: commit or abort some first (or "
            "collect the abandoned ones: pora stream gc)"
        )
    txn = PendingTransaction(txn_id, now_ms, now_ms)
    return checked_document(replace(doc, transactions=(*doc.transactions, txn)))


def add_transaction_segment(
    doc: StreamDocument, txn_id: str, ledger_id: int, now_ms: int
) -> StreamDocument:
    """A new, invisible segment of the transaction (its activity time moves)."""
    _check_active(doc)
    txn = _pending(doc, txn_id)
    limit = doc.config.txn_segments_max
    if pending_segment_count(doc) >= limit:
        raise StreamChangeRefused(
            f"stream {doc.name!r}: its pending transactions hold {limit} segments, the most "
            f"its config (txn_segments_max={limit}) lets it keep: commit or abort some "
            "first (or collect the abandoned ones: pora stream gc)"
        )
    segments = (*txn.segments, PendingSegment(ledger_id, now_ms))
    return checked_document(_with_txn(doc, replace(txn, segments=segments, active_ms=now_ms)))


def touch_transaction(doc: StreamDocument, txn_id: str, now_ms: int) -> StreamDocument:
    """The transaction's activity time moved to now (a commit attempt)."""
    txn = _pending(doc, txn_id)
    return checked_document(_with_txn(doc, replace(txn, active_ms=max(txn.active_ms, now_ms))))


def prior_commit(
    doc: StreamDocument, key_digest: str | None, app_version: tuple[str, int] | None
) -> int | None:
    """The commit number a commit with this key (or app id and version) already
    applied as, or None when it was not applied: a recorded key, or a version not above
    the app id's last, means the commit must change nothing."""
    if key_digest is not None:
        for key in doc.commit_keys:
            if key.digest == key_digest:
                return key.commit
    if app_version is not None:
        app_id, version = app_version
        for app in doc.app_versions:
            if app.app_id == app_id and version <= app.version:
                return app.commit
    return None


def commit_transaction(
    doc: StreamDocument,
    txn_id: str,
    ends: Sequence[tuple[int, int, int]],
    key_digest: str | None,
    app_version: tuple[str, int] | None,
    now_ms: int,
    dropped: Sequence[int] = (),
    replace_all: bool = False,
) -> StreamDocument:
    """The transaction's segments made visible at once, in the order of `ends`
    ((ledger id, last entry, byte length) of each), after every visible segment, with
    one new commit number; the transaction removed (its `dropped` segments with it:
    every segment is named once, in `ends` or in `dropped`) and its key and app
    version recorded. Call `prior_commit` first: a recorded key or version is refused
    here. `replace_all`: every segment visible before is removed in the same change
    (`without_visible`), so the commit's segments are the stream's whole contents."""
    _check_active(doc)
    txn = _pending(doc, txn_id)
    if prior_commit(doc, key_digest, app_version) is not None:
        raise StreamChangeRefused(f"stream {doc.name!r}: commit of {txn_id} was applied already")
    named = [ledger for ledger, _, _ in ends] + list(dropped)
    if sorted(named) != sorted(s.ledger_id for s in txn.segments):
        raise StreamChangeRefused(
            f"stream {doc.name!r}: the commit of {txn_id} does not name each of its segments once"
        )
    if replace_all:
        doc = without_visible(doc)
    commit = doc.commit + 1
    created = {s.ledger_id: s.created_ms for s in txn.segments}
    added = tuple(
        Segment(
            doc.next_seq + index,
            ledger_id,
            SegmentState.CLOSED,
            commit,
            created[ledger_id],
            last_entry_id,
            byte_length,
        )
        for index, (ledger_id, last_entry_id, byte_length) in enumerate(ends)
    )
    keys = doc.commit_keys
    if key_digest is not None:
        keys = (*keys, CommitKey(key_digest, commit))[-doc.config.commit_keys_max :]
    apps = doc.app_versions
    if app_version is not None:
        app_id, version = app_version
        others = [app for app in apps if app.app_id != app_id]
        limit = doc.config.app_ids_max
        if len(others) == len(apps) and len(apps) >= limit:
            raise StreamChangeRefused(
                f"stream {doc.name!r} records {limit} app ids, the most its config "
                f"(app_ids_max={limit}) lets it hold: app id {app_id!r} is not recorded"
            )
        apps = tuple(sorted([*others, AppVersion(app_id, version, commit)], key=lambda a: a.app_id))
    return checked_document(
        replace(
            doc,
            commit=commit,
            segments=(*doc.segments, *added),
            next_seq=doc.next_seq + len(added),
            transactions=tuple(t for t in doc.transactions if t.id != txn_id),
            commit_keys=keys,
            app_versions=apps,
        )
    )


def without_visible(doc: StreamDocument) -> StreamDocument:
    """The document with none of its visible segments (head and pages), as a
    truncation before `next_seq` leaves it, the commit number unchanged (the commit
    that replaces bumps it once). WriterActive while the live writer's segment is
    OPEN: it cannot be removed. The segments' ledgers and the pages' documents are
    deleted after the change took."""
    current = doc.open_segment
    if current is not None:
        raise WriterActive(doc.name, current.seq)
    if doc.first_seq >= doc.next_seq:
        return doc  # nothing held
    last = doc.segments[-1].last_entry_id if doc.segments else -1
    return replace(
        doc, segments=(), pages=(), first_held_seq=doc.next_seq, removed_last_entry_id=last
    )


def remove_transaction(doc: StreamDocument, txn_id: str) -> StreamDocument:
    """The transaction gone (aborted, skipped or collected); its ledgers are deleted
    after this change took. A transaction not pending: the document as it is."""
    if pending(doc, txn_id) is None:
        return doc
    return checked_document(
        replace(doc, transactions=tuple(t for t in doc.transactions if t.id != txn_id))
    )


def abandoned_transactions(doc: StreamDocument, idle_ms: int, now_ms: int) -> list[str]:
    """The pending transactions with no activity for `idle_ms`."""
    return [txn.id for txn in doc.transactions if now_ms - txn.active_ms >= idle_ms]


def commit_order(ledger_ids: Sequence[int], order: Sequence[int] | None) -> list[int]:
    """The transaction's segments' ledger ids (in creation order) in the order they
    become visible: `order`, when given, names each of them once."""
    if order is None:
        return list(ledger_ids)
    ordered = list(order)
    if sorted(ordered) != sorted(ledger_ids):
        raise InvalidArgument(
            f"order={ordered!r} must name each of the transaction's segments once by its "
            f"ledger id (TransactionSegment.ledger_id): {sorted(ledger_ids)}"
        )
    return ordered
