"""`pora bench`: durable 1 KiB adds over loopback, against Redis streams in the same run.

Both systems get the same closed-loop load: `connections` TCP connections, each
keeping `depth` requests in flight (a reply lets the next request go), payloads of
`payload_bytes`. Only requests completing inside the measured window (after the
warm-up) count. Latency is from just before the request is written to the socket
until its reply has been read.

Pora: a `pora serve` subprocess on a fresh temp data dir (or `--connect` to a
running node), loaded in one or more of these ways (`PORA_LOADS`), each with the
same connections, depth and payloads:

- `runs`: the adds free to go on a connection leave as one ADD_RUN frame (a run of
  consecutive entries of the connection's ledger), answered by one response once
  every add of it is durable. The depth is still the adds in flight per connection.
- `frames`: one ADD_ENTRY frame per add, pipelined, answered one by one.
- `library`: `pora.connect_node`'s `add_entry`, one task per add in flight.

Each connection writes its own ledger.

Redis: `redis-server` from PATH on a free loopback port, in a temp dir, with
`--appendonly yes --appendfsync always --save ''` (every write fsynced before the
reply, like a Pora add), loaded with `XADD` through a small pipelined RESP client
on trio sockets (`pora.resp`). Skipped with a message when redis-server is absent.

The load generator shares the machine with the server, so both clients are kept
equally lean: requests encoded once and resent from a buffer, replies counted
in bulk per received chunk (runs of OK add frames by `netio.codec`, runs of
XADD id replies by `pora.resp`), one window update per chunk.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import trio

from pora.bench.resp import ReplyCounter, encode_command
from pora.server.gc_tuning import GC_YOUNG_THRESHOLD_DEFAULT, freeze_and_tune

LATENCY_SAMPLES_MAX: Final = 5_000_000
#: bytes asked of the socket per receive, for both clients. Python's `recv` allocates
#: this much for every call (even one that finds nothing): at 256 KiB that costs
#: more than a whole chunk of replies takes to count (docs/performance.md).
RECEIVE_BYTES: Final = 64 * 1024
STARTUP_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class LoadConfig:
    connections: int = 8
    depth: int = 64
    payload_bytes: int = 1024
    duration_s: float = 5.0
    warmup_s: float = 1.0

    def __post_init__(self) -> None:
        if self.connections < 1 or self.depth < 1:
            raise ValueError("connections and depth must be >= 1")
        if not 0 < self.payload_bytes <= 4 << 20:
            raise ValueError("payload_bytes must be in (0, 4 MiB]")
        if self.duration_s <= 0 or self.warmup_s < 0:
            raise ValueError("duration_s must be > 0 and warmup_s >= 0")


@dataclass(frozen=True, slots=True)
class LoadResult:
    system: str
    ops: int
    seconds: float
    ops_per_s: float
    mb_per_s: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    errors: int
    note: str = ""


class Window:
    """Counts completions and latencies inside [start, end) of the run."""

    def __init__(self, config: LoadConfig) -> None:
        self.config = config
        now = time.perf_counter()
        self.start = now + config.warmup_s
        self.end = self.start + config.duration_s
        self.latencies: list[float] = []
        self.ops = 0
        self.errors = 0

    def done(self, sent_at: float, now: float) -> None:
        """One request sent at `sent_at` completed at `now`."""
        self.record(now, (sent_at,))

    def record(self, now: float, sent_times: Sequence[float]) -> None:
        """Requests sent at `sent_times` all completed at `now` (one received chunk):
        one call per chunk, so the load client's bookkeeping is not per request."""
        if self.start <= now < self.end:
            self.ops += len(sent_times)
            room = LATENCY_SAMPLES_MAX - len(self.latencies)
            if room > 0:
                if len(sent_times) > room:
                    sent_times = sent_times[:room]
                self.latencies.extend(map(now.__sub__, sent_times))

    @property
    def finished(self) -> bool:
        return time.perf_counter() >= self.end

    def result(self, system: str, note: str = "") -> LoadResult:
        seconds = self.config.duration_s
        ordered = sorted(self.latencies)

        def quantile(q: float) -> float:
            if not ordered:
                return math.nan
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0

        rate = self.ops / seconds
        return LoadResult(
            system=system,
            ops=self.ops,
            seconds=seconds,
            ops_per_s=rate,
            mb_per_s=rate * self.config.payload_bytes / 1e6,
            p50_ms=quantile(0.50),
            p99_ms=quantile(0.99),
            p999_ms=quantile(0.999),
            errors=self.errors,
            note=note,
        )


class SendTimes:
    """When the requests still in flight on one connection were sent, oldest first,
    for replies that come back in request order (Redis): runs of (sent_at, count),
    so a batch of requests written at once costs one entry."""

    __slots__ = ("_runs", "outstanding")

    def __init__(self) -> None:
        self._runs: deque[tuple[float, int]] = deque()  # (sent_at, count)
        self.outstanding = 0

    def add(self, sent_at: float, count: int) -> None:
        if count > 0:
            self._runs.append((sent_at, count))
            self.outstanding += count

    def take(self, count: int) -> list[float]:
        """Send times of the `count` oldest requests, which have now completed."""
        if count > self.outstanding:
            raise RuntimeError(f"{count} replies for {self.outstanding} requests in flight")
        self.outstanding -= count
        times: list[float] = []
        runs = self._runs
        while count:
            sent_at, in_run = runs[0]
            if in_run <= count:
                runs.popleft()
                times += [sent_at] * in_run
                count -= in_run
            else:
                runs[0] = (sent_at, in_run - count)
                times += [sent_at] * count
                count = 0
        return times


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# --- Redis ------------------------------------------------------------------------------------


@contextmanager
def redis_server(redis_path: str, parent_dir: Path | None = None) -> Iterator[int]:
    """Run redis-server with durable AOF on a free loopback port, in a temp dir under
    `parent_dir` (the same disk as the node's); yields the port."""
    with tempfile.TemporaryDirectory(prefix="pora-bench-redis-", dir=parent_dir) as directory:
        port = free_loopback_port()
        process = subprocess.Popen(
            [
                redis_path,
                "--port", str(port), "--bind", "127.0.0.1", "--dir", directory,
                "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                "--daemonize", "no", "--protected-mode", "yes", "--logfile", "",
                "--loglevel", "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            _wait_for_port(port, process)
            yield port
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stderr = process.stderr.read().decode() if process.stderr else ""
            raise RuntimeError(f"redis-server exited with {process.returncode}: {stderr}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"redis-server did not listen on port {port}")


async def _redis_connection(port: int, index: int, window: Window, payload: bytes) -> None:
    """One connection keeping `depth` XADDs in flight until the window ends."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    key = b"pora-bench-%d" % index
    command = encode_command([b"XADD", key, b"MAXLEN", b"~", b"100000", b"*", b"d", payload])
    depth = window.config.depth
    # encoded once: the first `n` commands of this are the next `n` requests
    commands = memoryview(command * depth)
    counter = ReplyCounter()
    in_flight = SendTimes()
    async with stream:
        in_flight.add(time.perf_counter(), depth)
        await stream.send_all(commands)
        while in_flight.outstanding:
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                raise RuntimeError("redis-server closed the connection")
            replies = counter.feed(data)
            if not replies:
                continue
            now = time.perf_counter()
            window.record(now, in_flight.take(replies))
            if not window.finished:
                in_flight.add(now, replies)
                await stream.send_all(commands[: replies * len(command)])
    window.errors += counter.errors_total
    if counter.errors:
        raise RuntimeError(f"redis-server replied with errors: {counter.errors[-1]}")


async def run_redis_load(port: int, config: LoadConfig) -> LoadResult:
    payload = os.urandom(config.payload_bytes)
    window = Window(config)
    async with trio.open_nursery() as nursery:
        for index in range(config.connections):
            nursery.start_soon(_redis_connection, port, index, window, payload)
    return window.result("redis XADD (appendfsync always)")


# --- Pora -------------------------------------------------------------------------------------


@asynccontextmanager
async def pora_server(
    parent_dir: Path | None = None, node_options: Sequence[str] = ()
) -> AsyncIterator[str]:
    """Run `pora serve` as a subprocess on a fresh data dir (a temp dir under
    `parent_dir`, removed afterwards); yields its address."""
    with tempfile.TemporaryDirectory(prefix="pora-bench-", dir=parent_dir) as directory:
        root = Path(directory)
        ready = root / "ready.json"
        command = [
            sys.executable, "-m", "pora.cli", "serve",
            "--data-dir", str(root / "data"), "--listen", "127.0.0.1:0",
            "--ready-file", str(ready), "--log-level", "warning",
        ]  # fmt: skip
        for option in node_options:
            command += ["--node-option", option]
        process = await trio.lowlevel.open_process(command)
        try:
            with trio.fail_after(STARTUP_TIMEOUT_S):
                while not ready.exists():
                    if process.poll() is not None:
                        raise RuntimeError(f"pora serve exited with {process.returncode}")
                    await trio.sleep(0.05)
            yield str(json.loads(ready.read_text())["listen"])
        finally:
            process.terminate()
            with trio.move_on_after(30):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


async def _pora_connection(address: str, ledger_id: int, window: Window, payload: bytes) -> None:
    import pora  # noqa: PLC0415

    next_entry = 0

    async with pora.connect_node(address) as client:

        async def writer() -> None:
            nonlocal next_entry
            while not window.finished:
                entry_id = next_entry
                next_entry += 1
                sent_at = time.perf_counter()
                await client.add_entry(ledger_id, entry_id, payload)
                window.done(sent_at, time.perf_counter())

        async with trio.open_nursery() as nursery:
            for _ in range(window.config.depth):
                nursery.start_soon(writer)


async def _pora_raw_connection(
    address: str, ledger_id: int, window: Window, payload: bytes
) -> None:
    """One connection keeping `depth` ADD_ENTRY frames in flight, straight on the codec.

    The same closed loop as the Redis client: frames for every free slot are written
    with one `send_all`; replies may come back in any order and are matched by
    request id. As lean as the Redis side: the frames are encoded once and only
    their ids rewritten (`RepeatedAddFrames`), OK responses come back as bare request
    ids (`AddOutcomeDecoder.next_add_outcomes`), and the window is told once per chunk.
    """
    from netio.bulk import AddOutcomeDecoder, RepeatedAddFrames  # noqa: PLC0415
    from netio.messages import ErrorResponse  # noqa: PLC0415

    host, _, port = address.rpartition(":")
    stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
    decoder = AddOutcomeDecoder()
    add_frames = RepeatedAddFrames(ledger_id, payload, window.config.depth)
    sent_at: dict[int, float] = {}
    next_id = 0
    errors: list[str] = []

    def frames(count: int, now: float) -> memoryview:
        """`count` more adds; request id and entry id are the same counter."""
        nonlocal next_id
        first = next_id
        next_id += count
        sent_at.update(dict.fromkeys(range(first, next_id), now))
        return add_frames.frames(first, first, count)

    async with stream:
        await stream.send_all(frames(window.config.depth, time.perf_counter()))
        while sent_at:
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                raise RuntimeError(f"the node at {address} closed the connection")
            decoder.receive_data(data)
            ok_ids, others = decoder.next_add_outcomes()
            if not ok_ids and not others:
                continue
            now = time.perf_counter()
            try:
                times = list(map(sent_at.pop, ok_ids))
                times += [sent_at.pop(other.request_id) for other in others]
            except KeyError as error:
                raise RuntimeError(
                    f"the node at {address} answered request {error}, which is not in flight"
                ) from None
            window.record(now, times)
            for other in others:
                window.errors += 1
                errors.append(
                    other.message
                    if isinstance(other, ErrorResponse)
                    else f"an add got a {type(other).__name__}"
                )
            if not window.finished:
                await stream.send_all(frames(len(times), now))
    if errors:
        raise RuntimeError(f"{len(errors)} adds failed; the last: {errors[-1]}")


async def _pora_run_connection(
    address: str, ledger_id: int, window: Window, payload: bytes
) -> None:
    """One connection keeping `depth` adds in flight as ADD_RUN frames, on the codec.

    The closed loop of `_pora_raw_connection`, but the adds free to go after a chunk
    of replies leave as one run (split only past RUN_ENTRIES_MAX), and each reply
    completes a whole run: every add of it was sent at the same time and is durable.
    """
    from netio.bulk import AddOutcomeDecoder, RepeatedRunFrames  # noqa: PLC0415
    from netio.frames import RUN_ENTRIES_MAX  # noqa: PLC0415
    from netio.messages import AddRunResponse, ErrorResponse  # noqa: PLC0415

    host, _, port = address.rpartition(":")
    stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
    decoder = AddOutcomeDecoder()
    run_frames = RepeatedRunFrames(ledger_id, payload, min(window.config.depth, RUN_ENTRIES_MAX))
    #: request id -> (sent at, adds in the run)
    in_flight: dict[int, tuple[float, int]] = {}
    next_id = next_entry = 0
    errors: list[str] = []

    def frames(count: int, now: float) -> bytes | bytearray:
        nonlocal next_id, next_entry
        parts: list[bytes | bytearray] = []
        while count:
            size = min(count, run_frames.capacity)
            # (a copy only when a frame of the same size may follow in this call)
            frame = run_frames.frame(next_id, next_entry, size)
            parts.append(frame if count == size else bytes(frame))
            in_flight[next_id] = (now, size)
            next_id += 1
            next_entry += size
            count -= size
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async with stream:
        await stream.send_all(frames(window.config.depth, time.perf_counter()))
        while in_flight:
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                raise RuntimeError(f"the node at {address} closed the connection")
            decoder.receive_data(data)
            responses = decoder.next_responses()
            if not responses:
                continue
            now = time.perf_counter()
            times: list[float] = []
            for response in responses:
                entry = in_flight.pop(response.request_id, None)
                if entry is None:
                    raise RuntimeError(
                        f"the node at {address} answered request {response.request_id}, "
                        "which is not in flight"
                    )
                sent_at, count = entry
                times += [sent_at] * count
                if isinstance(response, AddRunResponse) and not response.failures:
                    continue
                window.errors += count
                errors.append(
                    response.message
                    if isinstance(response, ErrorResponse)
                    else f"a run got {response!r}"
                )
            window.record(now, times)
            if not window.finished:
                await stream.send_all(frames(len(times), now))
    if errors:
        raise RuntimeError(f"{len(errors)} runs failed; the last: {errors[-1]}")


#: the ways `pora bench` can load a node: name -> (connection task, system name)
PORA_LOADS: Final = {
    "runs": (_pora_run_connection, "pora ADD_RUN, runs of the adds free to go"),
    "frames": (_pora_raw_connection, "pora ADD_ENTRY, one frame per add"),
    "library": (_pora_connection, "pora connect_node().add_entry"),
}


async def run_pora_load(
    address: str, config: LoadConfig, ledger_base: int, *, load: str = "runs"
) -> LoadResult:
    payload = os.urandom(config.payload_bytes)
    window = Window(config)
    connection, system = PORA_LOADS[load]
    async with trio.open_nursery() as nursery:
        for index in range(config.connections):
            nursery.start_soon(connection, address, ledger_base + index, window, payload)
    return window.result(system)


# --- the run ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SystemReport:
    """One system's rounds, and the median one."""

    #: a PORA_LOADS name, or "redis"
    load: str
    #: the round with the median adds/s
    median: LoadResult
    #: every round, in the order they ran
    rounds: list[LoadResult]
    #: median adds/s over Redis's median (Pora loads, when Redis ran)
    ratio: float | None = None


@dataclass(frozen=True, slots=True)
class BenchReport:
    config: LoadConfig
    #: one per Pora load, in the order asked
    pora: list[SystemReport]
    redis: SystemReport | None
    redis_skipped: str

    def as_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def median_result(results: Sequence[LoadResult]) -> LoadResult | None:
    """The round with the median adds/s (the lower middle one for an even count)."""
    if not results:
        return None
    ordered = sorted(results, key=lambda r: r.ops_per_s)
    return ordered[(len(ordered) - 1) // 2]


async def run_bench(
    config: LoadConfig,
    *,
    connect: str | None = None,
    redis: bool = True,
    pora_loads: Sequence[str] = ("runs", "frames"),
    parent_dir: Path | None = None,
    node_options: Sequence[str] = (),
    rounds: int = 1,
    say: Callable[[str], None] = print,
) -> BenchReport:
    """Run `rounds` rounds, each every Pora load (a fresh node each) then Redis, so
    all see the same machine conditions over time; report each one's median round."""
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    unknown = [load for load in pora_loads if load not in PORA_LOADS]
    if unknown:
        raise ValueError(f"unknown Pora load {unknown[0]!r}; choose from {', '.join(PORA_LOADS)}")
    # as `pora serve` does (gc_tuning.py): the load generator shares the CPU with the
    # server it measures, so it spends as little as it can on collections
    freeze_and_tune(GC_YOUNG_THRESHOLD_DEFAULT)
    ledger_base = int.from_bytes(os.urandom(5), "big") << 8 if connect else 1
    redis_path = shutil.which("redis-server")
    skipped = ""
    if not redis:
        skipped = "Redis run not requested (--no-redis)"
    elif redis_path is None:
        skipped = (
            "redis-server is not on PATH: Redis comparison skipped "
            "(install it, e.g. `apt-get install redis-server`)"
        )
    pora_rounds: dict[str, list[LoadResult]] = {load: [] for load in pora_loads}
    redis_rounds: list[LoadResult] = []
    for round_index in range(rounds):
        prefix = f"round {round_index + 1}/{rounds}: " if rounds > 1 else ""
        for load_index, load in enumerate(pora_loads):
            base = ledger_base + (round_index * len(pora_loads) + load_index) * config.connections
            if connect:
                say(f"{prefix}pora ({load}): loading the node at {connect}")
                pora_rounds[load].append(await run_pora_load(connect, config, base, load=load))
                continue
            say(f"{prefix}pora ({load}): starting `pora serve` on a temp data dir")
            async with pora_server(parent_dir, node_options) as address:
                say(f"{prefix}pora ({load}): loading {address}")
                pora_rounds[load].append(await run_pora_load(address, config, base, load=load))
        if redis and redis_path is not None:
            say(f"{prefix}redis: starting {redis_path} (appendonly yes, appendfsync always)")
            with redis_server(redis_path, parent_dir) as port:
                redis_rounds.append(await run_redis_load(port, config))
    redis_median = median_result(redis_rounds)
    redis_report = None
    if redis_median is not None:
        redis_report = SystemReport("redis", redis_median, redis_rounds)
    reports = []
    for load, results in pora_rounds.items():
        median = median_result(results)
        assert median is not None
        ratio = None
        if redis_median is not None and redis_median.ops_per_s > 0:
            ratio = median.ops_per_s / redis_median.ops_per_s
        reports.append(SystemReport(load, median, results, ratio))
    return BenchReport(config, reports, redis_report, skipped)


def format_table(report: BenchReport) -> str:
    config = report.config
    lines = [
        f"{config.connections} connections x depth {config.depth} (adds in flight per "
        f"connection), {config.payload_bytes}-byte payloads, {config.duration_s:g}s measured "
        f"after {config.warmup_s:g}s warm-up; every add acknowledged only once durable",
        "",
        f"{'system':<46} {'adds/s':>10} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'p999 ms':>8} {'errors':>7} {'vs redis':>9}",
    ]
    systems = [*report.pora, *([report.redis] if report.redis else [])]
    for system in systems:
        result = system.median
        ratio = f"{system.ratio:.2f}x" if system.ratio is not None else ""
        lines.append(
            f"{result.system:<46} {result.ops_per_s:>10,.0f} {result.mb_per_s:>8.1f} "
            f"{result.p50_ms:>8.2f} {result.p99_ms:>8.2f} {result.p999_ms:>8.2f} "
            f"{result.errors:>7} {ratio:>9}"
        )
    if any(len(system.rounds) > 1 for system in systems):
        lines.append("")
        lines.append("(the median round of each; adds/s of every round:")
        for system in systems:
            lines.append(
                f"  {system.load}: " + ", ".join(f"{r.ops_per_s:,.0f}" for r in system.rounds)
            )
        lines.append(")")
    if report.redis_skipped:
        lines.append("")
        lines.append(report.redis_skipped)
    return "\n".join(lines)
