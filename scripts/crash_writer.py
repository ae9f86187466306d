"""A writer process for crash tests: adds entries to many ledgers concurrently, and
reports every acknowledged add on stdout, until it is killed.

Each stdout line is `ack <ledger_id> <entry_id>`, written only after `add_entry`
returned. Payloads are a pure function of (ledger_id, entry_id), so a later run
(or the test) can recompute them, and re-adding an unacknowledged entry after a
crash is an idempotent retry, not a conflict.

    python scripts/crash_writer.py DATA_DIR [--writers N] [--ledgers-per-writer K]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import trio

import pora


def payload_for(ledger_id: int, entry_id: int) -> bytes:
    """Deterministic payload of 0..1999 bytes for (ledger_id, entry_id)."""
    seed = hashlib.blake2b(f"{ledger_id}:{entry_id}".encode(), digest_size=32).digest()
    size = int.from_bytes(seed[:2], "little") % 2000
    return (seed * (size // len(seed) + 1))[:size]


# flush, roll and trim often, so kills land among flushes and trims, not only adds
NODE_OPTIONS: dict[str, Any] = {
    "flush_interval_ms": 200.0,
    "memtable_flush_bytes": 32 * 1024,
    "segment_bytes": 1 << 20,
    "trim_interval_ms": 200.0,
}


async def write_until_killed(data_dir: Path, writers: int, ledgers_per_writer: int) -> None:
    acks: list[str] = []

    async with pora.open_node(data_dir, **NODE_OPTIONS) as node:
        os.write(1, b"ready\n")

        async def report_acks() -> None:
            while True:
                await trio.sleep(0.002)
                if acks:
                    lines = "".join(acks)
                    acks.clear()
                    os.write(1, lines.encode())

        async def writer(index: int) -> None:
            ledgers = [index + writers * k for k in range(ledgers_per_writer)]
            next_entry = {}
            for ledger_id in ledgers:
                try:
                    next_entry[ledger_id] = await node.last_entry_id(ledger_id) + 1
                except pora.NoSuchLedger:
                    next_entry[ledger_id] = 0
            turn = 0
            while True:
                ledger_id = ledgers[turn % len(ledgers)]
                turn += 1
                entry_id = next_entry[ledger_id]
                await node.add_entry(ledger_id, entry_id, payload_for(ledger_id, entry_id))
                next_entry[ledger_id] = entry_id + 1
                acks.append(f"ack {ledger_id} {entry_id}\n")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(report_acks)
            for index in range(writers):
                nursery.start_soon(writer, index)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--writers", type=int, default=32)
    parser.add_argument("--ledgers-per-writer", type=int, default=4)
    args = parser.parse_args()
    try:
        trio.run(write_until_killed, args.data_dir, args.writers, args.ledgers_per_writer)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
