"""`pora nodes --metadata URL`: the nodes registered live in the cluster's metadata
store.

`--json` prints one object, a stable shape for scripts:

    {"metadata": URL, "now_ms": ms since the Unix epoch,
     "nodes": [{"address": str, "state": "writable" | "read-only",
                "free_bytes": int, "rack": str | null, "last_seen_ms": int,
                "last_seen_ago_s": float, "instance_id": str}, ...]}

Nodes come sorted by address; a node whose lease expired is not listed.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from pora.cli._common import EXIT_OK, command, print_json, print_table
from pora.cli._metadata import add_metadata_argument, query_metadata
from pora.meta import MetadataStore, NodeRegistration
from pora.tools.progress import format_bytes

COLUMNS = ("address", "state", "free", "rack", "last_seen", "instance_id")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "nodes",
        help="the nodes registered in the cluster's metadata store",
        description="List the live nodes of the metadata store: address, state (writable "
        "or read-only), free space, rack label, when the store last heard from each and "
        "its instance id (its data dir's).",
    )
    add_metadata_argument(parser, required=True)
    parser.add_argument("--writable-only", action="store_true", help="leave out read-only nodes")
    parser.add_argument(
        "--json", action="store_true", help="print JSON for scripts instead of a table"
    )
    parser.set_defaults(run=run_nodes)


def state(node: NodeRegistration) -> str:
    return "read-only" if node.read_only else "writable"


def ago(seconds: float) -> str:
    """3.2 -> '3s ago'; 125 -> '2m5s ago'."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s ago"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60}s ago"
    return f"{whole // 3600}h{whole % 3600 // 60}m ago"


def node_json(node: NodeRegistration, now_ms: int) -> dict[str, Any]:
    return {
        "address": node.address,
        "state": state(node),
        "free_bytes": node.free_bytes,
        "rack": node.rack,
        "last_seen_ms": node.last_seen_ms,
        "last_seen_ago_s": max(0, now_ms - node.last_seen_ms) / 1000,
        "instance_id": node.instance_id,
    }


@command
def run_nodes(args: argparse.Namespace) -> int:
    async def live(store: MetadataStore) -> list[NodeRegistration]:
        return await store.list_nodes(writable_only=args.writable_only)

    nodes = query_metadata(args.metadata, live)
    now_ms = int(time.time() * 1000)
    if args.json:
        print_json(
            {
                "metadata": args.metadata,
                "now_ms": now_ms,
                "nodes": [node_json(node, now_ms) for node in nodes],
            }
        )
        return EXIT_OK
    if not nodes:
        which = "writable nodes" if args.writable_only else "nodes"
        print(
            f"no live {which} registered in {args.metadata} (a node registers when "
            "`pora serve --metadata` starts it)"
        )
        return EXIT_OK
    rows = [
        [
            node.address,
            state(node),
            format_bytes(node.free_bytes),
            node.rack or "-",
            ago((now_ms - node.last_seen_ms) / 1000),
            node.instance_id,
        ]
        for node in nodes
    ]
    print_table(COLUMNS, rows)
    return EXIT_OK
