"""Benchmark of the storage engine, in-process: durable adds/s, latency, recovery.

Prints a table (or JSON with --json):

- the raw ceiling of this disk: 1 MiB writes + fdatasync in a loop, and what that
  is worth in 1 KiB entries per second;
- durable 1 KiB adds/s with p50/p99 latency over 1, 100 and 10,000 ledgers, many
  concurrent writers (closed loop: each writer awaits its add, then adds again),
  both one `add_entry` per writer task and pipelined writers (`add_entries`);
- p50/p99 at half the 100-ledger throughput (open loop: adds start on a schedule);
- recovery: replay time and MB/s for a journal of about --recovery-mib MiB of
  --payload entries over --recovery-ledgers ledgers (a node that crashed before
  any flush).

    python scripts/bench_engine.py [--seconds 5] [--writers 512] [--recovery-mib 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import outcome
import trio

import pora
from journal.format import RecordKind
from journal.request import Request
from journal.segment import SegmentWriter
from pora.server.gc_tuning import GC_YOUNG_THRESHOLD_DEFAULT, freeze_and_tune

MIB = 1 << 20


@dataclass
class LoadResult:
    name: str
    ledgers: int
    writers: int
    adds: int
    seconds: float
    adds_per_s: float
    mb_per_s: float
    p50_ms: float
    p99_ms: float
    commits: int
    records_per_commit: float


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[index]


def raw_ceiling(directory: Path, seconds: float) -> float:
    """MB/s of 1 MiB pwrite + fdatasync in a loop on a preallocated file."""
    path = directory / "raw-ceiling.bin"
    size = 256 * MIB
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        block = os.urandom(MIB)
        written = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            os.pwrite(fd, block, written % size)
            os.fdatasync(fd)
            written += MIB
        return written / MIB / (time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()


async def wake_floor(tasks: int, seconds: float) -> float:
    """Wake-ups/s of `tasks` tasks that only park and are woken in bulk by one driver
    (no node work): what one trio process can do at most for one awaited call per
    task, whatever the call costs."""
    parked: list[trio.lowlevel.Task] = []
    wakeups = 0
    stop_at = time.perf_counter() + seconds

    def abort(_raise_cancel: object) -> trio.lowlevel.Abort:
        return trio.lowlevel.Abort.FAILED  # parked until the driver wakes it

    alive = tasks

    async def sleeper() -> None:
        nonlocal wakeups, alive
        while True:
            parked.append(trio.lowlevel.current_task())
            if await trio.lowlevel.wait_task_rescheduled(abort):
                alive -= 1
                return
            wakeups += 1

    async with trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(sleeper)
        started = time.perf_counter()
        stopping = False
        # until every sleeper returned: within a scheduler batch the driver may run
        # before some of the sleepers it woke, which park again after it looked
        while alive:
            await trio.lowlevel.checkpoint()
            woken, parked[:] = list(parked), []
            stopping = time.perf_counter() >= stop_at
            for task in woken:
                trio.lowlevel.reschedule(task, outcome.Value(stopping))
        elapsed = time.perf_counter() - started
    return wakeups / elapsed


async def closed_loop(
    data_dir: Path, ledgers: int, writers: int, seconds: float, payload_bytes: int, batch: int = 1
) -> LoadResult:
    """Each writer awaits its add (or its batch of `batch` adds), then adds again."""
    payload = os.urandom(payload_bytes)
    latencies: list[float] = []
    next_entry = [0] * ledgers
    stop_at = 0.0
    async with pora.open_node(data_dir) as node:
        freeze_and_tune(GC_YOUNG_THRESHOLD_DEFAULT)  # as `pora serve` does once it serves

        async def writer(seed: int) -> None:
            rng = random.Random(seed)
            if batch == 1:  # kept lean: this loop's own cost is part of the figure
                add_entry = node.add_entry
                clock = time.perf_counter
                record = latencies.append
                while (started := clock()) < stop_at:
                    ledger_id = rng.randrange(ledgers)
                    entry_id = next_entry[ledger_id]
                    next_entry[ledger_id] = entry_id + 1
                    await add_entry(ledger_id, entry_id, payload)
                    record(clock() - started)
                return
            while time.perf_counter() < stop_at:
                entries = []
                for _ in range(batch):
                    ledger_id = rng.randrange(ledgers)
                    entries.append((ledger_id, next_entry[ledger_id], payload))
                    next_entry[ledger_id] += 1
                started = time.perf_counter()
                outcomes = await node.add_entries(entries)
                assert not any(outcomes), outcomes
                latencies.extend([time.perf_counter() - started] * batch)

        # warm up: the ledgers exist (worker, entry log file) before the clock runs,
        # so the figure is the steady add rate, not the first-add cost of a ledger
        for start in range(0, ledgers, 1000):
            warm = [(i, 0, payload) for i in range(start, min(ledgers, start + 1000))]
            assert not any(await node.add_entries(warm))
        await node._registry.flush_all()
        next_entry = [1] * ledgers
        commits_before = node.statistics().journal.commits
        started = time.perf_counter()
        stop_at = started + seconds
        async with trio.open_nursery() as nursery:
            for index in range(writers):
                nursery.start_soon(writer, index)
        elapsed = time.perf_counter() - started
        commits = node.statistics().journal.commits - commits_before
    latencies.sort()
    adds = len(latencies)
    style = "add_entry" if batch == 1 else f"add_entries x{batch}"
    return LoadResult(
        name=f"{style}, {ledgers} ledgers",
        ledgers=ledgers,
        writers=writers,
        adds=adds,
        seconds=elapsed,
        adds_per_s=adds / elapsed,
        mb_per_s=adds * payload_bytes / elapsed / MIB,
        p50_ms=percentile(latencies, 0.50) * 1000,
        p99_ms=percentile(latencies, 0.99) * 1000,
        commits=commits,
        records_per_commit=adds / max(1, commits),
    )


async def open_loop(
    data_dir: Path, ledgers: int, rate_per_s: float, seconds: float, payload_bytes: int
) -> LoadResult:
    """Adds start on a fixed schedule; latency counts from the scheduled start."""
    payload = os.urandom(payload_bytes)
    latencies: list[float] = []
    next_entry = [0] * ledgers
    tick_s = 0.001
    per_tick = rate_per_s * tick_s
    rng = random.Random(1)
    async with pora.open_node(data_dir) as node:
        # as in the closed loops: the ledgers exist before the clock runs
        assert not any(await node.add_entries([(i, 0, payload) for i in range(ledgers)]))
        await node._registry.flush_all()
        next_entry = [1] * ledgers
        freeze_and_tune(GC_YOUNG_THRESHOLD_DEFAULT)  # as `pora serve` does once it serves

        async def one_add(ledger_id: int, entry_id: int, scheduled: float) -> None:
            await node.add_entry(ledger_id, entry_id, payload)
            latencies.append(time.perf_counter() - scheduled)

        commits_before = node.statistics().journal.commits
        started = time.perf_counter()
        owed = 0.0
        async with trio.open_nursery() as nursery:
            tick = 0
            while (now := time.perf_counter()) - started < seconds:
                tick += 1
                owed += per_tick
                while owed >= 1.0:
                    owed -= 1.0
                    ledger_id = rng.randrange(ledgers)
                    entry_id = next_entry[ledger_id]
                    next_entry[ledger_id] = entry_id + 1
                    nursery.start_soon(one_add, ledger_id, entry_id, now)
                await trio.sleep(max(0.0, started + tick * tick_s - time.perf_counter()))
        elapsed = time.perf_counter() - started
        commits = node.statistics().journal.commits - commits_before
    latencies.sort()
    adds = len(latencies)
    return LoadResult(
        name=f"open loop {rate_per_s:,.0f}/s, {ledgers} ledgers",
        ledgers=ledgers,
        writers=0,
        adds=adds,
        seconds=elapsed,
        adds_per_s=adds / elapsed,
        mb_per_s=adds * payload_bytes / elapsed / MIB,
        p50_ms=percentile(latencies, 0.50) * 1000,
        p99_ms=percentile(latencies, 0.99) * 1000,
        commits=commits,
        records_per_commit=adds / max(1, commits),
    )


@dataclass
class RecoveryResult:
    journal_mib: float
    records: int
    replay_seconds: float
    replay_mb_per_s: float
    open_seconds: float
    #: the process's CPU (user and system, every thread) over the open
    cpu_seconds: float


def write_journal(journal_dir: Path, target_mib: int, ledgers: int, payload_bytes: int) -> int:
    """Write a journal the way a node would, as if it crashed before any flush."""
    writer = SegmentWriter(journal_dir, segment_bytes=256 * MIB, first_seq=0)
    payload = os.urandom(payload_bytes)
    per_batch = 1024
    records = 0
    next_entry = [0] * ledgers
    rng = random.Random(2)
    while records * payload_bytes < target_mib * MIB:
        batch = []
        for _ in range(per_batch):
            ledger_id = rng.randrange(ledgers)
            batch.append(Request(RecordKind.ENTRY, ledger_id, next_entry[ledger_id], payload))
            next_entry[ledger_id] += 1
        writer.write_batch(batch, records)
        writer.sync()
        records += per_batch
    writer.close()
    return records


async def recovery(
    data_dir: Path, target_mib: int, ledgers: int, payload_bytes: int
) -> RecoveryResult:
    async with pora.open_node(data_dir):
        pass  # lay out the data dir
    records = await trio.to_thread.run_sync(
        write_journal, data_dir / "journal", target_mib, ledgers, payload_bytes
    )
    journal_bytes = sum(p.stat().st_size for p in (data_dir / "journal").iterdir())
    started = time.perf_counter()
    cpu_started = _process_cpu_seconds()
    async with pora.open_node(data_dir) as node:
        opened = time.perf_counter() - started
        cpu_seconds = _process_cpu_seconds() - cpu_started
        report = node.statistics().recovery
    assert report.records_replayed == records, (report.records_replayed, records)
    return RecoveryResult(
        journal_mib=journal_bytes / MIB,
        records=records,
        replay_seconds=report.seconds,
        replay_mb_per_s=report.bytes_scanned / MIB / report.seconds,
        open_seconds=opened,
        cpu_seconds=cpu_seconds,
    )


def _process_cpu_seconds() -> float:
    """User and system CPU of this process so far, all threads."""
    times = os.times()
    return times.user + times.system


def print_table(ceiling_mb_s: float, loads: list[LoadResult], rec: RecoveryResult | None) -> None:
    ceiling_adds = ceiling_mb_s * 1024
    print(
        f"raw ceiling: {ceiling_mb_s:,.0f} MB/s of 1 MiB write+fdatasync"
        f" = {ceiling_adds:,.0f} 1-KiB entries/s"
    )
    print()
    header = (
        f"{'load':<34} {'writers':>7} {'adds/s':>10} {'MB/s':>7} {'p50 ms':>7} "
        f"{'p99 ms':>7} {'rec/commit':>10} {'of ceiling':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in loads:
        print(
            f"{r.name:<34} {r.writers:>7} {r.adds_per_s:>10,.0f} {r.mb_per_s:>7.1f} "
            f"{r.p50_ms:>7.2f} {r.p99_ms:>7.2f} {r.records_per_commit:>10.1f} "
            f"{r.adds_per_s / ceiling_adds:>10.1%}"
        )
    if rec is not None:
        print()
        print(
            f"recovery: {rec.journal_mib:,.0f} MiB journal, {rec.records:,} records: replay "
            f"{rec.replay_seconds:.2f} s = {rec.replay_mb_per_s:,.0f} MB/s "
            f"(open incl. recovery {rec.open_seconds:.2f} s, CPU {rec.cpu_seconds:.2f} s)"
        )


async def run(args: argparse.Namespace, base: Path) -> None:
    ceiling = await trio.to_thread.run_sync(raw_ceiling, base, 2.0)
    loads: list[LoadResult] = []
    for ledgers in args.ledgers:
        data_dir = base / f"closed-{ledgers}"
        loads.append(await closed_loop(data_dir, ledgers, args.writers, args.seconds, args.payload))
    for ledgers in args.ledgers:
        loads.append(
            await closed_loop(
                base / f"batched-{ledgers}",
                ledgers,
                max(1, args.writers // args.batch),
                args.seconds,
                args.payload,
                batch=args.batch,
            )
        )
    hundred = next((r for r in loads if r.ledgers == 100 and r.name.startswith("add_entry,")), None)
    if hundred is not None:
        rate = hundred.adds_per_s / 2
        loads.append(await open_loop(base / "half", 100, rate, args.seconds, args.payload))
    rec = None
    if args.recovery_mib > 0:
        rec = await recovery(
            base / "recovery", args.recovery_mib, args.recovery_ledgers, args.payload
        )
    if args.json:
        print(
            json.dumps(
                {
                    "raw_ceiling_mb_per_s": ceiling,
                    "loads": [asdict(r) for r in loads],
                    "recovery": asdict(rec) if rec else None,
                },
                indent=2,
            )
        )
    else:
        print_table(ceiling, loads, rec)


def main() -> None:
    parser = argparse.ArgumentParser(description="Benchmark the Pora storage engine in-process.")
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="length of each load (default 5)"
    )
    parser.add_argument(
        "--writers", type=int, default=512, help="concurrent writer tasks (default 512)"
    )
    parser.add_argument("--payload", type=int, default=1024, help="payload bytes (default 1024)")
    parser.add_argument(
        "--batch", type=int, default=64, help="adds per add_entries call in the batched runs"
    )
    parser.add_argument(
        "--ledgers", type=int, nargs="+", default=[1, 100, 10_000], help="ledger counts to load"
    )
    parser.add_argument(
        "--recovery-mib",
        type=int,
        default=1024,
        help="journal size for the recovery run; 0 skips it",
    )
    parser.add_argument(
        "--recovery-ledgers",
        type=int,
        default=100,
        help="ledgers the recovery run's journal interleaves (default 100)",
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to put data (default: a temp dir)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="pora-bench-") as tmp:
        trio.run(run, args, Path(tmp))


if __name__ == "__main__":
    main()
