"""Transactions of a stream (docs/streams.md, "Transactions"): `Stream.begin()`,
`Stream.resume(txn_id)`. The decisions are in transaction_changes.py; this module
creates, closes and deletes the segments' ledgers and compare-and-sets the document
around them, re-reading it on every conflict before it decides again."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import anyio

from journal.errors import PoraError
from ledger.errors import InvalidArgument, InvalidArgumentType, LedgerFenced, NoSuchLedger
from pora.client.replication.writer import LedgerWriter
from pora.meta.records import Versioned
from pora.streams.document import StreamDocument
from pora.streams.errors import NoSuchStream, TransactionAborted
from pora.streams.records import StreamRecord
from pora.streams.removal import delete_removed, why_kept
from pora.streams.transaction_changes import (
    abandoned_transactions,
    add_transaction_segment,
    begin_transaction,
    commit_order,
    commit_transaction,
    pending,
    prior_commit,
    remove_transaction,
    touch_transaction,
    without_visible,
)
from pora.streams.transaction_fields import (
    PendingTransaction,
    check_app_version,
    check_transaction_id,
    commit_key_digest,
)
from pora.streams.writer import STREAM_KEY, recover_segment_ledger

if TYPE_CHECKING:
    from pora.streams.ledger_client import LedgerClient

_log = logging.getLogger("pora.streams.transaction")

#: the custom metadata key naming the transaction a segment's ledger was made for
TRANSACTION_KEY = "pora.txn"
#: the prefix of the custom metadata keys `open_segment(tags=...)` adds
TAG_PREFIX = "tag."
TAGS_MAX = 16
TAG_CHARS_MAX = 256


def check_tags(tags: object) -> dict[str, str]:
    """`tags` as a dict of short strings; InvalidArgument otherwise."""
    if tags is None:
        return {}
    if not isinstance(tags, Mapping):
        raise InvalidArgumentType(
            f"tags must be a mapping of str to str, not {type(tags).__name__}"
        )
    if len(tags) > TAGS_MAX:
        raise InvalidArgument(f"{len(tags)} tags: a segment takes at most {TAGS_MAX}")
    for key, value in tags.items():
        if not (isinstance(key, str) and isinstance(value, str)):
            raise InvalidArgumentType(f"tag {key!r}: keys and values must be str")
        if not (0 < len(key) <= TAG_CHARS_MAX and len(value) <= TAG_CHARS_MAX):
            raise InvalidArgument(
                f"tag {key!r}: a key has 1 to {TAG_CHARS_MAX} characters, a value at most "
                f"{TAG_CHARS_MAX}"
            )
    return dict(tags)


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _change(
    record: StreamRecord,
    change: Callable[[StreamDocument], StreamDocument | None],
) -> Versioned[StreamDocument]:
    return await record.change(change)


class TransactionSegment:
    """A pending segment of a transaction: `append` / `append_many` return the entry
    ids in this segment once acknowledged. The entries get their stream positions at
    the commit (`Position(segment's seq, entry id)`, the seq in `Stream.info()`)."""

    def __init__(self, transaction: Transaction, index: int, ledger: LedgerWriter) -> None:
        self.transaction = transaction
        #: its place among the segments this object opened
        self.index = index
        #: names it in `commit(order=...)`
        self.ledger_id = ledger.ledger_id
        self._ledger = ledger

    async def append(self, payload: bytes) -> int:
        self.transaction._check_usable()
        return await self._ledger.append(payload)

    async def append_many(self, payloads: Sequence[bytes]) -> list[int]:
        self.transaction._check_usable()
        return await self._ledger.append_many(payloads)

    async def close(self) -> None:
        """Close the segment's ledger at its last acknowledged entry (the commit does it
        for the segments still open)."""
        await self._ledger.close()


class Transaction:
    """Returned by `Stream.begin()` (an async context manager: begins on entry,
    commits on a clean exit unless committed or aborted, aborts on an exception) and
    by `Stream.resume(txn_id)` (already begun, possibly in another process)."""

    def __init__(
        self,
        client: LedgerClient,
        record: StreamRecord,
        txn_id: str | None = None,
        *,
        begun: bool | None = None,
    ) -> None:
        self._client = client
        self._record = record
        self.stream = record.name
        self.id = txn_id if txn_id is not None else uuid.uuid4().hex
        #: resumed ones are begun; one begun with a chosen id begins (or joins) on entry
        self._begun = (txn_id is not None) if begun is None else begun
        self._segments: list[TransactionSegment] = []
        self.aborted = False
        #: the commit number once committed (or found applied already)
        self.committed: int | None = None

    def __repr__(self) -> str:
        return f"Transaction({self.stream!r}, {self.id!r})"

    async def begin(self) -> None:
        if self._begun:
            return
        now = _now_ms()

        def change(doc: StreamDocument) -> StreamDocument | None:
            if pending(doc, self.id) is not None:
                return None  # a timed-out write that took
            return begin_transaction(doc, self.id, now)

        await _change(self._record, change)
        self._begun = True

    async def __aenter__(self) -> Transaction:
        await self.begin()
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> bool:
        if self.committed is not None or self.aborted:
            return False
        if exc_type is None:
            await self.commit()
            return False
        with anyio.CancelScope(shield=True):
            try:
                await self.abort()
            except (PoraError, OSError) as error:
                # the block's own exception is what the caller must see; the transaction
                # stays pending, for collect_abandoned_transactions
                _log.warning(
                    "stream %r: transaction %s not aborted (%s)", self.stream, self.id, error
                )
        return False

    def _check_usable(self) -> None:
        if self.aborted:
            raise TransactionAborted(self.stream, self.id)
        if self.committed is not None:
            raise TransactionAborted(
                self.stream, self.id, f"was committed (commit {self.committed})"
            )

    async def open_segment(self, tags: Mapping[str, str] | None = None) -> TransactionSegment:
        """A new pending segment (its ledger created, then recorded in the document with
        the transaction's activity time). `tags` go into the ledger's custom metadata
        (keys prefixed "tag.") so the cluster tools can tell whose ledger it is (a Spark
        job, partition and attempt). TransactionAborted once the transaction is
        gone."""
        custom = {STREAM_KEY: self.stream.encode(), TRANSACTION_KEY: self.id.encode()}
        for key, value in check_tags(tags).items():
            custom[TAG_PREFIX + key] = value.encode()
        self._check_usable()
        await self.begin()
        doc = (await self._record.read()).value
        if pending(doc, self.id) is None:
            raise TransactionAborted(self.stream, self.id, "is not pending (aborted or collected)")
        config = doc.config
        ledger = await self._client.create_ledger(
            config.ensemble_size,
            config.write_quorum,
            config.ack_quorum,
            custom_metadata=custom,
        )
        now = _now_ms()

        def change(doc: StreamDocument) -> StreamDocument | None:
            txn = pending(doc, self.id)
            if txn is not None and any(s.ledger_id == ledger.ledger_id for s in txn.segments):
                return None
            return add_transaction_segment(doc, self.id, ledger.ledger_id, now)

        try:
            await _change(self._record, change)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._discard_unless_named(ledger)
            raise
        segment = TransactionSegment(self, len(self._segments), ledger)
        self._segments.append(segment)
        return segment

    async def _discard_unless_named(self, ledger: LedgerWriter) -> None:
        """A segment's ledger whose recording failed: deleted unless the document may
        name it (`why_kept`); such a ledger is closed and left (the commit closes it
        like any other segment; an abort or gc deletes it)."""
        why = await why_kept(self._record, ledger.ledger_id)
        if why is None:
            await _delete_ledgers(self._client, self.stream, [ledger.ledger_id], ledger)
            return
        _log.warning(
            "stream %r: ledger %d of transaction %s is not deleted: %s",
            self.stream,
            ledger.ledger_id,
            self.id,
            why,
        )
        with contextlib.suppress(PoraError, OSError):
            await ledger.close()

    async def commit(
        self,
        key: str | None = None,
        app_id: str | None = None,
        version: int | None = None,
        order: Sequence[int] | None = None,
        only: Sequence[int] | None = None,
        replace: bool = False,
    ) -> int:
        """Make every segment of the transaction visible at once, in creation order (or
        `order`: the segments' ledger ids), with one compare-and-set; its commit
        number. Each segment is closed first: those this object opened are closed at
        their last acknowledged entry (appends still in flight finish first), those
        opened elsewhere are recovered (their writers fenced).

        `only` (ledger ids of segments of the transaction): just these become visible;
        the transaction's other segments (a failed or losing attempt's, opened by
        anyone, before or during the commit) are dropped with it and their ledgers
        deleted after the commit (their writers fenced).

        With `key` (or `app_id` and `version`), a commit already applied changes
        nothing and returns the commit number it applied as: a second commit with a
        recorded key, a version not above the app id's last, or a retry after a lost
        reply. The transaction is then removed and its ledgers deleted if it was still
        pending. TransactionAborted when it is gone without such a record.

        `replace`: the commit replaces the stream's contents: every segment visible
        before leaves the document in the same compare-and-set (as a truncation before
        the commit's first segment: readers of those positions get EntriesTruncated),
        and their ledgers are deleted after it. WriterActive while the stream's live
        writer holds a segment OPEN (nothing is changed; the transaction stays
        pending)."""
        if self.committed is not None:
            return self.committed
        if self.aborted:
            raise TransactionAborted(self.stream, self.id)
        digest = None if key is None else commit_key_digest(key)
        app_version = check_app_version(app_id, version)
        doc = (await self._record.read()).value
        applied = prior_commit(doc, digest, app_version)
        txn = pending(doc, self.id)
        if applied is not None or txn is None:
            return await self._already(digest, app_version)
        kept = _kept(txn, only)  # InvalidArgument first
        commit_order(kept, order)
        if replace:
            without_visible(doc)  # WriterActive before anything is closed
        await _change(self._record, lambda d: _touch(d, self.id))
        await self._close_own(kept)
        closed: dict[int, tuple[int, int, int]] = {}
        outcome: list[int] = []
        dropped: list[int] = []
        grown: list[PendingTransaction] = []
        #: the document the commit changed; empty when it was found applied on a
        #: re-read (a write of ours that timed out, or another process's commit)
        before: list[StreamDocument] = []

        def change(doc: StreamDocument) -> StreamDocument | None:
            outcome.clear()
            grown.clear()
            txn = pending(doc, self.id)
            if txn is None:
                visible = _visible_commit(doc, closed)
                if visible is not None:
                    # our write that timed out took (or another process committed this
                    # transaction, with its own `only` and `replace`): committed, with or
                    # without a key; `dropped` is what an attempt of ours would drop
                    outcome.append(visible)
                    before.clear()
                    return None
            dropped.clear()
            if prior_commit(doc, digest, app_version) is not None or txn is None:
                return None  # applied meanwhile (ours, timed out, or another's)
            kept = _kept(txn, only)
            if any(ledger_id not in closed for ledger_id in kept):
                grown.append(txn)  # a segment opened elsewhere meanwhile: close it too
                return None
            ordered = commit_order(kept, order)
            ends = [closed[ledger_id] for ledger_id in ordered]
            dropped.extend(s.ledger_id for s in txn.segments if s.ledger_id not in kept)
            new = commit_transaction(
                doc,
                self.id,
                ends,
                digest,
                app_version,
                _now_ms(),
                dropped=dropped,
                replace_all=replace,
            )
            outcome.append(new.commit)
            before[:] = [doc]
            return new

        while True:
            await self._recover_others(_kept(txn, only), closed)
            await _change(self._record, change)
            if outcome:
                self.committed = outcome[0]
                # `before` is empty when the commit was found taken (a timed-out write
                # or another process's): what it replaced is then garbage for gc, and
                # of what it dropped only what the stream does not hold goes
                await self._delete_dropped(dropped, before[0] if before else None, replace)
                return outcome[0]
            if not grown:
                return await self._already(digest, app_version)
            txn = grown[0]

    async def _close_own(self, kept: Sequence[int]) -> None:
        """This object's segments among `kept`, closed at their last acknowledged entry."""
        for segment in self._segments:
            if segment.ledger_id in kept:
                with contextlib.suppress(LedgerFenced):  # recovered elsewhere: end fixed
                    await segment.close()

    async def _recover_others(
        self, kept: Sequence[int], closed: dict[int, tuple[int, int, int]]
    ) -> None:
        """The ends of `kept` segments not in `closed` yet, fixed by recovery (whoever
        writes them elsewhere is fenced), recorded in `closed`."""
        for ledger_id in kept:
            if ledger_id not in closed:
                try:
                    last, length = await recover_segment_ledger(self._client, ledger_id)
                except NoSuchLedger:
                    await self._record.read()  # NoSuchStream: a stream delete fenced it
                    raise
                closed[ledger_id] = (ledger_id, last, length)

    async def _not_held(self, ledger_ids: Sequence[int]) -> list[int]:
        """Of `ledger_ids`, those the stream holds in no segment (paged ones too) nor
        pending transaction: a commit found applied may be another process's that
        made visible what an attempt of ours would have dropped. None of them when
        the document cannot be read (what is left is garbage for `pora stream gc`)."""
        try:
            doc = (await self._record.read()).value
            held = {s.ledger_id async for s in self._record.segments_from(doc, doc.first_seq)}
        except NoSuchStream:
            return list(ledger_ids)  # deleted: its ledgers are garbage
        except (PoraError, OSError):
            return []
        held.update(s.ledger_id for txn in doc.transactions for s in txn.segments)
        return [ledger_id for ledger_id in ledger_ids if ledger_id not in held]

    async def _delete_dropped(
        self, dropped: Sequence[int], before: StreamDocument | None, replace: bool
    ) -> None:
        """The ledgers of segments a commit dropped (a failed or losing attempt's:
        never visible), their writers here stopped first; with `replace`, those of
        the segments visible in `before`, the document the commit changed (None: the
        commit was found applied, and `dropped` is checked against the stream)."""
        if before is None:
            dropped = await self._not_held(dropped)
        elif replace:
            await self._delete_replaced(before)
        for segment in self._segments:
            if segment.ledger_id in dropped:
                await _delete_ledgers(self._client, self.stream, [], segment._ledger)
        await _delete_ledgers(self._client, self.stream, dropped)

    async def _delete_replaced(self, before: StreamDocument) -> None:
        """The segments a replacing commit removed (every one visible in `before`):
        their pages' documents and their ledgers, best effort (what is left is
        garbage for the cluster tools, as after a truncation)."""
        removed = list(before.segments)
        for ref in before.pages:
            with contextlib.suppress(PoraError, OSError):
                page = await self._record.read_page(ref.first_seq)
                removed.extend(page.segments)
        held = tuple(s for s in removed if s.seq >= before.first_held_seq)
        after = dataclasses.replace(before, pages=())
        await delete_removed(self._client, before, after, held)

    async def _already(self, digest: str | None, app_version: tuple[str, int] | None) -> int:
        """A commit that finds its key or version recorded (or its transaction gone)."""
        removed: list[int] = []

        def change(doc: StreamDocument) -> StreamDocument | None:
            removed.clear()
            txn = pending(doc, self.id)
            if prior_commit(doc, digest, app_version) is None or txn is None:
                return None
            removed.extend(s.ledger_id for s in txn.segments)
            return remove_transaction(doc, self.id)

        doc = (await _change(self._record, change)).value
        applied = prior_commit(doc, digest, app_version)
        if applied is None:
            self.aborted = True
            raise TransactionAborted(
                self.stream, self.id, "is not pending and no commit of it is recorded"
            )
        if removed:  # skipped: its own entries are not in the stream
            for segment in self._segments:
                await _delete_ledgers(self._client, self.stream, [], segment._ledger)
            await _delete_ledgers(self._client, self.stream, removed)
        self.committed = applied
        return applied

    async def abort(self, idle_ms: int | None = None) -> None:
        """Remove the transaction from the stream, then delete the ledgers it recorded
        (best effort: one left behind is garbage for the cluster tools, its record
        naming the stream and the transaction). Its appends raise TransactionAborted
        from then on. A transaction no longer pending (aborted, or committed by another
        process) is left as it is: nothing is deleted. `idle_ms` (for collecting):
        only if it is still idle that long when the document is changed."""
        if self.committed is not None:
            raise TransactionAborted(
                self.stream, self.id, f"was committed (commit {self.committed})"
            )
        gone: list[int] = []

        def change(doc: StreamDocument) -> StreamDocument | None:
            gone.clear()
            txn = pending(doc, self.id)
            if txn is None:
                return None
            if idle_ms is not None and _now_ms() - txn.active_ms < idle_ms:
                return None  # collecting: it was active meanwhile
            gone[:] = [s.ledger_id for s in txn.segments]
            return remove_transaction(doc, self.id)

        await _change(self._record, change)
        if idle_ms is not None and not gone:
            return  # collecting one that was active meanwhile
        self.aborted = True
        for segment in self._segments:  # this object's writers stop
            await _delete_ledgers(self._client, self.stream, [], segment._ledger)
        await _delete_ledgers(self._client, self.stream, gone)


def _kept(txn: PendingTransaction, only: Sequence[int] | None) -> list[int]:
    """The ledger ids of the segments a commit makes visible (creation order)."""
    ids = [s.ledger_id for s in txn.segments]
    if only is None:
        return ids
    wanted = list(only)
    if len(set(wanted)) != len(wanted) or not set(wanted) <= set(ids):
        raise InvalidArgument(
            f"only={wanted!r} must name segments of the transaction, each once, by ledger "
            f"id (TransactionSegment.ledger_id): {ids}"
        )
    return [ledger_id for ledger_id in ids if ledger_id in set(wanted)]


def _visible_commit(doc: StreamDocument, ledger_ids: Mapping[int, object]) -> int | None:
    """The commit number of the visible segment on one of these ledgers (the head's:
    a commit just made is there), or None when none is visible."""
    for segment in reversed(doc.segments):
        if segment.ledger_id in ledger_ids:
            return segment.commit
    return None


def _touch(doc: StreamDocument, txn_id: str) -> StreamDocument | None:
    return None if pending(doc, txn_id) is None else touch_transaction(doc, txn_id, _now_ms())


async def _delete_ledgers(
    client: LedgerClient, stream: str, ledger_ids: Sequence[int], writer: LedgerWriter | None = None
) -> None:
    if writer is not None:
        with contextlib.suppress(PoraError, OSError):
            await writer.close()
    for ledger_id in ledger_ids:
        try:
            await client.delete_ledger(ledger_id)
        except NoSuchLedger:
            pass
        except (PoraError, OSError) as error:
            _log.warning(
                "stream %r: ledger %d of a transaction that ended was not deleted (%s): "
                "garbage for the cluster tools",
                stream,
                ledger_id,
                error,
            )


async def resume_transaction(
    client: LedgerClient, record: StreamRecord, txn_id: str
) -> Transaction:
    txn_id = check_transaction_id(txn_id)
    doc = (await record.read()).value
    if pending(doc, txn_id) is None:
        raise TransactionAborted(
            record.name, txn_id, "is not pending (committed, aborted or collected)"
        )
    return Transaction(client, record, txn_id)


async def collect_abandoned(
    client: LedgerClient, record: StreamRecord, idle_s: float | None
) -> list[str]:
    """Abort every pending transaction idle for `idle_s` (None: the stream's
    txn_idle_s_max); the ids aborted."""
    doc = (await record.read()).value
    idle_ms = int(1000 * (doc.config.txn_idle_s_max if idle_s is None else idle_s))
    collected = []
    for txn_id in abandoned_transactions(doc, idle_ms, _now_ms()):
        txn = Transaction(client, record, txn_id)
        await txn.abort(idle_ms)
        if txn.aborted:
            collected.append(txn_id)
    return collected
