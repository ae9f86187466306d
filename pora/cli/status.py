"""`pora status --metadata URL`: the cluster on one screen, from its metadata store
alone: the live nodes (writable or read-only, draining when registrations say,
free space), the ledgers by state and the bytes of the closed ones, the streams,
and the fragments with a replica on a node that is gone (`_cluster_health.py`).

The ledgers are read page by page; only counts and the first `--show` fragments at
risk are kept, so a store of any size is summed in bounded memory.

`--json` prints one object, a stable shape for scripts:

    {"metadata": URL, "now_ms": int,
     "nodes": {"live": int, "writable": int, "read_only": int, "draining": int | null,
               "free_bytes": int,
               "list": [`pora nodes --json`'s node fields + "draining": bool | null]},
     "ledgers": {"total": int, "open": int, "in_recovery": int, "closed": int,
                 "closed_bytes": int},
     "streams": int,
     "under_replicated": {"fragments": int, "ledgers": int, "missing_replicas": int,
                          "list": [{"ledger_id", "first_entry_id", "last_entry_id",
                                    "missing": [{"address", "instance_id"}],
                                    "copies_left"}, ...],
                          "more": bool}}
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any, Final

from pora.cli._cluster_health import Fragment, draining, under_replicated
from pora.cli._common import EXIT_OK, EXIT_REFUSED, CommandError, command, print_json, print_table
from pora.cli._metadata import add_metadata_argument, query_metadata
from pora.cli.nodes import ago, node_json, state
from pora.meta import MetadataStore, NodeRegistration
from pora.meta.records import LedgerState
from pora.streams.document_model import STREAMS_SPACE
from pora.tools.progress import format_bytes

#: ledger records and stream names read per call
PAGE_SIZE: Final = 500
#: fragments at risk listed by default
SHOW_DEFAULT: Final = 10


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "status",
        help="the cluster on one screen: nodes, ledgers, streams, fragments at risk",
        description="Summarise the cluster from its metadata store: the live nodes "
        "(writable, read-only, draining when marked, free space), the ledgers by state and "
        "the payload bytes of the closed ones, the streams, and the under-replicated "
        "fragments: those with a replica on a node that is not registered, or registered "
        "with another instance id (a wiped or replaced data dir). Reads the store only.",
    )
    add_metadata_argument(parser, required=True)
    parser.add_argument(
        "--show",
        type=int,
        default=SHOW_DEFAULT,
        metavar="N",
        help=f"list at most N under-replicated fragments (default {SHOW_DEFAULT})",
    )
    parser.add_argument(
        "--json", action="store_true", help="print JSON for scripts instead of a table"
    )
    parser.set_defaults(run=run_status)


@dataclass
class _Tally:
    """The sums of one pass over the ledgers."""

    show: int
    by_state: dict[LedgerState, int] = field(default_factory=lambda: dict.fromkeys(LedgerState, 0))
    closed_bytes: int = 0
    fragments: int = 0
    ledgers_at_risk: int = 0
    missing_replicas: int = 0
    listed: list[Fragment] = field(default_factory=list)

    def add(self, fragments: list[Fragment]) -> None:
        if fragments:
            self.ledgers_at_risk += 1
        self.fragments += len(fragments)
        self.missing_replicas += sum(len(f.missing) for f in fragments)
        self.listed.extend(fragments[: self.show - len(self.listed)])


@dataclass
class _Status:
    nodes: list[NodeRegistration]
    tally: _Tally
    streams: int


async def _status(store: MetadataStore, show: int) -> _Status:
    nodes = await store.list_nodes()
    live = {node.address: node for node in nodes}
    tally = _Tally(show)
    after = -1
    while True:
        page = await store.list_ledgers(after_id=after, limit=PAGE_SIZE)
        for record in page:
            meta = record.value
            tally.by_state[meta.state] += 1
            if meta.state is LedgerState.CLOSED:
                tally.closed_bytes += meta.length
            tally.add(under_replicated(meta, live))
        if len(page) < PAGE_SIZE:
            break
        after = page[-1].value.ledger_id
    streams, names_after = 0, ""
    while True:
        names = await store.list_documents(STREAMS_SPACE, after=names_after, limit=PAGE_SIZE)
        streams += len(names)
        if len(names) < PAGE_SIZE:
            break
        names_after = names[-1]
    return _Status(nodes, tally, streams)


def _draining_count(nodes: list[NodeRegistration]) -> int | None:
    marks = [draining(node) for node in nodes]
    return None if any(mark is None for mark in marks) and nodes else sum(bool(m) for m in marks)


@command
def run_status(args: argparse.Namespace) -> int:
    if args.show < 0:
        raise CommandError(f"--show {args.show}: give 0 or more", EXIT_REFUSED)
    found = query_metadata(args.metadata, lambda store: _status(store, args.show))
    now_ms = int(time.time() * 1000)
    if args.json:
        print_json(_as_json(args.metadata, now_ms, found))
    else:
        _print_screen(args.metadata, now_ms, found)
    return EXIT_OK


def _as_json(url: str, now_ms: int, found: _Status) -> dict[str, Any]:
    nodes, tally = found.nodes, found.tally
    return {
        "metadata": url,
        "now_ms": now_ms,
        "nodes": {
            "live": len(nodes),
            "writable": sum(not node.read_only for node in nodes),
            "read_only": sum(node.read_only for node in nodes),
            "draining": _draining_count(nodes),
            "free_bytes": sum(node.free_bytes for node in nodes),
            "list": [{**node_json(node, now_ms), "draining": draining(node)} for node in nodes],
        },
        "ledgers": {
            "total": sum(tally.by_state.values()),
            "open": tally.by_state[LedgerState.OPEN],
            "in_recovery": tally.by_state[LedgerState.IN_RECOVERY],
            "closed": tally.by_state[LedgerState.CLOSED],
            "closed_bytes": tally.closed_bytes,
        },
        "streams": found.streams,
        "under_replicated": {
            "fragments": tally.fragments,
            "ledgers": tally.ledgers_at_risk,
            "missing_replicas": tally.missing_replicas,
            "list": [fragment.as_json() for fragment in tally.listed],
            "more": tally.fragments > len(tally.listed),
        },
    }


def _print_screen(url: str, now_ms: int, found: _Status) -> None:
    report = _as_json(url, now_ms, found)
    nodes, ledgers, risk = report["nodes"], report["ledgers"], report["under_replicated"]
    draining_text = "unknown" if nodes["draining"] is None else str(nodes["draining"])
    print(f"metadata          {url}")
    print(
        f"nodes             {nodes['live']} live: {nodes['writable']} writable, "
        f"{nodes['read_only']} read-only, {draining_text} draining; "
        f"{format_bytes(nodes['free_bytes'])} free"
    )
    print(
        f"ledgers           {ledgers['total']}: {ledgers['open']} open, "
        f"{ledgers['in_recovery']} in recovery, {ledgers['closed']} closed "
        f"({format_bytes(ledgers['closed_bytes'])} in closed ledgers)"
    )
    print(f"streams           {report['streams']}")
    print(
        f"under-replicated  {risk['fragments']} fragment(s) of {risk['ledgers']} ledger(s), "
        f"{risk['missing_replicas']} replica(s) missing"
        + ("" if risk["fragments"] == 0 else ": run `pora audit`, then `pora rereplicate`")
    )
    if found.nodes:
        print()
        rows = [
            [
                node.address,
                state(node) + (" draining" if draining(node) else ""),
                format_bytes(node.free_bytes),
                node.rack or "-",
                ago((now_ms - node.last_seen_ms) / 1000),
            ]
            for node in found.nodes
        ]
        print_table(("address", "state", "free", "rack", "last_seen"), rows)
    if found.tally.listed:
        print()
        fragment_rows: list[list[object]] = [
            [
                fragment.ledger_id,
                f"{fragment.first_entry_id}-"
                + ("" if fragment.last_entry_id is None else str(fragment.last_entry_id)),
                ",".join(member.address for member in fragment.missing),
                fragment.copies_left,
            ]
            for fragment in found.tally.listed
        ]
        print_table(("ledger", "entries", "missing", "copies_left"), fragment_rows)
        if risk["more"]:
            print(f"... and {risk['fragments'] - len(found.tally.listed)} more (--show N)")
