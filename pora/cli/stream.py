"""`pora stream list | show | create | seal | delete | trim | gc | read | tail`: the
cluster's streams (docs/streams.md), through its metadata store (`--metadata URL`).

`list` and `show` only read the metadata store; the others connect as a client
(`pora.connect`), since sealing, deleting, collecting and reading touch the segments'
ledgers on the nodes. Refusals (no such stream, a taken name, a bad position, option or URL) end
with exit status 2 and one line saying what to do.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import trio

import pora
from journal.errors import PoraError
from ledger.errors import InvalidArgument, InvalidArgumentType, NoSuchLedger
from pora.cli._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_REFUSED,
    CommandError,
    command,
    print_fields,
    print_json,
    print_table,
)
from pora.cli._entries import RawPayloads, check_raw_target, print_entry
from pora.cli._metadata import add_metadata_argument, query_metadata
from pora.client.replication.client import Client
from pora.meta import MetadataStore, MetadataUnavailable
from pora.meta.errors import NoSuchDocument
from pora.meta.records import LedgerMetadata
from pora.streams.cursors import CursorState, cursor_states
from pora.streams.document import (
    STREAMS_SPACE,
    Segment,
    SegmentState,
    StreamConfig,
    StreamDocument,
    check_stream_name,
    decode_document,
)
from pora.streams.errors import NoSuchStream, StreamExists
from pora.streams.orphans import (
    GRACE_S_DEFAULT,
    Orphan,
    held_ledger_ids,
    ledger_stream,
    orphan_ledgers,
)
from pora.streams.position import Position
from pora.streams.reader import Start
from pora.streams.records import StreamRecord
from pora.streams.stream import StreamInfo
from pora.streams.transaction_changes import abandoned_transactions

T = TypeVar("T")

#: the document's sections this command knows; any other one (a later version's
#: transactions, cursors, commit keys) is printed as the document holds it
_KNOWN_SECTIONS: Final = frozenset(
    {
        "format_version",
        "name",
        "config",
        "state",
        "commit",
        "segments",
        "pages",
        "next_seq",
        "writer",
        "created_ms",
    }
)
#: stream names read per page by `list`
_LIST_PAGE: Final = 1000
_LIST_COLUMNS: Final = ("name", "state", "commit", "segments", "writer_epoch")
_SEGMENT_COLUMNS: Final = ("seq", "ledger_id", "state", "entries", "bytes", "commit")
#: the options of `create`, as create_stream names them
_CONFIG_OPTIONS: Final = (
    ("ensemble_size", int, "E: nodes each segment's ledger is spread over (default 3)"),
    ("write_quorum", int, "Qw: copies of each entry (default 3)"),
    ("ack_quorum", int, "Qa: copies acknowledged before an append returns (default 2)"),
    ("segment_bytes_max", int, "roll to a new segment past this many bytes (default 256 MiB)"),
    ("segment_age_s_max", float, "roll to a new segment past this age (default 3600)"),
    ("retention_s", float, "keep entries this many seconds (default: forever)"),
    ("retention_bytes", int, "keep at most this many bytes (default: no limit)"),
    (
        "retention_s_max",
        float,
        "remove entries older than this even if a cursor needs them (default: never)",
    ),
    (
        "retention_bytes_max",
        int,
        "keep at most this many bytes even if a cursor needs more (default: no limit)",
    ),
    ("commit_keys_max", int, "commit keys kept for idempotent commits (default 10000)"),
    ("txn_idle_s_max", float, "a transaction idle this long is abandoned (default 86400)"),
    ("txn_pending_max", int, "pending transactions held at once (default 500)"),
    ("txn_segments_max", int, "segments of pending transactions, together (default 3000)"),
    ("app_ids_max", int, "app ids recorded for versioned commits (default 1000)"),
)


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
        "shown as '-'), its pending transactions (id, segments, last activity), its "
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
    for option, kind, text in _CONFIG_OPTIONS:
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
        description="Delete a stream: its document first (it is gone for every reader and "
        "writer), then its segments' ledgers.",
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


# -- arguments ----------------------------------------------------------------------------


def _stream_name(name: str) -> str:
    try:
        return check_stream_name(name)
    except InvalidArgument as error:
        raise CommandError(str(error), EXIT_REFUSED) from None


def _position(option: str, text: str) -> Position:
    try:
        return Position.parse(text)
    except InvalidArgument as error:
        raise CommandError(f"{option} {text}: {error}", EXIT_REFUSED) from None


def parse_start(text: str) -> Start:
    """--from: "beginning" (None), "end", or a position."""
    if text == "beginning":
        return None
    if text == "end":
        return "end"
    return _position("--from", text)


def parse_stop(text: str) -> Position | None:
    """--to: "end" (None: the end as of the start) or a position."""
    return None if text == "end" else _position("--to", text)


# -- running against the cluster ------------------------------------------------------------


def _with_client(url: str, body: Callable[[Client], Awaitable[T]]) -> T:
    """Connect to the cluster at `url`, run `body`; refusals become exit status 2."""

    async def main() -> T:
        async with pora.connect(url) as client:
            return await body(client)

    try:
        return trio.run(main)
    except (NoSuchStream, StreamExists, MetadataUnavailable) as error:
        raise CommandError(str(error), EXIT_REFUSED) from error
    except (InvalidArgument, InvalidArgumentType) as error:
        raise CommandError(str(error), EXIT_REFUSED) from error


def _query(url: str, query: Callable[[MetadataStore], Awaitable[T]]) -> T:
    try:
        return query_metadata(url, query)
    except NoSuchStream as error:
        raise CommandError(str(error), EXIT_REFUSED) from error


# -- what is printed ------------------------------------------------------------------------


def _segment_count(info: StreamInfo | StreamDocument) -> int:
    paged = sum(ref.last_seq - ref.first_seq + 1 for ref in info.pages)
    return paged + len(info.segments)


def segment_row(segment: Segment) -> dict[str, Any]:
    """A segment as `show` prints it; an OPEN segment's entries and bytes are the live
    writer's (None)."""
    closed = segment.state is SegmentState.CLOSED
    return {
        "seq": segment.seq,
        "ledger_id": segment.ledger_id,
        "state": segment.state.value,
        "entries": segment.last_entry_id + 1 if closed else None,
        "bytes": segment.byte_length if closed else None,
        "commit": segment.commit,
        "created_ms": segment.created_ms,
    }


def config_dict(config: StreamConfig) -> dict[str, Any]:
    return {option: getattr(config, option) for option, _kind, _text in _CONFIG_OPTIONS}


def stream_details(
    doc: StreamDocument,
    segments: list[Segment],
    raw: Mapping[str, Any],
    cursors: Sequence[CursorState] = (),
) -> dict[str, Any]:
    """What `show --json` prints: the document's known sections, decoded, its cursors,
    then every other section as the document holds it."""
    details: dict[str, Any] = {
        "name": doc.name,
        "state": doc.state.value,
        "commit": doc.commit,
        "writer_epoch": doc.writer_epoch,
        "writer_segment": doc.writer_segment,
        "next_seq": doc.next_seq,
        "created_ms": doc.created_ms,
        "config": config_dict(doc.config),
        "segments": [segment_row(s) for s in segments],
        "transactions": [
            {
                "id": txn.id,
                "created_ms": txn.created_ms,
                "active_ms": txn.active_ms,
                "segments": [
                    {"ledger_id": s.ledger_id, "created_ms": s.created_ms} for s in txn.segments
                ],
            }
            for txn in doc.transactions
        ],
        "commit_keys": [{"digest": k.digest, "commit": k.commit} for k in doc.commit_keys],
        "app_versions": [
            {"app_id": a.app_id, "version": a.version, "commit": a.commit} for a in doc.app_versions
        ],
        "cursors": [
            {"name": c.name, "next_position": str(c.next_position), "created_ms": c.created_ms}
            for c in cursors
        ],
        "attributes": dict(doc.attributes),
    }
    for section, value in raw.items():
        if section not in _KNOWN_SECTIONS and section not in details:
            details[section] = value
    return details


#: the keys of `stream_details` that `_print_details` prints itself
_SHOWN: Final = frozenset(
    {
        "writer_epoch",
        "writer_segment",
        "config",
        "segments",
        "created_ms",
        "state",
        "name",
        "transactions",
        "commit_keys",
        "app_versions",
        "cursors",
        "attributes",
    }
)
#: the characters of an attribute's value `show` prints (--json prints it whole)
ATTRIBUTE_SHOWN_CHARS: Final = 80


def _time(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds")


def _shortened(value: str) -> str:
    """The value's first characters on one line (line breaks and other control
    characters escaped as JSON does)."""
    shown = json.dumps(value[:ATTRIBUTE_SHOWN_CHARS], ensure_ascii=False)[1:-1]
    if len(value) <= ATTRIBUTE_SHOWN_CHARS:
        return shown
    return f"{shown}... ({len(value)} characters)"


def _print_details(details: dict[str, Any]) -> None:
    keys = details["commit_keys"]
    fields: list[tuple[str, object]] = [
        ("name", details["name"]),
        ("state", details["state"]),
        ("commit", details["commit"]),
        ("writer_epoch", details["writer_epoch"]),
        ("writer_segment", "-" if details["writer_segment"] is None else details["writer_segment"]),
        ("next_seq", details["next_seq"]),
        ("created", _time(details["created_ms"])),
        (
            "commit_keys",
            f"{len(keys)} recorded" + (f" (newest: commit {keys[-1]['commit']})" if keys else ""),
        ),
    ]
    fields += [(f"config.{k}", "-" if v is None else v) for k, v in details["config"].items()]
    extra = [k for k in details if k not in _KNOWN_SECTIONS and k not in _SHOWN]
    fields += [(section, json.dumps(details[section])) for section in extra]
    print_fields(fields)
    print()
    rows = [
        ["-" if row[c] is None else row[c] for c in _SEGMENT_COLUMNS] for row in details["segments"]
    ]
    print_table(_SEGMENT_COLUMNS, rows)
    sections: list[tuple[str, tuple[str, ...], list[list[object]]]] = [
        (
            "pending transactions",
            ("id", "segments", "ledger_ids", "created", "active"),
            [
                [
                    txn["id"],
                    len(txn["segments"]),
                    ",".join(str(s["ledger_id"]) for s in txn["segments"]) or "-",
                    _time(txn["created_ms"]),
                    _time(txn["active_ms"]),
                ]
                for txn in details["transactions"]
            ],
        ),
        (
            "app versions",
            ("app_id", "version", "commit"),
            [[a["app_id"], a["version"], a["commit"]] for a in details["app_versions"]],
        ),
        (
            "cursors",
            ("name", "next_position"),
            [[c["name"], c["next_position"]] for c in details["cursors"]],
        ),
        (
            "attributes",
            ("key", "value"),
            [[key, _shortened(value)] for key, value in sorted(details["attributes"].items())],
        ),
    ]
    for title, columns, section_rows in sections:
        print()
        if not section_rows:
            print(f"{title}: none")
            continue
        print(f"{title}:")
        print_table(columns, section_rows)


# -- the commands ---------------------------------------------------------------------------


@command
def run_list(args: argparse.Namespace) -> int:
    async def query(store: MetadataStore) -> list[dict[str, Any]]:
        rows = []
        after = ""
        while True:
            names = await store.list_documents(STREAMS_SPACE, after=after, limit=_LIST_PAGE)
            for name in names:
                try:
                    record = await store.read_document(STREAMS_SPACE, name)
                except NoSuchDocument:
                    continue  # deleted meanwhile
                doc = decode_document(record.value)
                rows.append(
                    {
                        "name": doc.name,
                        "state": doc.state.value,
                        "commit": doc.commit,
                        "segments": _segment_count(doc),
                        "writer_epoch": doc.writer_epoch,
                    }
                )
            if len(names) < _LIST_PAGE:
                return rows
            after = names[-1]

    rows = _query(args.metadata, query)
    if args.json:
        print_json({"streams": rows})
    else:
        print_table(_LIST_COLUMNS, [[row[c] for c in _LIST_COLUMNS] for row in rows])
    return EXIT_OK


@command
def run_show(args: argparse.Namespace) -> int:
    name = _stream_name(args.name)

    async def query(store: MetadataStore) -> dict[str, Any]:
        try:
            record = await store.read_document(STREAMS_SPACE, name)
        except NoSuchDocument as gone:
            raise NoSuchStream(name) from gone
        doc = decode_document(record.value)
        segments = [s async for s in StreamRecord(store, name).segments_from(doc, doc.first_seq)]
        cursors = [state async for state in cursor_states(store, name)]
        return stream_details(doc, segments, json.loads(record.value), cursors)

    details = _query(args.metadata, query)
    if args.json:
        print_json(details)
    else:
        _print_details(details)
    return EXIT_OK


@command
def run_create(args: argparse.Namespace) -> int:
    name = _stream_name(args.name)
    options = {
        option: getattr(args, option)
        for option, _kind, _text in _CONFIG_OPTIONS
        if getattr(args, option) is not None
    }

    async def body(client: Client) -> StreamInfo:
        stream = await client.create_stream(name, **options)
        return await stream.info()

    info = _with_client(args.metadata, body)
    if args.json:
        print_json({"name": info.name, "commit": info.commit, "config": config_dict(info.config)})
    else:
        print(f"created stream {info.name!r}")
    return EXIT_OK


@command
def run_seal(args: argparse.Namespace) -> int:
    name = _stream_name(args.name)

    async def body(client: Client) -> None:
        await (await client.open_stream(name)).seal()

    _with_client(args.metadata, body)
    print(f"sealed stream {name!r}")
    return EXIT_OK


@command
def run_delete(args: argparse.Namespace) -> int:
    name = _stream_name(args.name)

    async def body(client: Client) -> None:
        await client.delete_stream(name)

    _with_client(args.metadata, body)
    print(f"deleted stream {name!r}")
    return EXIT_OK


@command
def run_trim(args: argparse.Namespace) -> int:
    names = [_stream_name(name) for name in args.names]
    if args.watch is not None and not args.watch > 0:
        raise CommandError(
            f"--watch must be a number of seconds above 0, not {args.watch}", EXIT_REFUSED
        )

    async def trim_all(client: Client) -> dict[str, str]:
        chosen = names or [info.name async for info in client.list_streams()]
        held: dict[str, str] = {}
        for name in chosen:
            held[name] = str(await (await client.open_stream(name)).trim())
        return held

    async def body(client: Client) -> None:
        while True:
            held = await trim_all(client)
            if args.json:
                print(json.dumps({"first_held": held}), flush=True)
            else:
                for name, position in sorted(held.items()):
                    print(f"stream {name!r}: first position held {position}", flush=True)
            if args.watch is None:
                return
            await trio.sleep(args.watch)

    _with_client(args.metadata, body)
    return EXIT_OK


@dataclass
class _Collected:
    """What `gc` did (or, dry, would do) to one stream."""

    stream: str
    aborted: list[str] = field(default_factory=list)
    orphans: list[Orphan] = field(default_factory=list)
    #: ledger ids found orphan whose delete failed (the error, said once each)
    failed: dict[int, str] = field(default_factory=dict)


async def _collect_transactions(
    client: Client, name: str, idle_s: float | None, dry_run: bool
) -> list[str]:
    stream = await client.open_stream(name)
    if not dry_run:
        return await stream.collect_abandoned_transactions(idle_s)
    doc = (await StreamRecord(client.store, name).read()).value
    idle = doc.config.txn_idle_s_max if idle_s is None else idle_s
    return abandoned_transactions(doc, int(idle * 1000), _now_ms())


async def _find_orphans(
    client: Client, names: list[str] | None, grace_s: float
) -> dict[str, list[Orphan]]:
    """The orphan ledgers of each stream of `names` (None: every stream a ledger
    names, existing or not), by stream. The ledgers are listed before the documents
    are read: a ledger held when listed stays held or is deleted by whoever drops it."""
    by_stream: dict[str, list[LedgerMetadata]] = {}
    async for ledger in client.list_ledgers():
        stream = ledger_stream(ledger)
        if stream is not None and (names is None or stream in names):
            by_stream.setdefault(stream, []).append(ledger)
    now = _now_ms()
    found: dict[str, list[Orphan]] = {}
    for name, ledgers in sorted(by_stream.items()):
        record = StreamRecord(client.store, name)
        try:
            doc: StreamDocument | None = (await record.read()).value
        except NoSuchStream:
            doc = None
        held = set() if doc is None else await held_ledger_ids(record, doc)
        found[name] = orphan_ledgers(name, doc, held, ledgers, now, int(grace_s * 1000))
    return found


def _now_ms() -> int:
    return int(time.time() * 1000)


@command
def run_gc(args: argparse.Namespace) -> int:
    names = [_stream_name(name) for name in args.names]
    for option, value in (("--idle-s", args.idle_s), ("--grace-s", args.grace_s)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise CommandError(
                f"{option} must be a number of seconds, 0 or more, not {value}", EXIT_REFUSED
            )
    verb = "would " if args.dry_run else ""

    def said(result: _Collected, **line: object) -> None:
        if args.json:
            print(json.dumps({"stream": result.stream, "dry_run": args.dry_run, **line}))

    async def body(client: Client) -> list[_Collected]:
        chosen = names or [info.name async for info in client.list_streams()]
        results = {name: _Collected(name) for name in chosen}
        for name in chosen:
            results[name].aborted = await _collect_transactions(
                client, name, args.idle_s, args.dry_run
            )
        orphans = await _find_orphans(client, names or None, args.grace_s)
        for name, found in orphans.items():
            result = results.setdefault(name, _Collected(name))
            result.orphans = found
            if args.dry_run:
                continue
            for orphan in found:
                try:
                    await client.delete_ledger(orphan.ledger_id)
                except NoSuchLedger:
                    pass  # deleted meanwhile (by whoever dropped it)
                except (PoraError, OSError) as error:
                    result.failed[orphan.ledger_id] = str(error)
        return [results[name] for name in sorted(results)]

    results = _with_client(args.metadata, body)
    for result in results:
        for txn_id in result.aborted:
            said(result, action="abort_transaction", transaction=txn_id)
            if not args.json:
                print(f"stream {result.stream!r}: {verb}abort abandoned transaction {txn_id}")
        for orphan in result.orphans:
            error = result.failed.get(orphan.ledger_id)
            whose = "a writer's" if orphan.transaction is None else f"of {orphan.transaction}"
            said(
                result,
                action="delete_ledger",
                ledger_id=orphan.ledger_id,
                transaction=orphan.transaction,
                created_ms=orphan.created_ms,
                **({"error": error} if error is not None else {}),
            )
            if args.json:
                continue
            if error is not None:
                print(
                    f"stream {result.stream!r}: orphan ledger {orphan.ledger_id} not deleted "
                    f"({error})"
                )
            else:
                print(
                    f"stream {result.stream!r}: {verb}delete orphan ledger {orphan.ledger_id} "
                    f"({whose}, created {_time(orphan.created_ms)})"
                )
    aborted = sum(len(r.aborted) for r in results)
    deleted = sum(len(r.orphans) - len(r.failed) for r in results)
    failed = sum(len(r.failed) for r in results)
    summary = {
        "streams": len(results),
        "transactions_aborted": aborted,
        "ledgers_deleted": deleted,
        "ledgers_not_deleted": failed,
        "dry_run": args.dry_run,
    }
    if args.json:
        print(json.dumps({"summary": summary}))
    else:
        print(
            f"{len(results)} stream(s): {verb}abort {aborted} transaction(s), {verb}delete "
            f"{deleted} orphan ledger(s)" + (f"; {failed} not deleted" if failed else "")
        )
    return EXIT_PROBLEMS if failed else EXIT_OK


def _entry_fields(position: Position) -> dict[str, object]:
    return {"position": str(position), "segment": position.segment, "entry": position.entry}


@command
def run_read(args: argparse.Namespace) -> int:
    name = _stream_name(args.name)
    start, stop = parse_start(args.from_), parse_stop(args.to)
    if args.raw is not None and args.json:
        raise CommandError("--raw and --json exclude each other", EXIT_REFUSED)
    if args.raw is not None:
        check_raw_target(args.raw, "stream.bin")

    async def body(client: Client) -> None:
        stream = await client.open_stream(name)
        entries = stream.read(from_=start, to=stop)
        if args.raw is not None:
            with RawPayloads(args.raw, f"stream {name!r}") as out:
                async for _position, payload in entries:
                    out.write(payload)
            return
        async for position, payload in entries:
            print_entry(str(position), _entry_fields(position), payload, as_json=args.json)

    _with_client(args.metadata, body)
    return EXIT_OK


@command
def run_tail(args: argparse.Namespace) -> int:
    name = _stream_name(args.name)
    start = parse_start(args.from_)
    if args.count is not None and args.count < 1:
        raise CommandError(f"--count {args.count}: give 1 or more entries", EXIT_REFUSED)

    async def body(client: Client) -> None:
        stream = await client.open_stream(name)
        printed = 0
        async for position, payload in stream.subscribe(from_=start):
            fields = _entry_fields(position)
            print_entry(str(position), fields, payload, as_json=args.json, flush=True)
            printed += 1
            if printed == args.count:
                return

    _with_client(args.metadata, body)
    return EXIT_OK
