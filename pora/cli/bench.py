"""`pora bench`: durable adds over loopback, compared with Redis streams."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from journal.errors import PoraError
from pora.cli._common import pora_error_message

if TYPE_CHECKING:
    from pora.bench.network import LoadConfig


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="benchmark durable adds over loopback (and Redis XADD in the same run)",
        description="Start `pora serve` on a temp data dir (or --connect to a running "
        "node), run CONNECTIONS x DEPTH pipelined adds of PAYLOAD bytes, and print adds/s, "
        "MB/s and p50/p99/p999 latency. Then run the same load against redis-server "
        "(from PATH, started on loopback with appendfsync always) with XADD and print "
        "the ratio; without redis-server that part is skipped with a message. The loads "
        "come from equally lean raw pipelined clients (but --pora-load library): requests "
        "encoded once, replies counted in bulk per received chunk, as the clients share "
        "the CPU with the server.",
    )
    parser.add_argument("--connections", type=int, default=8, help="TCP connections (default 8)")
    parser.add_argument(
        "--depth", type=int, default=64, help="requests in flight per connection (default 64)"
    )
    parser.add_argument(
        "--payload-bytes", type=int, default=1024, help="bytes per add (default 1024)"
    )
    parser.add_argument(
        "--duration-s", type=float, default=5.0, help="measured seconds per system (default 5)"
    )
    parser.add_argument(
        "--warmup-s", type=float, default=1.0, help="unmeasured seconds first (default 1)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="alternate Pora and Redis this many times and report each one's median "
        "round: on a shared machine one round of each can land in different phases "
        "of the machine's speed, and the ratio with them (default 3)",
    )
    parser.add_argument(
        "--connect",
        metavar="HOST:PORT",
        default=None,
        help="load this running node instead of starting one (writes fresh ledgers)",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--no-redis", action="store_true", help="skip the Redis run")
    which.add_argument("--redis-only", action="store_true", help="skip the Pora runs")
    parser.add_argument(
        "--pora-load",
        default="runs,frames",
        metavar="LOAD[,LOAD]",
        help="how to load the node, comma-separated, each measured and compared with "
        "Redis: `runs` (the adds free to go on a connection leave as one ADD_RUN frame, "
        "one response per run), `frames` (one ADD_ENTRY frame and one response per add), "
        "`library` (pora.connect_node().add_entry, one task per add in flight); default "
        "runs,frames",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="where the started node's temp data dir goes (default: the system temp dir); "
        "pick the disk you want to measure",
    )
    parser.add_argument(
        "--node-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="node option for the started node (repeatable), as for `pora serve`",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import trio  # noqa: PLC0415

    from pora.bench.network import format_table, run_bench  # noqa: PLC0415

    checked = _checked_arguments(args)
    if isinstance(checked, str):
        print(f"pora bench: {checked}", file=sys.stderr)
        return 2
    config, pora_loads = checked

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        report = trio.run(
            functools.partial(
                run_bench,
                config,
                connect=args.connect,
                redis=not args.no_redis,
                pora_loads=pora_loads,
                parent_dir=args.dir,
                node_options=args.node_option,
                rounds=args.rounds,
                say=say,
            )
        )
    except (PoraError, BaseExceptionGroup) as error:
        # every connection fails the same way when the node goes away mid-run: its
        # reason once, not a group of CONNECTIONS tracebacks
        message = pora_error_message(error)
        if message is None:
            raise
        print(f"pora bench: {message}", file=sys.stderr)
        return 1
    print(report.as_json() if args.json else format_table(report))
    return 0


def _checked_arguments(args: argparse.Namespace) -> tuple[LoadConfig, list[str]] | str:
    """The load and the Pora loads asked for, or why the arguments are refused."""
    from pora.bench.network import PORA_LOADS, LoadConfig  # noqa: PLC0415
    from pora.server.settings import SettingsError, check_node_option_flags  # noqa: PLC0415

    try:
        config = LoadConfig(
            connections=args.connections,
            depth=args.depth,
            payload_bytes=args.payload_bytes,
            duration_s=args.duration_s,
            warmup_s=args.warmup_s,
        )
    except ValueError as error:
        return str(error)
    if args.rounds < 1:
        return "--rounds must be >= 1"
    pora_loads = [] if args.redis_only else [x.strip() for x in args.pora_load.split(",") if x]
    for load in pora_loads:
        if load not in PORA_LOADS:
            return f"unknown --pora-load {load!r}; choose from {', '.join(PORA_LOADS)}"
    try:
        check_node_option_flags(args.node_option)
    except SettingsError as error:
        return str(error)
    if args.connect is not None and pora_loads:
        refusal = _unreachable(args.connect)
        if refusal is not None:
            return f"--connect {args.connect!r}: {refusal}"
    return config, pora_loads


def _unreachable(address: str) -> str | None:
    """Why the node at `address` cannot be loaded (a malformed address, nothing
    answering there), or None once one connection to it opened."""
    import trio  # noqa: PLC0415

    from pora.client.node_client import connect_node  # noqa: PLC0415

    if not address.strip():
        return "an empty address: give the HOST:PORT of a running `pora serve`"

    async def probe() -> None:
        async with connect_node(address, reconnect_attempts=2):
            pass

    try:
        trio.run(probe)
    except PoraError as error:
        return str(error)
    return None
