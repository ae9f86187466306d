"""The node's operations: adds, fences, closes, deletes and reads, over the journal
and the ledger registry that `open_node` (pora/node/lifecycle.py) starts."""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

import trio

from journal.errors import PoraError
from journal.format import (
    CLOSE_KEEP_ALL,
    MASTER_KEY_BYTES_MAX,
    RecordFlag,
    RecordKind,
)
from journal.request import (
    ID_MAX,
    RUN_ENTRIES_MAX,
    Add,
    Request,
    add_is_plain,
    entry_run_request,
    entry_runs,
    merged_runs,
)
from journal.task import CommitListener, Journal, JournalStatistics
from ledger.arrivals import ArrivalStatistics
from ledger.errors import (
    EntryTooLarge,
    InvalidArgument,
    LedgerClosed,
    LedgerFenced,
    NodeClosed,
    NodeReadOnly,
    NoSuchEntry,
    NoSuchLedger,
    Unauthorized,
)
from ledger.registry import LedgerRegistry, RegistryStatistics
from ledger.state import LedgerInfo, LedgerState
from pora.node.add_queue import AddQueue, Completion
from pora.node.config import NodeConfig
from pora.node.datadir import (
    DataDir,
)
from pora.node.replay import RecoveryReport
from pora.node.trimmer import JournalTrimmer

__all__ = ["FenceBarrier", "Node", "NodeStatistics"]

_log = logging.getLogger("pora.node")

#: read_range's defaults for max_entries and max_bytes (a caller may ask for more):
#: bound what one call gathers in memory
READ_RANGE_ENTRIES_DEFAULT: Final = 1024
READ_RANGE_BYTES_DEFAULT: Final = 4 << 20


@dataclass(frozen=True, slots=True)
class NodeStatistics:
    journal: JournalStatistics
    ledgers: RegistryStatistics
    journal_segments_trimmed: int
    recovery: RecoveryReport
    long_polls: ArrivalStatistics


#: what a node in a cluster awaits before it answers a fence, with the journal position
#: the record that fenced the ledger lies below: it returns once the node's mark in
#: the metadata store is past that record (R27, pora/server/node_mark.py)
FenceBarrier = Callable[[int], Awaitable[None]]


def _as_pora_error(error: BaseException | None) -> PoraError | None:
    if error is None or isinstance(error, PoraError):
        return error
    raise error  # not an outcome of the request: a bug, let it surface


def _check_id(kind: str, value: int) -> None:
    if not (isinstance(value, int) and 0 <= value <= ID_MAX):
        raise InvalidArgument(f"{kind} must be an integer in [0, 2**63), got {value!r}")


def _check_master_key(master_key: bytes) -> None:
    # the journal and entry-log state records hold at most this many bytes of key
    if len(master_key) > MASTER_KEY_BYTES_MAX:
        raise InvalidArgument(f"a master key has at most {MASTER_KEY_BYTES_MAX} bytes")


class Node:
    """A running node. Make one with `open_node`; every method is safe to call
    from many tasks at once."""

    def __init__(
        self,
        data_dir: DataDir,
        config: NodeConfig,
        journal: Journal,
        registry: LedgerRegistry,
        trimmer: JournalTrimmer,
        recovery: RecoveryReport,
        fence_barrier: FenceBarrier | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.config = config
        self._journal = journal
        self._registry = registry
        self._recovery = recovery
        self._trimmer = trimmer
        self._closed = False
        self._read_only: str | None = None
        self._keys = registry.storage.keys
        self._arrivals = registry.storage.arrivals
        # the adds of many tasks in one turn become one submission; as many wait
        # for it as the journal's channel holds batches
        self._adds = AddQueue(
            self.submit, config.entry_bytes_max, self._refusal, config.journal.channel_batches_max
        )
        #: awaited before a fence is answered (R27); None: a node outside a cluster
        #: answers a fence once it is journalled
        self._fence_barrier = fence_barrier

    def stop_taking_requests(self) -> None:
        """Refuse what is submitted from now on with NodeClosed (the node stops)."""
        self._closed = True

    # --- writes ------------------------------------------------------------------------------

    async def submit(self, requests: list[Request]) -> None:
        """Queue requests made by `entry_request` (or fence/close requests); each
        completes through its `on_done`, with `error` None or a PoraError.

        The batch entry point for network workers: one channel send for many
        requests. Requests refused at once (read-only node, wrong master key) are
        completed before this returns and are not journalled. Waits while the
        journal channel is full (backpressure).
        """
        if self._closed:
            raise NodeClosed("the node is shutting down")
        if self._read_only is not None:
            refusal = NodeReadOnly(f"the node takes no writes for now: {self._read_only}")
            for request in requests:
                request.fail(refusal)
            return
        batch = self._keys.admit(requests, self._registry.metas)
        if not batch:
            await trio.lowlevel.checkpoint()
            return
        try:
            self._journal.submit_nowait(batch)
        except trio.WouldBlock:
            await self._journal.submit(batch)

    async def _perform(self, requests: list[Request]) -> None:
        """Submit `requests` and wait until every one of them has completed.

        Cancelling the wait does not cancel the requests (`Completion`): the caller
        then does not know whether they were stored.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        completion = Completion(requests)
        await self.submit(requests)
        await completion.wait()

    async def _perform_one(self, request: Request) -> int | None:
        await self._perform([request])
        if request.error is not None:
            raise request.error
        return request.result

    def entry_request(
        self,
        ledger_id: int,
        entry_id: int,
        payload: bytes,
        *,
        master_key: bytes = b"",
        recovery: bool = False,
        last_add_confirmed: int = -1,
    ) -> Request:
        """A checked add request for `submit` (raises InvalidArgument, EntryTooLarge)."""
        return Request(
            RecordKind.ENTRY,
            ledger_id,
            entry_id,
            self._taken_payload(ledger_id, entry_id, payload, last_add_confirmed, master_key),
            RecordFlag.RECOVERY_ADD if recovery else RecordFlag.NONE,
            None,
            last_add_confirmed,
            master_key,
        )

    def entry_requests(
        self,
        adds: Sequence[Add],
        on_done: Callable[[Request], None],
    ) -> tuple[list[Request], list[tuple[int, PoraError]]]:
        """Checked add requests for `submit`, many at once: the served node's hot path.

        Each add is `(tag, ledger_id, entry_id, last_add_confirmed, master_key,
        payload, recovery)`, the shape the network decoder gives (`tag` is the wire
        request id). Adds in a row to one ledger with consecutive entry ids (and the
        same key and flags) become one run request, their tags in `Request.tags` in
        order: the journal and the ledger then handle the run, not each add. Returns
        the requests, each completing through `on_done`, and the refused adds as
        `(tag, error)`, with the same checks and errors as `entry_request`.
        """
        return entry_runs(adds, self.config.entry_bytes_max, on_done, self._refusal)

    def _refusal(self, add: Add) -> PoraError | None:
        """What is wrong with an add that failed `entry_runs`' quick checks (None:
        nothing, take it: another bytes-like payload, say)."""
        _tag, ledger_id, entry_id, lac, master_key, payload, _recovery = add
        try:
            self._check_adds(ledger_id, entry_id, (payload,), lac, master_key)
        except PoraError as error:
            return error
        return None

    def _taken_payload(
        self, ledger_id: int, entry_id: int, payload: bytes, last_add_confirmed: int, key: bytes
    ) -> bytes:
        """The payload of one add the node takes, or the add's typed error raised. A
        bytes-like payload other than `bytes` is copied: the journal keeps it, and
        it must not change."""
        if add_is_plain(
            ledger_id, entry_id, last_add_confirmed, key, payload, self.config.entry_bytes_max
        ):
            return payload
        self._check_adds(ledger_id, entry_id, (payload,), last_add_confirmed, key)
        return bytes(payload)

    def _check_adds(
        self,
        ledger_id: int,
        first_entry_id: int,
        payloads: Sequence[bytes],
        last_add_confirmed: int,
        master_key: bytes,
    ) -> None:
        """Raise what the node refuses in adds of entries first_entry_id,
        first_entry_id + 1, ... (one add, or a run): InvalidArgument, or EntryTooLarge
        naming the entry. The rules of an add, stated once with their errors;
        `add_is_plain` only tells that an add keeps them all."""
        count = len(payloads)
        if not 1 <= count <= RUN_ENTRIES_MAX:
            raise InvalidArgument(f"a run carries 1 to {RUN_ENTRIES_MAX} entries, got {count}")
        _check_id("ledger_id", ledger_id)
        _check_id("entry_id", first_entry_id)
        if first_entry_id > ID_MAX - count + 1:
            raise InvalidArgument(
                f"a run of {count} entries from {first_entry_id} passes the largest entry "
                f"id {ID_MAX}"
            )
        entry_bytes_max = self.config.entry_bytes_max
        if max(map(len, payloads)) > entry_bytes_max:  # (a run's whole check at C speed)
            index, size = next(
                (i, len(p)) for i, p in enumerate(payloads) if len(p) > entry_bytes_max
            )
            raise EntryTooLarge(ledger_id, size, entry_bytes_max, first_entry_id + index)
        if not -1 <= last_add_confirmed <= ID_MAX:
            raise InvalidArgument(f"last_add_confirmed must be >= -1, got {last_add_confirmed}")
        _check_master_key(master_key)

    def run_request(
        self,
        ledger_id: int,
        first_entry_id: int,
        payloads: Sequence[bytes],
        *,
        master_key: bytes = b"",
        recovery: bool = False,
        last_add_confirmed: int = -1,
        on_done: Callable[[Request], None] | None = None,
    ) -> Request:
        """One checked request for a run of adds: entries first_entry_id,
        first_entry_id + 1, ... of one ledger (at most RUN_ENTRIES_MAX). A network
        worker makes one of these per ADD_RUN frame: the run is journalled as one
        record and applied at once. Raises InvalidArgument or EntryTooLarge, naming
        the entry, if any entry is unfit: then nothing of the run is taken.
        """
        self._check_adds(ledger_id, first_entry_id, payloads, last_add_confirmed, master_key)
        return entry_run_request(
            ledger_id,
            first_entry_id,
            payloads,
            last_add_confirmed,
            RecordFlag.RECOVERY_ADD if recovery else RecordFlag.NONE,
            master_key,
            on_done,
        )

    async def add_entry(
        self,
        ledger_id: int,
        entry_id: int,
        payload: bytes,
        *,
        master_key: bytes = b"",
        recovery: bool = False,
        last_add_confirmed: int = -1,
    ) -> None:
        """Store an entry; returns once it is journalled (fdatasync) and readable.

        Adding the same (ledger, entry) again with the same bytes succeeds (a retry);
        with other bytes it raises EntryConflict. `recovery` marks a recovering
        client's add, which a fenced ledger still accepts; `last_add_confirmed` is
        the writer's LAC, piggybacked (see `last_add_confirmed`).

        The calls of many tasks in one scheduler turn are submitted together, each
        ledger's consecutive adds as one run (pora/node/add_queue.py); each caller
        gets its own entry's outcome.
        """
        limit = self.config.entry_bytes_max
        if not add_is_plain(ledger_id, entry_id, last_add_confirmed, master_key, payload, limit):
            # rare (a call less for the usual add: this is the in-process hot path)
            payload = self._taken_payload(
                ledger_id, entry_id, payload, last_add_confirmed, master_key
            )
        await trio.lowlevel.checkpoint_if_cancelled()
        await self._adds.add(ledger_id, entry_id, last_add_confirmed, master_key, payload, recovery)

    async def add_entries(
        self, entries: Sequence[tuple[int, int, bytes]], *, master_key: bytes = b""
    ) -> list[PoraError | None]:
        """Store many `(ledger_id, entry_id, payload)` entries with one submission.

        Returns once every entry is durable or failed: one outcome per entry, in
        order (None for stored). For writers that keep many adds in flight, this
        costs a fraction of one `add_entry` call per entry. Arguments are checked
        before anything is submitted: a bad one raises and nothing is stored.
        """
        runs = merged_runs([self.entry_request(*entry, master_key=master_key) for entry in entries])
        if not runs:
            await trio.lowlevel.checkpoint()
            return []
        await self._perform(runs)
        return [_as_pora_error(run.error_of(i)) for run in runs for i in range(run.count)]

    async def add_batch(
        self,
        ledger_id: int,
        entry_ids: Sequence[int],
        payloads: Sequence[bytes],
        *,
        master_key: bytes = b"",
        recovery: bool = False,
        last_add_confirmed: int = -1,
    ) -> list[PoraError | None]:
        """Store entries of one ledger with explicit, strictly increasing ids (not
        necessarily consecutive: striping gives a node some ids of a ledger) in one
        submission: each stretch of consecutive ids is one run. One outcome per
        entry, in order (None for stored). Arguments are checked first: a bad one
        raises (naming the entry) and nothing is stored."""
        if len(entry_ids) != len(payloads) or not entry_ids:
            raise InvalidArgument(
                f"a batch needs one id per payload, at least one: got {len(entry_ids)} ids "
                f"and {len(payloads)} payloads"
            )
        if any(a >= b for a, b in itertools.pairwise(entry_ids)):
            raise InvalidArgument(f"a batch's entry ids must strictly increase: {entry_ids[:8]}")
        runs: list[Request] = []
        start = 0
        for index in range(1, len(entry_ids) + 1):
            if index == len(entry_ids) or entry_ids[index] != entry_ids[index - 1] + 1:
                runs.append(
                    self.run_request(
                        ledger_id,
                        entry_ids[start],
                        payloads[start:index],
                        master_key=master_key,
                        recovery=recovery,
                        last_add_confirmed=last_add_confirmed,
                    )
                )
                start = index
        await self._adds.perform(runs)
        return [_as_pora_error(run.error_of(i)) for run in runs for i in range(run.count)]

    async def fence_ledger(self, ledger_id: int, *, master_key: bytes = b"") -> int:
        """Shut the ledger's writer out (durably); returns its last entry id here."""
        _check_id("ledger_id", ledger_id)
        _check_master_key(master_key)
        result = await self._perform_one(
            Request(RecordKind.FENCE, ledger_id, -1, master_key=master_key)
        )
        assert result is not None
        barrier = self._fence_barrier
        if barrier is not None:
            meta = self._registry.metas.get(ledger_id)
            # the first fence record is the one a copy must hold: a fence of a fenced
            # ledger whose mark is written already needs no store write
            if meta is not None and meta.fence_seq >= 0:
                await barrier(meta.fence_seq + 1)
        return result

    async def close_ledger(
        self, ledger_id: int, last_entry_id: int | None = None, *, master_key: bytes = b""
    ) -> int:
        """Seal the ledger (durably) at `last_entry_id`, or at its last stored entry.

        Returns the last entry id the closed ledger keeps; reads past it fail.
        """
        _check_id("ledger_id", ledger_id)
        _check_master_key(master_key)
        if last_entry_id is None:
            seal = CLOSE_KEEP_ALL
        else:
            if not -1 <= last_entry_id <= ID_MAX:
                raise InvalidArgument(f"last_entry_id must be >= -1, got {last_entry_id}")
            seal = last_entry_id
        result = await self._perform_one(
            Request(RecordKind.CLOSE, ledger_id, seal, master_key=master_key)
        )
        assert result is not None
        return result

    async def delete_ledger(self, ledger_id: int, *, master_key: bytes = b"") -> None:
        """Delete the ledger and all its entries (durably). Only its owner may: the
        master key must be the ledger's (else Unauthorized, and nothing changes)."""
        _check_id("ledger_id", ledger_id)
        _check_master_key(master_key)
        self._registry.meta(ledger_id)  # NoSuchLedger without journalling anything
        if not self._keys.matches(ledger_id, master_key):
            raise Unauthorized(ledger_id)
        await self._perform_one(Request(RecordKind.DELETE, ledger_id, -1, master_key=master_key))

    async def collect_ledger(self, ledger_id: int) -> None:
        """Delete a ledger on the node's own behalf: its garbage collection found that
        the cluster no longer knows it. The same durable delete (and tombstone) as
        `delete_ledger`, with the ledger's own master key, which only the owner knows."""
        await self.delete_ledger(ledger_id, master_key=self._keys.key_of(ledger_id))

    # --- reads -------------------------------------------------------------------------------

    async def read_entry(self, ledger_id: int, entry_id: int, *, wait_s: float = 0.0) -> bytes:
        """The entry's payload. With `wait_s` > 0, a long poll: if the entry is not
        stored yet, wait for it up to `wait_s` seconds (then NoSuchEntry); a tail
        reader's way to follow a ledger without polling."""
        _check_id("ledger_id", ledger_id)
        _check_id("entry_id", entry_id)
        registry = self._registry
        if wait_s <= 0:
            return await registry.read_entry(ledger_id, entry_id)
        found: list[bytes] = []
        missing: list[PoraError] = []

        async def stored() -> bool:
            try:
                found.append(await registry.read_entry(ledger_id, entry_id))
            except (NoSuchEntry, NoSuchLedger) as error:
                meta = registry.metas.get(ledger_id)
                if meta is not None and meta.state is LedgerState.CLOSED:
                    raise  # nothing more will come
                if meta is None:
                    self._arrivals.wait_for_unknown_ledger(ledger_id, error)
                missing[:] = [error]
                return False
            return True

        await self._long_poll(ledger_id, wait_s, stored)
        if found:
            return found[0]
        raise missing[0]

    async def _long_poll(
        self, ledger_id: int, wait_s: float, answered: Callable[[], Awaitable[bool]]
    ) -> None:
        """Ask `answered` now and again after each arrival on the ledger (an add, a
        fence, a close, the ledger's first entry), until it says yes or `wait_s`
        passes. The next arrival's event is taken before each question, so that an
        arrival during it is not missed."""
        deadline = trio.current_time() + wait_s
        arrivals = self._arrivals
        with arrivals.waiting(ledger_id):
            while True:
                arrived = arrivals.next_arrival(ledger_id)
                if await answered():
                    return
                with trio.move_on_at(deadline):
                    await arrived.wait()
                    continue
                return

    async def read_range(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        max_entries: int = READ_RANGE_ENTRIES_DEFAULT,
        max_bytes: int = READ_RANGE_BYTES_DEFAULT,
    ) -> list[tuple[int, bytes]]:
        """The entries stored with ids in [first, last], ascending, as `(entry_id,
        payload)`: at most `max_entries`, and stopping before `max_bytes` of payload
        is passed (but always at least one entry when there is one). Ids that are not
        stored here (striping leaves gaps) are simply absent."""
        entries, _more = await self.read_range_page(
            ledger_id, first_entry_id, last_entry_id, max_entries=max_entries, max_bytes=max_bytes
        )
        return entries

    async def read_range_page(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        max_entries: int = READ_RANGE_ENTRIES_DEFAULT,
        max_bytes: int = READ_RANGE_BYTES_DEFAULT,
    ) -> tuple[list[tuple[int, bytes]], bool]:
        """As `read_range`, and whether a cap stopped the read before
        `last_entry_id` (`more`): every id in [first, last returned] (or [first, last]
        when not `more`) that is not in the answer is not stored here. A stored entry
        that fails its checksum raises StorageCorruption: it is never skipped."""
        _check_id("ledger_id", ledger_id)
        _check_id("first_entry_id", first_entry_id)
        _check_id("last_entry_id", last_entry_id)
        if max_entries < 1 or max_bytes < 1:
            raise InvalidArgument("max_entries and max_bytes must be >= 1")
        return await self._registry.read_range(
            ledger_id, first_entry_id, last_entry_id, max_entries, max_bytes
        )

    async def read_lac(
        self, ledger_id: int, *, known_lac: int = -1, wait_s: float = 0.0
    ) -> tuple[int, int]:
        """`(last_add_confirmed, last_entry_id)` of the ledger here (last_entry_id: the
        highest stored, -1 if none). With `wait_s` > 0, a long poll: answers once the
        LAC exceeds `known_lac`, or the ledger is closed or fenced, or the wait passes
        (then with the current values). A ledger not here raises NoSuchLedger (after
        the wait, for a long poll)."""
        _check_id("ledger_id", ledger_id)
        metas = self._registry.metas
        if wait_s > 0:

            async def answered() -> bool:
                meta = metas.get(ledger_id)
                if meta is None:
                    self._arrivals.wait_for_unknown_ledger(ledger_id, NoSuchLedger(ledger_id))
                    return False
                return meta.lac > known_lac or meta.fenced or meta.state is LedgerState.CLOSED

            await self._long_poll(ledger_id, wait_s, answered)
        else:
            await trio.lowlevel.checkpoint()
        meta = self._registry.meta(ledger_id)
        return meta.lac, max(meta.last_entry_id, -1)

    async def write_lac(
        self, ledger_id: int, last_add_confirmed: int, *, master_key: bytes = b""
    ) -> int:
        """A writer's last-add-confirmed, told while it is idle: the node keeps the
        highest (in memory: after a crash it may fall back to the last one persisted;
        a LAC is a lower bound) and wakes the ledger's LAC long polls. The key is
        checked as an add's; a fenced ledger raises LedgerFenced, a closed one
        LedgerClosed. Returns the ledger's LAC here."""
        _check_id("ledger_id", ledger_id)
        _check_master_key(master_key)
        if not -1 <= last_add_confirmed <= ID_MAX:
            raise InvalidArgument(f"last_add_confirmed must be >= -1, got {last_add_confirmed}")
        await trio.lowlevel.checkpoint()
        meta = self._registry.meta(ledger_id)
        if not self._keys.matches(ledger_id, master_key):
            raise Unauthorized(ledger_id)
        if meta.state is LedgerState.CLOSED:
            raise LedgerClosed(ledger_id)
        if meta.fenced:
            raise LedgerFenced(ledger_id)
        return self._registry.note_lac(ledger_id, last_add_confirmed)

    def last_add_confirmed(self, ledger_id: int) -> int:
        """The highest last-add-confirmed the ledger's writers piggybacked on adds
        here (-1 if none): every entry up to it is on an ack quorum of nodes."""
        _check_id("ledger_id", ledger_id)
        return self._registry.meta(ledger_id).lac

    async def last_entry_id(self, ledger_id: int) -> int:
        """The highest entry id stored (for a closed ledger: the sealed last entry)."""
        _check_id("ledger_id", ledger_id)
        meta = self._registry.meta(ledger_id)
        if meta.state is LedgerState.CLOSED:
            return meta.sealed_last_entry_id
        return meta.last_entry_id

    def ledger_info(self, ledger_id: int) -> LedgerInfo:
        return self._registry.meta(ledger_id).info()

    def stored_bytes(self) -> tuple[int, int]:
        """Payload bytes and entry-log bytes over every ledger on the node: a pass over
        them all, for metrics at scrape time."""
        metas = self._registry.metas.values()
        return sum(m.payload_bytes for m in metas), sum(m.log_end for m in metas)

    def ledgers(
        self, *, after_ledger_id: int = -1, count_max: int | None = None
    ) -> list[LedgerInfo]:
        """The ledgers on the node, by id: all of them, or a page of at most
        `count_max` with ids above `after_ledger_id` (without sorting them all)."""
        metas = self._registry.metas
        if count_max is None:
            ids = sorted(i for i in metas if i > after_ledger_id)
        else:
            ids = heapq.nsmallest(count_max, (i for i in metas if i > after_ledger_id))
        return [metas[i].info() for i in ids]

    @property
    def read_only(self) -> str | None:
        """Why the node takes no writes now, or None when it does."""
        return self._read_only

    def set_read_only(self, reason: str | None) -> None:
        """Refuse adds, fences and closes with NodeReadOnly (reason given), or take
        them again (None). Reads go on either way. Requests already accepted finish."""
        if reason is not None and self._read_only is None:
            _log.warning("node is read-only: %s", reason)
        elif reason is None and self._read_only is not None:
            _log.warning("node takes writes again")
        self._read_only = reason

    def add_commit_listener(self, listener: CommitListener) -> None:
        """Call `listener(records, bytes, fsync_seconds)` after every group commit
        (metrics). It runs on the journal task: it must be quick and not raise."""
        self._journal.add_commit_listener(listener)

    def statistics(self) -> NodeStatistics:
        return NodeStatistics(
            journal=self._journal.statistics(),
            ledgers=self._registry.statistics(),
            journal_segments_trimmed=self._trimmer.segments_trimmed,
            recovery=self._recovery,
            long_polls=self._arrivals.statistics(),
        )

    # --- journal trimming --------------------------------------------------------------------

    async def trim_journal(self) -> int:
        """Delete the journal segments whose every record is durable elsewhere (see
        `JournalTrimmer.trim`); returns how many went. The trimmer runs on its own:
        this is for tests and tools."""
        return await self._trimmer.trim()

    async def reclaim_journal(self) -> int:
        """Flush the ledgers holding a closed journal segment, then trim (see
        `JournalTrimmer.reclaim`); returns how many segments went."""
        return await self._trimmer.reclaim()
