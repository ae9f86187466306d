"""Benchmark of re-replication (docs/rereplication.md) on five local `pora serve`
nodes, in one run.

`--mib` MiB of 1 KiB entries (E=3 Qw=3 Qa=2, every ledger with a copy on nodes A and B,
the foreground writer's ledger on neither) are
written, then:

1. `raw copy`: the same entries copied between two nodes through the client, as a
   worker does (range reads of `--batch-entries`, one add call per batch, in turn),
   into scratch ledger ids: the ceiling to judge (2) by (target >= 0.5x).
2. `repair`: node A is SIGKILLed and its data dir deleted; `pora rereplicate` (its
   own process, no throttle) repairs every fragment that named it: MB/s and entries/s.
3. `repair, throttled`: node B is lost the same way and repaired with
   `--bytes-per-s` at a quarter of (2)'s rate.

All along, a foreground writer appends 1 KiB entries on a schedule
(`--foreground-rate` a second) to a ledger of its own; its acknowledgement p99 is
given with no repair running (before (2)), during (2) and during (3).

    python scripts/bench_rereplicate.py [--mib 1024] [--foreground-rate 200]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import trio

import pora
from pora.bench.schedule import run_on_schedule
from pora.cluster_ops.fragments import fragments_of
from pora.cluster_ops.session import cluster_session
from pora.meta.backends import open_metadata
from pora.meta.records import LedgerMetadata

ENTRY_BYTES = 1024
ENTRIES_PER_LEDGER = 50_000
#: a scratch ledger id for the raw copy: far above any the store hands out
SCRATCH_ID_BASE = 1 << 40
SCRATCH_KEY = b"\x00" * 32


@dataclass
class Node:
    process: trio.Process
    address: str
    data_dir: Path


@asynccontextmanager
async def five_nodes(folder: Path, url: str) -> AsyncIterator[list[Node]]:
    nodes: list[Node] = []
    try:
        for index in range(5):
            data_dir, ready = folder / f"node{index}", folder / f"ready{index}.json"
            command = [
                sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(data_dir),
                "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                "--ready-file", str(ready), "--metadata", url,
                "--registration-lease-s", "1", "--log-level", "warning",
            ]  # fmt: skip
            process = await trio.lowlevel.open_process(command, stderr=subprocess.DEVNULL)
            with trio.fail_after(60):
                while not ready.exists():  # noqa: ASYNC110 - another process writes it
                    await trio.sleep(0.05)
            nodes.append(Node(process, json.loads(ready.read_text())["advertise"], data_dir))
        yield nodes
    finally:
        for node in nodes:
            if node.process.returncode is None:
                node.process.send_signal(signal.SIGTERM)
        for node in nodes:
            await node.process.wait()


async def lose(node: Node, url: str) -> None:
    """SIGKILL, data dir deleted, back once the registration is gone."""
    node.process.send_signal(signal.SIGKILL)
    await node.process.wait()
    shutil.rmtree(node.data_dir)
    async with open_metadata(url, create=False) as store:
        while node.address in {n.address for n in await store.list_nodes()}:  # noqa: ASYNC110
            await trio.sleep(0.1)  # the lease runs out in the store: nothing to wait on


async def write_data(url: str, mib: int, on: set[str]) -> list[int]:
    """`mib` MiB of 1 KiB entries in ledgers that each have a copy on every node of
    `on`; their ids."""
    ids = []
    payload = os.urandom(ENTRY_BYTES)
    left = mib * 1024
    async with pora.connect(url) as client:
        while left > 0:
            ledger = await client.create_ledger(3, 3, 2)
            if on <= {m.address for m in ledger.metadata.ensembles[0].members}:
                count = min(left, ENTRIES_PER_LEDGER)
                for start in range(0, count, 1000):
                    await ledger.append_many([payload] * min(1000, count - start))
                left -= count
                ids.append(ledger.ledger_id)
            await ledger.close()
    return ids


async def raw_copy(url: str, ids: list[int], batch: int, scratch_base: int) -> float:
    """(1): every ledger's entries read from one member and added to another live node
    under a scratch id (`scratch_base` + its id), batch by batch in turn. Returns the
    seconds."""
    async with open_metadata(url, create=False) as store:
        ledgers = [(await store.read_ledger(ledger_id)).value for ledger_id in ids]
        addresses = [n.address for n in await store.list_nodes()]
    start = time.perf_counter()
    async with cluster_session(url) as cluster:
        for record in ledgers:
            source = record.ensembles[-1].members[1]
            target = await cluster.channel_for(next(a for a in addresses if a != source.address))
            channel = await cluster.channel_for(source.address)
            for first in range(0, record.last_entry_id + 1, batch):
                last = min(record.last_entry_id, first + batch - 1)
                answer = await channel.read_range(
                    record.ledger_id, first, last, max_entries=batch, max_bytes=64 << 20
                )
                await target.add_entries(
                    scratch_base + record.ledger_id,
                    answer.entries,
                    master_key=SCRATCH_KEY,
                    last_add_confirmed=last,
                    recovery=True,
                )
    return time.perf_counter() - start


@dataclass
class Foreground:
    """The foreground writer's acknowledgement latencies, by phase."""

    phase: str = "idle"
    latencies: dict[str, list[float]] = field(default_factory=dict)
    stop: bool = False
    #: the foreground ledger's nodes: never the lost ones, so its latency shows the
    #: repair's cost, not its own ensemble change's
    members: set[str] = field(default_factory=set)
    started: trio.Event = field(default_factory=trio.Event)

    def p99_ms(self, phase: str) -> float:
        found = sorted(self.latencies.get(phase, []))
        return found[int(len(found) * 0.99)] * 1000 if found else float("nan")


async def foreground(url: str, rate: float, state: Foreground, avoid: set[str]) -> None:
    payload = os.urandom(ENTRY_BYTES)
    async with pora.connect(url) as client:
        ledger = await client.create_ledger(3, 3, 2)
        while avoid & {m.address for m in ledger.metadata.ensembles[0].members}:
            await ledger.close()
            ledger = await client.create_ledger(3, 3, 2)
        state.members = {m.address for m in ledger.metadata.ensembles[0].members}
        state.started.set()

        async def append(due: float) -> None:
            phase = state.phase
            await ledger.append(payload)
            state.latencies.setdefault(phase, []).append(time.perf_counter() - due)

        await run_on_schedule(rate, append, until=lambda: state.stop)
        await ledger.close()


async def repair(url: str, bytes_per_s: float) -> tuple[float, int, int]:
    """`pora rereplicate` in a process of its own, as an operator runs it (in this
    one, its work would share the foreground writer's event loop and set its tail):
    seconds, entries and bytes copied."""
    command = [
        sys.executable, "-m", "pora.cli", "rereplicate", "--metadata", url, "--json",
        "--open-grace-s", "3600", "--bytes-per-s", str(int(bytes_per_s)),
    ]  # fmt: skip
    start = time.perf_counter()
    done = await trio.run_process(command, capture_stdout=True, check=True)
    seconds = time.perf_counter() - start
    summary = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert summary["event"] == "summary", summary
    return seconds, int(summary["entries_copied"]), int(summary["bytes_copied"])


def naming(ledgers: Sequence[LedgerMetadata], address: str) -> int:
    return sum(
        1
        for record in ledgers
        for fragment in fragments_of(record)
        if any(m.address == address for m in fragment.ensemble.members)
    )


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="pora-bench-rerepl-", dir=args.dir) as folder:
        url = f"sqlite:///{folder}/meta.db"
        async with five_nodes(Path(folder), url) as nodes:
            # every data ledger has a copy on both nodes lost, the foreground's on neither
            lost_a, lost_b = nodes[0], nodes[1]
            lost = {lost_a.address, lost_b.address}
            ids = await write_data(url, args.mib, lost)
            entries = args.mib * 1024
            mb = entries * ENTRY_BYTES / 1e6
            # the raw copy before and after the repairs: the load of the machine moves
            raw_before = await raw_copy(url, ids, args.batch_entries, SCRATCH_ID_BASE)
            print(f"raw copy: {mb / raw_before:.1f} MB/s, {entries / raw_before:.0f} entries/s")
            state = Foreground()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(foreground, url, args.foreground_rate, state, lost)
                await state.started.wait()
                await trio.sleep(args.idle_s)
                state.phase = "repair"
                await lose(lost_a, url)
                seconds, copied, nbytes = await repair(url, 0)
                print(
                    f"repair: {nbytes / 1e6 / seconds:.1f} MB/s, {copied / seconds:.0f} entries/s"
                )
                state.phase = "idle after"
                await trio.sleep(1)
                state.phase = "throttled"
                await lose(lost_b, url)
                limit = nbytes / seconds / 4
                t_seconds, t_copied, t_bytes = await repair(url, limit)
                state.stop = True
            raw_after = await raw_copy(url, ids, args.batch_entries, 2 * SCRATCH_ID_BASE)
            raw_s = (raw_before + raw_after) / 2
            load = os.getloadavg()
            result = {
                "mib": args.mib,
                "entries": entries,
                "raw_copy": {
                    "s": [raw_before, raw_after], "mb_s": mb / raw_s, "entries_s": entries / raw_s,
                },
                "repair": {
                    "s": seconds, "entries": copied, "mb_s": nbytes / 1e6 / seconds,
                    "entries_s": copied / seconds,
                    "vs_raw": (nbytes / seconds) / (mb * 1e6 / raw_s),
                },
                "throttled": {
                    "s": t_seconds, "entries": t_copied, "limit_mb_s": limit / 1e6,
                    "mb_s": t_bytes / 1e6 / t_seconds,
                },
                "foreground_p99_ms": {
                    phase: state.p99_ms(phase) for phase in ("idle", "repair", "throttled")
                },
                "foreground_appends": {k: len(v) for k, v in state.latencies.items()},
                "loadavg": load,
            }  # fmt: skip
            print(json.dumps(result, indent=1))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="MiB of 1 KiB entries (1024)")
    parser.add_argument("--batch-entries", type=int, default=1000)
    parser.add_argument("--foreground-rate", type=float, default=200.0)
    parser.add_argument("--idle-s", type=float, default=5.0, help="foreground alone first")
    parser.add_argument("--dir", default=None, help="where the temp cluster goes")
    trio.run(run, parser.parse_args(argv))


if __name__ == "__main__":
    main()
