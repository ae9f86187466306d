"""Replaying a stopped node's journal with the node's own recovery code.

`pora.open_node` recovers before it yields the node and, on a clean exit, flushes
every ledger, syncs the index and deletes the replayed journal; so opening and
closing a node is an exact offline `recover`. Shared by `pora recover` and
`pora verify --rebuild-index`.
"""

from __future__ import annotations

from typing import Any, Final

import trio

import pora
from pora.node.datadir import DataDir
from pora.node.replay import RecoveryReport
from pora.tools.inspection import journal_data_bytes, torn_tail_json
from pora.tools.progress import Progress

#: the progress bar's label: its total is the journal's written bytes, an estimate
REPLAY_LABEL: Final = "replaying journal (total estimated from segment sizes)"


def recover(directory: DataDir, *, accept_journal_gap: bool = False) -> RecoveryReport:
    """Replay and trim the journal of `directory` (the node's lock is taken by
    `open_node`: a node started meanwhile makes this raise DataDirLocked).
    `accept_journal_gap`: see `pora.open_node`."""
    return trio.run(_recover, directory, accept_journal_gap)


async def _recover(directory: DataDir, accept_journal_gap: bool) -> RecoveryReport:
    # the total is an estimate: the segments' written bytes include batch headers and
    # block padding, which the scan does not count, so the bar may end short of 100%
    # (finish() completes it)
    total = await trio.to_thread.run_sync(journal_data_bytes, directory.journal_dir)
    with Progress(REPLAY_LABEL, total) as bar:
        async with pora.open_node(
            directory.root, recovery_progress=bar.update, accept_journal_gap=accept_journal_gap
        ) as node:
            report = node.statistics().recovery
    return report


def report_json(report: RecoveryReport) -> dict[str, Any]:
    return {
        "segments": report.segments,
        "records_scanned": report.records_scanned,
        "records_replayed": report.records_replayed,
        "bytes_scanned": report.bytes_scanned,
        "bytes_replayed": report.bytes_replayed,
        "ledgers_touched": sorted(report.ledgers_touched),
        "torn_tail": torn_tail_json(report.torn_tail),
        "gaps_accepted": report.gaps_accepted,
        "segments_trimmed": report.segments_trimmed,
        "seconds": round(report.seconds, 3),
    }
