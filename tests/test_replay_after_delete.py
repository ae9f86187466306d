"""A node that crashed after deleting a ledger replays the ledger's older records
(its KEY among them) onto the delete's tombstone: it starts, and the ledger stays
deleted (R26). Found by the simulation (tests/simulation/), whose crashes leave the
journal as a kill does: a KEY record for a deleted ledger was failed and then
completed, and the node's start died on the request asserting it settles once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import pora


async def test_a_crash_after_a_delete_replays_the_ledgers_key_onto_its_tombstone(
    tmp_path: Path,
) -> None:
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    async with pora.open_node(live) as node:
        for entry_id in range(3):
            await node.add_entry(8, entry_id, b"doomed", master_key=b"k")
        await node.delete_ledger(8, master_key=b"k")
        await node._registry.flush_all()  # the tombstone in the index
        await node.add_entry(9, 0, b"kept", master_key=b"k")
        # every write above was synced: a copy now is what a kill would leave, the
        # journal still holding ledger 8's KEY and entries before its DELETE
        shutil.copytree(live, crashed)
    async with pora.open_node(crashed) as node:
        assert [info.ledger_id for info in node.ledgers()] == [9]
        with pytest.raises(pora.LedgerDeleted):
            await node.add_entry(8, 3, b"late", master_key=b"k")
        assert await node.read_entry(9, 0) == b"kept"
