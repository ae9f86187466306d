"""Benchmark of streams (`pora.Stream`) on a 3-node local cluster, in one run.

1 KiB payloads, E=3 Qw=3 Qa=2 throughout; each figure beside the baseline it is
judged by:

1. `stream`: `StreamWriter.append` from 512 tasks (one await at a time each) against
   `LedgerWriter.append` from 512 tasks on one ledger, on the same cluster: the
   stream costs at most 10% (target >= 0.9x).
2. `rollover`: the same stream load with a segment rolled every second
   (`segment_age_s_max=1`), its append p99 against (1)'s, which never rolls.
3. `end to end`: appends started on a schedule (an open loop, `pora.bench.schedule`)
   at 1,000/s and at half of (1)'s closed-loop rate, latency from the scheduled
   start to a subscriber (`stream.subscribe`) seeing the entry; against Redis
   Streams at the same rates: XADD to one `redis-server` with `appendfsync always`,
   read by an `XREAD BLOCK` reader on its own connection.

Rounds alternate (`--rounds`): each round runs every load once, in this order, and
each figure is the median round. The cluster and Redis run for the whole benchmark.

    python scripts/bench_streams.py [--rounds 3] [--duration-s 5] [--warmup-s 1]
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_client import local_cluster  # a sibling script, found through the line above

import pora
from pora.bench.network import LoadConfig, LoadResult, Window, median_result, redis_server
from pora.bench.resp import ReplyCounter, encode_command
from pora.bench.schedule import run_on_schedule
from pora.server.gc_tuning import GC_YOUNG_THRESHOLD_DEFAULT, freeze_and_tune

TASKS: Final = 512
E, QW, QA = 3, 3, 2
#: the open loops' fixed rate; the other is half of (1)'s closed-loop rate
FIXED_RATE: Final = 1000.0
#: a payload starts with its index in the load, in decimal, so that a reader knows
#: when it was scheduled
INDEX_DIGITS: Final = 16
#: past the open loop's window, how long a reader may still take to see the last entries
DRAIN_S: Final = 2.0
_REDIS_STREAM: Final = b"pora-bench"
_streams_made = itertools.count()


def indexed_payload(index: int, size: int) -> bytes:
    return f"{index:0{INDEX_DIGITS}d}".encode().ljust(size, b"x")


def payload_index(payload: bytes) -> int:
    return int(payload[:INDEX_DIGITS])


async def _new_stream(client: pora.Client, segment_age_s_max: float = 3600) -> pora.Stream:
    name = f"bench-{os.getpid()}-{next(_streams_made)}"
    return await client.create_stream(
        name,
        ensemble_size=E,
        write_quorum=QW,
        ack_quorum=QA,
        segment_age_s_max=segment_age_s_max,
    )


# --- closed loops ------------------------------------------------------------------------------


async def ledger_closed_loop(url: str, config: LoadConfig) -> LoadResult:
    """TASKS tasks each awaiting one `LedgerWriter.append` at a time, on one ledger."""
    payload = os.urandom(config.payload_bytes)
    async with pora.connect(url) as client:
        ledger = await client.create_ledger(ensemble_size=E, write_quorum=QW, ack_quorum=QA)
        window = Window(config)

        async def appender() -> None:
            while not window.finished:
                sent_at = time.perf_counter()
                await ledger.append(payload)
                window.done(sent_at, time.perf_counter())

        async with trio.open_nursery() as nursery:
            for _ in range(TASKS):
                nursery.start_soon(appender)
        await ledger.close()
        await client.delete_ledger(ledger.ledger_id)
    return window.result("LedgerWriter.append")


async def stream_closed_loop(
    url: str, config: LoadConfig, *, roll_every_s: float | None
) -> LoadResult:
    """TASKS tasks each awaiting one `StreamWriter.append` at a time, on a new stream
    (rolled every `roll_every_s` seconds, or never within the run); the note says
    how many segments the load made."""
    payload = os.urandom(config.payload_bytes)
    async with pora.connect(url) as client:
        stream = await _new_stream(client, roll_every_s or 3600)
        async with stream.open_writer() as writer:
            window = Window(config)

            async def appender() -> None:
                while not window.finished:
                    sent_at = time.perf_counter()
                    await writer.append(payload)
                    window.done(sent_at, time.perf_counter())

            async with trio.open_nursery() as nursery:
                for _ in range(TASKS):
                    nursery.start_soon(appender)
        info = await stream.info()
        segments = len(info.segments) + sum(p.last_seq - p.first_seq + 1 for p in info.pages)
        await client.delete_stream(stream.name)
    system = "stream append" + ("" if roll_every_s is None else f", roll every {roll_every_s:g} s")
    return window.result(system, note=f"{segments} segments")


# --- end to end: an open loop of appends, a subscriber --------------------------------------


async def stream_end_to_end(url: str, config: LoadConfig, rate: float) -> LoadResult:
    """Appends started `rate` times a second; latency from each one's scheduled start
    to the subscriber seeing it."""
    async with pora.connect(url) as client:
        stream = await _new_stream(client)
        scheduled: list[float] = []

        async with stream.open_writer() as writer, trio.open_nursery() as nursery:
            # the window (warm-up first) opens once the writer is open: on a loaded
            # machine opening it can take longer than a short run's whole window
            window = Window(config)

            async def subscriber() -> None:
                async for _position, payload in stream.subscribe():
                    window.done(scheduled[payload_index(payload)], time.perf_counter())

            nursery.start_soon(subscriber)

            async def append(due: float) -> None:
                index = len(scheduled)
                scheduled.append(due)
                await writer.append(indexed_payload(index, config.payload_bytes))

            await run_on_schedule(rate, append, until=lambda: window.finished)
            await trio.sleep(DRAIN_S)  # the subscriber sees the window's last entries
            nursery.cancel_scope.cancel()
        await client.delete_stream(stream.name)
    return window.result(f"stream subscribe at {rate:,.0f}/s")


_ENTRY_ID: Final = re.compile(rb"\r\n([0-9]+-[0-9]+)\r\n")
_INDEX: Final = re.compile(rb"\$%d\r\n([0-9]{%d})" % (1024, INDEX_DIGITS))


async def redis_end_to_end(port: int, config: LoadConfig, rate: float) -> LoadResult:
    """XADDs sent `rate` times a second on one connection (those due together in one
    write; replies only counted), an `XREAD BLOCK` reader on another; latency from
    each XADD's scheduled start to the reader receiving it."""
    if config.payload_bytes != 1024:
        raise ValueError("the Redis reader recognises 1 KiB payloads only")
    window = Window(config)
    scheduled: list[float] = []
    pending = bytearray()
    wanted = trio.Event()
    errors: list[str] = []
    writer_stream = await trio.open_tcp_stream("127.0.0.1", port)
    reader_stream = await trio.open_tcp_stream("127.0.0.1", port)

    async def sender() -> None:
        nonlocal wanted
        while True:
            await wanted.wait()
            wanted = trio.Event()
            data = bytes(pending)
            pending.clear()
            await writer_stream.send_all(data)

    async def replies() -> None:
        counter = ReplyCounter()
        while data := await writer_stream.receive_some(1 << 16):
            counter.feed(data)
            errors.extend(counter.errors)
            counter.errors.clear()

    async def reader() -> None:
        last_id = b"0-0"
        while True:
            await reader_stream.send_all(
                encode_command([b"XREAD", b"BLOCK", b"0", b"STREAMS", _REDIS_STREAM, last_id])
            )
            counter = ReplyCounter()
            reply = bytearray()
            while True:
                data = await reader_stream.receive_some(1 << 16)
                if not data:
                    raise RuntimeError("redis-server closed the reader's connection")
                reply += data
                if counter.feed(data):
                    break
            now = time.perf_counter()
            window.record(now, [scheduled[int(i)] for i in _INDEX.findall(reply)])
            ids = _ENTRY_ID.findall(reply)
            if ids:
                last_id = ids[-1]

    async def xadd(due: float) -> None:
        index = len(scheduled)
        scheduled.append(due)
        payload = indexed_payload(index, config.payload_bytes)
        pending.extend(encode_command([b"XADD", _REDIS_STREAM, b"*", b"p", payload]))
        wanted.set()

    async with writer_stream, reader_stream, trio.open_nursery() as nursery:
        await writer_stream.send_all(encode_command([b"DEL", _REDIS_STREAM]))
        await writer_stream.receive_some(1 << 16)
        for task in (sender, replies, reader):
            nursery.start_soon(task)
        await run_on_schedule(rate, xadd, until=lambda: window.finished)
        await trio.sleep(DRAIN_S)
        nursery.cancel_scope.cancel()
    window.errors = len(errors)
    return window.result(f"redis XADD + XREAD BLOCK at {rate:,.0f}/s")


# --- rounds and the table ------------------------------------------------------------------------


@dataclass
class Rounds:
    results: dict[str, list[LoadResult]] = field(default_factory=dict)

    def add(self, key: str, result: LoadResult) -> None:
        self.results.setdefault(key, []).append(result)

    def median(self, key: str) -> LoadResult | None:
        return median_result(self.results.get(key, []))


async def one_round(
    url: str, redis_port: int | None, config: LoadConfig, rounds: Rounds, say: Callable[[str], None]
) -> None:
    say("  LedgerWriter.append, 512 tasks")
    rounds.add("ledger", await ledger_closed_loop(url, config))
    say("  stream append, 512 tasks")
    stream = await stream_closed_loop(url, config, roll_every_s=None)
    rounds.add("stream", stream)
    say("  stream append, a rollover every second")
    rounds.add("rollover", await stream_closed_loop(url, config, roll_every_s=1.0))
    half = max(1.0, stream.ops_per_s / 2)
    for key, rate in (("fixed", FIXED_RATE), ("half", half)):
        say(f"  end to end at {rate:,.0f}/s")
        rounds.add(f"e2e_stream_{key}", await stream_end_to_end(url, config, rate))
        if redis_port is not None:
            rounds.add(f"e2e_redis_{key}", await redis_end_to_end(redis_port, config, rate))


def format_table(rounds: Rounds, note: str) -> str:
    lines = [
        f"{'figure':<44} {'ops/s':>9} {'p50 ms':>8} {'p99 ms':>8}  {'vs':<30} {'target':<16} met"
    ]

    def line(
        name: str, key: str, versus: str = "", target: str = "", met: bool | None = None
    ) -> None:
        result = rounds.median(key)
        if result is None:
            return
        verdict = {True: "yes", False: "NO", None: ""}[met]
        lines.append(
            f"{name:<44} {result.ops_per_s:>9,.0f} {result.p50_ms:>8.2f} {result.p99_ms:>8.2f}"
            f"  {versus:<30} {target:<16} {verdict}"
        )

    ledger, stream, rollover = (rounds.median(k) for k in ("ledger", "stream", "rollover"))
    line("(1) LedgerWriter.append, 512 tasks", "ledger")
    if ledger is not None and stream is not None and ledger.ops_per_s > 0:
        ratio = stream.ops_per_s / ledger.ops_per_s
        line("(1) stream append, 512 tasks", "stream", f"{ratio:.2f}x of LedgerWriter", ">= 0.90x",
             ratio >= 0.9)  # fmt: skip
    if stream is not None and rollover is not None:
        line("(2) stream append, rollover every 1 s", "rollover",
             f"p99 {rollover.p99_ms / stream.p99_ms:.2f}x of no rollover")  # fmt: skip
    for key, what in (("fixed", f"{FIXED_RATE:,.0f}/s"), ("half", "half of (1)")):
        pora_result, redis = rounds.median(f"e2e_stream_{key}"), rounds.median(f"e2e_redis_{key}")
        versus = ""
        if pora_result is not None and redis is not None:
            versus = f"p99 {pora_result.p99_ms / redis.p99_ms:.2f}x of Redis"
        line(f"(3) stream end to end at {what}", f"e2e_stream_{key}", versus)
        line(f"(3) Redis Streams end to end at {what}", f"e2e_redis_{key}")
    lines += ["", "ops/s of every round:"]
    for key, results in rounds.results.items():
        every = ", ".join(
            f"{r.ops_per_s:,.0f}"
            + (f" ({r.note})" if r.note else "")
            + (f" [{r.errors} errors]" if r.errors else "")
            for r in results
        )
        lines.append(f"  {key:<18} {every}")
    if note:
        lines += ["", note]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> None:
    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    freeze_and_tune(GC_YOUNG_THRESHOLD_DEFAULT)  # as `pora serve` and bench_client do
    config = LoadConfig(duration_s=args.duration_s, warmup_s=args.warmup_s)
    parent = args.dir or Path(tempfile.gettempdir())
    redis_path = shutil.which("redis-server")
    notes = [] if redis_path else ["redis-server is not on PATH: the Redis rows are skipped"]
    rounds = Rounds()
    async with local_cluster(parent, 3) as url:
        if redis_path is None:
            for index in range(args.rounds):
                say(f"round {index + 1}/{args.rounds}")
                await one_round(url, None, config, rounds, say)
        else:
            with redis_server(redis_path, parent) as port:
                for index in range(args.rounds):
                    say(f"round {index + 1}/{args.rounds}")
                    await one_round(url, port, config, rounds, say)
    load = os.getloadavg()
    notes.append(f"{os.cpu_count()} cores; load average at the end {load[0]:.2f} {load[1]:.2f}")
    print(format_table(rounds, "; ".join(notes)))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="alternated rounds (default 1)")
    parser.add_argument("--duration-s", type=float, default=5.0, help="measured seconds per load")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="warm-up seconds per load")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temp dirs (the disk)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.duration_s <= 0 or args.warmup_s < 0:
        parser.error("--duration-s must be above 0 and --warmup-s at least 0")
    trio.run(run, args)


if __name__ == "__main__":
    main()
