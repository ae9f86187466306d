"""The node's ledger garbage collection (pora/server/ledger_gc.py) on an in-process
node and a real SQLite store: the walk of the node's ledgers beside the store's
listing across page boundaries deletes exactly the ledgers the store lacks, spares
those inside the grace, and a store of another cluster deletes nothing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from test_meta_store import ledger

import pora
from pora.meta import open_metadata
from pora.server import ledger_gc
from pora.server.ledger_gc import LedgerCollector, LedgerGcConfig

KEY = b"k" * 20


async def test_the_walk_deletes_exactly_what_the_store_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger_gc, "PAGE_SIZE", 3)  # many pages on both sides
    known = {0, 1, 4, 5, 6, 7, 11, 20, 21}
    async with (
        open_metadata(f"sqlite:///{tmp_path}/meta.db") as store,
        pora.open_node(tmp_path / "node") as node,
    ):
        cluster_id = await store.initialize_cluster()
        for ledger_id in range(25):
            await node.add_entry(ledger_id, 0, b"x" * ledger_id, master_key=KEY)
        for ledger_id in [*sorted(known), 30, 31, 40]:  # the store has more than the node
            await store.create_ledger(ledger(ledger_id))
        collector = LedgerCollector(node, store, cluster_id, LedgerGcConfig(grace_s=0))
        assert await collector.collect() == 25 - len(known)
        assert {info.ledger_id for info in node.ledgers()} == known
        assert collector.statistics.ledgers_deleted == 25 - len(known)
        assert collector.statistics.bytes_deleted == sum(set(range(25)) - known)
        with pytest.raises(pora.LedgerDeleted):  # a tombstone refuses the id for good
            await node.add_entry(2, 1, b"late", master_key=KEY)
        assert await collector.collect() == 0


async def test_the_grace_and_another_cluster_spare_everything(tmp_path: Path) -> None:
    async with (
        open_metadata(f"sqlite:///{tmp_path}/meta.db") as store,
        pora.open_node(tmp_path / "node") as node,
    ):
        cluster_id = await store.initialize_cluster()
        await node.add_entry(7, 0, b"young", master_key=KEY)
        young = LedgerCollector(node, store, cluster_id, LedgerGcConfig(grace_s=3600))
        assert await young.collect() == 0
        # the node's ledgers created a day ago, seen by a store of another cluster
        later = LedgerCollector(
            node, store, "another", LedgerGcConfig(grace_s=0), wall_clock=lambda: 2e10
        )
        assert await later.collect() == 0
        assert later.statistics.passes_skipped == 1
        assert [info.ledger_id for info in node.ledgers()] == [7]


def test_config_refuses_what_would_never_run() -> None:
    for bad in ({"interval_s": 0}, {"deletions_per_s": float("nan")}, {"grace_s": -1}):
        with pytest.raises(ValueError, match="ledger_gc_"):
            replace(LedgerGcConfig(), **bad)
