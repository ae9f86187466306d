"""`pora stream list | show | create | seal | delete | trim | gc | read | tail`: the
cluster's streams (docs/streams.md), through its metadata store (`--metadata URL`).

`list` and `show` only read the metadata store; the others connect as a client
(`pora.connect`), since sealing, deleting, collecting and reading touch the segments'
ledgers on the nodes.

This module builds the command line; the commands are in _stream_views.py
(`list`, `show`) and _stream_actions.py (the others), their arguments' parsing in
_stream_arguments.py. Refusals (no such stream, a taken name, a bad position, option or URL) end
with exit status 2 and one line saying what to do.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pora.cli._common import EXIT_REFUSED
from pora.cli._metadata import add_metadata_argument
from pora.cli._stream_actions import (
    run_create,
    run_delete,
    run_gc,
    run_read,
    run_seal,
    run_tail,
    run_trim,
)
from pora.cli._stream_arguments import CONFIG_OPTIONS
from pora.cli._stream_views import run_list, run_show
from pora.streams.orphans import GRACE_S_DEFAULT


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "stream",
        help="the cluster's streams (list, show, create, seal, delete, trim, gc, read, tail)",
        description="Streams: named, replicated logs made of ledgers (docs/streams.md).",
    )
    commands = parser.add_subparsers(dest="stream_command", metavar="COMMAND")
    parser.set_defaults(run=lambda _args: _usage(parser))

    listing = commands.add_parser(
        "list",
        help="every stream: state, commit number, segments, writer epoch",
        description="List the cluster's streams by name: state (ACTIVE, SEALED), commit "
        "number, segment count and the live writer's epoch.",
    )
    _add_common(listing, prints=True)
    listing.set_defaults(run=run_list)

    show = commands.add_parser(
        "show",
        help="one stream's config, state, segments, transactions, cursors and attributes",
        description="Print one stream's document: its config, state, commit number, "
        "writer epoch and segments (seq, ledger id, state, entries, bytes, the commit "
        "that made it visible; an OPEN segment's entries are the live writer's and "
        "shown as '-'; a LOST one's ledger was deleted outside the stream, its entries "
        "gone), its pending transactions (id, segments, last activity), its "
        "cursors (name, next position), its attributes (key and the first 80 "
        "characters of the value; --json: whole) and any other section the document "
        "holds.",
    )
    _add_common(show, prints=True)
    show.add_argument("name", metavar="STREAM")
    show.set_defaults(run=run_show)

    create = commands.add_parser(
        "create",
        help="a new, empty stream",
        description="Create an empty stream; refused (exit 2) when the name is taken.",
    )
    _add_common(create, prints=True)
    create.add_argument("name", metavar="STREAM")
    for option, kind, text in CONFIG_OPTIONS:
        create.add_argument(
            "--" + option.replace("_", "-"), dest=option, type=kind, metavar="N", help=text
        )
    create.set_defaults(run=run_create)

    seal = commands.add_parser(
        "seal",
        help="end a stream for writers",
        description="Seal a stream: its live writer's segment is recovered and closed, and "
        "no writer may append again (reading goes on). Sealing a sealed stream succeeds.",
    )
    _add_common(seal, prints=False)
    seal.add_argument("name", metavar="STREAM")
    seal.set_defaults(run=run_seal)

    delete = commands.add_parser(
        "delete",
        help="delete a stream and its ledgers",
        description="Delete a stream: its document is marked deleting (it is gone for every "
        "reader and writer), the ledgers its writers may append to are fenced and deleted, "
        "then its cursors, then the document, then its pages and other ledgers. Once it "
        "returns, no append of any writer started after it is acknowledged. Exit status 1 "
        "when a "
        "writer's ledger could not be fenced (too few of its nodes answer): the stream stays "
        "marked (DELETING in `pora stream list`); run the command again once the nodes "
        "answer. 2 when there is no such stream.",
    )
    _add_common(delete, prints=False)
    delete.add_argument("name", metavar="STREAM")
    delete.set_defaults(run=run_delete)

    read = commands.add_parser(
        "read",
        help="a stream's entries (hex, raw bytes to a file, or JSON lines)",
        description="Print a stream's acknowledged entries from --from up to --to (not "
        "included; default: the end as of the start): one line per entry with its "
        "position, size and payload as hex; or --raw FILE to write the payloads' raw bytes "
        "(back to back, in position order) to FILE; or --json for JSON lines with the "
        "payload in base64.",
    )
    _add_common(read, prints=True)
    read.add_argument("name", metavar="STREAM")
    _add_from(read, default="beginning")
    read.add_argument(
        "--to",
        dest="to",
        metavar="POSITION|end",
        default="end",
        help="stop before this position (SEGMENT:ENTRY; default: end)",
    )
    read.add_argument("--raw", type=Path, metavar="FILE", help="write raw payload bytes here")
    read.set_defaults(run=run_read)

    trim = commands.add_parser(
        "trim",
        help="apply streams' retention (age and size), sparing what cursors need",
        description="Apply the retention of each stream named (every stream when none "
        "is): remove its oldest closed segments past retention_s and retention_bytes, but "
        "none a cursor still needs unless retention_s_max or retention_bytes_max say so "
        "(metadata first, then the ledgers). Prints the first position each stream still "
        "holds. With --watch S, again every S seconds until interrupted.",
    )
    _add_common(trim, prints=True)
    trim.add_argument("names", metavar="STREAM", nargs="*")
    trim.add_argument("--watch", type=float, metavar="S", help="trim again every S seconds (S > 0)")
    trim.set_defaults(run=run_trim)

    gc = commands.add_parser(
        "gc",
        help="abort abandoned transactions and delete streams' orphan ledgers",
        description="Collect each stream named (every stream when none is, and then also "
        "the ledgers of streams that no longer exist): abort its pending transactions "
        "idle (no segment opened, no commit attempted) for longer than its "
        "txn_idle_s_max (or --idle-s), deleting their ledgers; then delete its orphan "
        "ledgers: ledgers whose record names the stream (custom key pora.stream) that "
        "are neither its segments nor a pending transaction's, created more than "
        "--grace-s ago (a ledger of no transaction created after the live writer's "
        "segment is spared: it may be the writer's next one). Prints each transaction "
        "aborted and ledger deleted, then a summary; with --dry-run only what it would "
        "do.",
    )
    _add_common(gc, prints=True)
    gc.add_argument("names", metavar="STREAM", nargs="*")
    gc.add_argument(
        "--idle-s",
        type=float,
        metavar="S",
        help="abort transactions idle longer than S seconds (default: each stream's "
        "txn_idle_s_max)",
    )
    gc.add_argument(
        "--grace-s",
        type=float,
        metavar="S",
        default=GRACE_S_DEFAULT,
        help=f"only ledgers created over S seconds ago are orphans (default {GRACE_S_DEFAULT:.0f})",
    )
    gc.add_argument(
        "--dry-run", action="store_true", help="print what would be done, change nothing"
    )
    gc.set_defaults(run=run_gc)

    tail = commands.add_parser(
        "tail",
        help="follow a stream's entries as they are appended",
        description="Print a stream's entries as they are acknowledged, across rollovers "
        "and writer takeovers, each once and in order, until interrupted (or --count "
        "entries): the format of `pora stream read`.",
    )
    _add_common(tail, prints=True)
    tail.add_argument("name", metavar="STREAM")
    _add_from(tail, default="end")
    tail.add_argument("--count", type=int, metavar="N", help="stop after N entries")
    tail.set_defaults(run=run_tail)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return EXIT_REFUSED


def _add_common(parser: argparse.ArgumentParser, *, prints: bool) -> None:
    add_metadata_argument(parser, required=True)
    if prints:
        parser.add_argument(
            "--json", action="store_true", help="print JSON for scripts instead of tables"
        )


def _add_from(parser: argparse.ArgumentParser, *, default: str) -> None:
    parser.add_argument(
        "--from",
        dest="from_",
        metavar="POSITION|beginning|end",
        default=default,
        help=f"start at this position (SEGMENT:ENTRY), the beginning or the end "
        f"(default: {default})",
    )
