"""Latency of a replicated append at open-loop rates, hop by hop, against Redis WAIT 1.

Starts a local 3-node `pora cluster` and a Redis primary with two replicas
(`appendfsync always` on all three), both as `scripts/bench_client.py` does, and
runs an open loop of 1 KiB appends at each rate (`--rates`; `--half-closed` first
measures the closed-loop rate of `bench_client.py`'s point 2 and adds half of it)
on 8 ledgers with E=3 Qw=3 Qa=2.

Pora and Redis are driven and timed alike: one load generator
(`pora.bench.schedule.run_on_schedule`) gives each append its due time from the
rate, a timerfd wakes the generator at that time (an event loop's own sleep wakes up
to a millisecond late), and latency runs from the due time to the append's end, so a
late start counts (no coordinated omission). Each load runs on the event loop
`--backend` names (trio, asyncio, or asyncio on uvloop), in a thread of its own while
this script's trio loop minds the processes. Before each load the script collects
and freezes its heap (`gc.freeze`, as `pora serve` does after start-up): a full
collection walks everything the process holds, and unfrozen, the 30-60 ms it takes
here stops the load's event loop mid-run and sets the p999 of both systems.

Every process traces its part of each append (`pora.tracing`: the nodes through
`PORA_TRACE_FILE`, set for them here, this client by `tracing.enable`); once the
cluster has stopped the script joins the records by (ledger, entry) and by request
id, and prints per rate p50/p99/p999 in ms of the whole append and of each hop, on
the path of the node whose answer made the ack quorum (the second of three):

- `start late`: the due time to the `append` call (the generator's wake-up)
- `client out`: the call until the connection began writing the entry's frame
- `wire in`: from that write until the node read the bytes
- `node queue`: until the journal formed the group holding the entry
- `journal write`: the group's write to the page cache
- `fdatasync`: the group's sync, in its thread
- `sync wait`: the rest until the group is handed over: the thread's wake-up of the
  event loop, and an earlier group's sync still running
- `hand-over+respond`: to the ledger (memtable) and the response encoded
- `wire out`: until this client read the response
- `client resume`: until `append` returned (the other acks, earlier entries, R4)

Then the same rates for Redis: one `XADD` and `WAIT 1 0` per append on a pool of
connections (whole append only). `--rounds` alternates Pora and Redis and reports
each figure's median round.

    python scripts/bench_latency.py [--rates 500 1000] [--half-closed] [--rounds 1]
                                    [--duration-s 5] [--warmup-s 1] [--no-redis] [--json]
                                    [--backend trio|asyncio|uvloop] [--node-option NAME=VALUE]
"""

from __future__ import annotations

import argparse
import bisect
import functools
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import anyio
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_client  # a sibling script, found through the line above

import pora
from pora import tracing
from pora.bench.network import LoadConfig
from pora.bench.resp import ReplyCounter, encode_command
from pora.bench.schedule import run_on_schedule

HOPS: Final = (
    "start late",
    "client out",
    "wire in",
    "node queue",
    "journal write",
    "fdatasync",
    "sync wait",
    "hand-over+respond",
    "wire out",
    "client resume",
)
WHOLE: Final = "whole append"
ACK_QUORUM: Final = 2
#: the record kinds a client writes (the others are a node's)
CLIENT_KINDS: Final = ("cw", "cr")
REDIS_CONNECTIONS: Final = 64
_T = TypeVar("_T")
#: --backend: the event loop the loads run on, as anyio.run's arguments
BACKENDS: Final[dict[str, tuple[str, dict[str, Any]]]] = {
    "trio": ("trio", {}),
    "asyncio": ("asyncio", {}),
    "uvloop": ("asyncio", {"use_uvloop": True}),  # the optional `bench` extra
}


@dataclass(slots=True)
class Append:
    """One traced append, as this client saw it (ns on time.monotonic_ns's clock)."""

    ledger_id: int
    entry_id: int
    scheduled_ns: int
    called_ns: int
    returned_ns: int


@dataclass(slots=True)
class NodeTimes:
    """One node's timestamps of one entry, and the client's of its request there."""

    read_ns: int = 0
    formed_ns: int = 0
    written_ns: int = 0
    handed_over_ns: int = 0
    sync_ns: int = 0
    sent_ns: int = 0
    frame_written_ns: int = 0
    response_read_ns: int = 0

    def complete(self) -> bool:
        return all(getattr(self, name) > 0 for name in self.__slots__)


@dataclass(slots=True)
class Traces:
    """Every process's records, indexed for the join."""

    #: (node port, ledger, entry) -> that node's times of the entry
    entries: dict[tuple[int, int, int], NodeTimes] = field(default_factory=dict)
    #: (ledger, entry) -> the node ports that have it
    nodes_of: dict[tuple[int, int], list[int]] = field(default_factory=lambda: defaultdict(list))


def _runs(fields: Sequence[str]) -> Iterator[tuple[int, int]]:
    """(ledger, entry) of each entry of LEDGER:ENTRY:COUNT fields."""
    for text in fields:
        ledger, entry, count = map(int, text.split(":"))
        for offset in range(count):
            yield ledger, entry + offset


def _read_node(lines: list[list[str]], traces: Traces) -> None:
    """One node process's records: first the adds it read (they give its port)."""
    port = next(int(line[1]) for line in lines if line[0] == "nr")
    mine: dict[tuple[int, int], NodeTimes] = {}
    for line in lines:
        kind = line[0]
        if kind == "nr":
            t = int(line[3])
            for text in line[4:]:
                _request_id, ledger, entry, count = map(int, text.split(":"))
                for offset in range(count):
                    key = (ledger, entry + offset)
                    if key not in mine:
                        mine[key] = NodeTimes(read_ns=t)
        elif kind == "jw":
            for key in _runs(line[3:]):
                times = mine.get(key)
                if times is not None and not times.formed_ns:
                    times.formed_ns, times.written_ns = int(line[1]), int(line[2])
        elif kind == "js":
            for key in _runs(line[3:]):
                times = mine.get(key)
                if times is not None and not times.handed_over_ns:
                    times.handed_over_ns, times.sync_ns = int(line[1]), int(line[2])
        elif kind == "ns":
            for key in _runs(line[2:]):
                times = mine.get(key)
                if times is not None and not times.sent_ns:
                    times.sent_ns = int(line[1])
    for (ledger, entry), times in mine.items():
        traces.entries[(port, ledger, entry)] = times
        traces.nodes_of[(ledger, entry)].append(port)


def _read_client(client: list[list[str]], nodes: list[list[list[str]]], traces: Traces) -> None:
    """The client's writes and reads, set on the entries through the nodes' request ids."""
    written: dict[tuple[int, int], tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
    answered: dict[tuple[int, int, int], int] = {}
    for line in client:
        connection = (int(line[1]), int(line[2]))
        if line[0] == "cw":
            ids, times = written[connection]
            ids.append(int(line[4]))
            times.append(int(line[3]))
        elif line[0] == "cr":
            for text in line[4:]:
                answered.setdefault((*connection, int(text)), int(line[3]))
    for lines in nodes:
        for line in lines:
            if line[0] != "nr":
                continue
            connection = (int(line[1]), int(line[2]))
            ids, times = written.get(connection, ([], []))
            for text in line[4:]:
                request_id, ledger, entry, count = map(int, text.split(":"))
                at = bisect.bisect_left(ids, request_id)
                read = answered.get((*connection, request_id), 0)
                for offset in range(count):
                    node_times = traces.entries.get((connection[0], ledger, entry + offset))
                    if node_times is None:
                        continue
                    if at < len(ids) and not node_times.frame_written_ns:
                        node_times.frame_written_ns = times[at]
                    if read and not node_times.response_read_ns:
                        node_times.response_read_ns = read


def read_traces(prefix: Path) -> Traces:
    """Every trace file of `prefix`: the clients' records (whichever files hold them)
    and each node process's, one node per file."""
    traces = Traces()
    client: list[list[str]] = []
    nodes: list[list[list[str]]] = []
    for path in sorted(prefix.parent.glob(prefix.name + ".*")):
        lines = [line.split() for line in path.read_text().splitlines() if line]
        client += [line for line in lines if line[0] in CLIENT_KINDS]
        node = [line for line in lines if line[0] not in CLIENT_KINDS]
        if any(line[0] == "nr" for line in node):
            nodes.append(node)
            _read_node(node, traces)
    _read_client(client, nodes, traces)
    return traces


def hops_of(
    append: Append, traces: Traces, ack_quorum: int = ACK_QUORUM
) -> dict[str, float] | None:
    """The append's hops in ms on the path of the node that made its ack quorum, or
    None when a record is missing."""
    key = (append.ledger_id, append.entry_id)
    paths = [traces.entries[(port, *key)] for port in traces.nodes_of.get(key, [])]
    paths = sorted((p for p in paths if p.complete()), key=lambda p: p.response_read_ns)
    if len(paths) < ack_quorum:
        return None
    p = paths[ack_quorum - 1]
    marks = [
        ("start late", append.scheduled_ns, append.called_ns),
        ("client out", append.called_ns, p.frame_written_ns),
        ("wire in", p.frame_written_ns, p.read_ns),
        ("node queue", p.read_ns, p.formed_ns),
        ("journal write", p.formed_ns, p.written_ns),
        ("fdatasync", 0, p.sync_ns),
        ("sync wait", p.written_ns + p.sync_ns, p.handed_over_ns),
        ("hand-over+respond", p.handed_over_ns, p.sent_ns),
        ("wire out", p.sent_ns, p.response_read_ns),
        ("client resume", p.response_read_ns, append.returned_ns),
        (WHOLE, append.scheduled_ns, append.returned_ns),
    ]
    return {name: (end - start) / 1e6 for name, start, end in marks}


def percentiles(values: list[float]) -> tuple[float, float, float]:
    if not values:
        return (float("nan"),) * 3
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return at(0.5), at(0.99), at(0.999)


# --- the loads --------------------------------------------------------------------------------


async def pora_open_loop(url: str, rate: float, config: LoadConfig) -> list[Append]:
    """Appends on a schedule at `rate`/s over 8 E3 Qw3 Qa2 ledgers for the warm-up and
    the duration; returns those started after the warm-up."""
    payload = os.urandom(config.payload_bytes)
    perf_to_ns = time.monotonic_ns() - round(time.perf_counter() * 1e9)  # (one clock on Linux)
    appends: list[Append] = []
    async with pora.connect(url) as client:
        ledgers = await bench_client._ledgers(client, *bench_client.E3)
        begin = time.perf_counter()
        measure_from = begin + config.warmup_s
        end = measure_from + config.duration_s
        count = 0

        async def one(scheduled: float) -> None:
            nonlocal count
            ledger = ledgers[count % len(ledgers)]
            count += 1
            called_ns = time.monotonic_ns()
            entry_id = await ledger.append(payload)
            returned_ns = time.monotonic_ns()
            if scheduled >= measure_from:
                appends.append(
                    Append(
                        ledger.ledger_id,
                        entry_id,
                        round(scheduled * 1e9) + perf_to_ns,
                        called_ns,
                        returned_ns,
                    )
                )

        await run_on_schedule(rate, one, until=lambda: time.perf_counter() >= end)
        for ledger in ledgers:
            await ledger.close()
    return appends


async def redis_open_loop(port: int, rate: float, config: LoadConfig) -> list[float]:
    """One XADD and one WAIT 1 0 per append, on a schedule, each on a free connection
    of a pool; the latencies in ms of those started after the warm-up."""
    payload = os.urandom(config.payload_bytes)
    xadd_wait = encode_command(
        [b"XADD", b"pora-latency", b"MAXLEN", b"~", b"100000", b"*", b"d", payload]
    ) + encode_command([b"WAIT", b"1", b"0"])
    send_pool, take_pool = anyio.create_memory_object_stream[anyio.abc.SocketStream](
        REDIS_CONNECTIONS
    )
    streams = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(REDIS_CONNECTIONS)]
    for stream in streams:
        send_pool.send_nowait(stream)
    latencies: list[float] = []
    begin = time.perf_counter()
    measure_from = begin + config.warmup_s
    end = measure_from + config.duration_s

    async def one(scheduled: float) -> None:
        stream = await take_pool.receive()
        counter = ReplyCounter()
        await stream.send(xadd_wait)
        replies = 0
        while replies < 2:
            try:
                data = await stream.receive(65536)
            except anyio.EndOfStream:
                raise RuntimeError("redis-server closed the connection") from None
            replies += counter.feed(data)
        if counter.errors:
            raise RuntimeError(f"redis-server replied with an error: {counter.errors[-1]}")
        if scheduled >= measure_from:
            latencies.append((time.perf_counter() - scheduled) * 1e3)
        send_pool.send_nowait(stream)

    try:
        await run_on_schedule(rate, one, until=lambda: time.perf_counter() >= end)
    finally:
        for stream in streams:
            await stream.aclose()
    return latencies


# --- the run ----------------------------------------------------------------------------------


@dataclass(slots=True)
class RateResult:
    rate: float
    appends: int = 0
    untraced: int = 0
    #: hop -> [(p50, p99, p999) per round]
    pora: dict[str, list[tuple[float, float, float]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    redis: list[tuple[float, float, float]] = field(default_factory=list)


async def on_backend(backend: str, load: Callable[[], Awaitable[_T]]) -> _T:
    """`load()` run to its end on `backend`'s event loop, in a thread of its own."""
    name, options = BACKENDS[backend]
    run_load = functools.partial(anyio.run, load, backend=name, backend_options=options)
    gc.collect()
    gc.freeze()  # (the module docstring says why)
    try:
        return await trio.to_thread.run_sync(run_load)
    finally:
        gc.unfreeze()


async def pora_round(
    parent: Path,
    rates: list[float],
    half_closed: bool,
    config: LoadConfig,
    args: argparse.Namespace,
) -> tuple[list[float], list[list[Append]], Traces]:
    """One cluster, traced: the closed-loop rate first if asked, then each rate."""
    if half_closed:  # measured untraced, on a cluster of its own
        async with bench_client.local_cluster(parent, 3, args.node_option) as url:
            closed = await bench_client.client_closed_loop(url, bench_client.E3, config, "closed")
        rates = [*rates, max(100.0, closed.ops_per_s / 2)]
    with tempfile.TemporaryDirectory(prefix="pora-trace-", dir=parent) as directory:
        prefix = Path(directory) / "trace"
        os.environ[tracing.TRACE_ENV] = str(prefix)  # for the cluster's nodes
        try:
            async with bench_client.local_cluster(parent, 3, args.node_option) as url:
                tracing.enable(str(prefix))
                try:
                    loads = [functools.partial(pora_open_loop, url, r, config) for r in rates]
                    appends = [await on_backend(args.backend, load) for load in loads]
                finally:
                    tracing.disable()
        finally:
            del os.environ[tracing.TRACE_ENV]
        return rates, appends, read_traces(prefix)


async def run(args: argparse.Namespace) -> dict[str, RateResult]:
    config = LoadConfig(duration_s=args.duration_s, warmup_s=args.warmup_s)
    parent = Path(tempfile.gettempdir())
    results: dict[str, RateResult] = {}
    redis_path = None if args.no_redis else shutil.which("redis-server")
    for round_index in range(args.rounds):
        rates, appends_by_rate, traces = await pora_round(
            parent, list(args.rates), args.half_closed, config, args
        )
        for index, (rate, appends) in enumerate(zip(rates, appends_by_rate, strict=True)):
            name = "half closed" if index >= len(args.rates) else f"{rate:g}"
            result = results.setdefault(name, RateResult(rate))
            result.rate = rate
            hops = [hops_of(append, traces) for append in appends]
            traced = [h for h in hops if h is not None]
            result.appends += len(appends)
            result.untraced += len(hops) - len(traced)
            for hop in (WHOLE, *HOPS):
                result.pora[hop].append(percentiles([h[hop] for h in traced]))
        print(f"round {round_index + 1}: pora done", file=sys.stderr)
        if redis_path is not None:
            with bench_client.replicated_redis(redis_path, parent) as port:
                for result in results.values():
                    load = functools.partial(redis_open_loop, port, result.rate, config)
                    latencies = await on_backend(args.backend, load)
                    result.redis.append(percentiles(latencies))
            print(f"round {round_index + 1}: redis done", file=sys.stderr)
    return results


def _median(rounds: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    return (
        statistics.median(r[0] for r in rounds),
        statistics.median(r[1] for r in rounds),
        statistics.median(r[2] for r in rounds),
    )


def format_results(results: dict[str, RateResult], backend: str) -> str:
    lines = [
        f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; the loads on {backend}"
    ]
    for name, result in results.items():
        lines.append(
            f"\n{result.rate:,.0f}/s ({name}): {result.appends} appends, "
            f"{result.untraced} not fully traced; ms p50 / p99 / p999, median round"
        )
        for hop in (WHOLE, *HOPS):
            p50, p99, p999 = _median(result.pora[hop])
            lines.append(f"  {hop:<20} {p50:8.3f} {p99:8.3f} {p999:8.3f}")
        if result.redis:
            p50, p99, p999 = _median(result.redis)
            lines.append(f"  {'redis WAIT 1':<20} {p50:8.3f} {p99:8.3f} {p999:8.3f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Open-loop latency of E3 Qw3 Qa2 appends, hop by hop, against Redis WAIT 1."
    )
    parser.add_argument("--rates", type=float, nargs="*", default=[500.0, 1000.0],
                        metavar="RATE", help="open-loop rates, per s")  # fmt: skip
    parser.add_argument("--half-closed", action="store_true",
                        help="also half the closed-loop rate, measured first")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1, help="rounds (medians reported)")
    parser.add_argument("--duration-s", type=float, default=5.0, help="measured seconds per rate")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="unmeasured seconds first")
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis baseline")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--node-option", action="append", default=[], metavar="NAME=VALUE",
                        help="a node option of every node (repeatable)")  # fmt: skip
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="trio",
                        help="the event loop of the loads (Pora's client and Redis's): "
                        "trio, asyncio, or asyncio on uvloop (pip install uvloop, or the "
                        "bench extra)")  # fmt: skip
    args = parser.parse_args()
    if not args.rates and not args.half_closed:
        parser.error("give --rates, --half-closed or both")
    results = trio.run(run, args)
    if args.json:
        print(
            json.dumps(
                {
                    name: {
                        "rate": r.rate,
                        "appends": r.appends,
                        "untraced": r.untraced,
                        "pora_ms": {hop: _median(v) for hop, v in r.pora.items()},
                        "redis_wait1_ms": _median(r.redis) if r.redis else None,
                    }
                    for name, r in results.items()
                },
                indent=2,
            )
        )
    else:
        print(format_results(results, args.backend))


if __name__ == "__main__":
    main()
