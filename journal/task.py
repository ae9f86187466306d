"""The journal task: the one writer of the journal, doing group commit.

Requests arrive in batches (lists) on one bounded channel. The task drains every
batch waiting, until a trigger fires (bytes gathered, time waited, or queue empty),
then writes the whole group with one write (into the page cache, on the event loop;
in a worker thread when the segment rolls) and starts one fdatasync (in a
worker thread: journal/syncs.py). While it runs, the event loop
keeps accepting requests, so the next group gathers during the sync: the sync cost
is shared by everything that arrived in the meantime. When a sync ends, the code
that learns of it hands the group to the ledgers (`dispatch_nowait`, else
`dispatch` in a task), in journal order, and they complete each request. A
written group's way there is a `WrittenGroup` whose state moves only as
journal/groups.py allows, and ends once.

A full channel makes `submit` wait: that is the node's backpressure.
"""

from __future__ import annotations

import collections
import errno
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import trio

from journal.errors import JournalError, JournalNoSpace
from journal.format import UNSYNCED_BATCHES_LIMIT
from journal.groups import GroupState, WrittenGroup
from journal.mounts import describe, free_bytes
from journal.request import Request
from journal.segment import SegmentInfo, SegmentWriter, encode_batch
from journal.spares import SpareSegments, usable_spares
from journal.syncs import SyncInThread

_log = logging.getLogger("pora.journal")
Dispatch = Callable[[list[Request]], Awaitable[None]]
#: hands a group over without waiting, all of it or (False) none of it
DispatchNowait = Callable[[list[Request]], bool]
#: told (operations, bytes written, sync seconds) after every group commit
CommitListener = Callable[[int, int, float], None]


@dataclass(frozen=True, slots=True)
class GroupCommitConfig:
    """Knobs of the journal. Units are last in names."""

    #: how long the oldest request of a group may wait for company before the sync
    group_wait_ms_max: float = 1.0
    #: sync as soon as this many payload bytes are gathered
    group_bytes_max: int = 1 << 20
    #: sync as soon as nothing more is queued, without waiting for company
    #: (BookKeeper's flushWhenQueueEmpty). On by default: the sync slots
    #: (`syncs_in_flight_max`) already batch under load, since requests pile up
    #: while every slot syncs, so waiting only adds latency (figures:
    #: docs/performance.md). Off, a group waits up to `group_wait_ms_max` for more:
    #: fewer, larger syncs at medium load
    flush_when_queue_empty: bool = True
    #: groups written and being synced at once: with 2, the next group is gathered
    #: and written while the previous one's fdatasync runs (acks stay in order)
    syncs_in_flight_max: int = 2
    #: bound of the journal channel, in batches (a batch is one submitter's list)
    channel_batches_max: int = 4096
    #: a segment rolls when the next group would not fit
    segment_bytes: int = 256 << 20
    preallocate: bool = True
    #: zero-filled spare segments kept ready once the open one is a quarter full, so
    #: that no fdatasync converts preallocated (unwritten) extents: journal/spares.py.
    #: 0: none; only with `preallocate`
    spare_segments_max: int = 1
    #: a trimmed segment becomes a spare (while fewer than `spare_segments_max` are
    #: ready) instead of being deleted: its blocks are written already, so no zeros
    #: need writing for the next segment (journal/spares.py)
    recycle_segments: bool = True
    #: False only for throwaway test data: an acknowledged add is then not durable
    fsync: bool = True

    def __post_init__(self) -> None:
        if self.group_wait_ms_max < 0:
            raise ValueError("group_wait_ms_max must be >= 0")
        if self.group_bytes_max <= 0 or self.channel_batches_max <= 0:
            raise ValueError("group_bytes_max and channel_batches_max must be > 0")
        if self.spare_segments_max < 0:
            raise ValueError("spare_segments_max must be >= 0")
        if not 1 <= self.syncs_in_flight_max <= UNSYNCED_BATCHES_LIMIT:
            # every segment header records it, in a u16
            raise ValueError(f"syncs_in_flight_max must be in [1, {UNSYNCED_BATCHES_LIMIT}]")
        if self.segment_bytes < 4096:
            raise ValueError("segment_bytes must be at least 4096")


@dataclass(frozen=True, slots=True)
class JournalStatistics:
    next_seq: int
    dispatched_seq: int
    commits: int
    #: operations journalled: each entry of a run counts, as do fences, closes, ...
    #: (a run is one journal record: this is not a count of records)
    operations: int
    bytes_written: int
    #: the most operations one group commit carried
    group_operations_max: int
    sync_seconds_total: float
    sync_seconds_max: float
    queued_batches: int
    open_segment: SegmentInfo | None
    failed: bool
    #: spare segments zero-filled, taken by a roll, and made of a trimmed segment
    #: (journal/spares.py)
    spare_segments_made: int = 0
    spare_segments_taken: int = 0
    spare_segments_recycled: int = 0


class GroupTrace(Protocol):
    """What the journal tells a tracer (`pora.tracing`, set by the node when tracing
    is on): when each group was formed and written, and when it was synced."""

    def group_written(self, group: Sequence[Request], formed_ns: int) -> None: ...

    def group_synced(self, group: Sequence[Request], sync_seconds: float) -> None: ...


class Journal:
    """The journal writer task and its channel.

    `first_seq` is the sequence number the first record written gets; recovery
    computes it. `dispatch` receives each synced group, in order, exactly once.
    """

    def __init__(
        self,
        directory: Path,
        config: GroupCommitConfig,
        *,
        first_seq: int,
        dispatch: Dispatch,
        dispatch_nowait: DispatchNowait | None = None,
    ) -> None:
        self._directory = directory
        self._config = config
        self._dispatch = dispatch
        self._dispatch_nowait = dispatch_nowait
        self._send, self._receive = trio.open_memory_channel[list[Request]](
            config.channel_batches_max
        )
        self._next_seq = first_seq
        self._dispatched_seq = first_seq
        self._writer: SegmentWriter | None = None
        self._spares: SpareSegments | None = None
        if config.preallocate and config.spare_segments_max > 0:
            self._spares = SpareSegments(
                directory,
                segment_bytes=config.segment_bytes,
                spares_max=config.spare_segments_max,
                fsync=config.fsync,
            )
        #: set when a spare should be made (the open segment is a quarter full)
        self._spare_wanted = trio.Event()
        #: making a spare failed while this segment was open: wait for the next one
        self._spare_failed_in: SegmentInfo | None = None
        self._failure: JournalError | None = None
        #: groups written, in journal order, not yet handed over
        self._unsynced: collections.deque[WrittenGroup] = collections.deque()
        #: set when a sync ends; renewed by whoever waits for the next one
        self._a_sync_ended = trio.Event()
        #: a hand-over is waiting (a full ledger channel): the groups after it wait too
        self._handing_over_later = False
        self._nursery: trio.Nursery | None = None
        self._commits = 0
        self._operations = 0
        self._bytes_written = 0
        self._group_operations_max = 0
        self._sync_seconds_total = 0.0
        self._sync_seconds_max = 0.0
        #: when the last write began; requests found queued at the next gather have
        #: waited at most since then, so the group-wait clock starts there
        self._last_write_started = 0.0
        self._commit_listeners: list[CommitListener] = []
        self._reclaim: Callable[[], Awaitable[object]] | None = None
        #: the tracer of the hops of each group, None (the usual) when tracing is off
        self.trace: GroupTrace | None = None

    def add_commit_listener(self, listener: CommitListener) -> None:
        """Call `listener(operations, bytes, sync_seconds)` after every group commit
        (metrics). It runs on the journal task: it must be quick and not raise."""
        self._commit_listeners.append(listener)

    def set_reclaim(self, reclaim: Callable[[], Awaitable[object]]) -> None:
        """Have `reclaim()` awaited before a spare segment is zero-filled: the node
        trims the journal then, and a trimmed segment may become that spare
        (`recycle_pool`), with no zeros to write. By then the segment closed last is
        usually all flushed. One reclaimer; until it is set, spares are zero-filled."""
        assert self._reclaim is None, "one reclaimer"
        self._reclaim = reclaim

    @property
    def recycle_pool(self) -> SpareSegments | None:
        """Where the trimmer puts trimmed segments to be reused (`delete_segments`),
        or None when they are deleted."""
        return self._spares if self._config.recycle_segments else None

    # --- submitting ------------------------------------------------------------------

    async def submit(self, batch: list[Request]) -> None:
        """Queue `batch` for the journal, waiting while the channel is full."""
        self._check_accepting()
        try:
            await self._send.send(batch)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise JournalError("the journal is closed: the node is shutting down") from None

    def submit_nowait(self, batch: list[Request]) -> None:
        """Queue `batch`, or raise trio.WouldBlock when the channel is full."""
        self._check_accepting()
        try:
            self._send.send_nowait(batch)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise JournalError("the journal is closed: the node is shutting down") from None

    def _check_accepting(self) -> None:
        if self._failure is not None:
            raise self._failure

    def close_input(self) -> None:
        """Stop accepting requests; `run` returns once everything queued is written."""
        self._send.close()

    # --- positions the trimmer needs ------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The sequence number the next record will get."""
        return self._next_seq

    @property
    def dispatched_seq(self) -> int:
        """Every record with a smaller seq has been handed to `dispatch`."""
        return self._dispatched_seq

    @property
    def open_segment(self) -> SegmentInfo | None:
        return None if self._writer is None else self._writer.open_segment

    def statistics(self) -> JournalStatistics:
        return JournalStatistics(
            next_seq=self._next_seq,
            dispatched_seq=self._dispatched_seq,
            commits=self._commits,
            operations=self._operations,
            bytes_written=self._bytes_written,
            group_operations_max=self._group_operations_max,
            sync_seconds_total=self._sync_seconds_total,
            sync_seconds_max=self._sync_seconds_max,
            queued_batches=self._receive.statistics().current_buffer_used,
            open_segment=self.open_segment,
            failed=self._failure is not None,
            spare_segments_made=0 if self._spares is None else self._spares.made,
            spare_segments_taken=0 if self._spares is None else self._spares.taken,
            spare_segments_recycled=0 if self._spares is None else self._spares.recycled,
        )

    # --- the task ----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write groups until the input is closed and drained."""
        spares = self._spares
        self._writer = await self._open_first_segment()
        spare_maker = trio.CancelScope()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if spares is not None:
                    nursery.start_soon(self._keep_spares, spares, spare_maker)
                task_status.started()
                try:
                    await self._write_groups()
                finally:
                    # inside the nursery: a sync's end may still start a hand-over task
                    await self._wait_for_syncs_in_flight()
                    # the spare maker's thread stops at its next chunk, and its task
                    # ends: the nursery does not wait for a whole segment of zeros
                    if spares is not None:
                        spares.stop()
                    spare_maker.cancel()
        finally:
            writer, self._writer = self._writer, None
            if writer is not None:
                writer.close()

    async def _open_first_segment(self) -> SegmentWriter:
        """The writer of the first segment, after checking there is room for it."""
        config = self._config
        spares = self._spares

        def open_writer() -> SegmentWriter:
            if spares is not None:
                spares.adopt()  # the first segment may be a spare of the last run
            return SegmentWriter(
                self._directory,
                segment_bytes=config.segment_bytes,
                first_seq=self._next_seq,
                preallocate=config.preallocate,
                fsync=config.fsync,
                spares=spares,
                # the sync slots of `_write_groups` are what keeps this promise
                unsynced_batches_max=config.syncs_in_flight_max,
            )

        await trio.to_thread.run_sync(self._check_free_space)
        try:
            return await trio.to_thread.run_sync(open_writer)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            # the space went between the check and the preallocation (or the
            # filesystem counts differently): the same refusal, not a traceback
            raise self._no_space_error() from None

    async def _write_groups(self) -> None:
        """Gather, write and sync groups until the input is closed and drained (or the
        journal fails), then wait until the last one is handed over."""
        sync_slots = trio.Semaphore(self._config.syncs_in_flight_max)
        #: set once the last group started has been synced and handed over (or failed)
        handed_over: trio.Event | None = None
        while self._failure is None:
            # a slot first: while every slot syncs, requests pile up in the channel
            # and the next group gathers them all
            await sync_slots.acquire()
            group = await self._gather()
            if not group:
                sync_slots.release()
                break  # input closed and drained
            trace = self.trace
            if trace is None:
                handed_over = await self._commit(group, handed_over, sync_slots)
            else:
                formed_ns = time.monotonic_ns()
                handed_over = await self._commit(group, handed_over, sync_slots)
                trace.group_written(group, formed_ns)
        if handed_over is not None:
            await handed_over.wait()  # every group is handed over before the end

    def _space_needed(self) -> int:
        """Free bytes the journal needs to start: its first segment, preallocated
        whole, unless a spare left by the last run becomes that segment. Spares are
        not counted: one that does not fit is skipped (journal/spares.py) and the
        journal goes on, with slower syncs."""
        config = self._config
        if not config.preallocate:
            return 0  # segments grow as they are written
        if self._spares is not None and usable_spares(self._directory, config.segment_bytes):
            return 0
        return config.segment_bytes

    def _no_space_error(self) -> JournalNoSpace:
        return JournalNoSpace(
            f"{self._directory.name}/ ({self._directory}) on {describe(self._directory)} "
            f"has {_mib(free_bytes(self._directory))} free; the journal needs "
            f"{_mib(self._space_needed())} (one segment of segment_bytes="
            f"{self._config.segment_bytes}): free space on that filesystem, or lower "
            "segment_bytes (--node-option segment_bytes=...)"
        )

    def _check_free_space(self) -> None:
        """Refuse to start, saying what is needed where, rather than fail to preallocate."""
        if free_bytes(self._directory) < self._space_needed():
            raise self._no_space_error()

    async def _keep_spares(self, spares: SpareSegments, scope: trio.CancelScope) -> None:
        """Make spare segments when asked (`_spare_wanted`), one at a time, in a thread."""
        with scope:
            while True:
                await self._spare_wanted.wait()
                self._spare_wanted = trio.Event()
                if self._reclaim is not None and spares.wanted():
                    try:
                        await self._reclaim()
                    except OSError as exc:
                        _log.warning(
                            "trimming the journal in %s before making a spare failed (%s); "
                            "zero-filling one instead",
                            self._directory,
                            exc.strerror or exc,
                        )
                # asked again while a failed attempt ran: same segment, so not yet
                while spares.wanted() and self.open_segment != self._spare_failed_in:
                    try:
                        # not abandoned on cancel: `stop` makes the thread return soon,
                        # and it removes its partial file on the way out
                        if not await trio.to_thread.run_sync(spares.make_one):
                            return
                    except OSError as exc:
                        # a full disk, say: segments are preallocated as before, and
                        # the next segment tries again once it is a quarter full
                        self._spare_failed_in = self.open_segment
                        _log.warning(
                            "could not make a spare journal segment in %s (%s); new "
                            "segments are preallocated instead, which makes syncs slower",
                            self._directory,
                            exc.strerror or exc,
                        )
                        break

    async def _gather(self) -> list[Request]:
        """Collect one group; an empty list means the input is closed and drained."""
        config = self._config
        receive = self._receive
        try:
            first = receive.receive_nowait()
            # queued while the previous group was being written: it has waited since
            started_waiting = self._last_write_started
        except trio.WouldBlock:
            try:
                first = await receive.receive()
            except trio.EndOfChannel:
                return []
            started_waiting = trio.current_time()
        except trio.EndOfChannel:
            return []
        group = list(first)  # the submitter's list is theirs; extend a copy
        gathered_bytes = sum([r.body_bytes for r in first])
        deadline = started_waiting + config.group_wait_ms_max / 1000.0
        while gathered_bytes < config.group_bytes_max:
            more = await self._next_batch_before(deadline)
            if more is None:
                break
            group.extend(more)
            gathered_bytes += sum([r.body_bytes for r in more])
        return group

    async def _next_batch_before(self, deadline: float) -> list[Request] | None:
        """The next queued batch, or None when the group should be written now."""
        try:
            return self._receive.receive_nowait()
        except trio.WouldBlock:
            pass
        except trio.EndOfChannel:
            return None
        if self._config.flush_when_queue_empty:
            return None
        with trio.move_on_at(deadline):
            try:
                return await self._receive.receive()
            except trio.EndOfChannel:
                return None
        return None

    async def _commit(
        self,
        group: list[Request],
        previous: trio.Event | None,
        sync_slots: trio.Semaphore,
    ) -> trio.Event | None:
        """Write one group, and start its sync, which hands it to the ledgers once it
        and every group before it are durable. Returns the event set when that is
        done (`previous` if nothing was started). Holds one of `sync_slots`."""
        writer = self._writer
        assert writer is not None
        first_seq = self._next_seq
        self._last_write_started = trio.current_time()
        try:
            # encoded here, on the event loop, not in the thread: it is pure Python,
            # and a thread would only take the GIL back and forth with the loop.
            # Joined into one buffer: a write of one buffer copies into the page
            # cache faster than one of the batch's hundreds of bodies, which pays for
            # the join, and `fits` sums one length rather than hundreds (figures:
            # docs/performance.md)
            batch = [encode_batch(group, first_seq)]
        except ValueError as exc:
            # the group holds something the format cannot carry (an id out of range,
            # an oversized payload): the API validates first, so this is a caller's
            # bug. Nothing was written: refuse this group, keep the journal going.
            refused = JournalError(f"the journal refused a group of {len(group)}: {exc}")
            for request in group:
                request.fail(refused)
            sync_slots.release()
            return previous
        rolls = not writer.fits(batch)
        if previous is not None and rolls:
            # the write rolls to a new segment, which closes the old one: no sync of
            # the old one may still be running
            await previous.wait()
        # before writing: the encoder numbered the group from where the journal is
        assert group[0].seq == first_seq and group[-1].seq == first_seq + len(group) - 1, (
            first_seq,
            group[0].seq,
            group[-1].seq,
        )
        self._next_seq += len(group)
        try:
            if rolls:
                # a roll makes a file and syncs twice: milliseconds, not for the loop
                written = await trio.to_thread.run_sync(
                    writer.write_encoded, batch, len(group), first_seq
                )
            else:
                # written on the event loop: a page-cache write of at most
                # group_bytes_max costs less than the two thread hand-offs it would
                # wait for otherwise. It stays here: under sustained load, and beside
                # a writer holding the kernel's dirty pages at their threshold, the
                # loop's long stalls were waits for a core or the GIL, not this write
                # (docs/performance.md, "Event-loop stalls")
                written = writer.write_encoded(batch, len(group), first_seq)
        except OSError as exc:
            if previous is not None:
                await previous.wait()  # what was written before stays acknowledged
            self._fail(group, exc)
            sync_slots.release()
            return previous
        spares = self._spares
        if (
            spares is not None
            and writer.open_segment_bytes_used >= self._config.segment_bytes // 4
            and spares.wanted()
            and writer.open_segment != self._spare_failed_in
        ):
            self._spare_wanted.set()
        done = trio.Event()
        # the sync starts now, not when some task first runs (a turn later); its end
        # calls `_hand_over_synced`, which gives the slot back once handed over
        sync = SyncInThread(writer, self._on_sync_end)
        self._unsynced.append(WrittenGroup(group, written, sync, done, sync_slots))
        return done

    def _on_sync_end(self) -> None:
        self._a_sync_ended.set()
        self._hand_over_synced()

    async def _wait_for_syncs_in_flight(self) -> None:
        """Even a cancelled journal waits for the fdatasyncs it started before closing
        the segment: their threads use its file descriptor, which a close would pull
        from under them (a sync of a closed or, worse, reused descriptor)."""
        with trio.CancelScope(shield=True):
            while any(not unsynced.sync.ended for unsynced in self._unsynced):
                self._a_sync_ended = trio.Event()
                await self._a_sync_ended.wait()

    def _hand_over_synced(self) -> None:
        """Hand over every group whose sync has ended and all of whose predecessors
        are handed over: acknowledgements stay in journal order. Called when a sync
        ends, by the code that learns of it, so that the group's acks go out in this
        turn of the event loop (a task woken instead would run in the next one), and
        after a hand-over that had to wait."""
        unsynced = self._unsynced
        while unsynced and not self._handing_over_later and unsynced[0].sync.ended:
            head = unsynced.popleft()
            sync_seconds = self._hand_over_now(head)
            if sync_seconds is not None:
                self._handing_over_later = True
                assert self._nursery is not None
                self._nursery.start_soon(self._hand_over_later, head, sync_seconds)

    def _hand_over_now(self, unsynced: WrittenGroup) -> float | None:
        """Settle one synced group without waiting. Returns None when settled, or the
        sync's seconds when a ledger channel is full and the hand-over must wait
        (then nothing was done)."""
        group = unsynced.group
        try:
            sync_seconds = unsynced.sync.outcome()
        except OSError as exc:
            self._fail(group, exc)
            unsynced.settle(GroupState.FAILED)
            return None
        if self._failure is not None:
            # an earlier group failed: this one was written after it, and a sync
            # after a failed one proves nothing
            for request in group:
                request.fail(self._failure)
            unsynced.settle(GroupState.FAILED)
            return None
        trace = self.trace
        if trace is not None:
            trace.group_synced(group, sync_seconds)
        dispatch_nowait = self._dispatch_nowait
        if dispatch_nowait is None or not dispatch_nowait(group):
            unsynced.move_to(GroupState.WAITING_FOR_LEDGERS)
            return sync_seconds
        self._count_commit(unsynced, sync_seconds)
        unsynced.settle(GroupState.HANDED_OVER)
        return None

    async def _hand_over_later(self, unsynced: WrittenGroup, sync_seconds: float) -> None:
        """The hand-over of one group that waits for room in a ledger channel (the
        ledgers' backpressure); the groups after it wait for it."""
        handed_over = False
        try:
            await self._dispatch(unsynced.group)
            self._count_commit(unsynced, sync_seconds)
            handed_over = True
        finally:
            unsynced.settle(GroupState.HANDED_OVER if handed_over else GroupState.CANCELLED)
            self._handing_over_later = False
        self._hand_over_synced()

    def _count_commit(self, unsynced: WrittenGroup, sync_seconds: float) -> None:
        group = unsynced.group
        # counted in operations (each entry of a run is one), not in journal
        # records: what a user of the figures means by "records per group commit"
        operations = sum([len(request.bodies) for request in group])
        self._commits += 1
        self._operations += operations
        self._bytes_written += unsynced.written
        self._group_operations_max = max(self._group_operations_max, operations)
        self._sync_seconds_total += sync_seconds
        self._sync_seconds_max = max(self._sync_seconds_max, sync_seconds)
        for listener in self._commit_listeners:
            listener(operations, unsynced.written, sync_seconds)
        dispatched_seq = group[-1].seq + 1
        # groups are handed over in journal order, each once
        assert dispatched_seq > self._dispatched_seq, (dispatched_seq, self._dispatched_seq)
        self._dispatched_seq = dispatched_seq

    def _fail(self, group: list[Request], exc: OSError) -> None:
        """A journal write failed: nothing more can be acknowledged safely.

        After a failed fdatasync the kernel may have dropped the dirty pages, so a
        retry could report success for data that is gone. The journal stops; every
        queued request fails; the node keeps serving reads.
        """
        if self._failure is not None:  # failed already: this group was written after
            for request in group:
                request.fail(self._failure)
            return
        self._failure = JournalError(
            f"journal write failed in {self._directory} ({exc.strerror or exc}); "
            "the node no longer accepts writes. Free space or fix the disk, then restart "
            "the node: recovery replays everything that was acknowledged"
        )
        _log.error(
            "%s", _failure_advice(self._directory, exc),
            extra={"fields": {"errno": exc.errno, "journal_dir": str(self._directory)}},
        )  # fmt: skip
        for request in group:
            request.fail(self._failure)
        while True:
            try:
                queued = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            for request in queued:
                request.fail(self._failure)
        self._send.close()


def _failure_advice(directory: Path, exc: OSError) -> str:
    """The operator's view of a failed journal write: what failed, what the node does
    from now on, and what to do."""
    what = (
        f"journal write failed in {directory} ({exc.strerror or exc}): the node refuses "
        "every add, fence and close from now on (reads go on, /health answers 503) "
        "until it is restarted; nothing acknowledged is lost."
    )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            where = f"{describe(directory)} ({_mib(free_bytes(directory))} free now)"
        except OSError:
            where = "the journal's filesystem"
        return (
            f"{what} Free space on {where}, then restart the node: recovery replays "
            "everything acknowledged"
        )
    return (
        f"{what} Check the disk (kernel log, `dmesg`; SMART), then restart the node: "
        "recovery replays everything acknowledged. If the journal is damaged, the node "
        "refuses to start: see `pora journal verify`"
    )


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB"
