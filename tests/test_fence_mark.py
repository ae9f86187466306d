"""R27's fence rule on a real node and a real SQLite store: a fence is answered only
once the instance's mark is past the record that fenced the ledger; fences of a
fenced ledger whose record the mark covers write nothing; fences that arrive
together share a write; a store that cannot be written fails the fence (OVERLOADED
on the wire) and nothing else, and the next fence tries again."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import trio.testing

import pora
from netio.frames import Status
from netio.status import status_of
from pora.meta.backends import open_metadata
from pora.meta.config import MetadataConfig
from pora.meta.store import MetadataStore
from pora.server.membership import start_mark
from pora.server.metrics import NodeMetrics
from pora.server.node_mark import FenceNotRecorded, NodeMark

#: a store write blocked by a lock fails after about half of this
CALL_TIMEOUT_S = 0.5


@dataclass
class Setup:
    node: pora.Node
    store: MetadataStore
    mark: NodeMark
    meta_path: Path

    async def stored_mark(self) -> int | None:
        return await self.store.node_mark(self.node.data_dir.instance_id)

    def fence_position(self, ledger_id: int) -> int:
        """The journal position the record that fenced the ledger lies below."""
        meta = self.node._registry.metas[ledger_id]
        return meta.fence_seq + 1


@asynccontextmanager
async def node_with_mark(tmp_path: Path) -> AsyncIterator[Setup]:
    meta_path = tmp_path / "meta.db"
    async with open_metadata(
        f"sqlite://{meta_path}", MetadataConfig(call_timeout_s=CALL_TIMEOUT_S)
    ) as store:
        mark = NodeMark(store)
        async with pora.open_node(tmp_path / "data", fence_barrier=mark.cover) as node:
            await start_mark(mark, node, lambda: node.statistics().journal.dispatched_seq)
            yield Setup(node, store, mark, meta_path)


async def append(node: pora.Node, ledger_id: int, count: int) -> None:
    """`count` entries to a ledger this test has not written to yet."""
    for entry_id in range(count):
        await node.add_entry(ledger_id, entry_id, b"entry %d" % entry_id)


async def test_a_fence_waits_for_the_mark_and_a_covered_fence_writes_nothing(
    tmp_path: Path,
) -> None:
    async with node_with_mark(tmp_path) as setup:
        node = setup.node
        await append(node, 1, 5)
        await node.fence_ledger(1)
        position = setup.fence_position(1)
        # answered: the store holds a mark past the fence's record
        stored = await setup.stored_mark()
        assert stored is not None and stored >= position
        assert setup.mark.fence_writes == 1
        # appends move the journal; the recovery's fenced reads (and a second
        # recovery) fence the same ledger again: nothing more to write
        await append(node, 2, 20)
        for _ in range(5):
            await node.fence_ledger(1)
        assert setup.mark.fence_writes == 1
        assert await setup.stored_mark() == stored


async def test_fences_that_arrive_together_share_a_mark_write(tmp_path: Path) -> None:
    async with node_with_mark(tmp_path) as setup:
        node = setup.node
        for ledger_id in range(1, 21):
            await append(node, ledger_id, 2)
        async with trio.open_nursery() as nursery:
            for ledger_id in range(1, 21):
                nursery.start_soon(node.fence_ledger, ledger_id)
        # the first write starts with the first fence; every other one waits for it
        # and shares the next
        assert 1 <= setup.mark.fence_writes <= 2
        stored = await setup.stored_mark()
        assert stored is not None
        assert all(setup.fence_position(i) <= stored for i in range(1, 21))


async def test_a_store_that_cannot_be_written_fails_the_fence_and_nothing_else(
    tmp_path: Path,
) -> None:
    async with node_with_mark(tmp_path) as setup:
        node = setup.node
        await append(node, 1, 3)
        await append(node, 2, 3)
        locker = sqlite3.connect(setup.meta_path, isolation_level=None)
        try:
            locker.execute("BEGIN EXCLUSIVE")  # every write of the store waits, then fails
            outcomes: list[BaseException | None] = []

            async def fence(ledger_id: int) -> None:
                try:
                    await node.fence_ledger(ledger_id)
                except FenceNotRecorded as error:
                    outcomes.append(error)
                else:
                    outcomes.append(None)

            # fences that wait for a failing write fail with it, not one timeout each
            with trio.fail_after(CALL_TIMEOUT_S * 6):
                async with trio.open_nursery() as nursery:
                    for _ in range(4):
                        nursery.start_soon(fence, 1)
                    nursery.start_soon(fence, 2)
                    # appends go on while the fences wait on the store
                    await append(node, 3, 10)
            assert len(outcomes) == 5
            assert all(isinstance(o, FenceNotRecorded) for o in outcomes)
            assert status_of(outcomes[0]) is Status.OVERLOADED  # type: ignore[arg-type]
            assert "metadata store" in str(outcomes[0])
            assert setup.mark.failures >= 1
            # a fenced ledger whose fence is not covered is not answered either
            with pytest.raises(FenceNotRecorded):
                await node.fence_ledger(1)
            assert await node.last_entry_id(3) == 9
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        # the store is back: the next fence writes the mark and is answered
        await node.fence_ledger(1)
        stored = await setup.stored_mark()
        assert stored is not None
        assert stored >= max(setup.fence_position(1), setup.fence_position(2))


def _figures(setup: Setup) -> dict[str, float]:
    """The node's mark metrics as a scrape of `pora serve`'s /metrics renders them."""
    metrics = NodeMetrics(setup.node, setup.node.data_dir.journal_dir, mark=setup.mark)
    figures: dict[str, float] = {}
    for line in metrics.render().decode().splitlines():
        if line.startswith("pora_node_mark"):
            name, value = line.split()
            figures[name] = float(value)
    return figures


async def test_the_mark_its_fence_writes_and_its_failures_are_metrics(tmp_path: Path) -> None:
    async with node_with_mark(tmp_path) as setup:
        await append(setup.node, 1, 3)
        await setup.node.fence_ledger(1)
        figures = _figures(setup)
        assert figures["pora_node_mark"] >= setup.fence_position(1)
        assert figures["pora_node_mark_fence_writes_total"] == 1
        assert figures["pora_node_mark_failures_total"] == 0
        await append(setup.node, 2, 3)
        locker = sqlite3.connect(setup.meta_path, isolation_level=None)
        try:
            locker.execute("BEGIN EXCLUSIVE")
            with pytest.raises(FenceNotRecorded):
                await setup.node.fence_ledger(2)
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert _figures(setup)["pora_node_mark_failures_total"] == 1


async def test_a_fence_before_the_mark_starts_waits_for_the_start(tmp_path: Path) -> None:
    meta_path = tmp_path / "meta.db"
    async with open_metadata(f"sqlite://{meta_path}") as store:
        mark = NodeMark(store)
        at_barrier = trio.Event()

        async def barrier(position: int) -> None:
            at_barrier.set()  # the fence is journalled: only the mark holds it
            await mark.cover(position)

        async with pora.open_node(tmp_path / "data", fence_barrier=barrier) as node:
            await append(node, 1, 3)
            answered = trio.Event()

            async def fence() -> None:
                await node.fence_ledger(1)
                answered.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(fence)
                await at_barrier.wait()
                await trio.testing.wait_all_tasks_blocked()
                assert not answered.is_set()
                await start_mark(mark, node, lambda: node.statistics().journal.dispatched_seq)
            # the start's mark is past the fence's record: no write of its own
            fence_seq = node._registry.metas[1].fence_seq
            stored = await store.node_mark(node.data_dir.instance_id)
            assert stored is not None and stored > fence_seq
            assert mark.fence_writes == 0
