"""Long polls leave nothing behind, and those on ledgers not on the node are bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

import pora


async def test_long_polls_on_missing_ledgers_leave_no_state(
    data_dir: Path, mock_clock: trio.testing.MockClock
) -> None:
    mock_clock.autojump_threshold = 0  # nothing is written: no sync to wait for
    async with pora.open_node(data_dir, long_polls_unknown_ledgers_max=100) as node:
        arrivals = node._registry.storage.arrivals
        for ledger_id in range(1000, 3000):  # one after the other: each times out
            with pytest.raises(pora.NoSuchLedger):
                await node.read_entry(ledger_id, 0, wait_s=0.001)
        assert len(arrivals) == 0

        refused: list[str] = []
        most = 0

        async def poll(ledger_id: int) -> None:
            try:
                await node.read_entry(ledger_id, 0, wait_s=5)
            except pora.NoSuchLedger as error:
                refused.append(str(error))

        async with trio.open_nursery() as nursery:
            for ledger_id in range(5000, 7000):  # all at once
                nursery.start_soon(poll, ledger_id)
                if ledger_id % 100 == 0:
                    await trio.testing.wait_all_tasks_blocked()
                    most = max(most, len(arrivals))
        assert most <= 100
        assert len(refused) == 2000
        assert sum("long_polls_unknown_ledgers_max" in message for message in refused) == 1900
        assert len(arrivals) == 0


async def test_a_long_poll_waits_for_a_ledger_that_is_yet_to_come(
    data_dir: Path, mock_clock: trio.testing.MockClock
) -> None:
    mock_clock.autojump_threshold = 0.1
    async with pora.open_node(data_dir) as node:
        got: list[bytes] = []

        async def tail() -> None:
            got.append(await node.read_entry(9, 0, wait_s=30))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(tail)
            nursery.start_soon(tail)
            await trio.sleep(5)
            assert got == []
            await node.add_entry(9, 0, b"first")
        assert got == [b"first", b"first"]
        assert len(node._registry.storage.arrivals) == 0
