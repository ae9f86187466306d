"""The replicating client's own CPU per append, with nodes that answer at once.

`pora.Client` on a temp SQLite metadata store with three registered addresses whose
channels are stand-ins: every `add_entries` call answers OK after one checkpoint (a
posted call, `post_adds`, from the channel's answering task in a later turn), so
no node process shares the cores and the process's CPU time is the writer path's
(append, the turn, striping, acknowledgements, waking the appending tasks).

Closed loop: 512 tasks over 8 ledgers, each awaiting `--appends` appends one at a
time, as (1) and (2) of scripts/bench_client.py. Open loop (`--rate`): appends
started on a schedule, `--rate` per second spread over 8 E=3 Qw=3 Qa=2 ledgers for
`--duration-s`, each timed from its scheduled start: the low-batch case, where a
turn carries few appends and the per-turn costs dominate. Compare builds by
alternating runs (PYTHONPATH=...). `--metrics`: the client keeps its Prometheus
metrics (`pora.connect(..., metrics=registry)`), to weigh them against a run without.

    python scripts/bench_writer_path.py [--appends 200] [--rate 2000] [--label A] [--metrics]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import trio

from pora.bench.schedule import run_on_schedule
from pora.client.node_channel import NodeChannel
from pora.client.replication.client import connect
from pora.client.replication.writer import LedgerWriter
from pora.meta.backends import open_metadata
from pora.meta.records import NodeRegistration
from pora.server.gc_tuning import GC_YOUNG_THRESHOLD_DEFAULT, freeze_and_tune

if TYPE_CHECKING:  # by name only: the script also runs against builds without them
    from pora.client.node_channel import AddAnswer, AddRequest

TASKS = 512
LEDGERS = 8
#: with --metrics, makes the registry each client keeps its metrics in (none by
#: default, so that the script runs against builds without the option)
METRICS_REGISTRY: list[Callable[[], Any]] = []


def _connect_options() -> dict[str, Any]:
    return {"metrics": METRICS_REGISTRY[0]()} if METRICS_REGISTRY else {}


class _AnsweringChannel:
    """Stands in for a node's channel: every add is stored, at once."""

    async def add_entries(
        self, ledger_id: int, entries: Sequence[tuple[int, bytes]], **options: object
    ) -> list[None]:
        await trio.lowlevel.checkpoint()
        return [None] * len(entries)

    def __init__(self) -> None:
        self._posted: list[tuple[Callable[[Any], object], list[AddAnswer]]] = []
        self._answers_due = trio.Event()

    def post_adds(
        self, requests: Sequence[AddRequest], *, on_answers: Callable[[Any], object], **_: object
    ) -> bool:
        """Answered by `answer_posted` in a later turn, as a connection's reader does."""
        self._posted.append((on_answers, [[None] * len(request.entries) for request in requests]))
        if not self._answers_due.is_set():
            self._answers_due.set()
        return True

    async def answer_posted(self) -> None:
        while True:
            await self._answers_due.wait()
            self._answers_due = trio.Event()
            posted, self._posted = self._posted, []
            for on_answers, answers in posted:
                on_answers(answers)

    async def add_entries_many(
        self, requests: Sequence[AddRequest], **options: object
    ) -> list[AddAnswer]:
        await trio.lowlevel.checkpoint()  # one wait for every ledger's adds, as over TCP
        return [[None] * len(request.entries) for request in requests]

    async def write_lac(self, *arguments: object, **options: object) -> None:
        await trio.lowlevel.checkpoint()

    async def close_ledger(self, *arguments: object, **options: object) -> None:
        await trio.lowlevel.checkpoint()


@asynccontextmanager
async def _open_channel(address: str) -> AsyncIterator[NodeChannel]:
    channel = _AnsweringChannel()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(channel.answer_posted)
        yield cast(NodeChannel, channel)
        nursery.cancel_scope.cancel()


async def cpu_per_append(quorums: tuple[int, int, int], appends: int) -> tuple[float, float]:
    """(CPU us, wall us) per append of TASKS tasks doing `appends` each."""
    with tempfile.TemporaryDirectory(prefix="pora-bench-writer-") as directory:
        url = f"sqlite://{Path(directory) / 'meta.db'}"
        async with open_metadata(url) as store:
            for index in range(3):
                registration = NodeRegistration(f"127.0.0.1:{9001 + index}", f"stand-in-{index}")
                await store.register_node(registration, lease_s=600)
        payload = os.urandom(1024)
        async with connect(
            url, open_channel=_open_channel, rng=random.Random(1), **_connect_options()
        ) as client:
            ledgers = [
                await client.create_ledger(*quorums, password="")  # E, Qw, Qa
                for _ in range(LEDGERS)
            ]

            async def appender(ledger: LedgerWriter) -> None:
                for _ in range(appends):
                    await ledger.append(payload)

            cpu, wall = time.process_time(), time.perf_counter()
            async with trio.open_nursery() as nursery:
                for index in range(TASKS):
                    nursery.start_soon(appender, ledgers[index % LEDGERS])
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            for ledger in ledgers:
                await ledger.close()
    total = TASKS * appends
    return cpu / total * 1e6, wall / total * 1e6


async def schedule_cpu(rate: float, duration_s: float) -> float:
    """CPU us per start of the schedule alone (tasks that only checkpoint): what the
    open loop's figure includes besides the writer (the loop waking per start)."""

    async def nothing(due: float) -> None:
        await trio.lowlevel.checkpoint()

    total = int(rate * duration_s)
    cpu = time.process_time()
    await run_on_schedule(rate, nothing, total=total)
    return (time.process_time() - cpu) / total * 1e6


async def open_loop(rate: float, duration_s: float) -> tuple[float, float, float, float]:
    """(CPU us per append, achieved rate, p50 ms, p99 ms) of appends started `rate`
    per second over LEDGERS E=3 Qw=3 Qa=2 ledgers for `duration_s`."""
    with tempfile.TemporaryDirectory(prefix="pora-bench-writer-") as directory:
        url = f"sqlite://{Path(directory) / 'meta.db'}"
        async with open_metadata(url) as store:
            for index in range(3):
                registration = NodeRegistration(f"127.0.0.1:{9001 + index}", f"stand-in-{index}")
                await store.register_node(registration, lease_s=600)
        payload = os.urandom(1024)
        latencies: list[float] = []
        async with connect(
            url, open_channel=_open_channel, rng=random.Random(1), **_connect_options()
        ) as client:
            ledgers = [await client.create_ledger(3, 3, 2, password="") for _ in range(LEDGERS)]

            count = 0

            async def append(due: float) -> None:
                nonlocal count
                ledger = ledgers[count % LEDGERS]
                count += 1
                await ledger.append(payload)
                latencies.append(time.perf_counter() - due)

            total = int(rate * duration_s)
            cpu, wall = time.process_time(), time.perf_counter()
            await run_on_schedule(rate, append, total=total)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            for ledger in ledgers:
                await ledger.close()
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1e3
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3
    return cpu / total * 1e6, total / wall, p50, p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--appends", type=int, default=200, help="appends per task")
    parser.add_argument("--label", default="", help="a prefix for the output lines")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="open loop: appends per second (0: none)"
    )
    parser.add_argument("--duration-s", type=float, default=3.0, help="open loop: how long")
    parser.add_argument("--open-only", action="store_true", help="skip the closed loops")
    parser.add_argument("--metrics", action="store_true", help="the client keeps its metrics")
    args = parser.parse_args()
    if args.metrics:
        from prometheus_client import CollectorRegistry  # noqa: PLC0415 (only when asked)

        METRICS_REGISTRY.append(CollectorRegistry)
    freeze_and_tune(GC_YOUNG_THRESHOLD_DEFAULT)  # as the benchmarks' load clients do
    if args.rate > 0:
        cpu, achieved, p50, p99 = trio.run(open_loop, args.rate, args.duration_s)
        idle = trio.run(schedule_cpu, args.rate, args.duration_s)
        print(
            f"{args.label} open loop E=3 Qw=3 Qa=2 at {args.rate:.0f}/s: {cpu:.2f} us CPU per "
            f"append ({cpu - idle:.2f} beyond the schedule's own {idle:.2f}), {achieved:.0f}/s "
            f"achieved, p50 {p50:.2f} ms, p99 {p99:.2f} ms",
            flush=True,
        )
    if args.open_only:
        return
    for quorums in ((1, 1, 1), (3, 3, 2)):
        cpu, wall = trio.run(cpu_per_append, quorums, args.appends)
        e, qw, qa = quorums
        print(
            f"{args.label} E={e} Qw={qw} Qa={qa}: {cpu:.2f} us CPU per append ({wall:.2f} us wall)",
            flush=True,
        )


if __name__ == "__main__":
    main()
