"""Simulated time: trio's `MockClock`, moved only when every task is blocked and no
thread is working.

trio's own autojump moves the clock as soon as every task is blocked, also while a
node's disk thread (an fdatasync, a LevelDB write) or the metadata store's SQLite
thread is still running: a timeout could then fire in simulated time because a disk
was slow in real time, and a seed would not replay. `SimTime` counts the threads at
work (every `start_thread_soon`, which `trio.to_thread` and the journal's syncs use;
`CountingStore` counts the SQLite writer's calls) and jumps only when that count is
zero: a thread takes no simulated time at all.

It reaches into trio to do so (`trio._core._run._r`, the scheduler's batch order, and
`trio._threads.start_thread_soon`), which trio does not promise to keep: the trio
versions it supports are `SUPPORTED_TRIO` (pyproject.toml's `test` extra pins the
same range), and on any other it refuses to run, saying so.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import math
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import outcome
import trio
import trio.lowlevel
import trio.testing

from pora.meta.store import MetadataStore
from simulation.disk import SimDisk, SyncJob

#: the trio releases whose internals this module was checked against: [low, high)
SUPPORTED_TRIO = ((0, 25), (0, 36))


def _check_trio_version(version: str) -> None:
    low, high = SUPPORTED_TRIO
    release = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if not low <= release < high:
        raise RuntimeError(
            f"the simulation patches trio's internals and supports trio "
            f">={low[0]}.{low[1]},<{high[0]}.{high[1]}; this is trio {version}. Install "
            "a trio in that range (pip install -e '.[test]'), or check the internals "
            "clock.py patches against this trio and widen SUPPORTED_TRIO and "
            "pyproject.toml's pin together"
        )


_check_trio_version(trio.__version__)

# only once the version is known good: another trio may not have these
from trio import _threads as trio_threads  # noqa: E402
from trio._core import _run as trio_run  # noqa: E402  (the scheduler's batch order)


class Deadlock(Exception):
    """Every task waits and no timer is set: nothing can ever run again."""


class SimTime:
    def __init__(self) -> None:
        self.clock = _JumpingClock(self)
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

    @property
    def working(self) -> bool:
        return self._working > 0

    async def quiet(self) -> None:
        """Return once no thread is at work: until the caller's next checkpoint, no
        disk write is under way (what a consistent copy of a data dir needs)."""
        while self._working:
            await self._idle.wait()

    async def drive(self) -> None:
        """Raise Deadlock when every task waits, no thread works and no timer is set;
        run in the simulation's nursery, cancelled at its end. (The clock jumps by
        itself: `_JumpingClock`.)"""
        while True:
            # woken only when the clock did not jump: a thread works, or no timer is set
            await trio.testing.wait_all_tasks_blocked(cushion=0.0)
            if self._working:
                await self._idle.wait()
                continue
            if math.isinf(trio.lowlevel.current_statistics().seconds_to_next_deadline):
                raise Deadlock(
                    f"every task waits and no timer is set at t={trio.current_time():.3f}: "
                    "the simulation can never go on (a lost wake-up in the client?)"
                )
            await trio.lowlevel.checkpoint()


class _JumpingClock(trio.abc.Clock):
    """Simulated time that stands still while anything can run, and jumps to the next
    deadline when nothing can: trio asks a clock how long to sleep only when no task
    is runnable, and with no thread at work (every thread's result reaches the loop
    counted, `counted_threads`) nothing else can wake one. Jumping here, in the loop
    itself, costs no task switch; a task that jumped the clock would cost each jump
    two passes of the loop (a stream seed jumps thousands of times)."""

    def __init__(self, sim: SimTime) -> None:
        self._sim = sim
        self._now = 0.0

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        return self._now

    def deadline_to_sleep_time(self, deadline: float) -> float:
        if deadline <= self._now:
            return 0.0
        if self._sim.working or math.isinf(deadline):
            # wait (in real time) for a thread's result, or for SimTime.drive to see
            # that nothing will ever come
            return _REAL_WAIT_S
        self._now = deadline
        return 0.0


#: how long the loop waits in real time when the clock cannot jump: a thread's
#: result (or SimTime.drive's Deadlock) wakes it long before
_REAL_WAIT_S = 3600.0


@contextmanager
def counted_threads(sim: SimTime, disk: SimDisk | None = None) -> Iterator[None]:
    """Count every thread trio starts (`trio.to_thread`, the journal's syncs) as work
    in progress until it has run. With a `disk`, the result of a thread that synced
    a file reaches the event loop after a seeded disk latency in simulated time, and
    its syncs become durable only then (`SimDisk.settle`): a crash within that
    latency loses them. (Only those: a thread the metadata store waits for must not
    wait for the clock, which stands still while the store works.)"""
    original = trio.lowlevel.start_thread_soon  # what trio._threads imported too
    latency = random.Random(f"{disk.seed}/disk-latency") if disk is not None else None

    def counting(
        fn: Callable[[], Any], deliver: Callable[[Any], None], name: str | None = None
    ) -> None:
        token = trio.lowlevel.current_trio_token()
        sim.work_started()
        if disk is None or latency is None:

            def deliver_then_count(result: Any) -> None:  # in the worker thread
                deliver(result)
                # queued after deliver's own callback: the woken task is runnable before
                # the clock may move again
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(sim.work_ended)

            original(fn, deliver_then_count, name)
            return
        # drawn on the event loop, in the order threads start: the same for a seed
        delay_s = latency.uniform(0.0005, 0.005)
        job = SyncJob()

        def run_in_job() -> Any:
            with disk.in_job(job):
                return fn()

        async def settle_later(result: Any) -> None:
            await trio.sleep(delay_s)
            if not disk.settle(job):  # its node crashed first: the sync never ended
                result = outcome.Error(OSError(errno.EIO, "the node crashed (simulated)"))
            deliver(result)

        def on_loop(result: Any) -> None:
            trio.lowlevel.spawn_system_task(settle_later, result)
            sim.work_ended()  # (after the spawn: its timer is set before the clock moves)

        def held(result: Any) -> None:  # in the worker thread
            with contextlib.suppress(trio.RunFinishedError):
                if job.syncs:
                    token.run_sync_soon(on_loop, result)
                else:  # no sync to hold back (a read, the metadata store's work)
                    deliver(result)
                    token.run_sync_soon(sim.work_ended)

        original(run_in_job, held, name)

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
