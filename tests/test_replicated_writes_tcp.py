"""The whole write path under asyncio, over TCP to real `pora serve` processes (a
`pora cluster`): `pora.connect`, create, appends from many tasks, close, and every
entry read back from its whole write set."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from cluster_process import pora_cluster_process

import pora
from pora.client.replication.core.entry_format import decode_entry
from pora.client.replication.core.quorum import entry_write_set
from pora.meta.records import LedgerState


async def _write_and_check(url: str) -> None:
    async with pora.connect(url) as client:
        ledger = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password="pw"
        )
        ids = await asyncio.gather(*(ledger.append(b"entry %d" % k) for k in range(200)))
        assert sorted(ids) == list(range(200))
        assert await ledger.append_many([b"x", b"y"]) == [200, 201]
        await ledger.close()
        record = ledger.metadata
        assert (record.state, record.last_entry_id) == (LedgerState.CLOSED, 201)
    for entry_id in (0, 57, 199, 201):  # on every member of its write set
        for member in entry_write_set(record, entry_id):
            async with pora.connect_node(member.address) as node:
                data = await node.read_entry(ledger.ledger_id, entry_id)
                entry = decode_entry(ledger.ledger_id, entry_id, data, token=record.token)
                assert entry.payload == (b"y" if entry_id == 201 else b"entry %d" % entry_id)


@pytest.mark.slow  # three `pora serve` processes to start: ~3.5 s
def test_asyncio_writes_over_tcp_to_a_real_cluster(tmp_path: Path) -> None:
    with pora_cluster_process(tmp_path / "cluster", nodes=3) as url:
        asyncio.run(_write_and_check(url))
