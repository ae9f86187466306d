"""Crash recovery: replay the journal into the ledgers, then trim it.

The seed's algorithm, made safe:

1. Each ledger's metadata in the index says up to which journal seq it is durable
   (`durable_seq`) and where its entry log ends (`log_end`).
2. Every journal record after that seq is applied again through the *same* dispatch
   and ledger-worker code as live writes; entry-log writes are positioned (at
   `log_end`), so bytes a crashed flush left past the end are simply overwritten.
3. Every ledger is flushed, the index synced, the journal watermark set past the
   journal's end (journal/watermark.py), and then all segments are deleted.
   If a flush fails (a full or failing disk), every segment is kept instead, and
   the replayed entries of those ledgers stay in their memtables (readable); their
   workers retry the flush on their own schedule and hold the journal from being
   trimmed until it succeeds. A torn tail is then cut off the kept journal, so
   that the segments the node writes next can follow it.

Before any record is applied, the scan checks that the segments hold every seq from
the watermark on, without a gap (JournalGap otherwise: nothing is replayed).

Idempotent: a crash anywhere in here leaves either the old journal (replayed again
next time, skipping what became durable) or nothing left to replay.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import trio

from journal.fileio import fsync_directory
from journal.reader import JournalScanner, ReplayRuns, ReplayTally, TornTail
from journal.request import LedgerPart
from journal.segment import SegmentInfo, list_segments
from journal.trim import delete_segments
from journal.watermark import JournalState, Watermark, write_watermark
from ledger.errors import FlushFailed
from ledger.registry import LedgerRegistry

_log = logging.getLogger("pora.replay")

#: called with the number of journal bytes scanned so far
ProgressCallback = Callable[[int], None]

#: handed from the scanning thread to the event loop at a time: the batches that
#: hold this many records to replay (entries of a run each count), or this many
#: journal bytes (at least one batch)
_SCAN_CHUNK_RECORDS = 16384
_SCAN_CHUNK_BYTES = 16 << 20


@dataclass(slots=True)
class RecoveryReport:
    segments: int = 0
    records_scanned: int = 0
    records_replayed: int = 0
    bytes_scanned: int = 0
    bytes_replayed: int = 0
    ledgers_touched: set[int] = field(default_factory=set)
    torn_tail: TornTail | None = None
    #: what each gap the operator accepted (`accept_gaps`) left out
    gaps_accepted: list[str] = field(default_factory=list)
    segments_trimmed: int = 0
    #: ledgers whose flush after replay failed: the journal was kept for them
    unflushed_ledgers: list[int] = field(default_factory=list)
    #: what the failed flushes said (empty when none failed)
    flush_failure: str = ""
    next_seq: int = 0
    seconds: float = 0.0


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Disable Python's cyclic garbage collector for the block (if it was enabled)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


async def replay_journal(
    journal_dir: Path,
    registry: LedgerRegistry,
    *,
    dry_run: bool = False,
    progress: ProgressCallback | None = None,
    require_watermark: bool = False,
    accept_gaps: bool = False,
) -> RecoveryReport:
    """Replay every record not yet durable elsewhere; flush; trim (unless dry_run).

    `require_watermark`: the data dir's format keeps a journal watermark, so a
    journal without one is refused (`JournalScanner`). `accept_gaps`: the
    operator's override; replay what the segments hold past any gap (each logged)."""
    started = time.perf_counter()
    report = RecoveryReport()
    # snapshot: live durable_seq values move as replayed data gets flushed
    durable = {ledger_id: meta.durable_seq for ledger_id, meta in registry.metas.items()}
    max_durable = max(durable.values(), default=-1)
    segments = await trio.to_thread.run_sync(list_segments, journal_dir)
    report.segments = len(segments)
    scanner = JournalScanner(
        journal_dir, require_watermark=require_watermark, accept_gaps=accept_gaps
    )
    tally = ReplayTally()
    # replay keeps hundreds of thousands of bodies (views of the segments, which the
    # cyclic GC tracks) and requests in flight until the last flush: the collector's
    # passes, triggered every few hundred allocations, would walk them again and
    # again (1 s of CPU in a replay of 670k 100-byte entries). Replay makes no
    # reference cycles to speak of, so the collector rests until the flush is done.
    with _cyclic_gc_paused():
        await _scan_and_apply(scanner, ReplayRuns(durable, tally), registry, dry_run, progress)
        if not dry_run:
            # every replayed ledger flushes now: more at once
            with registry.storage.recovery_flushes():
                await _flush_all(registry, report)
    report.records_scanned = tally.records_scanned
    report.bytes_scanned = tally.payload_bytes_scanned
    report.records_replayed = tally.records_selected
    report.bytes_replayed = tally.payload_bytes_selected
    report.ledgers_touched = tally.ledgers_selected
    summary = scanner.summary
    report.torn_tail = summary.torn_tail
    for gap in summary.gaps_accepted:
        _log.warning("journal gap accepted by the operator: %s", gap.reason)
        report.gaps_accepted.append(gap.reason)
    if report.torn_tail is not None:
        _log.warning("journal ends with a torn tail: %s", report.torn_tail.describe())
    first_seq_on_disk = max((s.first_seq for s in segments), default=0)
    # the watermark too: after a clean stop it is the journal's end, and the ledger
    # that held the highest durable seq may have been deleted since
    watermark_seq = 0 if summary.watermark is None else summary.watermark.first_seq
    if summary.below_watermark:
        _log.warning(
            "%d journal segments lie below the journal watermark (seq %d): %s. Everything "
            "in them was durable in entry logs and index when the watermark was written "
            "(a trim or stop cut short before deleting them, or files put back into %s): "
            "they are not replayed%s",
            len(summary.below_watermark),
            watermark_seq,
            ", ".join(path.name for path in summary.below_watermark),
            journal_dir,
            "" if dry_run else ", and are deleted with the rest of the replayed journal",
        )
    report.next_seq = max(summary.last_seq + 1, first_seq_on_disk, max_durable + 1, watermark_seq)
    if not dry_run:
        await _trim(journal_dir, registry, segments, report)
    report.seconds = time.perf_counter() - started
    return report


async def _scan_and_apply(
    scanner: JournalScanner,
    runs: ReplayRuns,
    registry: LedgerRegistry,
    dry_run: bool,
    progress: ProgressCallback | None,
) -> None:
    """Apply the scanned records through the registry (unless dry_run), with the
    scan in a thread running ahead of the event loop."""
    batches = scanner.replay(runs)

    def next_chunk() -> tuple[dict[int, LedgerPart], bool]:
        """Each ledger's part of the next journal batches, up to a chunk's worth of
        bytes read or records; and whether the journal is exhausted."""
        summary = scanner.summary
        stop_at_bytes = summary.record_bytes + _SCAN_CHUNK_BYTES
        for _ in batches:
            if runs.records >= _SCAN_CHUNK_RECORDS or summary.record_bytes >= stop_at_bytes:
                return runs.take(), False
        return runs.take(), True

    # scanning (a thread) runs ahead of applying (the event loop), two chunks deep
    send_chunk, receive_chunk = trio.open_memory_channel[dict[int, LedgerPart]](2)

    async def scan_ahead() -> None:
        async with send_chunk:
            exhausted = False
            while not exhausted:
                chunk, exhausted = await trio.to_thread.run_sync(next_chunk)
                await send_chunk.send(chunk)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(scan_ahead)
        async with receive_chunk:
            async for chunk in receive_chunk:
                # one dispatch per chunk: each worker gets its ledger's runs of the
                # chunk as one part, and the event loop switches tasks less
                if chunk and not dry_run:
                    await registry.dispatch_parts(chunk)
                if progress is not None:
                    progress(scanner.summary.record_bytes)


async def _flush_all(registry: LedgerRegistry, report: RecoveryReport) -> None:
    """Flush every replayed ledger; those that fail go in `report.unflushed_ledgers`."""
    try:
        await registry.flush_all()
    except FlushFailed as failed:
        report.unflushed_ledgers = failed.ledger_ids
        report.flush_failure = str(failed)


async def _trim(
    journal_dir: Path, registry: LedgerRegistry, segments: list[SegmentInfo], report: RecoveryReport
) -> None:
    """Delete the journal if every replayed ledger flushed, else keep it all."""
    if report.unflushed_ledgers:
        _log.error(
            "after replay, %s. The journal in %s is kept (%d segments): the node serves "
            "those entries from memory, retries the flushes every flush interval, and "
            "trims the journal once they succeed. Free space on the disk (or fix it)",
            report.flush_failure,
            journal_dir,
            len(segments),
        )
        if report.torn_tail is not None:
            await trio.to_thread.run_sync(_cut_torn_tail, journal_dir, report.torn_tail)
        return
    await trio.to_thread.run_sync(registry.storage.index.sync)
    # everything is durable in entry logs and index now: the journal can go
    report.segments_trimmed = len(segments)
    emptied = Watermark(JournalState.EMPTY, report.next_seq)
    await trio.to_thread.run_sync(lambda: delete_segments(journal_dir, segments, watermark=emptied))


def _cut_torn_tail(journal_dir: Path, torn: TornTail) -> None:
    """End the kept journal where its valid data ends: only the last segment may end
    torn, and the node is about to write segments after it. What goes failed its
    checks (a write cut by a crash, or damaged media) and was not replayed: the
    warning above said so; cutting frees space and needs none."""
    if torn.offset == 0:  # the segment's header never reached the disk: no records
        torn.segment.unlink(missing_ok=True)
        fsync_directory(journal_dir)
        # the watermark may have named that segment's first seq: name what is left
        left = list_segments(journal_dir)
        if left:
            write_watermark(journal_dir, Watermark(JournalState.HOLDING, left[0].first_seq))
        return
    else:
        fd = os.open(torn.segment, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, torn.offset)
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_directory(journal_dir)
