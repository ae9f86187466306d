"""A writer's side of the metadata: ensemble changes (R8..R12), the close of the
record (R14, R15), sealing the nodes, and the LAC flush's WRITE_LAC (R7).

`EnsembleChanger` owns the writer's copy of its ledger record: every write of that
record (an ensemble change's compare-and-set, the close's) goes through it, one at a
time, so a change and a close never race on the version.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import anyio

from journal.errors import PoraError
from ledger.errors import LedgerFenced, NoSuchLedger
from netio.budget import Budget
from pora.client.node_calls import NodeCalls
from pora.client.node_pool import NodePool
from pora.client.replication.config import ClientConfig
from pora.client.replication.core.ledger_records import (
    WriterRetry,
    closed_at,
    why_fenced,
    writer_after_conflict,
    writer_ensemble_change,
)
from pora.client.replication.core.pending_adds import PendingAdds, Released
from pora.client.replication.core.placement import choose_replacements, quarantined
from pora.client.replication.errors import NotEnoughNodes
from pora.client.waiting import Event
from pora.meta.errors import (
    MetadataError,
    MetadataStoreGone,
    MetadataTimeout,
    MetadataVersionConflict,
    NoSuchLedgerMetadata,
)
from pora.meta.records import Ensemble, EnsembleMember, LedgerMetadata, LedgerState, Versioned
from pora.meta.store import MetadataStore

if TYPE_CHECKING:  # prometheus_client is imported only when the application asks
    from pora.client.replication.metrics import ClientMetrics

_log = logging.getLogger("pora.client.writer")

#: R12: the first wait before listing the nodes again for a replacement; it doubles
_RELIST_FIRST_S = 0.05
_RELIST_MAX_S = 1.0


@dataclass
class WriterContext:
    """What a ledger writer shares with its client."""

    store: MetadataStore
    pool: NodePool
    config: ClientConfig
    rng: random.Random
    #: payload bytes pending over every ledger of the client
    pending_bytes: Budget
    #: one queue and call per node, carrying every ledger's adds (`backlog.py`)
    node_calls: NodeCalls[EnsembleMember]
    #: the event type appends wait on, the cheapest of the running loop (waiters.py)
    new_event: Callable[[], Event] = field(default=anyio.Event)
    #: the application's metrics, when it asked for them (metrics.py)
    metrics: ClientMetrics | None = None


class WriterOutcomes(Protocol):
    """What the writer is told by its ensemble changer: outcomes to act on (wake
    appends, end the writer), not state to share."""

    def appends_acknowledged(self, released: Released) -> None:
        """Entries became acknowledged (R4): their appends return."""

    def writer_failed(self, error: PoraError) -> None:
        """The writer ends with `error` (R11, R12, R13)."""


class EnsembleChanger:
    def __init__(
        self,
        context: WriterContext,
        record: Versioned[LedgerMetadata],
        adds: PendingAdds,
        outcomes: WriterOutcomes,
    ) -> None:
        self.record = record
        self._context = context
        self._adds = adds
        self._outcomes = outcomes
        self._ledger_id = record.value.ledger_id
        self._needed = anyio.Event()
        self._record_lock = anyio.Lock()
        #: R9: each member (address, instance id) that failed for this ledger -> when
        #: (the loop's monotonic clock): not chosen again while in quarantine
        #: (`node_quarantine_s`); a new instance at one's address may be at once
        self._failed_at: dict[EnsembleMember, float] = {}
        #: a write of the record failed or was cancelled: whether it took is unknown
        self._record_unsure = False

    def member_failed(self, member: EnsembleMember, error: BaseException) -> None:
        """R8: a request to `member` failed; the change task replaces it."""
        if self._adds.fenced:
            return
        if self._adds.failed(member):
            _log.warning(
                "ledger %d: node %s failed (%s); replacing it", self._ledger_id, member, error
            )
            self._failed_at[member] = anyio.current_time()
            self._needed.set()

    async def run(self, wake_turn: Callable[[], None]) -> None:
        """One ensemble change at a time, for as long as members are failed."""
        while True:
            await self._needed.wait()
            self._needed = anyio.Event()
            try:
                await self._change_while_failed(wake_turn)
            except MetadataError as error:  # the store failed us (gone, unreachable)
                self._outcomes.writer_failed(error)
                return

    async def _change_while_failed(self, wake_turn: Callable[[], None]) -> None:
        adds = self._adds
        while not adds.fenced and adds.failed_members:
            replacements = await self._find_replacements()
            if replacements is None or adds.fenced:
                return  # failed meanwhile: nothing to change
            change = adds.replace(replacements)  # queues the resends (R10)
            wake_turn()
            if await self._write_ensemble(change.ensemble):
                # R10: only now may entries at or after its first entry be acknowledged
                released = adds.ensemble_durable(change.ensemble)
                if released.ids:
                    self._outcomes.appends_acknowledged(released)

    async def _find_replacements(self) -> Mapping[EnsembleMember, EnsembleMember] | None:
        """R9 with R12: wait (listing the nodes again, with backoff) up to
        `ensemble_change_timeout_s` for enough replacements; then fail the writer.
        While it waits, a record found in recovery or closed fences the writer (R11):
        a recovery that took the ledger meanwhile is why no append can be
        acknowledged any more, not the want of nodes (the application must not
        retry on a ledger that is gone)."""
        config = self._context.config
        deadline = anyio.current_time() + config.ensemble_change_timeout_s
        delay = _RELIST_FIRST_S
        while True:
            try:
                nodes = await self._context.store.list_nodes(writable_only=True)
                self._failed_at = quarantined(
                    self._failed_at, anyio.current_time(), config.node_quarantine_s
                )
                return choose_replacements(
                    nodes,
                    self._adds.ensemble.members,
                    self._adds.failed_members,
                    self._context.rng,
                    excluded=self._failed_at.keys(),
                )
            except MetadataStoreGone:
                raise  # for good: no wait brings the store's file back
            except (NotEnoughNodes, MetadataError) as error:
                last_error: PoraError = error
            with contextlib.suppress(MetadataError):  # the wait goes on; R12 decides
                if await self._taken_by_recovery():
                    self._outcomes.writer_failed(LedgerFenced(self._ledger_id))
                    return None
            left = deadline - anyio.current_time()
            if left <= 0:
                _log.error(
                    "ledger %d: no replacement for failed node(s) in %.1f s: %s",
                    self._ledger_id,
                    config.ensemble_change_timeout_s,
                    last_error,
                )
                self._outcomes.writer_failed(last_error)
                return None
            await anyio.sleep(min(delay, left))
            delay = min(delay * 2, _RELIST_MAX_S)

    async def _taken_by_recovery(self) -> bool:
        """The record re-read shows the ledger in recovery or closed (R11), or gone
        (deleted, R26: the fence's cause, re-read by the writer, says so)."""
        if self.record.value.state is not LedgerState.OPEN:
            return True
        try:
            reread = await self._context.store.read_ledger(self._ledger_id)
        except NoSuchLedgerMetadata:
            return True
        return reread.value.state is not LedgerState.OPEN

    async def _write_ensemble(self, ensemble: Ensemble) -> bool:
        """R9/R11: compare-and-set the record with `ensemble`. On a conflict (or a
        timeout), re-read: OPEN retries (or finds the write took), anything else fences
        the writer. True once the ensemble is durable."""
        store = self._context.store
        # timed-out writes are retried until this deadline: on SQLite, a process frozen
        # while it holds the write lock times every write out while reads still answer
        deadline = anyio.current_time() + self._context.config.ensemble_change_timeout_s
        async with self._record_lock:
            while not self._adds.fenced:
                try:
                    # the record may be one the close re-read, in recovery or closed
                    changed = writer_ensemble_change(self.record.value, ensemble)
                except LedgerFenced as fenced:
                    self._outcomes.writer_failed(fenced)
                    return False
                try:
                    self.record = await store.update_ledger(changed, self.record.version)
                except MetadataVersionConflict:
                    pass
                except MetadataTimeout as error:
                    if anyio.current_time() >= deadline:
                        self._outcomes.writer_failed(error)
                        break
                else:
                    self._count_change()
                    return True
                reread = await self._reread()
                if reread is None:
                    return False
                try:
                    verdict = writer_after_conflict(reread, ensemble)
                except LedgerFenced as fenced:
                    self._outcomes.writer_failed(fenced)
                    return False
                self.record = reread
                if verdict is WriterRetry.APPLIED:
                    self._count_change()
                    return True
        return False

    def _count_change(self) -> None:
        if self._context.metrics is not None:
            self._context.metrics.ensemble_changed()

    async def _reread(self) -> Versioned[LedgerMetadata] | None:
        try:
            return await self._context.store.read_ledger(self._ledger_id)
        except MetadataError as error:
            self._outcomes.writer_failed(error)
            return None

    async def close_record(self, last_entry_id: int, length: int) -> None:
        """R14: the record CLOSED at `last_entry_id` (compare-and-set). A re-read showing
        it in recovery, or closed elsewhere, is R11: LedgerFenced. A failure of the
        store (a timeout: the write may have taken) propagates; the next call re-reads
        the record first, so a timed-out write that took is found closed at this
        writer's entry, and the close is retried otherwise."""
        async with self._record_lock:
            try:
                await self._close_record(last_entry_id, length)
            except BaseException:
                self._record_unsure = True
                raise

    async def _close_record(self, last_entry_id: int, length: int) -> None:
        try:
            await self._close_record_once(last_entry_id, length)
        except NoSuchLedgerMetadata:  # R26: deleted under its writer
            raise why_fenced(self._ledger_id, None) from None

    async def _close_record_once(self, last_entry_id: int, length: int) -> None:
        store = self._context.store
        if self._record_unsure:
            self.record = await store.read_ledger(self._ledger_id)
            self._record_unsure = False
        while True:
            current = self.record.value
            if current.state is LedgerState.CLOSED and (
                current.last_entry_id,
                current.length,
            ) == (last_entry_id, length):
                return
            if current.state is not LedgerState.OPEN:
                raise why_fenced(self._ledger_id, current)  # R11, R26
            closed = closed_at(current, last_entry_id, length)
            try:
                self.record = await store.update_ledger(closed, self.record.version)
            except MetadataVersionConflict:
                self.record = await store.read_ledger(self._ledger_id)
            else:
                return

    async def seal(self, last_entry_id: int, master_key: bytes) -> None:
        """R14: ask the last ensemble's nodes to seal at `last_entry_id` (best effort:
        the metadata is the truth)."""

        async def seal_one(member: EnsembleMember) -> None:
            channel = await self._context.pool.channel(member.address)
            await channel.close_ledger(
                self._ledger_id,
                last_entry_id,
                master_key=master_key,
                instance_id=member.instance_id,
                timeout_s=self._context.config.node_timeout_s,
            )

        await self._on_each(self.record.value.ensembles[-1].members, seal_one, "seal")

    async def write_lac(self, lac: int, master_key: bytes) -> None:
        """R7: tell the current ensemble the LAC (best effort)."""

        async def write_one(member: EnsembleMember) -> None:
            channel = await self._context.pool.channel(member.address)
            await channel.write_lac(
                self._ledger_id,
                lac,
                master_key=master_key,
                instance_id=member.instance_id,
                timeout_s=self._context.config.node_timeout_s,
            )

        failed = self._adds.failed_members
        members = [m for m in self._adds.ensemble.members if m not in failed]
        await self._on_each(members, write_one, "write the LAC")

    async def _on_each(
        self,
        members: Sequence[EnsembleMember],
        call: Callable[[EnsembleMember], Awaitable[None]],
        what: str,
    ) -> None:
        timeout_s = self._context.config.node_timeout_s

        async def one(member: EnsembleMember) -> None:
            with anyio.move_on_after(timeout_s) as scope:
                try:
                    await call(member)
                except NoSuchLedger:
                    pass
                except (PoraError, OSError) as error:
                    _log.info(
                        "ledger %d: could not %s on %s: %s", self._ledger_id, what, member, error
                    )
            if scope.cancelled_caught:
                _log.info("ledger %d: no answer to %s from %s", self._ledger_id, what, member)

        async with anyio.create_task_group() as tasks:
            for member in members:
                tasks.start_soon(one, member)
