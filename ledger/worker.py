"""One ledger's worker: the only task that touches the ledger's private workspace.

(Or rather, the one task but for one case: while it waits for input with none
queued, the journal's hand-over applies a synced batch at once (`offer_nowait`),
which is what the task would do first when woken, one turn of the loop later.)

It applies journalled requests in journal order (so replay after a crash applies
the same requests in the same order and reaches the same state), completes them,
and flushes its memtable in the background: entry log write + fdatasync, and only
then the index positions and metadata, in one LevelDB batch.

Bookkeeping for journal trimming: the worker knows the oldest journal seq of this
ledger that is not yet durable outside the journal (queued in its channel, applied
but unflushed, or being flushed). The trimmer keeps every segment at or after the
smallest such seq across ledgers.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import trio

from journal.errors import PoraError
from journal.format import BODY_HEADER_SIZE, CLOSE_KEEP_ALL, RecordFlag, RecordKind
from journal.request import LedgerPart, Request
from ledger.entrylog import EntryLog
from ledger.entrylog_format import (
    FIRST_RECORD_OFFSET,
    STATE_ENTRY_ID,
    LedgerStateRecord,
    encode_record,
    encode_state_record,
)
from ledger.errors import (
    EntryConflict,
    LedgerClosed,
    LedgerDeleted,
    LedgerFenced,
    NoSuchLedger,
    describe_os_error,
)
from ledger.memtable import Body, Memtable
from ledger.state import NO_ENTRY, LedgerMeta, LedgerState

if TYPE_CHECKING:
    from ledger.storage import LedgerStorage


_log = logging.getLogger("pora.ledger")

_ENTRY_ONLY: Final = {RecordKind.ENTRY}


class FlushBarrier(list[Request]):
    """Sent through a ledger channel in place of a batch: flush everything before me.

    Once `done` is set, `failure` says whether that flush failed (why, or None)."""

    def __init__(self) -> None:
        super().__init__()
        self.done = trio.Event()
        self.failure: str | None = None


class LedgerWorker:
    def __init__(
        self,
        ledger_id: int,
        storage: LedgerStorage,
        metas: dict[int, LedgerMeta],
        retire: Callable[[LedgerWorker], None],
    ) -> None:
        config = storage.config
        self.ledger_id = ledger_id
        self._storage = storage
        self._metas = metas
        self._retire = retire
        self.send, self._receive = trio.open_memory_channel[list[Request]](
            config.ledger_channel_batches_max
        )
        self.memtable = Memtable(storage.budget, config.recent_bytes_max)
        #: first seq of each batch dispatched to us and not yet applied
        self._queued_seqs: collections.deque[int] = collections.deque()
        #: first seq applied since the last flush began (None: nothing to flush)
        self._unflushed_since: int | None = None
        #: first seq covered by the flush in progress
        self._flushing_since: int | None = None
        self._applied_seq = -1
        self._dirty_since = 0.0
        self._last_activity = trio.current_time()
        self._flush_running = False
        self._flush_finished = trio.Event()
        #: the ledger was deleted and its files and index keys are not yet removed
        self.delete_pending = False
        #: why the last flush failed (None: it succeeded, or none ran yet)
        self._last_flush_failure: str | None = None
        self._nursery: trio.Nursery | None = None
        #: the ledger state this worker last wrote to the entry log (None: not yet)
        self._logged_state: LedgerStateRecord | None = None

    @property
    def meta(self) -> LedgerMeta | None:
        return self._metas.get(self.ledger_id)

    @property
    def flush_failing(self) -> bool:
        """The last flush failed (a full or failing disk): it retries on its own
        schedule, every `flush_interval_ms`. Until one succeeds, what it holds stays
        in `oldest_undurable_seq`, and the worker does not retire."""
        return self._last_flush_failure is not None

    @property
    def flush_failure(self) -> str | None:
        """Why the last flush failed, or None."""
        return self._last_flush_failure

    def oldest_undurable_seq(self) -> int | None:
        """The smallest journal seq of this ledger not yet durable elsewhere."""
        candidates = [s for s in (self._flushing_since, self._unflushed_since) if s is not None]
        if self._queued_seqs:
            candidates.append(self._queued_seqs[0])
        return min(candidates) if candidates else None

    # --- the task ------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until the input closes (shutdown or retirement), then flush what is
        left. If that flush fails, `oldest_undurable_seq` still says what the
        journal must keep: the registry asks it after this returns."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._serve()
            await self._flush_and_wait()

    async def _serve(self) -> None:
        config = self._storage.config
        receive = self._receive
        flush_interval_s = config.flush_interval_ms / 1000.0
        while True:
            # no deadline on the wait: timers are the registry's housekeeping task
            # (`on_tick`), so waiting costs no cancel scope per batch
            try:
                batch = receive.receive_nowait()
            except trio.WouldBlock:
                try:
                    batch = await receive.receive()
                except trio.EndOfChannel:
                    return
            except trio.EndOfChannel:
                return
            self._handle(batch)
            if self.memtable.unflushed_bytes >= config.memtable_ledger_bytes_max:
                # flushes fall behind: stop taking entries, so the channel fills and
                # the journal waits (backpressure) rather than memory growing
                await self._flush_and_wait()
                if self.flush_failing:
                    await trio.sleep(flush_interval_s)

    async def enqueue(self, batch: list[Request]) -> None:
        """Queue a synced batch for this worker; waits while its channel is full."""
        # counted from now: while it waits for room, the batch is not durable here
        self._queued_seqs.append(batch[0].seq)
        try:
            self.send.send_nowait(batch)
        except trio.WouldBlock:
            await self.send.send(batch)

    def offer_nowait(self, batch: list[Request]) -> bool:
        """Apply a synced batch at once (`_take_nowait`) or queue it; False, with
        nothing taken, when the channel is full."""
        if self._take_nowait(batch):
            return True
        try:
            self.send.send_nowait(batch)
        except trio.WouldBlock:
            return False
        self._queued_seqs.append(batch[0].seq)
        return True

    @property
    def channel_full(self) -> bool:
        """`offer_nowait` would refuse a batch now."""
        channel = self.send.statistics()
        return channel.current_buffer_used >= channel.max_buffer_size

    def _take_nowait(self, batch: list[Request]) -> bool:
        """Apply `batch` now, in the caller's task, if this worker's task waits for
        input with none queued (so nothing is ahead of the batch) and the memtable
        has room; False: send it through the channel. A synced group's acks then go
        out in the turn of the event loop that learnt of its sync, rather than in
        the next one, when the woken worker task would run."""
        channel = self.send.statistics()
        if (
            channel.current_buffer_used
            or not channel.tasks_waiting_receive
            or self.memtable.unflushed_bytes >= self._storage.config.memtable_ledger_bytes_max
        ):
            return False
        self._queued_seqs.append(batch[0].seq)
        self._handle(batch)
        return True

    def _handle(self, batch: list[Request]) -> None:
        if type(batch) is FlushBarrier:
            self._nursery_start(self._flush_for_barrier, batch)
            return
        self._queued_seqs.popleft()
        self._apply(batch)
        self._last_activity = trio.current_time()
        config = self._storage.config
        if not self._flush_running and (
            self.memtable.unflushed_bytes >= config.memtable_flush_bytes
            or self._storage.budget.exceeded
        ):
            self._nursery_start(self._flush)

    def on_tick(self, now: float) -> None:
        """The registry's periodic look: flush what has waited `flush_interval_ms`,
        retire when idle `idle_retire_ms` with nothing unflushed or queued."""
        config = self._storage.config
        if self._unflushed_since is not None:
            if (
                not self._flush_running
                and now >= self._dirty_since + config.flush_interval_ms / 1e3
            ):
                self._nursery_start(self._flush)
            return
        if (
            not self._flush_running
            and not self.delete_pending
            and now >= self._last_activity + config.idle_retire_ms / 1e3
            and self._receive.statistics().current_buffer_used == 0
        ):
            # idle and clean: retire (the registry forgets us and closes our input,
            # so the next request for this ledger starts a fresh worker)
            self._retire(self)

    def _nursery_start(self, fn: Callable[..., object], *args: object) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)  # type: ignore[arg-type]

    # --- applying requests (synchronous: journal order is apply order) ------------------

    def _apply(self, batch: list[Request]) -> None:
        metas = self._metas
        ledger_id = self.ledger_id
        meta = metas.get(ledger_id)
        if type(batch) is LedgerPart:
            self.memtable.replaying()  # its bodies are views of journal segments
        if meta is None or not self._append_run(batch, meta):
            self._apply_one_by_one(batch)
        if self._unflushed_since is None:
            self._unflushed_since = batch[0].seq
            self._dirty_since = trio.current_time()
        # a replayed part's last request may merge records: the part knows its last seq
        self._applied_seq = batch.last_seq if type(batch) is LedgerPart else batch[-1].seq
        self._storage.arrivals.signal(ledger_id)  # long-poll readers look again

    def _append_run(self, batch: list[Request], meta: LedgerMeta) -> bool:
        """Apply the batch at once if it is the common case: runs of new entries with
        consecutive ids right past the head of an open ledger (what pipelining
        writers send). Checked and applied with list operations, not a Python step
        per check per entry: this bounds the node's add rate. False: not that case,
        nothing was applied."""
        if meta.state is not LedgerState.OPEN or meta.fenced:
            return False
        first = batch[0].entry_id
        if first <= meta.last_entry_id:
            return False
        if len(batch) == 1:
            request = batch[0]
            if request.kind is not RecordKind.ENTRY:
                return False
            bodies = request.bodies
            count = len(bodies)
            lac = request.lac
        else:
            starts = [request.entry_id for request in batch]
            counts = [len(request.bodies) for request in batch]
            if {request.kind for request in batch} != _ENTRY_ONLY or starts != list(
                itertools.accumulate(counts[:-1], initial=first)
            ):
                return False
            bodies = list(itertools.chain.from_iterable([r.bodies for r in batch]))
            count = len(bodies)
            lac = max([request.lac for request in batch])
        last = first + count - 1
        body_bytes = self.memtable.put_many(range(first, last + 1), bodies)
        if meta.first_entry_id == NO_ENTRY:
            meta.first_entry_id = first
        meta.last_entry_id = last
        meta.entry_count += count
        meta.payload_bytes += body_bytes - count * BODY_HEADER_SIZE
        if lac > meta.lac:  # noqa: PLR1730 (a compare is cheaper than max())
            meta.lac = lac
        for request in batch:
            on_done = request.on_done
            if on_done is not None:
                on_done(request)
        return True

    def _apply_one_by_one(self, batch: list[Request]) -> None:
        for request in batch:
            kind = request.kind
            if kind is RecordKind.ENTRY:
                self._apply_entries(request)
            elif kind is RecordKind.FENCE:
                fenced = self._meta_or_create()
                if fenced is None:
                    request.fail(LedgerDeleted(self.ledger_id, " on this node"))
                    continue
                if not fenced.fenced:
                    fenced.fenced = True
                    fenced.fence_seq = request.seq
                request.complete(_last_visible(fenced))
            elif kind is RecordKind.CLOSE:
                self._apply_close(request)
            elif kind is RecordKind.DELETE:
                self._apply_delete(request)
            elif kind is RecordKind.KEY:
                keyed = self._meta_or_create()
                if keyed is None:
                    request.fail(LedgerDeleted(self.ledger_id, " on this node"))
                    continue
                if keyed.master_key is None:
                    keyed.master_key = bytes(request.payload)
                request.complete()
            else:  # the journal reader rejects unknown kinds; this is a bug
                raise AssertionError(f"unknown record kind {kind!r}")

    def _meta_or_create(self) -> LedgerMeta | None:
        """The ledger's metadata, created if the ledger is new here; None when this
        node deleted it (a request journalled before the delete was applied, or
        replayed from an older journal, must not bring it back)."""
        meta = self._metas.get(self.ledger_id)
        if meta is None:
            if self._storage.keys.deleted(self.ledger_id):
                return None
            meta = LedgerMeta(self.ledger_id, created_ms=time.time_ns() // 1_000_000)
            self._metas[self.ledger_id] = meta
        return meta

    def _apply_entries(self, request: Request) -> None:
        """An ENTRY request (one entry or a run) the fast path did not take: a
        closed or fenced ledger, or entries that may be stored already (retries)."""
        meta = self._meta_or_create()
        if meta is None:
            request.fail(LedgerDeleted(self.ledger_id, " on this node"))
            return
        if meta.state is LedgerState.CLOSED:
            request.fail(LedgerClosed(self.ledger_id))
            return
        if meta.fenced and not request.flags & RecordFlag.RECOVERY_ADD:
            request.fail(LedgerFenced(self.ledger_id))
            return
        errors: list[BaseException | None] = []
        for index, body in enumerate(request.bodies):
            errors.append(self._apply_entry(meta, request.entry_id + index, body))
        if meta.lac < request.lac:  # noqa: PLR1730 (a compare is cheaper than max())
            meta.lac = request.lac
        first_error = next((error for error in errors if error is not None), None)
        if first_error is None:
            request.complete()
        elif all(error is first_error for error in errors):
            request.fail(first_error)
        else:
            request.entry_errors = errors
            request.complete()

    def _apply_entry(self, meta: LedgerMeta, entry_id: int, body: Body) -> BaseException | None:
        """Store one entry; None, or the error this entry fails with."""
        payload = memoryview(body)[BODY_HEADER_SIZE:]
        if entry_id <= meta.last_entry_id:
            # out of order or a retry: it may be stored already
            stored = self._stored_payload(entry_id)
            if stored is not None:
                return None if stored == payload else EntryConflict(self.ledger_id, entry_id)
        self.memtable.put(entry_id, body)
        meta.last_entry_id = max(meta.last_entry_id, entry_id)
        if meta.first_entry_id == NO_ENTRY or entry_id < meta.first_entry_id:
            meta.first_entry_id = entry_id
        meta.entry_count += 1
        meta.payload_bytes += len(payload)
        return None

    def _stored_payload(self, entry_id: int) -> bytes | None:
        """The payload stored for `entry_id`, if any.

        Only reached for out-of-order adds and retries. It reads the index and maybe
        the entry log on the event-loop thread: both are short (bloom filter, one
        pread), and doing it here keeps apply synchronous, which keeps journal order.
        Its stalls under load are not measured yet (docs/performance.md, "Event-loop
        stalls").
        """
        payload = self.memtable.get(entry_id)
        if payload is not None or self.delete_pending:
            return payload
        storage = self._storage
        position = storage.index.get_position(self.ledger_id, entry_id)
        if position is None:
            return None
        log = storage.files.acquire(self.ledger_id, self._open_log_blocking)
        try:
            return log.read_record(position[0], position[1], entry_id)
        finally:
            storage.files.release(self.ledger_id)

    def _open_log_blocking(self) -> EntryLog:
        config = self._storage.config
        return EntryLog.open(
            self._storage.entrylog_path(self.ledger_id),
            self.ledger_id,
            prealloc_chunk_bytes=config.entrylog_prealloc_bytes,
            fsync=config.fsync,
        )

    def _apply_close(self, request: Request) -> None:
        meta = self._meta_or_create()
        if meta is None:
            request.fail(LedgerDeleted(self.ledger_id, " on this node"))
            return
        seal = meta.last_entry_id if request.entry_id == CLOSE_KEEP_ALL else request.entry_id
        if meta.state is LedgerState.CLOSED:
            # closing again is harmless when it agrees with the first close
            if request.entry_id in (CLOSE_KEEP_ALL, meta.sealed_last_entry_id):
                request.complete(meta.sealed_last_entry_id)
            else:
                request.fail(LedgerClosed(self.ledger_id))
            return
        meta.state = LedgerState.CLOSED
        meta.sealed_last_entry_id = seal
        request.complete(seal)

    def _apply_delete(self, request: Request) -> None:
        if self._metas.pop(self.ledger_id, None) is None:
            request.fail(NoSuchLedger(self.ledger_id))
            return
        self.memtable.clear()
        self.delete_pending = True
        self._logged_state = None
        self._storage.keys.forget(self.ledger_id)
        request.complete()

    # --- flushing ------------------------------------------------------------------------

    async def _flush_and_wait(self) -> None:
        while self._flush_running:
            await self._flush_finished.wait()
        if self._unflushed_since is not None or self.delete_pending:
            await self._flush()

    async def _flush_for_barrier(self, barrier: FlushBarrier) -> None:
        await self._flush_and_wait()
        barrier.failure = self._last_flush_failure
        barrier.done.set()

    async def _flush(self) -> None:
        if self._flush_running:
            return
        self._flush_running = True
        self._flush_finished = trio.Event()
        memtable = self.memtable
        entries = memtable.begin_flush()
        self._flushing_since, self._unflushed_since = self._unflushed_since, None
        durable_seq = self._applied_seq
        delete_first = self.delete_pending
        meta = self.meta
        snapshot = dataclasses.replace(meta) if meta is not None else None
        try:
            if delete_first:
                await self._delete_storage()
            if snapshot is not None:
                await self._write_flush(
                    entries, snapshot, durable_seq, create=snapshot.log_end == 0
                )
                if meta is self.meta and meta is not None:
                    meta.log_end = snapshot.log_end
                    meta.durable_seq = durable_seq
            memtable.end_flush()
            self._last_flush_failure = None
        except OSError as exc:
            # a full or failing disk: nothing is lost (the journal keeps every record
            # until a flush succeeds, the memtable keeps serving reads); retry later
            self._last_flush_failure = self._flush_failure_text(exc)
            _log.error(
                "flush of ledger %d failed: %s; its entries stay in memory and in the "
                "journal (which keeps them until a flush succeeds), retrying every %.0f ms",
                self.ledger_id,
                self._last_flush_failure,
                self._storage.config.flush_interval_ms,
            )
            self._undo_flush()
            self.delete_pending = self.delete_pending or delete_first
        except BaseException:
            self._undo_flush()
            raise
        finally:
            self._flushing_since = None
            self._flush_running = False
            self._flush_finished.set()

    def _flush_failure_text(self, error: OSError) -> str:
        """What failed, where: the file as text and the errno's name and meaning."""
        if isinstance(error, PoraError):  # ours (UnindexedEntryLog): it says all of that
            return str(error)
        if error.errno is None:  # LevelDB's (plyvel.IOError): its message names the file
            return f"index write failed: {describe_os_error(error)}"
        path = error.filename
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if path is None:  # the entry log's writes and syncs name no file
            path = self._storage.entrylog_path(self.ledger_id)
        return f"{describe_os_error(error)} on {path}"

    def _undo_flush(self) -> None:
        self.memtable.abort_flush()
        if self._flushing_since is not None and (
            self._unflushed_since is None or self._flushing_since < self._unflushed_since
        ):
            self._unflushed_since = self._flushing_since
        self._dirty_since = trio.current_time()

    async def _write_flush(
        self, entries: dict[int, Body], snapshot: LedgerMeta, durable_seq: int, *, create: bool
    ) -> None:
        entry_ids, bodies = self._in_entry_order(entries)
        state = LedgerStateRecord(
            snapshot.state, snapshot.fenced, snapshot.sealed_last_entry_id, snapshot.master_key
        )
        if state != self._logged_state:
            # the entry log carries the ledger's state too, so that a lost index can be
            # rebuilt from the logs (`pora verify --rebuild-index`); the last one wins.
            # Written after the entries, and not indexed: it is not an entry
            bodies.append(encode_record(self.ledger_id, STATE_ENTRY_ID, encode_state_record(state)))
        if not bodies:
            await self._write_meta(snapshot, durable_seq)
            return
        await self._write_bodies(entry_ids, bodies, snapshot, durable_seq, create=create)
        self._logged_state = state

    def _in_entry_order(self, entries: dict[int, Body]) -> tuple[list[int], list[Body]]:
        """The flush's entry ids and bodies, in entry-id order: range reads become
        sequential (appends come in order already). Two lists made in C: a flush
        holds thousands of entries."""
        if self.memtable.flushing_in_order:
            return list(entries), list(entries.values())
        entry_ids = sorted(entries)
        return entry_ids, [entries[entry_id] for entry_id in entry_ids]

    async def _write_meta(self, snapshot: LedgerMeta, durable_seq: int) -> None:
        """A flush with nothing to write to the entry log: the metadata only."""
        index = self._storage.index
        await trio.to_thread.run_sync(
            lambda: index.put_meta(dataclasses.replace(snapshot, durable_seq=durable_seq)),
            limiter=self._storage.flush_limiter,
        )
        snapshot.durable_seq = durable_seq

    async def _write_bodies(
        self,
        entry_ids: list[int],
        bodies: list[Body],
        snapshot: LedgerMeta,
        durable_seq: int,
        *,
        create: bool,
    ) -> None:
        """Append the bodies to the entry log and sync it, then index the entries'
        positions with the metadata in one batch; `snapshot` gets the new log end."""
        storage = self._storage
        ledger_id = self.ledger_id
        index = storage.index

        def write() -> None:
            # a new log's records start after its header
            start = max(snapshot.log_end, FIRST_RECORD_OFFSET)
            lengths = log.write_bodies(bodies, start)
            log.sync()  # entry-log bytes are on disk before the index points at them
            snapshot.log_end = start + sum(lengths)
            snapshot.durable_seq = durable_seq
            del lengths[len(entry_ids) :]  # the state record's
            index.apply_back_to_back(ledger_id, entry_ids, start, lengths, snapshot)

        # take a flush slot first and only then pin the file: with thousands of
        # ledgers flushing at once, pinning while queued for a slot would hold
        # thousands of files open, past the open_files_max cap
        async with storage.flush_limiter:
            log = await storage.acquire_log(ledger_id, create=create)
            try:
                await trio.to_thread.run_sync(write, limiter=storage.slot_held)
            finally:
                storage.release_log(ledger_id)

    async def _delete_storage(self) -> None:
        storage = self._storage
        ledger_id = self.ledger_id
        # a reader may hold the file for a moment; it fails cleanly once we are done
        await storage.files.discard_when_released(ledger_id)
        path = storage.entrylog_path(ledger_id)

        def delete() -> None:
            path.unlink(missing_ok=True)
            storage.index.delete_ledger(ledger_id)

        await trio.to_thread.run_sync(delete, limiter=storage.flush_limiter)
        storage.keys.tombstone_written(ledger_id)
        self.delete_pending = False


def _last_visible(meta: LedgerMeta) -> int:
    """The last entry id a reader of this ledger may see."""
    if meta.state is LedgerState.CLOSED:
        return meta.sealed_last_entry_id
    return meta.last_entry_id
