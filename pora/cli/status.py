"""`pora status --metadata URL`: the cluster on one screen, from its metadata store
alone: the live nodes (writable or read-only, draining, free space), the ledgers by
state and the bytes of the closed ones, the streams, and the under-replicated
fragments, decided by the audit's own rule (`pora.cluster_ops.fragments`, A1..A3 and
A14 of docs/rereplication.md) so that `pora status` and `pora audit` agree.

The ledgers are read page by page; only counts and the first `--show` fragments at
risk are kept, so a store of any size is summed in bounded memory.

`--json` prints one object, a stable shape for scripts:

    {"metadata": URL, "now_ms": int,
     "nodes": {"live": int, "writable": int, "read_only": int, "draining": int,
               "free_bytes": int,
               "list": [`pora nodes --json`'s node fields + "draining": bool]},
     "ledgers": {"total": int, "open": int, "in_recovery": int, "closed": int,
                 "closed_bytes": int},
     "streams": int,
     "under_replicated": {"fragments": int, "ledgers": int, "missing_replicas": int,
                          "list": [{"ledger_id", "first_entry_id", "last_entry_id",
                                    "missing": [{"address", "instance_id", "why"}],
                                    "copies_left"}, ...],
                          "more": bool}}
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Final

from pora.cli._common import EXIT_OK, EXIT_REFUSED, CommandError, command, print_json, print_table
from pora.cli._metadata import add_metadata_argument, query_metadata
from pora.cli.nodes import ago, node_json, state
from pora.cluster_ops.fragments import LostMember, lost_members
from pora.cluster_ops.inventory import all_ledgers, draining_addresses, live_nodes
from pora.meta import MetadataStore, NodeRegistration
from pora.meta.records import LedgerState
from pora.streams.document_model import STREAMS_SPACE
from pora.tools.progress import format_bytes

#: stream names read per call (the ledgers are paged by `all_ledgers`)
PAGE_SIZE: Final = 500
#: fragments at risk listed by default
SHOW_DEFAULT: Final = 10


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "status",
        help="the cluster on one screen: nodes, ledgers, streams, fragments at risk",
        description="Summarise the cluster from its metadata store: the live nodes "
        "(writable, read-only, draining, free space), the ledgers by state and "
        "the payload bytes of the closed ones, the streams, and the under-replicated "
        "fragments, by the rule of `pora audit` without --deep: those with a replica on a "
        "node that is not registered, registered with another instance id (a wiped or "
        "replaced data dir), or draining. Reads the store only.",
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


@dataclass(frozen=True)
class _AtRisk:
    """One under-replicated fragment: its lost members, as the audit lists them."""

    lost: tuple[LostMember, ...]

    def as_json(self) -> dict[str, object]:
        fragment = self.lost[0].fragment
        return {
            "ledger_id": fragment.ledger_id,
            "first_entry_id": fragment.first_entry_id,
            "last_entry_id": fragment.last_entry_id,
            "missing": [
                {"address": m.member.address, "instance_id": m.member.instance_id, "why": m.why}
                for m in self.lost
            ],
            # one figure for the whole fragment (A2): every member carries the same
            "copies_left": self.lost[0].copies_left,
        }


@dataclass
class _Tally:
    """The sums of one pass over the ledgers."""

    show: int
    by_state: dict[LedgerState, int] = field(default_factory=lambda: dict.fromkeys(LedgerState, 0))
    closed_bytes: int = 0
    fragments: int = 0
    ledgers_at_risk: int = 0
    missing_replicas: int = 0
    listed: list[_AtRisk] = field(default_factory=list)

    def add(self, lost: list[LostMember]) -> None:
        """One ledger's lost members, in fragment order (as `lost_members` gives them)."""
        if lost:
            self.ledgers_at_risk += 1
        self.missing_replicas += len(lost)
        for _, members in itertools.groupby(lost, key=lambda m: m.fragment.index):
            self.fragments += 1
            if len(self.listed) < self.show:
                self.listed.append(_AtRisk(tuple(members)))


@dataclass
class _Status:
    nodes: list[NodeRegistration]
    tally: _Tally
    streams: int


async def _status(store: MetadataStore, show: int) -> _Status:
    # the audit's inputs, read the audit's way: the same store gives the same answer
    live = await live_nodes(store)
    draining = await draining_addresses(store)
    tally = _Tally(show)
    async for record in all_ledgers(store):
        meta = record.value
        tally.by_state[meta.state] += 1
        if meta.state is LedgerState.CLOSED:
            tally.closed_bytes += meta.length
        tally.add(lost_members(meta, live, draining))
    streams, names_after = 0, ""
    while True:
        names = await store.list_documents(STREAMS_SPACE, after=names_after, limit=PAGE_SIZE)
        streams += len(names)
        if len(names) < PAGE_SIZE:
            break
        names_after = names[-1]
    return _Status(list(live.values()), tally, streams)


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
            "draining": sum(node.draining for node in nodes),
            "free_bytes": sum(node.free_bytes for node in nodes),
            "list": [{**node_json(node, now_ms), "draining": node.draining} for node in nodes],
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
    print(f"metadata          {url}")
    print(
        f"nodes             {nodes['live']} live: {nodes['writable']} writable, "
        f"{nodes['read_only']} read-only, {nodes['draining']} draining; "
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
                state(node) + (" draining" if node.draining else ""),
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
                at_risk["ledger_id"],
                f"{at_risk['first_entry_id']}-"
                + ("" if at_risk["last_entry_id"] is None else str(at_risk["last_entry_id"])),
                ",".join(f"{m['address']} ({m['why']})" for m in at_risk["missing"]),
                at_risk["copies_left"],
            ]
            for at_risk in risk["list"]
        ]
        print_table(("ledger", "entries", "missing", "copies_left"), fragment_rows)
        if risk["more"]:
            print(f"... and {risk['fragments'] - len(found.tally.listed)} more (--show N)")
