"""The journal trimmer: deletes (or recycles) the journal segments whose every
record is durable in entry logs and index, periodically and when the journal asks
before making a spare segment."""

from __future__ import annotations

import contextlib
import functools
import logging

import trio

from journal.segment import list_segments
from journal.task import Journal
from journal.trim import delete_segments, trimmable_segments
from journal.watermark import JournalState, Watermark
from ledger.errors import FlushFailed
from ledger.registry import LedgerRegistry
from pora.node.datadir import DataDir

_log = logging.getLogger("pora.node")


class JournalTrimmer:
    """Trims the journal of a running node. Registers itself as the journal's
    reclaimer (`Journal.set_reclaim`); `run` trims every `interval_ms`."""

    def __init__(
        self, data_dir: DataDir, journal: Journal, registry: LedgerRegistry, interval_ms: float
    ) -> None:
        self._journal_dir = data_dir.journal_dir
        self._journal = journal
        self._registry = registry
        self._interval_s = interval_ms / 1000.0
        #: one trim at a time: the periodic one and the journal's reclaim may meet
        self._lock = trio.Lock()
        self.segments_trimmed = 0
        journal.set_reclaim(self.reclaim)

    async def run(self) -> None:
        while True:
            await trio.sleep(self._interval_s)
            await self.reclaim()

    async def trim(self) -> int:
        """Delete the journal segments whose every record is durable elsewhere (or
        keep them as spares: `GroupCommitConfig.recycle_segments`).

        Returns how many went. Runs periodically, and before the journal makes a
        spare segment (`Journal.set_reclaim`); callable by hand (tests).
        """
        async with self._lock:
            return await self._trim()

    async def _trim(self) -> int:
        oldest = self._registry.oldest_undurable_seq()
        watermark = self._journal.dispatched_seq
        if oldest is not None:
            watermark = min(watermark, oldest)
        journal_dir = self._journal_dir
        segments = await trio.to_thread.run_sync(list_segments, journal_dir)
        victims = trimmable_segments(segments, watermark)
        if not victims:
            return 0
        index = self._registry.storage.index
        # the index writes of flushes were not synced one by one: sync them all now,
        # before the journal that could redo them goes away
        try:
            await trio.to_thread.run_sync(index.sync)
        except OSError as error:
            # a full or failing index disk: the flushes meet it too and say what to do;
            # the node goes on serving, and the journal keeps these segments meanwhile
            _log.warning(
                "journal trim put off: the index could not be synced (%s); the journal "
                "keeps %d segment(s) that could go until a sync succeeds",
                error,
                len(victims),
            )
            return 0
        pool = self._journal.recycle_pool
        # the journal must hold everything from the first segment it keeps on
        kept_from = Watermark(JournalState.HOLDING, segments[len(victims)].first_seq)
        await trio.to_thread.run_sync(
            functools.partial(
                delete_segments, journal_dir, victims, watermark=kept_from, recycle_into=pool
            )
        )
        self.segments_trimmed += len(victims)
        return len(victims)

    async def reclaim(self) -> int:
        """Flush the ledgers whose unflushed entries are in a closed journal segment,
        then trim (`trim`); returns how many segments went.

        A ledger flushes when its memtable fills or its flush interval passes. Under
        load a segment closes every second or so, and a ledger that went quiet with
        a little unflushed would keep it, and every segment after it, for up to its
        flush interval: the journal grows by gigabytes, spares must be zero-filled
        instead of recycled, and syncs slow down (a node loaded again right after
        another load runs well below a fresh one: docs/performance.md). Flushing such a ledger
        early costs what its next flush would have cost. The periodic trimmer and
        the journal, before it makes a spare, reclaim this way.
        """
        segment = self._journal.open_segment
        if segment is not None:
            # a ledger whose flush fails keeps its segments (its oldest undurable seq
            # stays) and retries on its own schedule; the others' flushes went through
            with contextlib.suppress(FlushFailed):
                await self._registry.flush_all(undurable_before=segment.first_seq)
        return await self.trim()
