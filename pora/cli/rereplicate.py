"""`pora audit` and `pora rereplicate`: under-replicated fragments listed, and
repaired (docs/rereplication.md).

`pora audit --json` prints one object:

    {"metadata": URL, "ledgers": int, "fragments": int, "under_replicated": [
        {"ledger": int, "state": "OPEN" | "IN_RECOVERY" | "CLOSED", "stream": str | null,
         "fragment": {"first_entry": int, "last_entry": int | null}, "position": int,
         "node": str, "instance_id": str, "why": str, "entries_at_risk": int | null,
         "copies_left": int}, ...]}

`pora rereplicate --json` prints one object per line: an event per fragment repaired,
skipped or failed (`{"event": "repaired" | "skipped" | "failed" | "recovered",
"ledger": int, ...}`), then `{"event": "summary", ...}`.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from pora.cli._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    command,
    print_json,
    print_json_line,
)
from pora.cli._metadata import add_metadata_argument, run_on_metadata
from pora.cluster_ops.session import Cluster, audit_cluster, cluster_session, rereplicate, watch
from pora.cluster_ops.worker import Report, Rereplicator, Totals, WorkerOptions
from pora.tools.progress import Progress

T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="list the under-replicated fragments of every ledger and stream segment",
        description="List each fragment (an ensemble and its entry range) of every ledger "
        "and stream segment with a node that is not registered, is registered with "
        "another data-dir instance id, is draining, or (--deep) misses entries it should "
        "hold. Exit status 1 when anything is under-replicated, 0 when all is clean.",
    )
    add_metadata_argument(parser, required=True)
    parser.add_argument(
        "--deep", action="store_true", help="also range-read every live member's fragments"
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.set_defaults(run=run_audit)

    parser = subparsers.add_parser(
        "rereplicate",
        help="copy the missing copies of under-replicated fragments to other nodes",
        description="Repair every under-replicated fragment: copy its entries from the "
        "surviving copies to a node chosen by the placement rules, then name that node "
        "in the ledger record (compare-and-set). Several workers may run at once: each "
        "ledger is worked on under a lock in the metadata store.",
    )
    add_metadata_argument(parser, required=True)
    add_worker_arguments(parser)
    parser.add_argument(
        "--watch", action="store_true",
        help="keep running; repair nodes lost for --lost-after-s; SIGINT or SIGTERM stops "
        "it (exit 0): a repair cut short is finished by the next run",
    )  # fmt: skip
    parser.add_argument(
        "--lost-after-s", type=positive, default=300.0, metavar="S",
        help="with --watch: how long a node's registration must be gone before its "
        "fragments are repaired (default 300), so a restart does not start a copy storm",
    )  # fmt: skip
    parser.add_argument(
        "--interval-s", type=positive, default=10.0, metavar="S",
        help="with --watch: seconds between rounds (default 10)",
    )  # fmt: skip
    parser.set_defaults(run=run_rereplicate)


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a number above 0")
    return value


def count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number above 0")
    return int(text)


def rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of at least 0 (0: no bound)")
    return value


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--password", default="",
        help="the ledgers' password (default: none, as stream segments have); a ledger "
        "with another one is skipped",
    )  # fmt: skip
    parser.add_argument(
        "--entries-per-s", type=rate, default=0.0, metavar="N",
        help="copy at most N entries a second (default 0: no bound)",
    )  # fmt: skip
    parser.add_argument(
        "--bytes-per-s", type=rate, default=0.0, metavar="N",
        help="copy at most N bytes a second (default 0: no bound)",
    )  # fmt: skip
    parser.add_argument(
        "--open-grace-s", type=rate, default=60.0, metavar="S",
        help="an open ledger's last fragment is repaired only when still lost after S "
        "seconds, by fencing and recovering the ledger (a stream's open segment: by "
        "taking the stream over); an idle writer is fenced too: set S above the "
        "writers' idle times (default 60)",
    )  # fmt: skip
    parser.add_argument(
        "--lock-lease-s", type=positive, default=10.0, metavar="S",
        help="the lease of a ledger's lock in SQLite: how soon another worker takes over "
        "a dead one's ledger (default 10; ZooKeeper frees it with the session)",
    )  # fmt: skip
    parser.add_argument(
        "--deep", action="store_true",
        help="also refill live members that miss entries (found by range reads)",
    )  # fmt: skip
    parser.add_argument(
        "--batch-entries", type=count, default=1000, metavar="N",
        help="entry ids per batch: one range read, one add call (default 1000)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print JSON lines for scripts")


def worker_options(args: argparse.Namespace) -> WorkerOptions:
    return WorkerOptions(
        password=args.password,
        entries_per_s=args.entries_per_s,
        bytes_per_s=args.bytes_per_s,
        open_grace_s=args.open_grace_s,
        lock_lease_s=args.lock_lease_s,
        deep=args.deep,
        batch_entries=args.batch_entries,
    )


def in_cluster(url: str, work: Callable[[Cluster], Awaitable[T]]) -> T:
    """Run `work` on a session of the cluster at `url` (store and node connections)."""

    async def main() -> T:
        async with cluster_session(url) as cluster:
            return await work(cluster)

    return run_on_metadata(url, main)


@command
def run_audit(args: argparse.Namespace) -> int:
    report = in_cluster(args.metadata, lambda cluster: audit_cluster(cluster, args.deep))
    if args.json:
        print_json(
            {
                "metadata": args.metadata,
                "ledgers": report.ledgers,
                "fragments": report.fragments,
                "under_replicated": [finding.to_json() for finding in report.findings],
            }
        )
    else:
        for finding in report.findings:
            print(finding.line())
        state = f"{len(report.findings)} under-replicated" if report.findings else "all replicated"
        print(f"{report.ledgers} ledgers, {report.fragments} fragments: {state}")
    return EXIT_PROBLEMS if report.findings else EXIT_OK


def event_printer(as_json: bool) -> Report:
    def report(event: dict[str, object]) -> None:
        if as_json:
            print_json_line(event)
            return
        details = ", ".join(f"{k}={v}" for k, v in event.items() if k not in ("event", "ledger"))
        print(f"ledger {event['ledger']}: {event['event']}: {details}", flush=True)

    return report


async def run_with_progress(
    cluster: Cluster, options: WorkerOptions, report: Report, shown: bool
) -> Totals:
    """One run; with `shown`, a progress line of the entries copied on stderr."""
    workers: list[Rereplicator] = []
    async with anyio.create_task_group() as tasks:
        if shown:

            async def draw() -> None:
                with Progress("re-replicating", None, unit="entries") as progress:
                    while True:
                        if workers:
                            progress.update(workers[0].totals.copied.entries)
                        await anyio.sleep(0.2)

            tasks.start_soon(draw)
        totals = await rereplicate(cluster, options, report, workers.append)
        tasks.cancel_scope.cancel()
    return totals


async def watch_until_stopped(
    cluster: Cluster, options: WorkerOptions, report: Report, args: argparse.Namespace
) -> None:
    """`watch` until SIGINT or SIGTERM (a service manager's stop). The handlers are
    installed here rather than left to Python's default: a process started with
    SIGINT ignored (a background job of a shell without job control) would not stop."""
    async with anyio.create_task_group() as tasks:

        async def stop_on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    tasks.cancel_scope.cancel()
                    return

        tasks.start_soon(stop_on_signal)
        await watch(cluster, options, report, args.lost_after_s, args.interval_s)


@command
def run_rereplicate(args: argparse.Namespace) -> int:
    options = worker_options(args)
    report = event_printer(args.json)

    async def work(cluster: Cluster) -> int:
        if args.watch:
            await watch_until_stopped(cluster, options, report, args)
            return EXIT_OK
        shown = not args.json and sys.stderr.isatty()
        totals = await run_with_progress(cluster, options, report, shown)
        if args.json:
            print_json_line(totals.to_json())
        else:
            print(
                f"{totals.repaired} fragments repaired, {totals.copied.entries} entries "
                f"({totals.copied.bytes} bytes) copied, {totals.skipped} skipped, "
                f"{totals.failed} failed"
            )
        return EXIT_PROBLEMS if totals.failed else EXIT_OK

    return in_cluster(args.metadata, work)
