"""`pora stream create | seal | delete | trim | gc | read | tail`: the commands that
connect to the cluster as a client (`pora.connect`), since they change streams or
read their segments' ledgers on the nodes.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from journal.errors import PoraError
from ledger.errors import NoSuchLedger
from pora.cli._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_REFUSED,
    CommandError,
    command,
    print_json,
)
from pora.cli._entries import RawPayloads, check_raw_target, print_entry
from pora.cli._metadata import run_client
from pora.cli._stream_arguments import CONFIG_OPTIONS, parse_start, parse_stop, stream_name
from pora.cli._stream_views import config_dict, time_text
from pora.client.replication.client import Client
from pora.meta.records import LedgerMetadata
from pora.streams.document import StreamDocument
from pora.streams.errors import NoSuchStream, StreamExists
from pora.streams.orphans import (
    Orphan,
    held_ledger_ids,
    ledger_stream,
    orphan_ledgers,
)
from pora.streams.position import Position
from pora.streams.records import StreamRecord
from pora.streams.stream import StreamInfo
from pora.streams.transaction_changes import abandoned_transactions

T = TypeVar("T")


# -- running against the cluster ------------------------------------------------------------


def _with_client(url: str, body: Callable[[Client], Awaitable[T]]) -> T:
    """Connect to the cluster at `url`, run `body`; refusals become exit status 2."""
    return run_client(url, body, (NoSuchStream, StreamExists))


@command
def run_create(args: argparse.Namespace) -> int:
    name = stream_name(args.name)
    options = {
        option: getattr(args, option)
        for option, _kind, _text in CONFIG_OPTIONS
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
    name = stream_name(args.name)

    async def body(client: Client) -> None:
        await (await client.open_stream(name)).seal()

    _with_client(args.metadata, body)
    print(f"sealed stream {name!r}")
    return EXIT_OK


@command
def run_delete(args: argparse.Namespace) -> int:
    name = stream_name(args.name)

    async def body(client: Client) -> None:
        await client.delete_stream(name)

    _with_client(args.metadata, body)
    print(f"deleted stream {name!r}")
    return EXIT_OK


@command
def run_trim(args: argparse.Namespace) -> int:
    names = [stream_name(name) for name in args.names]
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
    names = [stream_name(name) for name in args.names]
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
                    f"({whose}, created {time_text(orphan.created_ms)})"
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
    name = stream_name(args.name)
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
    name = stream_name(args.name)
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
