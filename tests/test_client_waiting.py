"""`TrioEvent`, the event a writer's appends wait on: every waiter is woken once by
`set`, and a waiter cancelled first is not woken at all, even when it waits on the
same event again."""

from __future__ import annotations

import trio
import trio.testing

from pora.client.waiting import TrioEvent


async def test_set_wakes_every_waiter_once() -> None:
    event = TrioEvent()
    woken: list[int] = []

    async def waiter(index: int) -> None:
        await event.wait()
        woken.append(index)

    async with trio.open_nursery() as nursery:
        for index in range(5):
            nursery.start_soon(waiter, index)
        await trio.testing.wait_all_tasks_blocked()
        event.set()
        event.set()  # (a second set is nothing)
    assert sorted(woken) == [0, 1, 2, 3, 4]
    assert event.is_set()
    await event.wait()  # set: returns at once


async def test_a_cancelled_waiter_is_passed_by_and_one_waiting_again_is_woken_once() -> None:
    event = TrioEvent()
    other = trio.Event()
    outcomes: list[str] = []

    async def cancelled_then_elsewhere() -> None:
        with trio.CancelScope() as scope:
            scopes.append(scope)
            await event.wait()
        outcomes.append("cancelled")
        await other.wait()  # parked elsewhere when the event is set: not woken by it
        outcomes.append("woken by the other event")

    async def cancelled_then_again() -> None:
        with trio.CancelScope() as scope:
            scopes.append(scope)
            await event.wait()
        await event.wait()  # listed twice now
        outcomes.append("woken once")
        await trio.sleep_forever()  # a second reschedule would break trio here

    scopes: list[trio.CancelScope] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancelled_then_elsewhere)
        nursery.start_soon(cancelled_then_again)
        await trio.testing.wait_all_tasks_blocked()
        for scope in scopes:
            scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        event.set()
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(outcomes) == ["cancelled", "woken once"]
        other.set()
        await trio.testing.wait_all_tasks_blocked()
        assert "woken by the other event" in outcomes
        nursery.cancel_scope.cancel()
