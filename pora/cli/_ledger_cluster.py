"""`pora ledger show | read | tail | recover ID --metadata URL`: a replicated ledger read
through the cluster, as a client (`pora.connect`), in the output forms of the data-dir
commands.

`show`, `read` and `tail` never fence: they open the ledger with `recover=False`, so a
writer that is still appending goes on undisturbed, and an open ledger reads up to the
last entry its nodes confirm (its LAC, R23). `recover` is the one that changes
something: it fences the ledger's last ensemble, recovers its tail and closes it (R16..
R22), for a ledger whose writer died.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ledger.errors import NoSuchLedger, Unauthorized
from pora.cli._common import (
    EXIT_OK,
    EXIT_REFUSED,
    CommandError,
    print_fields,
    print_json,
)
from pora.cli._entries import RawPayloads, print_entry
from pora.cli._ledger_metadata import ledger_json
from pora.cli._metadata import run_client
from pora.client.replication.client import Client
from pora.client.replication.reader import LedgerReader

T = TypeVar("T")


def add_cluster_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """--metadata URL (read through the cluster instead of a data dir) and --password."""
    parser.add_argument(
        "--metadata",
        metavar="URL",
        required=required,
        help="read the ledger through the cluster whose metadata store is at URL "
        "(sqlite:///abs/path.db, sqlite:relative/path.db, zk://host:port,.../chroot) "
        "instead of a stopped node's data dir",
    )
    parser.add_argument(
        "--password",
        default="",
        metavar="TEXT",
        help="with --metadata: the ledger's password (default: empty)",
    )


def check_source(args: argparse.Namespace) -> bool:
    """True when the command reads through the cluster (--metadata); refuses
    --metadata together with --data-dir, and --password without --metadata."""
    if args.metadata is None:
        if args.password:
            raise CommandError("--password goes with --metadata URL", EXIT_REFUSED)
        return False
    if args.data_dir is not None:
        raise CommandError(
            "give either --data-dir (a stopped node's copy) or --metadata (the ledger "
            "read through the cluster), not both",
            EXIT_REFUSED,
        )
    return True


def with_client(url: str, body: Callable[[Client], Awaitable[T]]) -> T:
    """Connect to the cluster at `url` and run `body`; a missing ledger or a wrong
    password end the command with exit status 2."""
    return run_client(url, body, (NoSuchLedger, Unauthorized))


def reader_details(reader: LedgerReader, url: str) -> dict[str, Any]:
    """The ledger's record, every ensemble, and what its nodes confirm."""
    details = ledger_json(reader.record)
    meta = reader.metadata
    details["ensembles"] = [
        {
            "first_entry_id": ensemble.first_entry_id,
            "addresses": [member.address for member in ensemble.members],
        }
        for ensemble in meta.ensembles
    ]
    details["last_add_confirmed"] = reader.last_add_confirmed
    details["custom_metadata_keys"] = sorted(meta.custom)
    details["metadata"] = url
    return details


def print_details(details: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print_json(details)
        return
    fields: list[tuple[str, object]] = []
    for name, value in details.items():
        if name == "ensembles":
            for ensemble in value:
                addresses = ",".join(ensemble["addresses"])
                fields.append((f"ensemble from {ensemble['first_entry_id']}", addresses))
        elif name == "current_ensemble":
            continue  # the last of the ensembles listed
        elif name == "custom_metadata_keys":
            fields.append((name, ", ".join(value) or "-"))
        else:
            fields.append((name, value))
    created = datetime.datetime.fromtimestamp(details["created_ms"] / 1000, tz=datetime.UTC)
    fields.append(("created", created.isoformat(timespec="milliseconds")))
    print_fields(fields)


def run_show(args: argparse.Namespace) -> int:
    async def body(client: Client) -> dict[str, Any]:
        reader = await client.open_ledger(args.ledger_id, args.password, recover=False)
        return reader_details(reader, args.metadata)

    print_details(with_client(args.metadata, body), as_json=args.json)
    return EXIT_OK


def run_read(args: argparse.Namespace) -> int:
    """The entries in [--from, --to], --to capped at what the ledger holds: a closed
    ledger's last entry, an open one's LAC when it was opened."""
    if args.allow_stale:
        raise CommandError(
            "--allow-stale is for a data dir; a read through the cluster is never stale",
            EXIT_REFUSED,
        )

    async def body(client: Client) -> None:
        reader = await client.open_ledger(args.ledger_id, args.password, recover=False)
        last = reader.last_add_confirmed
        if args.last is not None:
            last = min(last, args.last)
        entries = reader.read_entries(args.first, last) if last >= args.first else None
        if args.raw is not None:
            with RawPayloads(args.raw, f"ledger {args.ledger_id}") as out:
                if entries is not None:
                    async for _entry_id, payload in entries:
                        out.write(payload)
            return
        if entries is not None:
            async for entry_id, payload in entries:
                _print(args.ledger_id, entry_id, payload, as_json=args.json)

    with_client(args.metadata, body)
    return EXIT_OK


def _print(ledger_id: int, entry_id: int, payload: bytes, *, as_json: bool) -> None:
    fields = {"ledger_id": ledger_id, "entry_id": entry_id}
    print_entry(str(entry_id), fields, payload, as_json=as_json, flush=True)


def run_tail(args: argparse.Namespace) -> int:
    """Follows the ledger from --from as its nodes confirm entries; ends after the
    last entry of a closed ledger, at --count, or on Ctrl-C."""
    if args.count is not None and args.count < 1:
        raise CommandError(f"--count {args.count}: give 1 or more entries", EXIT_REFUSED)

    async def body(client: Client) -> None:
        reader = await client.open_ledger(args.ledger_id, args.password, recover=False)
        printed = 0
        async for entry_id, payload in reader.tail(args.first):
            _print(args.ledger_id, entry_id, payload, as_json=args.json)
            printed += 1
            if printed == args.count:
                return

    with_client(args.metadata, body)
    return EXIT_OK


def run_recover(args: argparse.Namespace) -> int:
    """Fence, recover the tail, close (a closed ledger is left as it is); then prints
    the closed ledger's details."""

    async def body(client: Client) -> tuple[bool, dict[str, Any]]:
        before = await client.open_ledger(args.ledger_id, args.password, recover=False)
        reader = await client.open_ledger(args.ledger_id, args.password, recover=True)
        return not before.closed, reader_details(reader, args.metadata)

    changed, details = with_client(args.metadata, body)
    details["recovered"] = changed
    print_details(details, as_json=args.json)
    return EXIT_OK
