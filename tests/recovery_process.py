"""A ledger recovery in a process of its own, for tests that SIGSTOP and SIGKILL it
part way (tests/test_recovery_processes.py), run with sys.executable:

    python recovery_process.py METADATA_URL LEDGER_ID NODE_TIMEOUT_S

Opens the ledger with recovery (password "pw"): fences it, recovers its tail, closes
it; prints `closed LAST_ENTRY_ID` when done.
"""

from __future__ import annotations

import asyncio
import sys

import pora
from pora.client.replication.config import ClientConfig

PASSWORD = "pw"


async def main(url: str, ledger_id: int, node_timeout_s: float) -> None:
    async with pora.connect(url, ClientConfig(node_timeout_s=node_timeout_s)) as client:
        reader = await client.open_ledger(ledger_id, password=PASSWORD)
        print(f"closed {reader.last_entry_id}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
