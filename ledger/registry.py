"""The ledgers of a node: their metadata, their workers, and routing to them.

The registry receives every synced journal group (`dispatch`), splits it by
ledger and hands each part to that ledger's worker, starting the worker if the
ledger has none (workers retire when idle). It serves reads from a worker's
memtable or from the index and entry log, and tells the trimmer how far the
journal is durable elsewhere.

That answer comes only from flushes that succeeded: a worker whose flush failed
keeps its oldest undurable seq, does not retire, and, if it ends (at `close`)
with entries still unflushed, stays counted (`unflushed_ledgers`), so that the
journal holding those entries is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import trio

from journal.request import Request
from ledger.errors import FlushFailed, NoSuchEntry, NoSuchLedger, ledger_list
from ledger.state import LedgerMeta, LedgerState
from ledger.storage import LedgerStorage
from ledger.worker import FlushBarrier, LedgerWorker


@dataclass(frozen=True, slots=True)
class RegistryStatistics:
    ledgers: int
    active_workers: int
    workers_started: int
    workers_retired: int
    memtable_unflushed_bytes: int
    open_files: int


class LedgerRegistry:
    def __init__(self, storage: LedgerStorage, metas: dict[int, LedgerMeta]) -> None:
        self.storage = storage
        #: every ledger on the node, active or not; workers mutate their own entry
        self.metas = metas
        self.active: dict[int, LedgerWorker] = {}
        #: workers that ended (at close) with entries their last flush failed to make
        #: durable: the journal must keep those entries for the next start to replay
        self._ended_unflushed: dict[int, LedgerWorker] = {}
        self._nursery: trio.Nursery | None = None
        self._closing = False
        self._closed = trio.Event()
        self._workers_started = 0
        self._workers_retired = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the ledger workers until `close` and until every worker has drained."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            housekeeping = trio.CancelScope()

            async def keep_house() -> None:
                with housekeeping:
                    await self._keep_house()

            nursery.start_soon(keep_house)
            task_status.started()
            await self._closed.wait()
            housekeeping.cancel()
            # the workers drain their channels, flush, and return; the nursery waits

    async def _keep_house(self) -> None:
        """Give every active worker a periodic look at its timers (flush interval,
        idle retirement): one task for all, rather than a deadline on every wait."""
        config = self.storage.config
        shorter_ms = min(config.flush_interval_ms, config.idle_retire_ms)
        interval_s = min(1.0, max(0.01, shorter_ms / 4 / 1000))
        while True:
            await trio.sleep(interval_s)
            now = trio.current_time()
            for worker in list(self.active.values()):
                worker.on_tick(now)

    def close(self) -> None:
        """Stop the workers once they have applied and flushed everything queued."""
        self._closing = True
        for worker in list(self.active.values()):
            worker.send.close()
        self.active.clear()
        self._closed.set()

    # --- the write path --------------------------------------------------------------------

    async def dispatch(self, group: list[Request]) -> None:
        """Hand a synced journal group to the ledger workers, in journal order."""
        first_ledger = group[0].ledger_id
        if all(r.ledger_id == first_ledger for r in group):
            await self._send(first_ledger, group)
            return
        await self.dispatch_parts(_by_ledger(group))

    async def dispatch_parts(self, parts: Mapping[int, list[Request]]) -> None:
        """Hand each ledger its part of the journal (in journal order), split by
        ledger already: replay's runs (journal/replay_runs.py)."""
        for ledger_id, part in parts.items():
            await self._send(ledger_id, part)

    def dispatch_nowait(self, group: list[Request]) -> bool:
        """`dispatch` without waiting: True when every part went into its ledger's
        channel; False, with nothing handed over, when one of them is full."""
        first_ledger = group[0].ledger_id
        if all(r.ledger_id == first_ledger for r in group):
            return self._send_nowait(first_ledger, group)
        by_ledger = _by_ledger(group)
        for ledger_id in by_ledger:
            worker = self.active.get(ledger_id)
            if worker is not None and worker.channel_full:
                return False
        for ledger_id, part in by_ledger.items():
            sent = self._send_nowait(ledger_id, part)
            assert sent, "a channel with room refused a part"
        return True

    def _send_nowait(self, ledger_id: int, part: list[Request]) -> bool:
        worker = self.active.get(ledger_id)
        if worker is None:
            worker = self._start_worker(ledger_id)
        return worker.offer_nowait(part)

    async def _send(self, ledger_id: int, part: list[Request]) -> None:
        worker = self.active.get(ledger_id)
        if worker is None:
            worker = self._start_worker(ledger_id)
        await worker.enqueue(part)

    def _start_worker(self, ledger_id: int) -> LedgerWorker:
        if self._nursery is None or self._closing:
            raise RuntimeError("the ledger registry is not running")
        worker = LedgerWorker(ledger_id, self.storage, self.metas, self._retire)
        self.active[ledger_id] = worker
        self._workers_started += 1
        self._nursery.start_soon(self._run_worker, worker)
        return worker

    async def _run_worker(self, worker: LedgerWorker) -> None:
        await worker.run()
        if worker.oldest_undurable_seq() is not None:
            self._ended_unflushed[worker.ledger_id] = worker

    def _retire(self, worker: LedgerWorker) -> None:
        if self.active.get(worker.ledger_id) is worker:
            del self.active[worker.ledger_id]
        worker.send.close()
        self._workers_retired += 1

    async def flush_all(self, *, undurable_before: int | None = None) -> None:
        """Apply and flush everything dispatched so far, in every ledger; or only in
        the ledgers holding something undurable from before journal seq
        `undurable_before` (those keep the journal from being trimmed there), and
        whose last flush did not fail (those retry on their own schedule: asked
        again at every trim, a full disk would have them fail and log every
        second).

        Raises FlushFailed, naming them, if the flush of any ledger failed: their
        entries are then in memory and in the journal only (and still counted in
        `oldest_undurable_seq`); the other ledgers' flushes went through."""
        barriers: list[tuple[int, FlushBarrier]] = []
        for worker in list(self.active.values()):
            if undurable_before is not None:
                oldest = worker.oldest_undurable_seq()
                if oldest is None or oldest >= undurable_before or worker.flush_failing:
                    continue
            barrier = FlushBarrier()
            try:
                await worker.send.send(barrier)
            except trio.ClosedResourceError:  # retired meanwhile: it flushed on the way out
                continue
            barriers.append((worker.ledger_id, barrier))
        failures: dict[int, str] = {}
        for ledger_id, barrier in barriers:
            await barrier.done.wait()
            if barrier.failure is not None:
                failures[ledger_id] = barrier.failure
        if failures:
            failed = sorted(failures)
            raise FlushFailed(
                failed,
                f"the flush of {len(failed)} ledger(s) to their entry logs failed "
                f"(ledgers {ledger_list(failed)}; first: {failures[failed[0]]}); their "
                "entries stay in memory and in the journal until a flush succeeds",
            )

    def unflushed_ledgers(self) -> dict[int, str]:
        """The ledgers whose last flush failed and that hold entries not yet durable
        outside the journal, with why: running workers, and those that ended so (at
        `close`)."""
        unflushed = {
            ledger_id: worker.flush_failure
            for ledger_id, worker in self.active.items()
            if worker.flush_failure is not None and worker.oldest_undurable_seq() is not None
        }
        for ledger_id, worker in self._ended_unflushed.items():
            unflushed[ledger_id] = worker.flush_failure or "its last flush did not finish"
        return unflushed

    # --- what the trimmer needs ------------------------------------------------------------

    def oldest_undurable_seq(self) -> int | None:
        """The smallest journal seq not yet durable in entry logs and index, if any."""
        oldest: int | None = None
        for worker in (*self.active.values(), *self._ended_unflushed.values()):
            seq = worker.oldest_undurable_seq()
            if seq is not None and (oldest is None or seq < oldest):
                oldest = seq
        return oldest

    # --- reads -------------------------------------------------------------------------------

    def meta(self, ledger_id: int) -> LedgerMeta:
        meta = self.metas.get(ledger_id)
        if meta is None:
            raise NoSuchLedger(ledger_id)
        return meta

    async def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        meta = self.meta(ledger_id)
        if meta.state is LedgerState.CLOSED and entry_id > meta.sealed_last_entry_id:
            raise NoSuchEntry(ledger_id, entry_id)
        worker = self.active.get(ledger_id)
        if worker is not None:
            payload = worker.memtable.get(entry_id)
            if payload is not None:
                return payload
            if worker.delete_pending:  # the index may still hold a former incarnation
                raise NoSuchEntry(ledger_id, entry_id)
        if meta.log_end == 0 or entry_id > meta.last_entry_id:
            raise NoSuchEntry(ledger_id, entry_id)
        storage = self.storage
        log = await storage.acquire_log(ledger_id, create=False)
        try:
            return await trio.to_thread.run_sync(storage.read_stored, log, ledger_id, entry_id)
        finally:
            storage.release_log(ledger_id)

    async def read_range(
        self, ledger_id: int, first: int, last: int, max_entries: int, max_bytes: int
    ) -> tuple[list[tuple[int, bytes]], bool]:
        """Stored entries with ids in [first, last] (see Node.read_range), and whether
        a cap stopped the read before `last` (then the answer is complete only
        through its last entry)."""
        meta = self.meta(ledger_id)
        if meta.state is LedgerState.CLOSED:
            last = min(last, meta.sealed_last_entry_id)
        last = min(last, meta.last_entry_id)
        if last < first:
            return [], False
        found: dict[int, bytes] = {}
        worker = self.active.get(ledger_id)
        if worker is not None:
            found = worker.memtable.items_between(first, last)
        #: the last id the stored entries were looked through (a cap stops the look)
        looked_through = last
        if meta.log_end > 0 and not (worker is not None and worker.delete_pending):
            storage = self.storage

            def read_stored() -> tuple[list[tuple[int, bytes]], int]:
                positions: list[tuple[int, int, int]] = []
                wanted_bytes = 0
                through = last
                for position in storage.index.iter_positions(ledger_id, first, last):
                    if position[0] in found:
                        continue
                    if len(positions) >= max_entries or wanted_bytes >= max_bytes:
                        through = positions[-1][0]
                        break
                    positions.append(position)
                    wanted_bytes += position[2]
                positions.sort(key=lambda p: p[1])
                payloads = log.read_records(positions)
                stored = [(p[0], payload) for p, payload in zip(positions, payloads, strict=True)]
                return stored, through

            log = await storage.acquire_log(ledger_id, create=False)
            try:
                stored, looked_through = await trio.to_thread.run_sync(read_stored)
            finally:
                storage.release_log(ledger_id)
            found.update(stored)
        entries: list[tuple[int, bytes]] = []
        total = 0
        more = looked_through < last
        for entry_id in sorted(found):
            payload = found[entry_id]
            if entry_id > looked_through:
                break  # (stored entries past it were not looked at)
            if entries and (len(entries) >= max_entries or total + len(payload) > max_bytes):
                more = True
                break
            entries.append((entry_id, payload))
            total += len(payload)
        return entries, more

    def note_lac(self, ledger_id: int, lac: int) -> int:
        """Raise the ledger's last-add-confirmed to `lac` (a writer's WRITE_LAC; kept
        in memory only: it is a lower bound, and may fall back to the last persisted
        value after a crash), wake its long polls, and return the LAC now."""
        meta = self.meta(ledger_id)
        if lac > meta.lac:
            meta.lac = lac
            self.storage.arrivals.signal(ledger_id)
        return meta.lac

    def statistics(self) -> RegistryStatistics:
        return RegistryStatistics(
            ledgers=len(self.metas),
            active_workers=len(self.active),
            workers_started=self._workers_started,
            workers_retired=self._workers_retired,
            memtable_unflushed_bytes=self.storage.budget.unflushed_bytes,
            open_files=len(self.storage.files),
        )


def _by_ledger(group: list[Request]) -> dict[int, list[Request]]:
    """The group's requests split by ledger, each part in journal order."""
    by_ledger: dict[int, list[Request]] = {}
    for request in group:
        part = by_ledger.get(request.ledger_id)
        if part is None:
            by_ledger[request.ledger_id] = [request]
        else:
            part.append(request)
    return by_ledger
