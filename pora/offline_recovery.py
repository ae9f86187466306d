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
from pora.datadir import DataDir
from pora.inspect import torn_tail_json
from pora.progress import Progress
from pora.recovery import RecoveryReport

#: how often the "replaying" line is refreshed while the node recovers
_TICK_S: Final = 0.2


def recover(directory: DataDir) -> RecoveryReport:
    """Replay and trim the journal of `directory` (the node's lock is taken by
    `open_node`: a node started meanwhile makes this raise DataDirLocked)."""
    return trio.run(_recover, directory)


async def _recover(directory: DataDir) -> RecoveryReport:
    # open_node offers no progress callback for its recovery: show that it is alive
    with Progress("replaying journal (node recovery)", None, unit="elapsed") as bar:
        async with trio.open_nursery() as nursery:

            async def tick() -> None:
                while True:
                    await trio.sleep(_TICK_S)
                    bar.update(0)

            nursery.start_soon(tick)
            async with pora.open_node(directory.root) as node:
                report = node.statistics().recovery
            nursery.cancel_scope.cancel()
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
        "segments_trimmed": report.segments_trimmed,
        "seconds": round(report.seconds, 3),
    }
