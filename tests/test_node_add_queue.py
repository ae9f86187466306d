"""`node.add_entry` and `node.add_batch` from many tasks in one scheduler turn: one
journal submission for the turn, each ledger's consecutive adds as one run, and each
caller with its own outcome (pora/node/add_queue.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

import pora
from journal.errors import PoraError
from journal.format import RecordKind
from journal.request import Request
from pora.node.node import Node


def _count_submissions(node: Node) -> list[list[Request]]:
    """Every batch the node hands its journal from now on."""
    batches: list[list[Request]] = []
    journal = node._journal
    submit_nowait = journal.submit_nowait

    def counting(batch: list[Request]) -> None:
        batches.append(batch)
        submit_nowait(batch)

    journal.submit_nowait = counting  # type: ignore[method-assign]
    return batches


async def test_many_tasks_adds_are_one_submission_durable_after_reopen(data_dir: Path) -> None:
    ledgers, per_ledger = 10, 40
    async with pora.open_node(data_dir) as node:
        batches = _count_submissions(node)
        async with trio.open_nursery() as nursery:
            # started in one turn, ledgers interleaved: each ledger's ids in order
            for entry_id in range(per_ledger):
                for ledger_id in range(ledgers):
                    payload = f"{ledger_id}:{entry_id}".encode()
                    nursery.start_soon(node.add_entry, ledger_id, entry_id, payload)
        runs = [r for batch in batches for r in batch if r.kind is RecordKind.ENTRY]
        assert sum(run.count for run in runs) == ledgers * per_ledger
        assert len(batches) <= 3  # one a turn, not one an add
        assert len(runs) <= 3 * ledgers  # each ledger's consecutive adds merged
    async with pora.open_node(data_dir) as node:
        for ledger_id in range(ledgers):
            entries = await node.read_range(ledger_id, 0, per_ledger - 1)
            assert entries == [(i, f"{ledger_id}:{i}".encode()) for i in range(per_ledger)]


async def test_one_failing_entry_of_a_run_fails_only_its_caller(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        await node.add_entry(1, 3, b"stored")
        outcomes: dict[int, PoraError | None] = {}

        async def add(entry_id: int, payload: bytes) -> None:
            try:
                await node.add_entry(1, entry_id, payload)
            except PoraError as error:
                outcomes[entry_id] = error
            else:
                outcomes[entry_id] = None

        async with trio.open_nursery() as nursery:
            for entry_id in range(8):
                nursery.start_soon(add, entry_id, b"other" if entry_id == 3 else b"new")
        assert isinstance(outcomes.pop(3), pora.EntryConflict)
        assert outcomes == dict.fromkeys([0, 1, 2, 4, 5, 6, 7])
        assert await node.read_entry(1, 3) == b"stored"
        assert await node.read_entry(1, 7) == b"new"


async def test_an_argument_error_is_raised_at_the_call_only(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        with pytest.raises(pora.InvalidArgument, match="entry_id"):
            await node.add_entry(1, -1, b"x")
        await node.add_entry(1, 0, b"x")
        assert await node.read_entry(1, 0) == b"x"


@pytest.mark.parametrize("seal", ["fence", "close"])
async def test_a_sealed_ledger_refusal_reaches_every_caller(data_dir: Path, seal: str) -> None:
    refused = pora.LedgerFenced if seal == "fence" else pora.LedgerClosed
    async with pora.open_node(data_dir) as node:
        await node.add_entry(2, 0, b"a")
        if seal == "fence":
            await node.fence_ledger(2)
        else:
            await node.close_ledger(2)
        errors: list[BaseException] = []

        async def add(entry_id: int) -> None:
            with pytest.raises(refused) as caught:
                await node.add_entry(2, entry_id, b"b")
            errors.append(caught.value)

        async with trio.open_nursery() as nursery:
            for entry_id in range(1, 17):
                nursery.start_soon(add, entry_id)
            nursery.start_soon(node.add_entry, 3, 0, b"other ledger")
        assert len(errors) == 16
        assert await node.read_entry(3, 0) == b"other ledger"


async def test_a_caller_cancelled_before_its_call_submits_nothing(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        stored: list[int] = []

        async def add(entry_id: int) -> None:
            await node.add_entry(4, entry_id, b"e")
            stored.append(entry_id)

        async with trio.open_nursery() as nursery:
            for entry_id in range(10):
                nursery.start_soon(add, entry_id)
            with trio.CancelScope() as scope:
                scope.cancel()
                await node.add_entry(4, 10, b"never")
        assert sorted(stored) == list(range(10))
        with pytest.raises(pora.NoSuchEntry):
            await node.read_entry(4, 10)


async def test_a_parked_caller_cancelled_ends_its_wait_and_its_add_goes_on(
    data_dir: Path,
) -> None:
    async with pora.open_node(data_dir) as node:
        cancelled = trio.CancelScope()
        # the turn's batch is held back until after the cancel: otherwise the journal's
        # write thread may finish in the scheduler batch that wakes this task from
        # wait_all_tasks_blocked, and the add completes before the cancel reaches it
        journal = node._journal
        submit_nowait = journal.submit_nowait
        held: list[list[Request]] = []

        def hold(batch: list[Request]) -> None:
            held.append(batch)

        journal.submit_nowait = hold  # type: ignore[method-assign]

        async def add_then_cancelled() -> None:
            with cancelled:
                await node.add_entry(4, 0, b"maybe")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(add_then_cancelled)
            await trio.testing.wait_all_tasks_blocked()
            assert len(held) == 1  # submitted, and parked for its outcome
            cancelled.cancel()
        assert cancelled.cancelled_caught
        journal.submit_nowait = submit_nowait  # type: ignore[method-assign]
        for batch in held:
            submit_nowait(batch)  # the cancelled caller's add goes on
        await node.add_entry(4, 1, b"after")  # journalled after the cancelled one
        assert await node.read_entry(4, 0) == b"maybe"


async def test_add_batch_calls_of_one_turn_share_a_submission(data_dir: Path) -> None:
    async with pora.open_node(data_dir) as node:
        batches = _count_submissions(node)
        results: dict[int, list[PoraError | None]] = {}

        async def add_batch(ledger_id: int) -> None:
            results[ledger_id] = await node.add_batch(ledger_id, [0, 1, 3], [b"a", b"b", b"d"])

        async with trio.open_nursery() as nursery:
            for ledger_id in range(20):
                nursery.start_soon(add_batch, ledger_id)
            nursery.start_soon(node.add_entry, 0, 4, b"e")
        assert results == {ledger_id: [None, None, None] for ledger_id in range(20)}
        assert len(batches) <= 2
        assert await node.read_range(0, 0, 4) == [(0, b"a"), (1, b"b"), (3, b"d"), (4, b"e")]


async def test_a_closed_node_refuses_every_queued_caller(data_dir: Path) -> None:
    errors: list[BaseException] = []
    async with pora.open_node(data_dir) as node:

        async def add(entry_id: int) -> None:
            try:
                await node.add_entry(5, entry_id, b"x")
            except pora.NodeClosed as error:
                errors.append(error)

        async with trio.open_nursery() as nursery:
            for entry_id in range(5):
                nursery.start_soon(add, entry_id)
            node.stop_taking_requests()
    assert len(errors) == 5
