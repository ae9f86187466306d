"""A tour of the storage engine in-process, on ./pora-data (or the dir given).

Writes entries into a few ledgers from many concurrent tasks, reads them back,
closes and fences ledgers, restarts the node, and prints what it holds. Run it
twice: the second run finds the first run's ledgers after recovery.

    python scripts/demo_engine.py [--data-dir ./pora-data]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import trio

import pora


async def demo(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        known = len(node.ledgers())
        first = max((info.ledger_id for info in node.ledgers()), default=-1) + 1
        print(f"node on {node.data_dir.root}: {known} ledgers found after recovery")
        ledgers = range(first, first + 8)
        started = time.perf_counter()

        async def writer(ledger_id: int) -> None:
            for entry_id in range(2000):
                await node.add_entry(ledger_id, entry_id, f"{ledger_id}/{entry_id} ".encode() * 32)

        async with trio.open_nursery() as nursery:
            for ledger_id in ledgers:
                nursery.start_soon(writer, ledger_id)
        elapsed = time.perf_counter() - started
        stats = node.statistics().journal
        print(
            f"added {stats.operations:,} durable entries in {elapsed:.2f}s "
            f"({stats.operations / elapsed:,.0f}/s, {stats.commits:,} group commits)"
        )
        sample = await node.read_entry(first, 1999)
        print(f"read back ledger {first} entry 1999: {sample[:24]!r}...")
        await node.close_ledger(first)
        await node.fence_ledger(first + 1)
    async with pora.open_node(data_dir) as node:
        print(f"\nafter a restart, {len(node.ledgers())} ledgers:")
        print(f"{'ledger':>8} {'state':>7} {'first':>6} {'last':>6} {'entries':>8} {'bytes':>10}")
        for info in node.ledgers()[-8:]:
            print(
                f"{info.ledger_id:>8} {info.state:>7} {info.first_entry_id:>6} "
                f"{info.last_entry_id:>6} {info.entry_count:>8} {info.payload_bytes:>10,}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description="Tour the Pora storage engine in-process.")
    parser.add_argument("--data-dir", type=Path, default=Path("pora-data"))
    args = parser.parse_args()
    trio.run(demo, args.data_dir)


if __name__ == "__main__":
    main()
