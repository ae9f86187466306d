"""`pora ledger list | show | read`: what a stopped node stores, from its index and
entry logs; with `--metadata URL`, the cluster's records, and `show | read | tail |
recover` of one ledger through the cluster (`_ledger_cluster.py`).

The index and entry logs hold what was flushed; records still only in the journal
(a node that crashed and was not recovered yet) are not there. These commands scan
the journal for such records and say so ("run `pora recover` first") rather than
show stale data as if it were all.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Iterable
from pathlib import Path
from typing import Final, NoReturn

from journal.errors import JournalError
from ledger.index import Index
from ledger.state import NO_ENTRY, LedgerMeta
from pora.cli import _ledger_cluster as cluster
from pora.cli._common import (
    DEFAULT_DATA_DIR,
    EXIT_OK,
    EXIT_REFUSED,
    CommandError,
    add_common_arguments,
    command,
    offline_data_dir,
    open_index,
    print_fields,
    print_json,
    print_table,
    warn,
)
from pora.cli._entries import RawPayloads, check_raw_target, print_entry
from pora.cli._ledger_metadata import (
    add_metadata_listing_arguments,
    check_no_paging,
    list_from_metadata,
)
from pora.node.datadir import DataDir
from pora.tools.inspection import (
    ReplayPlan,
    durable_seqs,
    entrylog_path,
    journal_data_bytes,
    ledger_details,
    ledger_row,
    open_entry_log,
    plan_replay,
    read_entries,
    visible_last_entry,
)
from pora.tools.progress import Progress

#: ledger and entry ids are non-negative i64
ID_LIMIT: Final = 2**63

_LIST_COLUMNS = (
    "ledger_id",
    "state",
    "first_entry_id",
    "last_entry_id",
    "entry_count",
    "payload_bytes",
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "ledger",
        help="inspect ledgers (list, show, read, tail, recover)",
        description="Inspect the ledgers of a stopped node, from its index and entry logs "
        "(--data-dir), or of the cluster through its metadata store (--metadata).",
    )
    commands = parser.add_subparsers(dest="ledger_command", metavar="COMMAND")
    parser.set_defaults(run=lambda _args: _usage(parser))

    listing = commands.add_parser(
        "list",
        help="every ledger: state, first and last entry, entry count, bytes",
        description="List every ledger of a stopped node's data dir (--data-dir): id, state "
        "(open, closed, fenced), first and last entry id (for a closed ledger: the sealed "
        "last entry), entry count and payload bytes; warns about journal records not yet "
        "replayed into them. Or, with --metadata URL, the cluster's ledgers as the "
        "metadata store records them: id, state, ensembles, quorums, last entry, length.",
    )
    add_common_arguments(listing)
    add_metadata_listing_arguments(listing)
    # --data-dir's default applies only when --metadata is not given either
    listing.set_defaults(run=run_list, data_dir=None)

    show = commands.add_parser(
        "show",
        help="one ledger's metadata",
        description="Print one ledger's metadata as a stopped node's index stores it "
        "(--data-dir), or as the metadata store records it with the last entry its nodes "
        "confirm (--metadata URL; never fences a writer).",
    )
    add_common_arguments(show)
    cluster.add_cluster_arguments(show, required=False)
    show.add_argument("ledger_id", type=int, metavar="ID")
    # --data-dir's default applies only when --metadata is not given either
    show.set_defaults(run=run_show, data_dir=None)

    read = commands.add_parser(
        "read",
        help="a ledger's entries (hex, raw bytes to a file, or JSON lines)",
        description="Print a ledger's stored entries in [--from, --to]: one line per entry "
        "with its id, size and payload as hex; or --raw FILE to write the payloads' raw "
        "bytes (concatenated, in entry order) to FILE; or --json for JSON lines with the "
        "payload in base64. Every record is checked against its checksum. Refuses when the "
        "journal holds records of the ledger not yet replayed (run `pora recover` first). "
        "With --metadata URL, reads the replicated ledger through the cluster (any live "
        "replica of each entry; an open ledger up to the last entry its nodes confirm, "
        "never fencing its writer).",
    )
    add_common_arguments(read)
    cluster.add_cluster_arguments(read, required=False)
    read.add_argument("ledger_id", type=int, metavar="ID")
    read.add_argument("--from", dest="first", type=int, default=0, metavar="N")
    read.add_argument("--to", dest="last", type=int, metavar="M", help="inclusive")
    read.add_argument("--raw", type=Path, metavar="FILE", help="write raw payload bytes here")
    read.add_argument(
        "--allow-stale",
        action="store_true",
        help="read what is stored even if the journal holds newer records of the ledger",
    )
    read.set_defaults(run=run_read, data_dir=None)

    tail = commands.add_parser(
        "tail",
        help="follow a ledger through the cluster as entries are confirmed",
        description="Print a ledger's entries from --from on as its nodes confirm them, "
        "in the output of `read`, each line flushed as it comes; ends after the last "
        "entry of a closed ledger, after --count entries, or on Ctrl-C (exit 130). Never "
        "fences the writer.",
    )
    cluster.add_cluster_arguments(tail, required=True)
    tail.add_argument("ledger_id", type=int, metavar="ID")
    tail.add_argument("--from", dest="first", type=int, default=0, metavar="N")
    tail.add_argument("--count", type=int, metavar="N", help="stop after N entries")
    tail.add_argument("--json", action="store_true", help="print JSON lines")
    tail.set_defaults(run=run_tail)

    recover = commands.add_parser(
        "recover",
        help="fence, recover and close a ledger whose writer died",
        description="Recover a ledger through the cluster: fence its last ensemble (its "
        "writer, if alive, can append no more), find the last entry an ack quorum may "
        "have acknowledged, write it to a quorum and close the ledger there. Prints the "
        "closed ledger as `show` does, with `recovered` false when it was closed already.",
    )
    cluster.add_cluster_arguments(recover, required=True)
    recover.add_argument("ledger_id", type=int, metavar="ID")
    recover.add_argument("--json", action="store_true", help="print JSON")
    recover.set_defaults(run=run_recover)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _pending(directory: DataDir, metas: dict[int, LedgerMeta]) -> ReplayPlan | None:
    """What the journal holds that the index does not show yet; None (with a warning)
    if the journal cannot be read."""
    try:
        with Progress("scanning journal", journal_data_bytes(directory.journal_dir)) as bar:
            return plan_replay(
                directory.journal_dir,
                durable_seqs(metas),
                progress=bar.update,
                require_watermark=directory.journal_watermark_required,
            )
    except JournalError as error:
        warn(
            f"the journal cannot be read ({error}); what it holds is not shown. "
            "Check it with `pora journal verify`"
        )
        return None


def _load_metas(index: Index) -> dict[int, LedgerMeta]:
    try:
        return index.load_all_meta()
    except ValueError as error:
        raise CommandError(f"ledger metadata cannot be read: {error}") from error


@command
def run_list(args: argparse.Namespace) -> int:
    if args.metadata is not None:
        if args.data_dir is not None:
            raise CommandError(
                "give either --data-dir (a stopped node's ledgers) or --metadata (the "
                "cluster's ledgers), not both",
                EXIT_REFUSED,
            )
        return list_from_metadata(args)
    check_no_paging(args)
    data_dir = DEFAULT_DATA_DIR if args.data_dir is None else args.data_dir
    with offline_data_dir(data_dir) as directory, open_index(directory) as index:
        metas = _load_metas(index)
        plan = _pending(directory, metas)
    rows = [ledger_row(metas[ledger_id]) for ledger_id in sorted(metas)]
    pending = {} if plan is None else {i: plan.pending_for(i) for i in plan.ledgers}
    if args.json:
        print_json(
            {
                "ledgers": rows,
                "unreplayed_journal_records": {str(k): v for k, v in sorted(pending.items())},
            }
        )
    else:
        print_table(_LIST_COLUMNS, [[row[c] for c in _LIST_COLUMNS] for row in rows])
    if pending:
        unknown = sorted(set(pending) - set(metas))
        message = (
            f"the journal holds {sum(pending.values())} records of {len(pending)} ledgers "
            "not yet replayed into the index, so these figures are out of date"
        )
        if unknown:
            message += f" (ledgers only in the journal: {_few(unknown)})"
        warn(message + ": run `pora recover` first")
    return EXIT_OK


def _few(ids: list[int]) -> str:
    text = ", ".join(str(i) for i in ids[:10])
    return text + (f", ... ({len(ids) - 10} more)" if len(ids) > 10 else "")


def _check_id(what: str, value: int) -> None:
    """Ledger and entry ids are non-negative signed 64-bit integers: anything else
    would match nothing, silently."""
    if not 0 <= value < ID_LIMIT:
        raise CommandError(
            f"{what} {value} is out of range: ids are in 0..{ID_LIMIT - 1} (2**63-1)",
            EXIT_REFUSED,
        )


def _meta_or_fail(index: Index, ledger_id: int, plan: ReplayPlan | None) -> LedgerMeta:
    _check_id("ledger id", ledger_id)
    try:
        meta = index.get_meta(ledger_id)
    except ValueError as error:
        raise CommandError(f"ledger metadata cannot be read: {error}") from error
    if meta is None:
        hint = ""
        if plan is not None and plan.pending_for(ledger_id):
            hint = (
                f"; the journal holds {plan.pending_for(ledger_id)} records of it not yet "
                "replayed: run `pora recover` first"
            )
        raise CommandError(f"ledger {ledger_id} is not in the index{hint}")
    return meta


@command
def run_show(args: argparse.Namespace) -> int:
    _check_id("ledger id", args.ledger_id)
    if cluster.check_source(args):
        return cluster.run_show(args)
    data_dir = DEFAULT_DATA_DIR if args.data_dir is None else args.data_dir
    with offline_data_dir(data_dir) as directory, open_index(directory) as index:
        metas = _load_metas(index)
        plan = _pending(directory, metas)
        meta = _meta_or_fail(index, args.ledger_id, plan)
        details = ledger_details(meta, directory)
        details["indexed_entries"] = index.count_positions(meta.ledger_id)
    pending = 0 if plan is None else plan.pending_for(meta.ledger_id)
    details["unreplayed_journal_records"] = pending
    if args.json:
        print_json(details)
    else:
        created = datetime.datetime.fromtimestamp(details["created_ms"] / 1000, tz=datetime.UTC)
        fields: list[tuple[str, object]] = [(name, value) for name, value in details.items()]
        fields.append(("created", created.isoformat(timespec="milliseconds")))
        print_fields(fields)
    if pending:
        warn(
            f"the journal holds {pending} records of ledger {meta.ledger_id} not yet "
            "replayed: run `pora recover` first"
        )
    return EXIT_OK


@command
def run_read(args: argparse.Namespace) -> int:
    _check_read_args(args)
    if cluster.check_source(args):
        return cluster.run_read(args)
    data_dir = DEFAULT_DATA_DIR if args.data_dir is None else args.data_dir
    with offline_data_dir(data_dir) as directory, open_index(directory) as index:
        metas = _load_metas(index)
        plan = _pending(directory, metas)
        meta = _meta_or_fail(index, args.ledger_id, plan)
        pending = None if plan is None else plan.pending_for(meta.ledger_id)
        if pending != 0 and not args.allow_stale:
            _refuse_stale(meta.ledger_id, pending)
        last = visible_last_entry(meta)
        if args.last is not None:
            last = min(last, args.last)
        if last == NO_ENTRY or last < args.first or meta.log_end == 0:
            entries: list[tuple[int, bytes]] = []
            log = None
        else:
            log = open_entry_log(entrylog_path(directory, meta.ledger_id), meta.ledger_id)
        try:
            source = (
                entries
                if log is None
                else read_entries(index, log, meta.ledger_id, args.first, last)
            )
            if args.raw is not None:
                _write_raw(args.raw, meta.ledger_id, source)
            else:
                _print_entries(meta.ledger_id, source, as_json=args.json)
        finally:
            if log is not None:
                log.close()
    return EXIT_OK


@command
def run_tail(args: argparse.Namespace) -> int:
    _check_id("ledger id", args.ledger_id)
    _check_id("--from", args.first)
    return cluster.run_tail(args)


@command
def run_recover(args: argparse.Namespace) -> int:
    _check_id("ledger id", args.ledger_id)
    return cluster.run_recover(args)


def _check_read_args(args: argparse.Namespace) -> None:
    """Refuse `pora ledger read` arguments that cannot go together, before the data
    dir is touched."""
    if args.raw is not None and args.json:
        raise CommandError("--raw and --json exclude each other", EXIT_REFUSED)
    _check_id("ledger id", args.ledger_id)
    _check_id("--from", args.first)
    if args.last is not None:
        _check_id("--to", args.last)
    if args.last is not None and args.last < args.first:
        raise CommandError(
            f"bad range --from {args.first} --to {args.last}: need 0 <= from <= to", EXIT_REFUSED
        )
    if args.raw is not None:
        check_raw_target(args.raw, "ledger.bin")


def _refuse_stale(ledger_id: int, pending: int | None) -> NoReturn:
    """The journal may hold newer records of the ledger than its entry log does."""
    what = (
        "the journal cannot be read, so it may hold newer records of it"
        if pending is None
        else f"the journal holds {pending} records of it not yet replayed"
    )
    raise CommandError(
        f"ledger {ledger_id}: {what}; run `pora recover` first (or pass "
        "--allow-stale to read what the entry log holds now)"
    )


def _write_raw(target: Path, ledger_id: int, source: Iterable[tuple[int, bytes]]) -> None:
    """The payloads alone, back to back, into the file `target`."""
    with RawPayloads(target, f"ledger {ledger_id}") as out:
        for _entry_id, payload in source:
            out.write(payload)


def _print_entries(ledger_id: int, source: Iterable[tuple[int, bytes]], *, as_json: bool) -> None:
    """One line per entry: JSON, or entry id, size and payload in hex."""
    for entry_id, payload in source:
        fields = {"ledger_id": ledger_id, "entry_id": entry_id}
        print_entry(str(entry_id), fields, payload, as_json=as_json)
