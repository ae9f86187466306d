"""Benchmark of the replicating client (`pora.Client`) and the per-node client, in one go.

1 KiB payloads throughout; each figure is set beside the baseline it is judged by:

1. `client E1`: `pora.Client`, one `await ledger.append()` per task, 512 tasks over 8
   ledgers with E=Qw=Qa=1, on one `pora serve` registered in a temp SQLite metadata
   store, against `pora bench`'s lean `runs` load (8 connections x 64 adds in flight
   as ADD_RUN frames) on the same node. Target: >= 0.6x.
2. `client E3`: the same load with E=3 Qw=3 Qa=2 on a 3-node `pora cluster`, against
   (1) (target >= 0.33x: three times the work on the same cores), then an open loop
   at half that rate (appends started on a schedule, latency from the schedule):
   p99 target <= 10 ms.
3. `redis WAIT`: Redis Streams on a primary and two replicas (`appendfsync always` on
   all three), 8 connections x 64 XADDs in flight, the XADDs freed by a reply sent
   together and followed by one `WAIT 1 0` that completes them (one replica has
   them; WAIT does not wait for its fsync). Printed as its ratio to (2).
4. `library`: `pora.connect_node().add_entry`, one per task from 512 tasks (8
   connections x 64), against the lean `frames` load (one ADD_ENTRY frame per add)
   on the same node (target >= 0.6x); `node.add_entry` in-process from 800 tasks
   over 100 ledgers against the disk's raw 1 MiB write+fdatasync ceiling measured in
   the same run (scripts/bench_engine.py's; target >= 0.25x), and against the trio
   floor: 800 tasks that only park and are woken in bulk by one driver, no node work
   (`bench_engine.wake_floor`), the most one trio process does of one awaited call
   per task, whatever the call costs.

Rounds alternate (`--rounds`): each round runs every load once, in this order, and
each figure is the median round. `--profile DIR` then runs (1) and (2) once more
under cProfile (the client process only; the nodes are subprocesses) and writes
`client-e1.pstats`, `client-e3.pstats` and a summary of each there. `--only 4` (or
`--only 1 4`, ...) runs just those points; `--open-rates 1000 2000` adds open loops at
those rates to (2), for the latency at each.

    python scripts/bench_client.py [--rounds 3] [--duration-s 5] [--json] [--profile DIR]
                                   [--only N ...] [--open-rates RATE ...]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Final

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_engine  # a sibling script, found through the line above

import pora
from pora.bench.network import (
    RECEIVE_BYTES,
    STARTUP_TIMEOUT_S,
    LoadConfig,
    LoadResult,
    Window,
    free_loopback_port,
    median_result,
    pora_server,
    run_pora_load,
)
from pora.bench.resp import ReplyCounter, encode_command
from pora.bench.schedule import run_on_schedule
from pora.client.replication.writer import LedgerWriter
from pora.server.gc_tuning import GC_YOUNG_THRESHOLD_DEFAULT, freeze_and_tune

TASKS: Final = 512
LEDGERS: Final = 8
ENGINE_TASKS: Final = 800
ENGINE_LEDGERS: Final = 100
#: the node's ledger ids for the raw loads, far above what the metadata store allocates
RAW_LEDGER_BASE: Final = 1 << 40


@dataclass(frozen=True, slots=True)
class Comparison:
    """One figure against its baseline: medians over the rounds."""

    name: str
    measured: LoadResult
    baseline: LoadResult | None
    ratio: float | None
    target: str
    met: bool | None
    rounds: list[float]


# --- the processes ----------------------------------------------------------------------------


@asynccontextmanager
async def registered_node(parent: Path) -> AsyncIterator[tuple[str, str]]:
    """One `pora serve` registered in a fresh SQLite metadata store; yields (the node's
    address, the metadata URL) once the node is registered."""
    with tempfile.TemporaryDirectory(prefix="pora-bench-client-", dir=parent) as directory:
        root = Path(directory)
        url = f"sqlite://{root / 'meta.db'}"
        ready = root / "ready.json"
        command = [
            sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(root / "data"),
            "--listen", "127.0.0.1:0", "--metadata", url, "--ready-file", str(ready),
            "--log-level", "warning",
        ]  # fmt: skip
        process = await trio.lowlevel.open_process(command)
        try:
            with trio.fail_after(STARTUP_TIMEOUT_S):
                while not ready.exists():
                    if process.poll() is not None:
                        raise RuntimeError(f"pora serve exited with {process.returncode}")
                    await trio.sleep(0.05)
                address = str(json.loads(ready.read_text())["listen"])
                await _wait_registered(url, 1)
            yield address, url
        finally:
            await _stop(process)


async def _wait_registered(url: str, nodes: int) -> None:
    from pora.meta.backends import open_metadata  # noqa: PLC0415

    async with open_metadata(url) as store:
        # the store has a watch, but a poll is simpler here and only runs at startup
        while len(await store.list_nodes(writable_only=True)) < nodes:  # noqa: ASYNC110
            await trio.sleep(0.05)


async def _stop(process: trio.Process) -> None:
    process.terminate()
    with trio.move_on_after(30):
        await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()


def _free_port_run(count: int) -> int:
    """A base port B with B+1 .. B+count free on loopback just now."""
    for _ in range(100):
        base = free_loopback_port()
        if base + count > 65535:
            continue
        try:
            for offset in range(1, count + 1):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", base + offset))
        except OSError:
            continue
        return base
    raise RuntimeError(f"found no {count} consecutive free loopback ports")


@asynccontextmanager
async def local_cluster(
    parent: Path, nodes: int, node_options: Sequence[str] = ()
) -> AsyncIterator[str]:
    """`pora cluster --nodes N` as a subprocess on a temp folder, each node given
    `--node-option` of each of `node_options` (NAME=VALUE); yields the metadata URL
    once it says every node is registered."""
    with tempfile.TemporaryDirectory(prefix="pora-bench-cluster-", dir=parent) as directory:
        command = [
            sys.executable, "-m", "pora.cli", "cluster", "--nodes", str(nodes),
            "--dir", directory, "--base-port", str(_free_port_run(nodes)),
            "--node-arg=--log-level=warning",
            *(f"--node-arg=--node-option={option}" for option in node_options),
        ]  # fmt: skip
        process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE)
        assert process.stdout is not None
        url = ""
        try:
            with trio.fail_after(STARTUP_TIMEOUT_S):
                output = b""
                while b"\nready:" not in output and not output.startswith(b"ready:"):
                    chunk = await process.stdout.receive_some(4096)
                    if not chunk:
                        raise RuntimeError(f"pora cluster exited early: {output.decode()}")
                    output += chunk
            for line in output.decode().splitlines():
                if line.startswith("metadata URL: "):
                    url = line.removeprefix("metadata URL: ").strip()
            if not url:
                raise RuntimeError(f"pora cluster printed no metadata URL: {output.decode()}")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_drain, process.stdout)
                yield url
                nursery.cancel_scope.cancel()
        finally:
            await _stop(process)


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    while await stream.receive_some(4096):
        pass


def _redis_process(
    redis_path: str, port: int, directory: Path, *extra: str
) -> subprocess.Popen[bytes]:
    directory.mkdir()
    return subprocess.Popen(
        [
            redis_path, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
            "--appendonly", "yes", "--appendfsync", "always", "--save", "",
            "--daemonize", "no", "--logfile", "", "--loglevel", "warning", *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _redis_call(port: int, *command: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=STARTUP_TIMEOUT_S) as connection:
        connection.sendall(encode_command(list(command)))
        return connection.recv(4096)


@contextmanager
def replicated_redis(redis_path: str, parent: Path) -> Iterator[int]:
    """A Redis primary and two replicas, every one with `appendfsync always`; yields the
    primary's port once both replicas acknowledge a write."""
    with tempfile.TemporaryDirectory(prefix="pora-bench-redis-", dir=parent) as directory:
        root = Path(directory)
        primary = free_loopback_port()
        processes = [_redis_process(redis_path, primary, root / "primary")]
        try:
            for index in range(2):
                processes.append(
                    _redis_process(
                        redis_path,
                        free_loopback_port(),
                        root / f"replica-{index}",
                        "--replicaof",
                        "127.0.0.1",
                        str(primary),
                    )
                )
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while True:
                try:
                    _redis_call(primary, b"SET", b"pora-bench-ready", b"1")
                    if _redis_call(primary, b"WAIT", b"2", b"1000").startswith(b":2"):
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis replicas did not catch up with the primary")
                time.sleep(0.1)
            yield primary
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


# --- the loads --------------------------------------------------------------------------------


async def _ledgers(client: pora.Client, ensemble: int, write: int, ack: int) -> list[LedgerWriter]:
    return [
        await client.create_ledger(ensemble_size=ensemble, write_quorum=write, ack_quorum=ack)
        for _ in range(LEDGERS)
    ]


async def client_closed_loop(
    url: str, quorums: tuple[int, int, int], config: LoadConfig, system: str
) -> LoadResult:
    """TASKS tasks, each awaiting one `append` at a time, on LEDGERS ledgers. The note
    says the client process's CPU per append over the whole load (warm-up included)."""
    payload = os.urandom(config.payload_bytes)
    appended = 0
    async with pora.connect(url) as client:
        ledgers = await _ledgers(client, *quorums)

        async def appender(ledger: LedgerWriter) -> None:
            nonlocal appended
            while not window.finished:
                sent_at = time.perf_counter()
                await ledger.append(payload)
                window.done(sent_at, time.perf_counter())
                appended += 1

        window = Window(config)  # the clock starts once the ledgers exist
        cpu_before = time.process_time()
        async with trio.open_nursery() as nursery:
            for index in range(TASKS):
                nursery.start_soon(appender, ledgers[index % LEDGERS])
        cpu = time.process_time() - cpu_before
        for ledger in ledgers:
            await ledger.close()
    return window.result(system, note=f"client CPU {cpu / max(1, appended) * 1e6:.1f} us/append")


async def client_open_loop(
    url: str, quorums: tuple[int, int, int], config: LoadConfig, rate: float, system: str
) -> LoadResult:
    """Appends started on a schedule at `rate`/s over LEDGERS ledgers (a pool of
    parked workers, woken at most once a millisecond: `pora.bench.schedule`); latency
    runs from the scheduled start, so a late start counts against it."""
    payload = os.urandom(config.payload_bytes)
    async with pora.connect(url) as client:
        ledgers = await _ledgers(client, *quorums)
        window = Window(config)
        count = 0

        async def one(scheduled: float) -> None:
            nonlocal count
            ledger = ledgers[count % LEDGERS]
            count += 1
            await ledger.append(payload)
            window.done(scheduled, time.perf_counter())

        await run_on_schedule(rate, one, until=lambda: window.finished)
        for ledger in ledgers:
            await ledger.close()
    return window.result(system)


async def _redis_wait_connection(port: int, index: int, window: Window, payload: bytes) -> None:
    """`depth` XADDs in flight; the ones a reply frees leave together with one WAIT 1 0
    after them, and complete when that WAIT answers."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    xadd = encode_command([b"XADD", b"pora-bench-%d" % index, b"MAXLEN", b"~", b"100000",
                           b"*", b"d", payload])  # fmt: skip
    wait = encode_command([b"WAIT", b"1", b"0"])
    depth = window.config.depth
    counter = ReplyCounter()
    batches: deque[tuple[float, int]] = deque()  # (sent at, XADDs), each then one WAIT
    replies = 0  # counted and not yet matched to a whole batch

    def send(count: int, now: float) -> bytes:
        batches.append((now, count))
        return xadd * count + wait

    async with stream:
        await stream.send_all(send(depth, time.perf_counter()))
        while batches:
            data = await stream.receive_some(RECEIVE_BYTES)
            if not data:
                raise RuntimeError("redis-server closed the connection")
            replies += counter.feed(data)
            done: list[float] = []
            while batches and replies >= batches[0][1] + 1:
                sent_at, count = batches.popleft()
                replies -= count + 1
                done += [sent_at] * count
            if not done:
                continue
            now = time.perf_counter()
            window.record(now, done)
            if not window.finished:
                await stream.send_all(send(len(done), now))
    window.errors += counter.errors_total
    if counter.errors:
        raise RuntimeError(f"redis-server replied with errors: {counter.errors[-1]}")


async def redis_wait_load(port: int, config: LoadConfig) -> LoadResult:
    payload = os.urandom(config.payload_bytes)
    window = Window(config)
    async with trio.open_nursery() as nursery:
        for index in range(config.connections):
            nursery.start_soon(_redis_wait_connection, port, index, window, payload)
    return window.result("redis XADD + WAIT 1, 2 replicas")


async def engine_load(
    parent: Path, config: LoadConfig
) -> tuple[LoadResult, LoadResult, LoadResult]:
    """(the raw ceiling as 1 KiB adds/s, the trio wake-up floor, in-process
    `node.add_entry`)."""
    with tempfile.TemporaryDirectory(prefix="pora-bench-engine-", dir=parent) as directory:
        root = Path(directory)
        mib_s = await trio.to_thread.run_sync(bench_engine.raw_ceiling, root, config.duration_s)
        wakeups_s = await bench_engine.wake_floor(ENGINE_TASKS, config.duration_s)
        engine = await bench_engine.closed_loop(
            root / "data", ENGINE_LEDGERS, ENGINE_TASKS, config.duration_s, config.payload_bytes
        )
    ceiling = mib_s * 1024 * 1024 / config.payload_bytes
    nan = float("nan")
    raw = LoadResult("raw 1 MiB write+fdatasync", 0, config.duration_s, ceiling,
                     mib_s * 1.048576, nan, nan, nan, 0)  # fmt: skip
    floor = LoadResult(f"trio floor: {ENGINE_TASKS} tasks parked, woken in bulk",
                       int(wakeups_s * config.duration_s), config.duration_s, wakeups_s,
                       0.0, nan, nan, nan, 0)  # fmt: skip
    measured = LoadResult(
        f"node.add_entry in-process, {ENGINE_TASKS} tasks / {ENGINE_LEDGERS} ledgers",
        engine.adds,
        engine.seconds,
        engine.adds_per_s,
        engine.adds_per_s * config.payload_bytes / 1e6,
        engine.p50_ms,
        engine.p99_ms,
        nan,
        0,
    )
    return raw, floor, measured


# --- the run ----------------------------------------------------------------------------------

#: the rounds' key of (2)'s open loop at a rate given by --open-rates
OPEN_AT: Final = "client_e3_at_"

E1: Final = (1, 1, 1)
E3: Final = (3, 3, 2)


@dataclass
class Rounds:
    results: dict[str, list[LoadResult]]

    def add(self, key: str, result: LoadResult) -> None:
        self.results.setdefault(key, []).append(result)


async def one_round(parent: Path, config: LoadConfig, rounds: Rounds, say: Callable[[str], None],
                    redis_path: str | None, points: frozenset[int],
                    open_rates: Sequence[float] = ()) -> None:  # fmt: skip
    lean = replace(config, connections=TASKS // 64, depth=64)
    if 1 in points:
        await _point_1(parent, config, lean, rounds, say)
    if 2 in points:
        await _point_2(parent, config, rounds, say, open_rates)
    if 3 in points and redis_path is not None:
        say("(3) Redis primary + 2 replicas, XADD + WAIT 1")
        with replicated_redis(redis_path, parent) as port:
            rounds.add("redis_wait", await redis_wait_load(port, lean))
    if 4 in points:
        await _point_4(parent, config, lean, rounds, say)


async def _point_1(parent: Path, config: LoadConfig, lean: LoadConfig, rounds: Rounds,
                   say: Callable[[str], None]) -> None:  # fmt: skip
    say("(1) one node with metadata: lean runs, then the client E=Qw=Qa=1")
    async with registered_node(parent) as (address, url):
        rounds.add("runs", await run_pora_load(address, lean, RAW_LEDGER_BASE, load="runs"))
        rounds.add("client_e1", await client_closed_loop(url, E1, config, "client E1, 1 node"))


async def _point_2(parent: Path, config: LoadConfig, rounds: Rounds, say: Callable[[str], None],
                   open_rates: Sequence[float]) -> None:  # fmt: skip
    say("(2) 3-node cluster: the client E=3 Qw=3 Qa=2, closed then open loop at half")
    async with local_cluster(parent, 3) as url:
        closed = await client_closed_loop(url, E3, config, "client E3 Qw3 Qa2, 3 nodes")
        rounds.add("client_e3", closed)
        rate = max(closed.ops_per_s / 2, 100.0)
        rounds.add("client_e3_half", await client_open_loop(
            url, E3, config, rate, f"client E3, open loop at {rate:,.0f}/s"))  # fmt: skip
        for rate in open_rates:
            rounds.add(f"{OPEN_AT}{rate:g}", await client_open_loop(
                url, E3, config, rate, f"client E3, open loop at {rate:,.0f}/s"))  # fmt: skip


async def _point_4(parent: Path, config: LoadConfig, lean: LoadConfig, rounds: Rounds,
                   say: Callable[[str], None]) -> None:  # fmt: skip
    say("(4) one node: lean frames, then connect_node().add_entry per task")
    async with pora_server(parent) as address:
        rounds.add("frames", await run_pora_load(address, lean, RAW_LEDGER_BASE, load="frames"))
        rounds.add("library", await run_pora_load(address, lean, RAW_LEDGER_BASE + 64,
                                                  load="library"))  # fmt: skip
    say("(4) in-process: the raw write+fdatasync ceiling, the trio floor, node.add_entry")
    raw, floor, engine = await engine_load(parent, config)
    rounds.add("raw", raw)
    rounds.add("floor", floor)
    rounds.add("engine", engine)


def compare(rounds: Rounds) -> list[Comparison]:
    def median(key: str) -> LoadResult | None:
        return median_result(rounds.results.get(key, []))

    def row(name: str, key: str, base_key: str | None, target: float | None,
            sign: str = ">=") -> Comparison | None:  # fmt: skip
        measured = median(key)
        if measured is None:
            return None
        baseline = median(base_key) if base_key else None
        ratio = None
        if baseline is not None and baseline.ops_per_s > 0:
            ratio = measured.ops_per_s / baseline.ops_per_s
        met = None
        if target is not None and ratio is not None:
            met = ratio >= target
        text = f"{sign} {target:g}x" if target is not None else ""
        every = [r.ops_per_s for r in rounds.results[key]]
        return Comparison(name, measured, baseline, ratio, text, met, every)

    rows = [
        row("(1) client E1 vs lean runs", "client_e1", "runs", 0.6),
        row("(2) client E3 vs (1)", "client_e3", "client_e1", 0.33),
        row("(2) open loop at half of (2)", "client_e3_half", None, None),
        row("(3) redis WAIT 1 vs (2)", "redis_wait", "client_e3", None),
        row("(4) connect_node add_entry vs frames", "library", "frames", 0.6),
        row("(4) node.add_entry vs raw ceiling", "engine", "raw", 0.25),
        row("(4) trio floor vs raw ceiling", "floor", "raw", None),
        row("(4) node.add_entry vs trio floor", "engine", "floor", None),
    ]
    half = rows[2]
    if half is not None:
        rows[2] = replace(half, target="p99 <= 10 ms", met=half.measured.p99_ms <= 10.0)
    for key in rounds.results:
        if key.startswith(OPEN_AT):
            rate = float(key.removeprefix(OPEN_AT))
            rows.append(row(f"(2) open loop at {rate:,.0f}/s", key, None, None))
    return [r for r in rows if r is not None]


def format_table(comparisons: Sequence[Comparison], rounds: Rounds, note: str) -> str:
    lines = [
        f"{'figure':<38} {'adds/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'baseline':>9} "
        f"{'ratio':>6}  {'target':<13} met",
    ]
    for c in comparisons:
        base = f"{c.baseline.ops_per_s:,.0f}" if c.baseline else ""
        ratio = f"{c.ratio:.2f}x" if c.ratio is not None else ""
        met = {True: "yes", False: "NO", None: ""}[c.met]
        lines.append(
            f"{c.name:<38} {c.measured.ops_per_s:>9,.0f} {c.measured.p50_ms:>7.2f} "
            f"{c.measured.p99_ms:>7.2f} {base:>9} {ratio:>6}  {c.target:<13} {met}"
        )
    lines += ["", "adds/s of every round:"]
    for key, results in rounds.results.items():
        lines.append(f"  {key:<15} " + ", ".join(f"{r.ops_per_s:,.0f}" for r in results))
        notes = [r.note for r in results if r.note.startswith("client CPU")]
        if notes:
            lines.append(f"  {'':<15} " + ", ".join(notes))
    if note:
        lines += ["", note]
    return "\n".join(lines)


async def profile_client(parent: Path, config: LoadConfig, directory: Path,
                         say: Callable[[str], None]) -> None:  # fmt: skip
    """(1) and (2)'s client loads once more under cProfile, the nodes unprofiled."""
    await trio.Path(directory).mkdir(parents=True, exist_ok=True)

    async def profiled(name: str, load: Awaitable[LoadResult]) -> None:
        profiler = cProfile.Profile()
        profiler.enable()
        result = await load
        profiler.disable()
        profiler.dump_stats(directory / f"{name}.pstats")
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(40)
        summary = f"{name}: {result.ops:,} appends, {result.ops_per_s:,.0f}/s profiled\n"
        (directory / f"{name}.txt").write_text(summary + text.getvalue())
        say(f"profile of {name}: {directory / (name + '.txt')}")

    async with registered_node(parent) as (_, url):
        await profiled("client-e1", client_closed_loop(url, E1, config, "client E1"))
    async with local_cluster(parent, 3) as url:
        await profiled("client-e3", client_closed_loop(url, E3, config, "client E3"))


async def run(args: argparse.Namespace) -> None:
    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    freeze_and_tune(GC_YOUNG_THRESHOLD_DEFAULT)  # as `pora serve` and `pora bench` do
    config = LoadConfig(duration_s=args.duration_s, warmup_s=args.warmup_s)
    parent: Path | None = args.dir
    base = parent or Path(tempfile.gettempdir())
    redis_path = shutil.which("redis-server")
    note = "" if redis_path else "redis-server is not on PATH: (3) skipped"
    rounds = Rounds({})
    for index in range(args.rounds):
        say(f"round {index + 1}/{args.rounds}")
        await one_round(base, config, rounds, say, redis_path, frozenset(args.only),
                        args.open_rates)  # fmt: skip
    load = os.getloadavg()
    note = "; ".join(filter(None, [note, f"load average at the end {load[0]:.2f} {load[1]:.2f}"]))
    comparisons = compare(rounds)
    if args.json:
        print(json.dumps({"comparisons": [asdict(c) for c in comparisons],
                          "rounds": {k: [asdict(r) for r in v] for k, v in rounds.results.items()},
                          "note": note}, indent=2))  # fmt: skip
    else:
        print(format_table(comparisons, rounds, note))
    if args.profile:
        await profile_client(base, config, args.profile, say)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="alternated rounds (default 1)")
    parser.add_argument("--duration-s", type=float, default=5.0, help="measured seconds per load")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="warm-up seconds per load")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temp dirs (the disk)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="then profile the client of (1) and (2) into DIR")  # fmt: skip
    parser.add_argument("--only", type=int, nargs="+", choices=[1, 2, 3, 4], default=[1, 2, 3, 4],
                        metavar="N", help="run only these points (default: all)")  # fmt: skip
    parser.add_argument("--open-rates", type=float, nargs="+", default=[], metavar="RATE",
                        help="(2) also: open loops at these appends/s (p99 by rate)")  # fmt: skip
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    trio.run(run, args)


if __name__ == "__main__":
    main()
