"""What every ledger worker of a node shares: the index, the open-file cache, the
memory budget, the flush thread limit, and where entry logs live."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import trio

from ledger.arrivals import Arrivals
from ledger.entrylog import EntryLog
from ledger.errors import NoSuchEntry
from ledger.filecache import FileCache
from ledger.index import Index
from ledger.keys import LedgerKeys
from ledger.memtable import MemoryBudget


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    """Knobs of the ledger workers. Units are last in names."""

    #: bound of each ledger's channel, in batches
    ledger_channel_batches_max: int = 256
    #: a ledger flushes its memtable once this many bytes are unflushed. Small
    #: enough that one flush's fdatasync does not hold up the journal's for long
    #: (p99 add latency), large enough that many ledgers do not flush too often
    #: (adds/s of 100 ledgers in-process); figures: docs/performance.md
    memtable_flush_bytes: int = 2 << 20
    #: a ledger stops taking entries (backpressure) past this many unflushed bytes
    memtable_ledger_bytes_max: int = 16 << 20
    #: node-wide ceiling of unflushed bytes: past it, every ledger that adds flushes
    memtable_total_bytes_max: int = 256 << 20
    #: flushed entries kept in memory per ledger for tail readers
    recent_bytes_max: int = 256 << 10
    #: unflushed data older than this is flushed: bounds journal growth and replay
    #: time; each flush costs a thread hop, an fdatasync and an index write per
    #: ledger, so with thousands of ledgers a short interval costs throughput
    flush_interval_ms: float = 10_000.0
    #: an idle, clean ledger worker retires after this long
    idle_retire_ms: float = 30_000.0
    #: entry logs grow by preallocated chunks of this size
    entrylog_prealloc_bytes: int = 4 << 20
    #: open entry-log files, node-wide
    open_files_max: int = 1024
    #: flushes running at once (each is a write + fdatasync + index batch)
    flush_threads_max: int = 4
    #: flushes running at once at the end of the journal's replay at start, when
    #: every replayed ledger flushes and nothing else runs yet: fdatasyncs of many
    #: entry logs at once share the file system's journal commits (that flush, in a
    #: 256 MiB replay of 100 ledgers: 0.75-1.2 s with 4 at once, 0.14-0.65 s with 32;
    #: 32 for the whole replay was slower, the flush threads taking the reader's GIL)
    recovery_flush_threads_max: int = 32
    fsync: bool = True

    def __post_init__(self) -> None:
        if self.memtable_ledger_bytes_max < self.memtable_flush_bytes:
            raise ValueError("memtable_ledger_bytes_max must be >= memtable_flush_bytes")
        if min(self.open_files_max, self.flush_threads_max, self.recovery_flush_threads_max) < 1:
            raise ValueError(
                "open_files_max, flush_threads_max and recovery_flush_threads_max must be >= 1"
            )


class _NotCached(Exception):
    """Raised by the opener given to FileCache.acquire when we only want a hit."""


def _not_cached() -> EntryLog:
    raise _NotCached


class LedgerStorage:
    def __init__(self, root: Path, index: Index, config: LedgerConfig, arrivals: Arrivals) -> None:
        self.root = root
        self.index = index
        self.config = config
        self.files: FileCache[int, EntryLog] = FileCache(config.open_files_max, EntryLog.close)
        self.budget = MemoryBudget(config.memtable_total_bytes_max)
        self.flush_limiter = trio.CapacityLimiter(config.flush_threads_max)
        #: for thread calls made while already holding a flush_limiter slot
        self.slot_held = trio.CapacityLimiter(math.inf)
        #: every ledger's master key, checked when requests are submitted (before they
        #: are journalled); a worker forgets a deleted ledger's
        self.keys = LedgerKeys(index.is_deleted)
        #: long-poll readers wait here; a worker signals after applying to its ledger
        self.arrivals = arrivals

    @contextlib.contextmanager
    def recovery_flushes(self) -> Iterator[None]:
        """Let `recovery_flush_threads_max` flushes run at once for the block (the
        end of the journal's replay at start), then `flush_threads_max` again."""
        limiter = self.flush_limiter
        limiter.total_tokens = max(self.config.recovery_flush_threads_max, limiter.total_tokens)
        try:
            yield
        finally:
            limiter.total_tokens = self.config.flush_threads_max

    def entrylog_path(self, ledger_id: int) -> Path:
        # 256 subfolders keep directories small with 10,000s of ledgers
        return self.root / f"{ledger_id & 0xFF:02x}" / f"{ledger_id:016x}.log"

    async def acquire_log(self, ledger_id: int, *, create: bool) -> EntryLog:
        """The ledger's entry log, pinned in the cache until `release_log`.

        Opening validates a header and creating preallocates and syncs: both are
        blocking, so they run in a thread, outside the (thread-unsafe) cache.
        """
        try:
            return self.files.acquire(ledger_id, _not_cached)
        except _NotCached:
            pass
        path = self.entrylog_path(ledger_id)
        chunk = self.config.entrylog_prealloc_bytes
        fsync = self.config.fsync
        if create:
            opened = await trio.to_thread.run_sync(
                lambda: EntryLog.create(path, ledger_id, prealloc_chunk_bytes=chunk, fsync=fsync)
            )
        else:
            opened = await trio.to_thread.run_sync(
                lambda: EntryLog.open(path, ledger_id, prealloc_chunk_bytes=chunk, fsync=fsync)
            )
        log = self.files.acquire(ledger_id, lambda: opened)
        if log is not opened:  # another task opened it while we were in the thread
            opened.close()
        return log

    def release_log(self, ledger_id: int) -> None:
        self.files.release(ledger_id)

    def read_stored(self, log: EntryLog, ledger_id: int, entry_id: int) -> bytes:
        """Index lookup and pread of one entry (blocking: call from a thread)."""
        position = self.index.get_position(ledger_id, entry_id)
        if position is None:
            raise NoSuchEntry(ledger_id, entry_id)
        offset, record_length = position
        return log.read_record(offset, record_length, entry_id)
