"""Crash recovery: replay the journal into the ledgers, then trim it.

The seed's algorithm, made safe:

1. Each ledger's metadata in the index says up to which journal seq it is durable
   (`durable_seq`) and where its entry log ends (`log_end`).
2. Every journal record after that seq is applied again through the *same* dispatch
   and ledger-worker code as live writes; entry-log writes are positioned (at
   `log_end`), so bytes a crashed flush left past the end are simply overwritten.
3. Every ledger is flushed, the index synced, and then all segments are deleted.

Idempotent: a crash anywhere in here leaves either the old journal (replayed again
next time, skipping what became durable) or nothing left to replay.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from journal.reader import JournalRecord, JournalScanner, TornTail
from journal.request import Request
from journal.segment import list_segments
from journal.trim import delete_segments
from ledger.registry import LedgerRegistry

_log = logging.getLogger("pora.recovery")

#: called with the number of journal bytes scanned so far
ProgressCallback = Callable[[int], None]

#: records handed from the scanning thread to the event loop at a time
_SCAN_CHUNK_RECORDS = 8192


@dataclass(slots=True)
class RecoveryReport:
    segments: int = 0
    records_scanned: int = 0
    records_replayed: int = 0
    bytes_scanned: int = 0
    bytes_replayed: int = 0
    ledgers_touched: set[int] = field(default_factory=set)
    torn_tail: TornTail | None = None
    segments_trimmed: int = 0
    next_seq: int = 0
    seconds: float = 0.0


async def replay_journal(
    journal_dir: Path,
    registry: LedgerRegistry,
    *,
    dry_run: bool = False,
    progress: ProgressCallback | None = None,
) -> RecoveryReport:
    """Replay every record not yet durable elsewhere; flush; trim (unless dry_run)."""
    started = time.perf_counter()
    report = RecoveryReport()
    # snapshot: live durable_seq values move as replayed data gets flushed
    durable = {ledger_id: meta.durable_seq for ledger_id, meta in registry.metas.items()}
    max_durable = max(durable.values(), default=-1)
    segments = await trio.to_thread.run_sync(list_segments, journal_dir)
    report.segments = len(segments)
    scanner = JournalScanner(journal_dir)
    batches = scanner.batches()

    def next_chunk() -> list[list[JournalRecord]]:
        chunk: list[list[JournalRecord]] = []
        count = 0
        for batch in batches:
            chunk.append(batch)
            count += len(batch)
            if count >= _SCAN_CHUNK_RECORDS:
                break
        return chunk

    # scanning (a thread) runs ahead of applying (the event loop), two chunks deep
    send_chunk, receive_chunk = trio.open_memory_channel[list[list[JournalRecord]]](2)

    async def scan_ahead() -> None:
        async with send_chunk:
            while chunk := await trio.to_thread.run_sync(next_chunk):
                await send_chunk.send(chunk)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(scan_ahead)
        async with receive_chunk:
            async for chunk in receive_chunk:
                await _apply_chunk(chunk, durable, registry, report, dry_run=dry_run)
                if progress is not None:
                    progress(scanner.summary.record_bytes)
    summary = scanner.summary
    report.torn_tail = summary.torn_tail
    if report.torn_tail is not None:
        _log.warning(
            "journal ends with a torn tail in %s at byte %d (%s): the last group commit "
            "was cut by the crash; it was never acknowledged",
            report.torn_tail.segment,
            report.torn_tail.offset,
            report.torn_tail.reason,
        )
    first_seq_on_disk = max((s.first_seq for s in segments), default=0)
    report.next_seq = max(summary.last_seq + 1, first_seq_on_disk, max_durable + 1)
    if not dry_run:
        await registry.flush_all()
        await trio.to_thread.run_sync(registry.storage.index.sync)
        # everything is durable in entry logs and index now: the journal can go
        report.segments_trimmed = len(segments)
        await trio.to_thread.run_sync(delete_segments, journal_dir, segments)
    report.seconds = time.perf_counter() - started
    return report


async def _apply_chunk(
    chunk: list[list[JournalRecord]],
    durable: dict[int, int],
    registry: LedgerRegistry,
    report: RecoveryReport,
    *,
    dry_run: bool,
) -> None:
    """Turn journal records not yet durable into requests and dispatch them, group
    by group, exactly as the journal task dispatches live groups."""
    touched = report.ledgers_touched
    for batch in chunk:
        report.records_scanned += len(batch)
        group: list[Request] = []
        for record in batch:
            size = len(record.payload)
            report.bytes_scanned += size
            if record.seq <= durable.get(record.ledger_id, -1):
                continue
            request = Request(
                record.kind,
                record.ledger_id,
                record.entry_id,
                record.payload,
                record.flags,
                None,
                record.lac,
            )
            request.seq = record.seq
            request.body = record.body
            group.append(request)
            touched.add(record.ledger_id)
            report.bytes_replayed += size
        report.records_replayed += len(group)
        if group and not dry_run:
            await registry.dispatch(group)
