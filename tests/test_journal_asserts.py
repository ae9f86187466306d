"""The journal's asserted rules: a request settles once, a written group moves only
along its allowed states, and each group ends exactly once."""

from __future__ import annotations

import pytest
import trio

from journal.format import RecordKind
from journal.groups import GroupState, WrittenGroup
from journal.request import Request


class _Ended:
    """A sync that has ended (the group's states do not look at it)."""

    ended = True

    def outcome(self) -> float:
        return 0.0


def request() -> Request:
    return Request(RecordKind.ENTRY, 1, 0, b"x")


@pytest.mark.parametrize(
    ("first", "second"),
    [("complete", "complete"), ("complete", "fail"), ("fail", "complete"), ("fail", "fail")],
)
def test_a_request_settles_once(first: str, second: str) -> None:
    settled: list[Request] = []
    done = request()
    done.on_done = settled.append
    settle = {"complete": done.complete, "fail": lambda: done.fail(OSError("x"))}
    settle[first]()
    assert settled == [done]
    with pytest.raises(AssertionError, match="after it was settled"):
        settle[second]()
    assert settled == [done]  # the owner was told once


def test_a_replayed_run_settles_once() -> None:
    run = Request.entry_run(1, 0, [request().bodies[0]], -1, request().flags, None, None, [])
    run.complete()
    with pytest.raises(AssertionError):
        run.fail(OSError("x"))


def _group() -> tuple[WrittenGroup, trio.Semaphore]:
    slots = trio.Semaphore(1, max_value=1)
    slots.acquire_nowait()
    return WrittenGroup([request()], 512, _Ended(), trio.Event(), slots), slots


async def test_a_group_handed_over_at_once_gives_its_slot_back_once() -> None:
    group, slots = _group()
    group.settle(GroupState.HANDED_OVER)
    assert group.done.is_set()
    assert slots.value == 1
    with pytest.raises(AssertionError, match="handed over group cannot become"):
        group.settle(GroupState.FAILED)
    assert slots.value == 1


async def test_a_group_waits_for_the_ledgers_before_it_is_handed_over() -> None:
    group, slots = _group()
    group.move_to(GroupState.WAITING_FOR_LEDGERS)
    assert not group.done.is_set()
    assert slots.value == 0  # the slot is held while it waits
    with pytest.raises(AssertionError, match="cannot become failed"):
        group.move_to(GroupState.FAILED)  # it was synced: only a cancel can stop it
    group.settle(GroupState.CANCELLED)
    assert (group.state, group.done.is_set(), slots.value) == (GroupState.CANCELLED, True, 1)


async def test_a_written_group_cannot_be_cancelled_nor_end_as_written() -> None:
    group, _slots = _group()
    with pytest.raises(AssertionError):
        group.settle(GroupState.CANCELLED)
    with pytest.raises(AssertionError):
        group.settle(GroupState.WRITTEN)
    assert group.state is GroupState.WRITTEN
