"""Operations per second of the metadata store's backends, from concurrent tasks.

    python scripts/bench_meta.py --sqlite [--zookeeper] [--url URL ...]
        [--tasks 8] [--duration 2 | --ops N] [--rounds 1] [--json]

For each backend: `create` (allocate an id, create the record), `cas` (read-modify-write
of one ledger per task: no conflicts), `cas-contended` (every task on one ledger:
wins and conflicts are reported; ops/s counts attempts) and `read` (random records
among those created). With several rounds the backends take turns, so a drift of the
machine's speed (disk, other load) spreads over all of them. `--sqlite` uses a fresh
temporary file, `--zookeeper` a local ZooKeeper server in a temporary folder
(pora.meta.local_zookeeper); `--url` any store (its records are left behind).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Protocol

import trio

from pora.meta import (
    Ensemble,
    EnsembleMember,
    LedgerMetadata,
    MetadataStore,
    MetadataVersionConflict,
    open_metadata,
)

OPERATIONS = ("create", "cas", "cas-contended", "read")


@dataclasses.dataclass
class Result:
    backend: str
    round: int
    op: str
    ops: int
    seconds: float
    p50_ms: float
    p99_ms: float
    wins: int | None = None
    conflicts: int | None = None

    @property
    def ops_per_s(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0


def record(ledger_id: int, counter: int = 0) -> LedgerMetadata:
    members = tuple(EnsembleMember(f"127.0.0.1:{3181 + k}", f"instance-{k}") for k in range(3))
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
        ensembles=(Ensemble(0, members),),
        password_digest=b"digest",
        created_ms=int(time.time() * 1000),
        custom={"counter": str(counter).encode()},
    )


def bumped(meta: LedgerMetadata) -> LedgerMetadata:
    counter = int(meta.custom["counter"]) + 1
    return dataclasses.replace(meta, custom={"counter": str(counter).encode()})


class Budget:
    """Until the duration is over, or the operations are all given out."""

    def __init__(self, duration_s: float | None, ops: int | None) -> None:
        self._ends = None if duration_s is None else time.monotonic() + duration_s
        self._left = ops

    def take(self) -> bool:
        if self._ends is not None and time.monotonic() >= self._ends:
            return False
        if self._left is not None:
            if self._left <= 0:
                return False
            self._left -= 1
        return True


Step = Callable[[int], Awaitable[bool | None]]


async def measure(args: argparse.Namespace, step: Step) -> tuple[int, float, list[float]]:
    """Run `step(task)` from every task until the budget ends: ops, seconds, latencies."""
    budget = Budget(args.duration, args.ops)
    latencies: list[float] = []

    async def task(number: int) -> None:
        while budget.take():
            started = time.perf_counter()
            await step(number)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for number in range(args.tasks):
            nursery.start_soon(task, number)
    return len(latencies), time.perf_counter() - started, latencies


def percentile_ms(latencies: list[float], share: float) -> float:
    if not latencies:
        return 0.0
    if len(latencies) == 1:
        return latencies[0] * 1000
    return statistics.quantiles(latencies, n=100, method="inclusive")[round(share * 100) - 1] * 1000


async def bench_backend(
    store: MetadataStore, backend: str, round_: int, args: argparse.Namespace
) -> list[Result]:
    results: list[Result] = []
    created: list[int] = []

    def result(op: str, measured: tuple[int, float, list[float]], **extra: int) -> Result:
        ops, seconds, latencies = measured
        return Result(
            backend,
            round_,
            op,
            ops,
            seconds,
            percentile_ms(latencies, 0.5),
            percentile_ms(latencies, 0.99),
            **extra,
        )

    async def create(_task: int) -> None:
        ledger_id = await store.allocate_ledger_id()
        await store.create_ledger(record(ledger_id))
        created.append(ledger_id)

    if "create" in args.op:
        results.append(result("create", await measure(args, create)))
    own = [await store.allocate_ledger_id() for _ in range(args.tasks + 1)]
    for ledger_id in own:
        await store.create_ledger(record(ledger_id))
    created.extend(own)

    async def cas(task: int) -> None:
        current = await store.read_ledger(own[task])
        await store.update_ledger(bumped(current.value), current.version)

    if "cas" in args.op:
        results.append(result("cas", await measure(args, cas)))

    outcomes = {"wins": 0, "conflicts": 0}

    async def contended(_task: int) -> None:
        current = await store.read_ledger(own[-1])
        try:
            await store.update_ledger(bumped(current.value), current.version)
        except MetadataVersionConflict:
            outcomes["conflicts"] += 1
        else:
            outcomes["wins"] += 1

    if "cas-contended" in args.op:
        results.append(result("cas-contended", await measure(args, contended), **outcomes))

    async def read(_task: int) -> None:
        await store.read_ledger(random.choice(created))

    if "read" in args.op:
        results.append(result("read", await measure(args, read)))
    return results


@contextmanager
def backends(args: argparse.Namespace) -> Iterator[list[tuple[str, str]]]:
    """(name, url) of every backend asked for, started and cleaned up here."""
    with ExitStack() as stack:
        chosen: list[tuple[str, str]] = []
        if args.sqlite:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-meta-")))
            chosen.append(("sqlite", f"sqlite:///{folder}/meta.db"))
        if args.zookeeper:
            chosen.append(("zookeeper", stack.enter_context(local_zookeeper())))
        chosen.extend((url, url) for url in args.url)
        yield chosen


class _LocalZooKeeper(Protocol):
    def __enter__(self) -> _LocalZooKeeper: ...
    def __exit__(self, *exc: object) -> None: ...
    def url(self, chroot: str) -> str: ...


@contextmanager
def local_zookeeper() -> Iterator[str]:
    # imported by name: the module may be missing from the build being measured
    try:
        module = importlib.import_module("pora.meta.local_zookeeper")
    except ImportError:
        sys.exit("--zookeeper needs pora.meta.local_zookeeper, which this build lacks")
    start: Callable[[Path], _LocalZooKeeper] = module.LocalZooKeeper
    with (
        tempfile.TemporaryDirectory(prefix="bench-meta-zk-") as folder,
        start(Path(folder)) as server,
    ):
        yield server.url(chroot="/bench")


async def run_all(args: argparse.Namespace, chosen: list[tuple[str, str]]) -> list[Result]:
    results: list[Result] = []
    for round_ in range(args.rounds):
        # alternate the order so each backend runs first as often as the others
        order = chosen if round_ % 2 == 0 else list(reversed(chosen))
        for name, url in order:
            async with open_metadata(url) as store:
                results.extend(await bench_backend(store, name, round_, args))
    return results


def print_table(results: list[Result]) -> None:
    print(
        f"{'backend':<12} {'round':>5} {'op':<14} {'ops/s':>9} {'p50 ms':>8} {'p99 ms':>8}  notes"
    )
    for r in results:
        notes = "" if r.wins is None else f"wins {r.wins}, conflicts {r.conflicts}"
        print(
            f"{r.backend:<12} {r.round:>5} {r.op:<14} {r.ops_per_s:>9.0f} "
            f"{r.p50_ms:>8.2f} {r.p99_ms:>8.2f}  {notes}"
        )


def as_json(result: Result) -> dict[str, Any]:
    document = dataclasses.asdict(result)
    document["ops_per_s"] = result.ops_per_s
    return document


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", action="append", default=[], help="a store URL (repeatable)")
    parser.add_argument("--sqlite", action="store_true", help="a fresh temporary SQLite file")
    parser.add_argument("--zookeeper", action="store_true", help="a local ZooKeeper server")
    parser.add_argument("--tasks", type=int, default=8, help="concurrent tasks (default 8)")
    bound = parser.add_mutually_exclusive_group()
    bound.add_argument("--duration", type=float, help="seconds per operation (default 2)")
    bound.add_argument("--ops", type=int, help="operations per operation kind")
    parser.add_argument("--rounds", type=int, default=1, help="rounds, backends alternating")
    parser.add_argument(
        "--op",
        action="append",
        choices=OPERATIONS,
        help="operations to run (repeatable; default all)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.duration is None and args.ops is None:
        args.duration = 2.0
    args.op = args.op or list(OPERATIONS)
    if not (args.sqlite or args.zookeeper or args.url):
        parser.error("give at least one backend: --sqlite, --zookeeper or --url URL")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with backends(args) as chosen:
        results = trio.run(run_all, args, chosen)
    if args.json:
        print(json.dumps([as_json(r) for r in results], indent=2))
    else:
        print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
