"""`pora recover`: replay a stopped node's journal into its ledgers, offline, then trim.

The replay is the node's own: `pora.open_node` recovers on open (the same code a
node runs at start) and its clean exit flushes every ledger and trims the journal.
`--dry-run` only scans the journal and counts what would be replayed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ledger.index import Index
from ledger.state import LedgerMeta
from pora.cli._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    CommandError,
    add_common_arguments,
    command,
    offline_data_dir,
    open_index,
    print_fields,
    print_json,
)
from pora.node.datadir import DataDir, IndexMissing, refuse_entry_logs_without_index
from pora.tools.inspection import (
    durable_seqs,
    journal_data_bytes,
    plan_replay,
    torn_tail_json,
)
from pora.tools.offline_replay import recover, report_json
from pora.tools.progress import Progress


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "recover",
        help="replay the journal into the ledgers (offline), then trim it",
        description="Replay a stopped node's journal into its entry logs and index, "
        "with the node's own recovery code, then delete the replayed journal. "
        "Idempotent: a second run replays nothing. A torn journal tail (the cut-off "
        "last write of a crash) is reported and is not an error.",
    )
    add_common_arguments(parser)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="only report what would be replayed; change nothing",
    )
    parser.add_argument(
        "--accept-journal-gap",
        action="store_true",
        help="replay what the journal holds even though segments it must hold are "
        "missing (or its watermark is missing or damaged), accepting that the entries "
        "in them are lost on this node; only when they cannot be restored from a "
        "backup (see docs/operations.md, 'The journal has a gap')",
    )
    parser.set_defaults(run=run)


@command
def run(args: argparse.Namespace) -> int:
    with offline_data_dir(args.data_dir) as directory:
        index = _open_existing_index(directory)
        metas: dict[int, LedgerMeta] = {}
        if index is not None:
            try:
                metas = index.load_all_meta()
            finally:
                index.close()
        if args.dry_run:
            with Progress("scanning journal", journal_data_bytes(directory.journal_dir)) as bar:
                plan = plan_replay(
                    directory.journal_dir,
                    durable_seqs(metas),
                    progress=bar.update,
                    require_watermark=directory.journal_watermark_required,
                )
            result: dict[str, Any] = {
                "dry_run": True,
                "segments": plan.segments,
                "records_scanned": plan.records_scanned,
                "records_replayed": plan.records_to_replay,
                "bytes_scanned": plan.bytes_scanned,
                "bytes_replayed": plan.bytes_to_replay,
                "ledgers_touched": sorted(plan.ledgers),
                "torn_tail": torn_tail_json(plan.torn_tail),
                "gaps_accepted": [],
                "segments_trimmed": 0,
            }
            _print_result(result, as_json=args.json)
            return EXIT_OK
    # the node takes the lock itself: a node started in between is refused by it
    report = recover(directory, accept_journal_gap=args.accept_journal_gap)
    result = {"dry_run": False, **report_json(report)}
    _print_result(result, as_json=args.json)
    return EXIT_OK


def _open_existing_index(directory: DataDir) -> Index | None:
    """The index (read-only), or None for a node that never stored anything. A
    missing index next to entry logs is refused (the node's own check): recovering
    into a fresh index would start those ledgers over and overwrite their logs."""
    try:
        refuse_entry_logs_without_index(directory)
    except IndexMissing as error:
        raise CommandError(str(error), EXIT_PROBLEMS) from error
    if not (directory.index_dir / "CURRENT").exists():
        return None
    return open_index(directory)


def _print_result(result: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print_json(result)
        return
    dry = result["dry_run"]
    torn = result["torn_tail"]
    ledgers = result["ledgers_touched"]
    shown = ", ".join(str(ledger) for ledger in ledgers[:20])
    if len(ledgers) > 20:
        shown += f", ... ({len(ledgers) - 20} more)"
    fields: list[tuple[str, object]] = [
        ("journal segments", result["segments"]),
        ("records scanned", f"{result['records_scanned']} ({result['bytes_scanned']} bytes)"),
        (
            "records to replay" if dry else "records replayed",
            f"{result['records_replayed']} ({result['bytes_replayed']} bytes)",
        ),
        ("ledgers touched", f"{len(ledgers)}" + (f": {shown}" if ledgers else "")),
        (
            "torn tail",
            "none" if torn is None else torn["message"],
        ),
    ]
    for gap in result["gaps_accepted"]:
        fields.append(("GAP ACCEPTED", f"{gap}: entries there are lost on this node"))
    if dry:
        fields.append(("note", "dry run: nothing was written; run without --dry-run to replay"))
    else:
        fields.append(("segments trimmed", result["segments_trimmed"]))
        fields.append(("seconds", result["seconds"]))
    print_fields(fields)
    sys.stdout.flush()
