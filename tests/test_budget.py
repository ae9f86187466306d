"""The budget behind the client's pending bounds and the server's read limits: in
line, never over, nothing lost, on either event loop."""

from __future__ import annotations

import anyio
import pytest
import trio
import trio.testing

import pora
from netio.budget import Budget, BudgetPair


async def test_reservations_wait_in_line_and_never_pass_the_limit() -> None:
    budget = Budget(100, "test", trio.Event)
    order: list[int] = []

    async def take(name: int, size: int) -> None:
        await budget.take(size)
        order.append(name)
        assert budget.used <= 100

    await budget.take(90)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(take, 1, 50)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(take, 2, 5)  # would fit, but waits behind the first
        await trio.testing.wait_all_tasks_blocked()
        assert order == [] and budget.waiting == 2
        budget.give(90)
    assert sorted(order) == [1, 2] and budget.used == 55


async def test_one_reservation_larger_than_the_limit_passes_alone() -> None:
    budget = Budget(10, "test", trio.Event)
    await budget.take(1000)
    assert budget.used == 1000
    with trio.move_on_after(0.01):
        await budget.take(1)
        pytest.fail("a second reservation passed a budget over its limit")
    budget.give(1000)
    await budget.take(1)
    assert budget.used == 1 and budget.waiting == 0


async def test_a_cancelled_waiter_leaves_nothing_behind() -> None:
    budget = Budget(10, "test", trio.Event)
    await budget.take(10)
    with trio.move_on_after(0.01):
        await budget.take(5)
    assert budget.waiting == 0
    budget.give(10)
    assert budget.used == 0


async def test_budget_hands_room_out_in_order_and_takes_back_a_cancelled_wait() -> None:
    budget = Budget(10, "test", anyio.Event)
    assert budget.try_take(8)
    assert not budget.try_take(3)
    order: list[str] = []

    async def take(name: str, amount: int) -> None:
        await budget.take(amount)
        order.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take, "first", 5)
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as scope:
            scope.cancel()
            await budget.take(1)  # cancelled while waiting: takes nothing
        nursery.start_soon(take, "second", 1)
        await trio.testing.wait_all_tasks_blocked()
        assert order == []  # "second" would fit but queues behind "first"
        budget.give(3)
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["first"]  # 10 taken: "second" waits on
        budget.give(5)
    assert order == ["first", "second"]
    assert budget.used == 6
    assert budget.try_take(100) is False
    budget.give(6)
    assert budget.try_take(100)  # over the limit, but alone: never stuck


async def test_a_limit_under_one_is_refused_with_a_typed_error() -> None:
    await trio.lowlevel.checkpoint()
    with pytest.raises(pora.InvalidArgument, match="pending bytes: the limit must be at least 1"):
        Budget(0, "pending bytes", trio.Event)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_takers_wait_in_line_on_any_event_loop(backend: str) -> None:
    """The budget waits on the event type it is given, so it serves both loops."""

    async def main() -> list[str]:
        budget = Budget(10, "test", anyio.Event)
        order: list[str] = []

        async def take(name: str, amount: int) -> None:
            await budget.take(amount)
            order.append(name)

        assert budget.try_take(10)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(take, "first", 8)
            await anyio.wait_all_tasks_blocked()
            tasks.start_soon(take, "second", 2)
            await anyio.wait_all_tasks_blocked()
            assert budget.waiting == 2
            budget.give(8)  # room for the first, none left for the second
            await anyio.wait_all_tasks_blocked()
            assert (order, budget.waiting) == (["first"], 1)
            budget.give(8)
        assert budget.used == 4
        return order

    assert anyio.run(main, backend=backend) == ["first", "second"]


async def test_a_pair_grants_both_amounts_together_in_line() -> None:
    """The client's room: a count and its bytes, taken and given in one call; a
    taker waits for both and holds neither meanwhile; a later, smaller taker
    does not pass it."""
    pair = BudgetPair(4, "inflight_max", 100, "inflight_bytes_max", trio.Event)
    assert pair.try_take(3, 90)
    assert not pair.try_take(1, 20)  # the count fits, the bytes do not
    assert (pair.count_used, pair.size_used) == (3, 90)
    order: list[str] = []

    async def take(name: str, count: int, size: int) -> None:
        await pair.take(count, size)
        order.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take, "bytes", 1, 50)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(take, "small", 1, 1)  # would fit, but waits behind
        await trio.testing.wait_all_tasks_blocked()
        assert order == [] and pair.waiting == 2
        assert (pair.count_used, pair.size_used) == (3, 90)  # nothing held while waiting
        pair.give(1, 5)  # room for "small" only: it stays behind "bytes"
        await trio.testing.wait_all_tasks_blocked()
        assert order == [] and pair.waiting == 2
        pair.give(1, 55)  # room for both, granted in line
        assert pair.waiting == 0
    assert sorted(order) == ["bytes", "small"]
    assert (pair.count_used, pair.size_used) == (3, 81)


async def test_a_pair_lets_a_call_alone_through_whatever_its_size() -> None:
    pair = BudgetPair(2, "inflight_max", 10, "inflight_bytes_max", trio.Event)
    assert pair.try_take(5, 1000)  # nothing held: served alone rather than stuck
    with trio.move_on_after(0.01):
        await pair.take(1, 1)
        pytest.fail("a second taker passed a pair over its limits")
    assert pair.waiting == 0  # the cancelled taker left nothing behind
    pair.give(5, 1000)
    assert (pair.count_used, pair.size_used) == (0, 0)
    assert pair.try_take(1, 10) and not pair.try_take(1, 1)


async def test_a_pair_limit_under_one_is_refused_with_a_typed_error() -> None:
    await trio.lowlevel.checkpoint()
    with pytest.raises(pora.InvalidArgument, match="inflight_bytes_max: the limit must be"):
        BudgetPair(1, "inflight_max", 0, "inflight_bytes_max", trio.Event)
