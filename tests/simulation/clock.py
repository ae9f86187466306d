"""Simulated time: trio's `MockClock`, moved only when every task is blocked and no
thread is working.

trio's own autojump moves the clock as soon as every task is blocked, also while a
node's disk thread (an fdatasync, a LevelDB write) or the metadata store's SQLite
thread is still running: a timeout could then fire in simulated time because a disk
was slow in real time, and a seed would not replay. `SimTime` counts the threads at
work (every `start_thread_soon`, which `trio.to_thread` and the journal's syncs use;
`CountingStore` counts the SQLite writer's calls) and jumps only when that count is
zero: a thread takes no simulated time at all.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import trio
import trio.lowlevel
import trio.testing
from trio import _threads as trio_threads
from trio._core import _run as trio_run  # the scheduler's batch shuffling

from pora.meta.store import MetadataStore


class Deadlock(Exception):
    """Every task waits and no timer is set: nothing can ever run again."""


class SimTime:
    def __init__(self) -> None:
        self.clock = trio.testing.MockClock(rate=0.0)
        self._working = 0
        self._idle = trio.Event()
        self._idle.set()

    def work_started(self) -> None:
        self._working += 1
        if self._working == 1:
            self._idle = trio.Event()

    def work_ended(self) -> None:
        self._working -= 1
        if self._working == 0:
            self._idle.set()

    async def quiet(self) -> None:
        """Return once no thread is at work: until the caller's next checkpoint, no
        disk write is under way (what a consistent copy of a data dir needs)."""
        while self._working:
            await self._idle.wait()

    async def drive(self) -> None:
        """Jump the clock to the next deadline whenever nothing else can run; run in
        the simulation's nursery, cancelled at its end."""
        while True:
            await trio.testing.wait_all_tasks_blocked(cushion=0.0)
            if self._working:
                await self._idle.wait()
                continue
            delay = trio.lowlevel.current_statistics().seconds_to_next_deadline
            if math.isinf(delay):
                raise Deadlock(
                    f"every task waits and no timer is set at t={trio.current_time():.3f}: "
                    "the simulation can never go on (a lost wake-up in the client?)"
                )
            if delay > 0:
                self.clock.jump(delay)
            await trio.lowlevel.checkpoint()


@contextmanager
def counted_threads(sim: SimTime) -> Iterator[None]:
    """Count every thread trio starts (`trio.to_thread`, the journal's syncs) as work
    in progress until its result is back on the event loop."""
    original = trio.lowlevel.start_thread_soon  # what trio._threads imported too

    def counting(
        fn: Callable[[], Any], deliver: Callable[[Any], None], name: str | None = None
    ) -> None:
        token = trio.lowlevel.current_trio_token()
        sim.work_started()

        def deliver_then_count(result: Any) -> None:  # in the worker thread
            deliver(result)
            # queued after deliver's own callback: the woken task is runnable before
            # the clock may move again
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(sim.work_ended)

        original(fn, deliver_then_count, name)

    # trio.to_thread calls the name its module imported; the journal's syncs call
    # trio.lowlevel's
    trio_threads.start_thread_soon = counting  # type: ignore[attr-defined,assignment]
    trio.lowlevel.start_thread_soon = counting  # type: ignore[assignment]
    try:
        yield
    finally:
        trio_threads.start_thread_soon = original  # type: ignore[attr-defined]
        trio.lowlevel.start_thread_soon = original


class _InOrder(random.Random):
    """What trio's scheduler draws from to reorder each batch of runnable tasks:
    never reorder. How many batches the loop runs depends on when disk threads end
    (real time), so any draw per batch would replay differently; the simulation's
    randomness is the network's and the plan's, all seeded."""

    def random(self) -> float:
        return 0.75  # trio reverses a batch below 0.5

    def shuffle(self, x: Any) -> None:
        """Under hypothesis, pytest-trio has trio sort each batch by task age and
        shuffle it: keep the age order."""


@contextmanager
def tasks_in_order() -> Iterator[None]:
    original = trio_run._r
    trio_run._r = _InOrder()
    try:
        yield
    finally:
        trio_run._r = original


class CountingStore:
    """A metadata store whose calls count as work in progress (the SQLite store
    writes in a thread of its own, which `counted_threads` does not see), with a
    seeded round trip in simulated time around each call."""

    def __init__(self, inner: MetadataStore, sim: SimTime, seed: int) -> None:
        self._inner = inner
        self._sim = sim
        #: the store's round trip, in simulated time (a ZooKeeper's would be ~1 ms):
        #: what lets a recovery's compare-and-set land inside a writer's ensemble
        #: change, and the other way round
        self._latency = random.Random(f"{seed}/metadata")

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(attribute):
            return attribute  # the url, watch_ledger (its polls are counted threads)
        sim = self._sim

        @functools.wraps(attribute)
        async def counted(*args: Any, **kwargs: Any) -> Any:
            await trio.sleep(self._latency.uniform(0.0002, 0.003))
            sim.work_started()
            try:
                answer = await attribute(*args, **kwargs)
            finally:
                sim.work_ended()
            await trio.sleep(self._latency.uniform(0.0002, 0.003))
            return answer

        return counted


def counting_store(inner: MetadataStore, sim: SimTime, seed: int) -> MetadataStore:
    return cast(MetadataStore, CountingStore(inner, sim, seed))
