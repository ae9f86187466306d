"""Starting and stopping a node: `open_node` and what it runs.

`open_node` is the one way to run a node (in-process, in tests, and under
`pora serve`): it locks the data dir, replays the journal, starts the tasks, yields
the `Node`, and on exit stops taking requests, drains, flushes, trims and unlocks.
If a ledger's last flush failed (a full or failing disk), the exit keeps the
whole journal, which holds that ledger's entries, and raises FlushFailed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

from journal.errors import JournalError
from journal.segment import list_segments
from journal.task import Journal
from journal.trim import delete_segments
from journal.watermark import JournalState, Watermark, write_watermark
from ledger.arrivals import Arrivals
from ledger.errors import FlushFailed, describe_os_error, ledger_list
from ledger.index import Index
from ledger.registry import LedgerRegistry
from ledger.storage import LedgerStorage
from pora import tracing
from pora.node.config import NodeConfig
from pora.node.datadir import (
    DataDir,
    DataDirLock,
    open_data_dir,
    refuse_entry_logs_without_index,
    upgrade_data_dir,
)
from pora.node.node import FenceBarrier, Node
from pora.node.replay import ProgressCallback, RecoveryReport, replay_journal
from pora.node.trimmer import JournalTrimmer

_log = logging.getLogger("pora.node")


@contextlib.asynccontextmanager
async def open_node(
    data_dir: str | Path = "pora-data",
    *,
    recovery_progress: ProgressCallback | None = None,
    accept_journal_gap: bool = False,
    fence_barrier: FenceBarrier | None = None,
    **options: Any,
) -> AsyncIterator[Node]:
    """Run a node on `data_dir` for the duration of the `async with` block.

    Options are the fields of NodeConfig, GroupCommitConfig and LedgerConfig, by
    name (for example `group_wait_ms_max=2`, `memtable_flush_bytes=8 << 20`).
    `recovery_progress`, if given, is called now and then during recovery with the
    journal bytes scanned so far (for progress bars). `accept_journal_gap` is the
    operator's override (`pora recover --accept-journal-gap`): recovery replays what
    the journal holds past a gap, or a missing or damaged watermark, instead of
    refusing; what may be lost is logged and in `statistics().recovery`.
    `fence_barrier` is a cluster's (`pora serve`: its `NodeMark`): the node answers
    a fence only once `await fence_barrier(position)` returned, `position` being the
    journal position the record that fenced the ledger lies below (R27).
    """
    config = NodeConfig.from_options(**options)
    root = Path(data_dir)
    directory = await trio.to_thread.run_sync(lambda: open_data_dir(root))
    lock = DataDirLock(directory.root)
    lock.acquire()
    try:
        directory = await trio.to_thread.run_sync(upgrade_data_dir, directory)
        # before LevelDB is asked: it would create an empty index in place of a lost one
        await trio.to_thread.run_sync(refuse_entry_logs_without_index, directory)
        index = await trio.to_thread.run_sync(
            lambda: Index(
                directory.index_dir,
                cache_bytes=config.index_cache_bytes,
                bloom_bits=config.index_bloom_bits,
                paranoid_checks=True,
            )
        )
        try:
            if await trio.to_thread.run_sync(index.is_empty):
                await trio.to_thread.run_sync(
                    functools.partial(refuse_entry_logs_without_index, directory, index_empty=True)
                )
            async with _running_node(
                directory, config, index, recovery_progress, accept_journal_gap, fence_barrier
            ) as node:
                yield node
        finally:
            # shielded: a node left by cancellation (its owner's scope, a crash) must
            # still close LevelDB, whose lock would refuse the next open in this process
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(index.close)
    finally:
        lock.release()


@contextlib.asynccontextmanager
async def _running_node(
    directory: DataDir,
    config: NodeConfig,
    index: Index,
    recovery_progress: ProgressCallback | None,
    accept_journal_gap: bool,
    fence_barrier: FenceBarrier | None,
) -> AsyncIterator[Node]:
    metas = await trio.to_thread.run_sync(index.load_all_meta)
    arrivals = Arrivals(config.long_polls_unknown_ledgers_max)
    storage = LedgerStorage(directory.ledgers_dir, index, config.ledger, arrivals)
    registry = LedgerRegistry(storage, metas)
    clean_exit = False
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(registry.run)
            report = await _replay(directory, registry, recovery_progress, accept_journal_gap)
            journal = Journal(
                directory.journal_dir,
                config.journal,
                first_seq=report.next_seq,
                dispatch=registry.dispatch,
                dispatch_nowait=registry.dispatch_nowait,
            )
            journal.trace = tracing.current()  # None unless PORA_TRACE_FILE is set
            journal_done = await _start_journal(nursery, journal, directory)
            # before the first record: from now on the journal holds what it gets (and
            # the segments a replay could not flush, which come before)
            await trio.to_thread.run_sync(_mark_journal_holding, directory.journal_dir)
            trimmer = JournalTrimmer(directory, journal, registry, config.trim_interval_ms)
            node = Node(directory, config, journal, registry, trimmer, report, fence_barrier)
            trimming = trio.CancelScope()

            async def run_trimmer() -> None:
                with trimming:
                    await trimmer.run()

            nursery.start_soon(run_trimmer)
            try:
                yield node
            finally:
                # stop taking requests, write what is queued, let every ledger
                # apply and flush it, then stop
                node.stop_taking_requests()
                journal.close_input()
                with trio.CancelScope(shield=True):
                    await journal_done.wait()
                    trimming.cancel()
                    registry.close()
        clean_exit = True
    finally:
        storage.files.close_all()
    if clean_exit:
        unflushed = registry.unflushed_ledgers()
        if unflushed:
            # their entries are durable in the journal only: keep all of it (the next
            # start replays what the index does not hold yet)
            raise _journal_kept(directory, unflushed)
        # every record is durable in entry logs and index: start next time with an
        # empty journal (nothing to replay)
        await trio.to_thread.run_sync(index.sync)
        segments = await trio.to_thread.run_sync(list_segments, directory.journal_dir)
        emptied = Watermark(JournalState.EMPTY, journal.next_seq)
        await trio.to_thread.run_sync(
            functools.partial(delete_segments, directory.journal_dir, segments, watermark=emptied)
        )


async def _replay(
    directory: DataDir,
    registry: LedgerRegistry,
    recovery_progress: ProgressCallback | None,
    accept_journal_gap: bool,
) -> RecoveryReport:
    """Replay the journal into the (running) registry; from then on the ledgers'
    master keys, replayed or from the index, are checked."""
    _log.info("recovering %s: %d ledgers known", directory.root, len(registry.metas))
    report = await replay_journal(
        directory.journal_dir,
        registry,
        progress=recovery_progress,
        require_watermark=directory.journal_watermark_required,
        accept_gaps=accept_journal_gap,
    )
    _log.info(
        "recovered in %.2fs: %d segments, %d of %d records replayed into %d ledgers",
        report.seconds,
        report.segments,
        report.records_replayed,
        report.records_scanned,
        len(report.ledgers_touched),
    )
    registry.storage.keys.restore(
        (ledger_id, meta.master_key)
        for ledger_id, meta in registry.metas.items()
        if meta.master_key is not None
    )
    return report


async def _start_journal(nursery: trio.Nursery, journal: Journal, directory: DataDir) -> trio.Event:
    """Run the journal task in `nursery`; the event is set when it has ended."""
    journal_done = trio.Event()

    async def run_journal(task_status: trio.TaskStatus[None]) -> None:
        try:
            await journal.run(task_status=task_status)
        finally:
            journal_done.set()

    try:
        await nursery.start(run_journal)
    except OSError as error:  # no room for a new segment, say
        raise JournalError(
            f"cannot start the journal in {directory.journal_dir}: "
            f"{describe_os_error(error)}. Nothing acknowledged is lost: every "
            "journal segment is kept. Free space on that filesystem (or fix the "
            "disk), then start the node again"
        ) from error
    return journal_done


def _journal_kept(directory: DataDir, unflushed: dict[int, str]) -> FlushFailed:
    ledgers = sorted(unflushed)
    return FlushFailed(
        ledgers,
        f"the node closed, but {len(ledgers)} ledger(s) could not be flushed to their "
        f"entry logs (ledgers {ledger_list(ledgers)}; first: {unflushed[ledgers[0]]}). "
        f"Nothing acknowledged is lost: the journal in {directory.journal_dir} is kept "
        "with their entries. Free space on the disk (or fix it), then start the node "
        "again or run `pora recover`: the journal is replayed then",
    )


def _mark_journal_holding(journal_dir: Path) -> None:
    """Set the watermark to the oldest segment: the journal just opened its first one
    (after recovery emptied the journal, the only one), and must hold it all."""
    segments = list_segments(journal_dir)
    assert segments, "the journal opens its segment before it starts"
    write_watermark(journal_dir, Watermark(JournalState.HOLDING, segments[0].first_seq))
