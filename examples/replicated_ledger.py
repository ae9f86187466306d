"""Write a replicated ledger to the local cluster and read it back.

    bash scripts/cluster.sh                          # one terminal: 3 nodes
    .venv/bin/python examples/replicated_ledger.py   # another, from the same folder

Pass the metadata URL `pora cluster` printed to use another cluster:
`.venv/bin/python examples/replicated_ledger.py zk://127.0.0.1:2181/pora`.
"""

from __future__ import annotations

import asyncio
import sys

import pora


async def main(url: str) -> None:
    async with pora.connect(url) as client:
        # each entry on 3 nodes; an append returns once 2 of them hold it durably
        ledger = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password="demo"
        )
        nodes = ", ".join(m.address for m in ledger.metadata.ensembles[-1].members)
        print(f"ledger {ledger.ledger_id} on {nodes}")
        for line in (b"hello", b"replicated", b"world"):
            entry_id = await ledger.append(line)
            print(f"appended entry {entry_id}")
        await ledger.close()

        reader = await client.open_ledger(ledger.ledger_id, password="demo")
        async for entry_id, payload in reader.read_entries(0, reader.last_entry_id):
            print(f"read entry {entry_id}: {payload.decode()}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "sqlite:pora-cluster/meta.db"))
