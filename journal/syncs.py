"""The journal's fdatasyncs: started at once, their ends delivered by a callback.

Two ways, one contract: `on_end` is called on the event loop when the sync has
ended, and then `outcome()` gives its seconds or raises its OSError. A callback,
not a task waiting on an event: every add of the group waits for what runs
after the sync, and a task woken by an event runs only in the loop's next batch
of tasks; called from where the end is read, the hand-over runs in this one.
A sync is never abandoned (nothing closes the segment under it).

- `RingSyncStarter`: through io_uring (journal/uring.py), submitted from the event loop,
  their ends read by one reaper task from an eventfd. No thread of ours in the path.
- `SyncInThread`: in a worker thread, where io_uring cannot be used.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import math
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import trio

from journal.uring import FdatasyncRing

if TYPE_CHECKING:
    import outcome  # trio's own dependency: what start_thread_soon delivers

_log = logging.getLogger("pora.journal")

OnEnd = Callable[[], None]


class Syncable(Protocol):
    """What a sync needs of a SegmentWriter."""

    @property
    def sync_fd(self) -> int | None: ...

    def sync(self) -> None: ...


class Sync(Protocol):
    @property
    def ended(self) -> bool: ...

    def outcome(self) -> float:
        """Once ended: the sync's seconds, or its OSError raised."""
        ...


def _timed_sync(writer: Syncable) -> float:
    started = time.perf_counter()
    writer.sync()
    return time.perf_counter() - started


class SyncInThread:
    """One fdatasync of the journal, started in a worker thread at once.

    `trio.to_thread.run_sync` would start it only when an awaiting task runs, a
    turn of the event loop after the group was written; every add of the group
    waits for that turn. The loop learns of the end by a callback.
    """

    __slots__ = ("_on_end", "_result")

    def __init__(self, writer: Syncable, on_end: OnEnd) -> None:
        self._result: outcome.Outcome[float] | None = None
        self._on_end = on_end
        token = trio.lowlevel.current_trio_token()

        def deliver(result: outcome.Outcome[float]) -> None:  # in the worker thread
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._finish, result)

        trio.lowlevel.start_thread_soon(functools.partial(_timed_sync, writer), deliver)

    def _finish(self, result: outcome.Outcome[float]) -> None:
        self._result = result
        self._on_end()

    @property
    def ended(self) -> bool:
        return self._result is not None

    def outcome(self) -> float:
        assert self._result is not None, "the sync has not ended"
        return self._result.unwrap()


class _RingSync:
    __slots__ = ("_on_end", "ended", "result", "seconds_taken", "started")

    def __init__(self, on_end: OnEnd) -> None:
        self._on_end = on_end
        self.started = time.perf_counter()
        self.ended = False
        self.result = 0
        self.seconds_taken = 0.0

    def finish(self, result: int) -> None:
        self.result = result
        self.seconds_taken = time.perf_counter() - self.started
        self.ended = True
        self._on_end()

    def outcome(self) -> float:
        assert self.ended, "the sync has not ended"
        if self.result < 0:
            raise OSError(-self.result, os.strerror(-self.result))
        return self.seconds_taken


class RingSyncStarter:
    """Starts fdatasyncs through one io_uring; `reap` (a task) delivers their ends.

    A sync's seconds run from its submission until the loop reads its completion.
    """

    def __init__(self, ring: FdatasyncRing, *, unsignalled_check_s: float = 0.01) -> None:
        self._ring = ring
        #: with syncs in flight and no signal for this long, the reaper looks at the
        #: ring anyway: a completion the kernel held in its overflow list signals
        #: nothing (journal/uring.py). Rare, so the stall it costs then matters
        #: little. 0: never
        self._unsignalled_check_s = unsignalled_check_s or math.inf
        self._pending: dict[int, _RingSync] = {}
        self._next_tag = 0
        #: shielded while syncs are in flight: a cancelled journal still waits for
        #: them (their tasks do), so the reaper must stay to deliver their ends
        self._scope = trio.CancelScope()
        #: set while syncs are in flight: wakes the look for unsignalled ends
        self._busy = trio.Event()
        self._stopping = False
        self.failed = False

    @classmethod
    def open(
        cls, syncs_in_flight_max: int, *, unsignalled_check_s: float = 0.01
    ) -> RingSyncStarter | None:
        ring = FdatasyncRing.open(syncs_in_flight_max)
        return None if ring is None else cls(ring, unsignalled_check_s=unsignalled_check_s)

    def start(self, writer: Syncable, on_end: OnEnd) -> Sync:
        """Start an fdatasync of the writer's open segment; `on_end` is called from
        the reaper once it has ended."""
        fd = writer.sync_fd
        if fd is None or self.failed:
            return SyncInThread(writer, on_end)
        tag = self._next_tag
        self._next_tag = tag + 1
        sync = _RingSync(on_end)
        try:
            self._ring.submit_fdatasync(fd, tag)
        except (OSError, RuntimeError) as exc:
            # never seen; a ring that refuses a submission is not used again
            self.failed = True
            _log.warning("io_uring refused a journal sync (%s); syncing in threads from now", exc)
            return SyncInThread(writer, on_end)
        self._pending[tag] = sync
        self._scope.shield = True
        self._busy.set()
        return sync

    async def reap(self) -> None:
        """Deliver completions as they come; runs until cancelled with none in flight."""
        with self._scope:
            async with trio.open_nursery() as nursery:
                if self._unsignalled_check_s != math.inf:
                    nursery.start_soon(self._look_when_unsignalled)
                await self._reap_signalled()
                nursery.cancel_scope.cancel()

    async def _reap_signalled(self) -> None:
        ring = self._ring
        pending = self._pending
        while True:
            await trio.lowlevel.wait_readable(ring.event_fd)
            self._deliver()
            self._scope.shield = bool(pending)
            if self._stopping and not pending:
                return

    async def _look_when_unsignalled(self) -> None:
        """While syncs are in flight, look at the ring every `unsignalled_check_s`
        whatever the eventfd says. A task of its own, not a deadline on each wait
        for a signal: a cancel scope per reap cost more than this task's wake-up
        every `unsignalled_check_s` (docs/performance.md)."""
        pending = self._pending
        while True:
            await self._busy.wait()
            await trio.sleep(self._unsignalled_check_s)
            if pending:
                self._deliver()
                self._scope.shield = bool(pending)
            if not pending:
                self._busy = trio.Event()
                if self._stopping:
                    self._scope.cancel()

    def _deliver(self) -> None:
        """Finish every pending sync whose completion the ring holds."""
        pending = self._pending
        ring = self._ring
        flushes = ring.overflow_flushes
        try:
            done = ring.completions()
        except OSError as exc:
            # the ring cannot be read (flushing its overflow failed): the syncs in
            # flight may never be heard of, so they fail now, which stops the
            # journal's writes (it cannot tell what is durable), and no sync goes
            # through this ring again
            self.failed = True
            _log.error(
                "reading the journal's io_uring failed (%s): the syncs in flight count as failed",
                exc.strerror or exc,
            )
            done = [(tag, -(exc.errno or errno.EIO)) for tag in pending]
        if ring.overflow_flushes and not flushes:
            _log.info(
                "io_uring kept journal sync completions in its overflow list without "
                "signalling them; flushed them. The journal looks for this at every "
                "reap, and every sync_unsignalled_check_ms while syncs are in flight"
            )
        for tag, result in done:
            sync = pending.pop(tag, None)
            if sync is not None:
                sync.finish(result)

    def stop(self) -> None:
        """End `reap` once no sync is in flight (at once if none is). Not by
        cancelling it with syncs in flight: a shield does not hold against the
        cancel of its own scope, and their tasks would wait for ever."""
        self._stopping = True
        if not self._pending:
            self._scope.cancel()

    def close(self) -> None:
        if self._pending:  # a bug: their tasks would wait for ever
            raise RuntimeError(f"closing the sync ring with {len(self._pending)} syncs in flight")
        self._ring.close()
