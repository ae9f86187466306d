"""The open-loop generator of the benchmarks (`pora.bench.schedule`) and its timer
(`pora.bench.deadline_timer`): operations start at their due times, never before,
on trio and on asyncio, and the timer wakes well under the millisecond an event
loop's own sleep can be late by."""

from __future__ import annotations

import itertools
import time

import anyio
import pytest

from pora.bench.deadline_timer import DeadlineTimer
from pora.bench.schedule import run_on_schedule

BACKENDS = ["trio", "asyncio"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_operation_starts_at_its_due_time_never_before(backend: str) -> None:
    rate = 2000.0
    starts: list[tuple[float, float]] = []

    async def operation(due: float) -> None:
        starts.append((due, time.perf_counter()))
        await anyio.sleep(0.002)  # several in flight at once: workers are added

    async def main() -> int:
        return await run_on_schedule(rate, operation, total=200)

    assert anyio.run(main, backend=backend) == 200
    dues = sorted(due for due, _ in starts)
    assert len(dues) == 200
    gaps = [b - a for a, b in itertools.pairwise(dues)]
    assert all(gap == pytest.approx(1 / rate, rel=1e-6) for gap in gaps)
    assert all(started >= due for due, started in starts)


def test_a_schedule_ends_on_its_condition_and_waits_for_what_it_started() -> None:
    dues: list[float] = []
    ended = 0
    #: when `until` first held: no operation may be due after it
    condition_held_at: list[float] = []

    async def operation(due: float) -> None:
        nonlocal ended
        dues.append(due)
        await anyio.sleep(0.01)
        ended += 1

    def until() -> bool:
        # a condition on the work done, not on the clock: a loaded machine only delays it
        if ended >= 10 and not condition_held_at:
            condition_held_at.append(time.perf_counter())
        return bool(condition_held_at)

    started = anyio.run(lambda: run_on_schedule(1000.0, operation, until=until), backend="trio")
    assert started >= 10 and ended == started == len(dues)
    assert max(dues) <= condition_held_at[0]  # nothing was started once the condition held


def test_a_schedule_needs_an_end_and_a_finite_rate() -> None:
    async def operation(due: float) -> None:
        pass

    for rate, total in ((1000.0, None), (0.0, 1), (float("inf"), 1)):
        with pytest.raises(ValueError):
            anyio.run(lambda: run_on_schedule(rate, operation, total=total))  # noqa: B023


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_timer_wakes_at_the_deadline_not_a_millisecond_later(backend: str) -> None:
    lateness: list[float] = []

    async def main() -> None:
        with DeadlineTimer() as timer:
            for _ in range(50):
                deadline = time.perf_counter() + 0.0003
                await timer.wait_until(deadline)
                lateness.append(time.perf_counter() - deadline)

    anyio.run(main, backend=backend)
    assert min(lateness) >= 0
    # An event loop's sleep of 0.3 ms waits a whole millisecond (epoll's timeout is
    # rounded up), so it is never less than 0.7 ms late: one punctual wake-up shows the
    # timer fired at the deadline. The best of 50, not the median, so that a loaded
    # machine (which delays most wake-ups by its scheduling) cannot fail the test.
    assert min(lateness) < 0.0006, sorted(lateness)[:5]
