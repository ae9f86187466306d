"""`pora ledger list --metadata URL`: the cluster's ledgers as the metadata store
records them, read page by page (`list_ledgers`) and printed as each page arrives, so a
store of any size is listed in bounded memory.

`--json` prints one object, a stable shape for scripts (written as the pages arrive):

    {"metadata": URL,
     "ledgers": [{"ledger_id": int, "version": int,
                  "state": "OPEN" | "IN_RECOVERY" | "CLOSED",
                  "ensemble_size": int, "write_quorum": int, "ack_quorum": int,
                  "ensembles": int (count),
                  "current_ensemble": {"first_entry_id": int, "addresses": [str, ...]},
                  "last_entry_id": int, "length": int, "created_ms": int}, ...],
     "next_after": int | null}

`next_after` is the last id listed when `--limit` stopped the listing (pass it as
`--after` for the next page), else null.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Final

from pora.cli._common import EXIT_OK, EXIT_REFUSED, CommandError, TableWriter
from pora.cli._metadata import query_metadata
from pora.meta import LedgerMetadata, MetadataStore, Versioned

#: records asked for per `list_ledgers` call
PAGE_SIZE: Final = 500

COLUMNS = (
    "ledger_id",
    "state",
    "E/Qw/Qa",
    "ensembles",
    "current_ensemble",
    "last_entry_id",
    "length",
)


def add_metadata_listing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metadata",
        metavar="URL",
        help="list the cluster's ledgers from this metadata store (sqlite:///abs/path.db, "
        "sqlite:relative/path.db, zk://host:port,.../chroot) instead of a data dir",
    )
    parser.add_argument(
        "--limit", type=int, metavar="N", help="with --metadata: list at most N ledgers"
    )
    parser.add_argument(
        "--after",
        type=int,
        default=-1,
        metavar="ID",
        help="with --metadata: start after ledger ID (the `next_after` of a previous page)",
    )


def check_no_paging(args: argparse.Namespace) -> None:
    """--limit and --after page through the metadata store only."""
    if args.limit is not None or args.after != -1:
        raise CommandError(
            "--limit and --after page through --metadata URL; a data dir is listed whole",
            EXIT_REFUSED,
        )


def ledger_json(record: Versioned[LedgerMetadata]) -> dict[str, Any]:
    meta = record.value
    current = meta.ensembles[-1]
    return {
        "ledger_id": meta.ledger_id,
        "version": record.version,
        "state": meta.state.value,
        "ensemble_size": meta.ensemble_size,
        "write_quorum": meta.write_quorum,
        "ack_quorum": meta.ack_quorum,
        "ensembles": len(meta.ensembles),
        "current_ensemble": {
            "first_entry_id": current.first_entry_id,
            "addresses": [member.address for member in current.members],
        },
        "last_entry_id": meta.last_entry_id,
        "length": meta.length,
        "created_ms": meta.created_ms,
    }


def ledger_row(record: Versioned[LedgerMetadata]) -> list[object]:
    meta = record.value
    return [
        meta.ledger_id,
        meta.state.value,
        f"{meta.ensemble_size}/{meta.write_quorum}/{meta.ack_quorum}",
        len(meta.ensembles),
        ",".join(member.address for member in meta.ensembles[-1].members),
        meta.last_entry_id,
        meta.length,
    ]


class _JsonListing:
    """The --json document, written a ledger at a time."""

    def __init__(self, url: str) -> None:
        self._first = True
        print(f'{{"metadata": {json.dumps(url)},\n "ledgers": [', end="")

    def add(self, record: Versioned[LedgerMetadata]) -> None:
        separator = "\n  " if self._first else ",\n  "
        self._first = False
        print(separator + json.dumps(ledger_json(record), separators=(", ", ": ")), end="")

    def end(self, next_after: int | None) -> None:
        print(f'\n ],\n "next_after": {json.dumps(next_after)}}}')


def list_from_metadata(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        raise CommandError(f"--limit {args.limit}: give at least 1", EXIT_REFUSED)
    if args.after < -1:
        raise CommandError(f"--after {args.after}: ledger ids are >= 0", EXIT_REFUSED)

    async def listing(store: MetadataStore) -> int:
        json_out = _JsonListing(args.metadata) if args.json else None
        table = None if args.json else TableWriter(COLUMNS, buffer_rows=PAGE_SIZE)
        after, listed, more = args.after, 0, True
        while more and (args.limit is None or listed < args.limit):
            wanted = PAGE_SIZE if args.limit is None else min(PAGE_SIZE, args.limit - listed)
            page = await store.list_ledgers(after_id=after, limit=wanted)
            more = len(page) == wanted
            for record in page:
                if json_out is not None:
                    json_out.add(record)
                elif table is not None:
                    table.add(ledger_row(record))
            listed += len(page)
            after = page[-1].value.ledger_id if page else after
        # the limit may end the listing exactly at the last ledger: look one further
        stopped_by_limit = more and listed > 0 and bool(await store.list_ledgers(after, 1))
        if json_out is not None:
            json_out.end(after if stopped_by_limit else None)
            return EXIT_OK
        assert table is not None
        if listed:
            table.flush()
        else:
            print(
                f"no ledgers in {args.metadata}"
                + (f" after {args.after}" if args.after >= 0 else "")
            )
        if stopped_by_limit:
            print(
                f"stopped at --limit {args.limit}: continue with --after {after}",
                file=sys.stderr,
            )
        return EXIT_OK

    return query_metadata(args.metadata, listing)
