"""The byte budget behind the server's read limits: in line, never over, nothing lost."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from pora.server.read_budget import ByteBudget


async def test_reservations_wait_in_line_and_never_pass_the_limit() -> None:
    budget = ByteBudget(100)
    order: list[int] = []

    async def take(name: int, size: int) -> None:
        await budget.acquire(size)
        order.append(name)
        assert budget.used <= 100

    await budget.acquire(90)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(take, 1, 50)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(take, 2, 5)  # would fit, but waits behind the first
        await trio.testing.wait_all_tasks_blocked()
        assert order == [] and budget.waiting == 2
        budget.release(90)
    assert sorted(order) == [1, 2] and budget.used == 55


async def test_one_reservation_larger_than_the_limit_passes_alone() -> None:
    budget = ByteBudget(10)
    await budget.acquire(1000)
    assert budget.used == 1000
    with trio.move_on_after(0.01):
        await budget.acquire(1)
        pytest.fail("a second reservation passed a budget over its limit")
    budget.release(1000)
    await budget.acquire(1)
    assert budget.used == 1 and budget.waiting == 0


async def test_a_cancelled_waiter_leaves_nothing_behind() -> None:
    budget = ByteBudget(10)
    await budget.acquire(10)
    with trio.move_on_after(0.01):
        await budget.acquire(5)
    assert budget.waiting == 0
    budget.release(10)
    assert budget.used == 0
