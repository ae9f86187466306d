"""The node: wires the journal, the ledger registry, recovery and the trimmer.

`open_node` is the one way to run a node (in-process, in tests, and under
`pora serve`): it locks the data dir, recovers, starts the tasks, yields the
`Node`, and on exit stops taking requests, drains, flushes, trims and unlocks.
If a ledger's last flush failed (a full or failing disk), the exit keeps the
whole journal, which holds that ledger's entries, and raises FlushFailed.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import hmac
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import crc32c
import trio

from journal.errors import JournalError, PoraError
from journal.format import (
    BODY_CRC_FIELD,
    BODY_FIELDS,
    CLOSE_KEEP_ALL,
    MASTER_KEY_BYTES_MAX,
    RecordFlag,
    RecordKind,
)
from journal.request import Request
from journal.segment import list_segments
from journal.task import Journal, JournalStatistics
from journal.trim import delete_segments, trimmable_segments
from journal.watermark import JournalState, Watermark, write_watermark
from ledger.errors import (
    EntryTooLarge,
    FlushFailed,
    InvalidArgument,
    LedgerClosed,
    NodeClosed,
    NodeReadOnly,
    NoSuchEntry,
    NoSuchLedger,
    Unauthorized,
    describe_os_error,
    ledger_list,
)
from ledger.index import Index
from ledger.registry import LedgerRegistry, RegistryStatistics
from ledger.state import LedgerInfo, LedgerState
from ledger.storage import LedgerStorage
from pora.node.config import NodeConfig
from pora.node.datadir import (
    DataDir,
    DataDirLock,
    open_data_dir,
    refuse_entry_logs_without_index,
    upgrade_data_dir,
)
from pora.node.replay import ProgressCallback, RecoveryReport, replay_journal

_log = logging.getLogger("pora.node")

ID_MAX: Final = 2**63 - 1
#: read_range's defaults: bound what one call may gather in memory
RANGE_ENTRIES_MAX: Final = 1024
RANGE_BYTES_MAX: Final = 4 << 20

CommitListener = Callable[[int, int, float], None]


@dataclass(frozen=True, slots=True)
class NodeStatistics:
    journal: JournalStatistics
    ledgers: RegistryStatistics
    journal_segments_trimmed: int
    recovery: RecoveryReport


def _as_pora_error(error: BaseException | None) -> PoraError | None:
    if error is None or isinstance(error, PoraError):
        return error
    raise error  # not an outcome of the request: a bug, let it surface


#: the most adds one run request carries: runs are what one connection read or one
#: `add_entries` call brings, so this only bounds a record's size in odd cases
RUN_ENTRIES_MAX: Final = 1024
#: a run request made from one ADD_RUN frame answers that one frame: no per-add tags
_NO_RUN_TAGS: Final[list[int]] = []


def _as_runs(requests: list[Request]) -> list[Request]:
    """Single-entry requests, in order, with each stretch of consecutive entries of a
    ledger (same key and flags) merged into one run request."""
    runs: list[Request] = []
    stretch: list[Request] = []
    for request in requests:
        if stretch:
            head = stretch[-1]
            if (
                request.ledger_id == head.ledger_id
                and request.entry_id == head.entry_id + 1
                and request.flags == head.flags
                and request.master_key == head.master_key
                and len(stretch) < RUN_ENTRIES_MAX
            ):
                stretch.append(request)
                continue
            runs.append(_merged(stretch))
        stretch = [request]
    if stretch:
        runs.append(_merged(stretch))
    return runs


def _merged(stretch: list[Request]) -> Request:
    if len(stretch) == 1:
        return stretch[0]
    first = stretch[0]
    return Request.entry_run(
        first.ledger_id,
        first.entry_id,
        [request.bodies[0] for request in stretch],
        max([request.lac for request in stretch]),
        first.flags,
        first.master_key,
        None,
        [],
    )


def _check_id(kind: str, value: int) -> None:
    if not (isinstance(value, int) and 0 <= value <= ID_MAX):
        raise InvalidArgument(f"{kind} must be an integer in [0, 2**63), got {value!r}")


class Node:
    """A running node. Make one with `open_node`; every method is safe to call
    from many tasks at once."""

    def __init__(
        self,
        data_dir: DataDir,
        config: NodeConfig,
        journal: Journal,
        registry: LedgerRegistry,
        recovery: RecoveryReport,
    ) -> None:
        self.data_dir = data_dir
        self.config = config
        self._journal = journal
        self._registry = registry
        self._recovery = recovery
        self._closed = False
        self._segments_trimmed = 0
        #: one trim at a time: the periodic one and the journal's `reclaim` may meet
        self._trim_lock = trio.Lock()
        journal.reclaim = self.reclaim_journal
        self._read_only: str | None = None
        self._commit_listeners: list[CommitListener] = []
        self._master_keys = registry.storage.master_keys
        self._arrivals = registry.storage.arrivals
        #: long polls waiting now, by ledger: the last to leave removes the ledger's
        #: arrival event, so that polls leave nothing behind
        self._long_polls: dict[int, int] = {}
        #: ledgers that did not exist when a long poll began to wait for them
        self._long_polled_unknown: set[int] = set()

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
        batch = self._check_master_keys(requests)
        if not batch:
            await trio.lowlevel.checkpoint()
            return
        try:
            self._journal.submit_nowait(batch)
        except trio.WouldBlock:
            await self._journal.submit(batch)

    def _check_master_keys(self, requests: list[Request]) -> list[Request]:
        """Refuse requests with a wrong key, and adds to a closed ledger; put a KEY
        record before the first request of a ledger that has no key yet (it fixes
        the key, durably, in journal order). Refused requests are not journalled."""
        keys = self._master_keys
        metas = self._registry.metas
        checked: list[Request] | None = None  # made only when the batch must change
        for index, request in enumerate(requests):
            claimed = request.master_key
            if claimed is None:
                if checked is not None:
                    checked.append(request)
                continue
            if request.kind is RecordKind.ENTRY:
                # (a close still in the journal is met by the ledger worker's own check)
                meta = metas.get(request.ledger_id)
                if meta is not None and meta.state is LedgerState.CLOSED:
                    if checked is None:
                        checked = requests[:index]
                    request.fail(LedgerClosed(request.ledger_id))
                    continue
            known = keys.get(request.ledger_id)
            if known is not None and (known is claimed or hmac.compare_digest(known, claimed)):
                if checked is not None:
                    checked.append(request)
                continue
            if checked is None:
                checked = requests[:index]
            if known is None:
                keys[request.ledger_id] = claimed
                checked.append(Request(RecordKind.KEY, request.ledger_id, -1, claimed))
                checked.append(request)
            else:
                request.fail(Unauthorized(request.ledger_id))
        return requests if checked is None else checked

    async def _perform(self, requests: list[Request]) -> None:
        """Submit `requests` and wait until every one of them has completed.

        Parks the task and is woken by the last completion (cheaper than an Event
        per request: this is the per-add cost of in-process writers). Cancelling
        the wait does not cancel the requests: like a timeout on any database,
        the caller then does not know whether they were stored.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        task = trio.lowlevel.current_task()
        pending = len(requests)
        parked = False  # requests refused at submission complete before we park

        def on_done(_request: Request) -> None:
            nonlocal pending
            pending -= 1
            if pending == 0 and parked:
                trio.lowlevel.reschedule(task)

        for request in requests:
            request.on_done = on_done
        await self.submit(requests)
        if pending:

            def abort(_raise_cancel: object) -> trio.lowlevel.Abort:
                nonlocal parked
                parked = False
                return trio.lowlevel.Abort.SUCCEEDED

            parked = True
            await trio.lowlevel.wait_task_rescheduled(abort)
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()

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
        if not (
            type(ledger_id) is int
            and type(entry_id) is int
            and 0 <= ledger_id <= ID_MAX
            and 0 <= entry_id <= ID_MAX
        ):
            _check_id("ledger_id", ledger_id)
            _check_id("entry_id", entry_id)
        if len(payload) > self.config.entry_bytes_max:
            raise EntryTooLarge(ledger_id, len(payload), self.config.entry_bytes_max, entry_id)
        if type(payload) is not bytes:  # the journal keeps it: it must not change
            payload = bytes(payload)
        if last_add_confirmed != -1 and not -1 <= last_add_confirmed <= ID_MAX:
            raise InvalidArgument(f"last_add_confirmed must be >= -1, got {last_add_confirmed}")
        if len(master_key) > MASTER_KEY_BYTES_MAX:
            raise InvalidArgument(f"a master key has at most {MASTER_KEY_BYTES_MAX} bytes")
        return Request(
            RecordKind.ENTRY,
            ledger_id,
            entry_id,
            payload,
            RecordFlag.RECOVERY_ADD if recovery else RecordFlag.NONE,
            None,
            last_add_confirmed,
            master_key,
        )

    def entry_requests(
        self,
        adds: Sequence[tuple[int, int, int, int, bytes, bytes, bool]],
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
        entry_bytes_max = self.config.entry_bytes_max
        refused: list[tuple[int, PoraError]] = []
        new_run = Request.entry_run
        pack_fields = BODY_FIELDS.pack
        pack_crc = BODY_CRC_FIELD.pack
        checksum = crc32c.crc32c
        join = b"".join
        plain = RecordFlag.NONE
        recovering = RecordFlag.RECOVERY_ADD
        # each run: ledger, first entry id, key, flags, bodies, tags, lacs
        runs: list[tuple[int, int, bytes, RecordFlag, list[bytes], list[int], list[int]]] = []
        # the run being gathered: its ledger, the entry id that would extend it, ...
        run_ledger = run_next = -1
        run_key = b""
        run_recovery = False
        bodies: list[bytes] = []
        tags: list[int] = []
        lacs: list[int] = []
        for tag, ledger_id, entry_id, lac, master_key, payload, recovery in adds:
            if not (
                ledger_id >= 0
                and entry_id >= 0
                and lac >= -1
                and len(payload) <= entry_bytes_max
                and len(master_key) <= MASTER_KEY_BYTES_MAX
                and type(payload) is bytes
                and type(ledger_id) is int
                and type(entry_id) is int
                and ledger_id <= ID_MAX
                and entry_id <= ID_MAX
                and lac <= ID_MAX
            ):
                # rare: let the one-at-a-time path find what is wrong and say so
                try:
                    self.entry_request(
                        ledger_id,
                        entry_id,
                        payload,
                        master_key=master_key,
                        recovery=recovery,
                        last_add_confirmed=lac,
                    )
                except PoraError as error:
                    refused.append((tag, error))
                    continue
            if (
                entry_id != run_next
                or ledger_id != run_ledger
                or master_key != run_key
                or recovery != run_recovery
                or len(bodies) >= RUN_ENTRIES_MAX
            ):
                bodies, tags, lacs = [], [], []
                flags = recovering if recovery else plain
                runs.append((ledger_id, entry_id, master_key, flags, bodies, tags, lacs))
                run_ledger = ledger_id
                run_key = master_key
                run_recovery = recovery
            # encode_body, inlined: a call per add is a tenth of this loop's cost
            fields = pack_fields(len(payload), ledger_id, entry_id, lac)
            bodies.append(join((pack_crc(checksum(payload, checksum(fields))), fields, payload)))
            tags.append(tag)
            lacs.append(lac)
            run_next = entry_id + 1
        requests = [
            new_run(ledger, first, bodies, max(lacs), flags, key, on_done, tags)
            for ledger, first, key, flags, bodies, tags, lacs in runs
        ]
        return requests, refused

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
        if not -1 <= last_add_confirmed <= ID_MAX:
            raise InvalidArgument(f"last_add_confirmed must be >= -1, got {last_add_confirmed}")
        if len(master_key) > MASTER_KEY_BYTES_MAX:
            raise InvalidArgument(f"a master key has at most {MASTER_KEY_BYTES_MAX} bytes")
        entry_bytes_max = self.config.entry_bytes_max
        if max(map(len, payloads)) > entry_bytes_max:
            index, size = next(
                (i, len(p)) for i, p in enumerate(payloads) if len(p) > entry_bytes_max
            )
            raise EntryTooLarge(ledger_id, size, entry_bytes_max, first_entry_id + index)
        pack_fields = BODY_FIELDS.pack
        pack_crc = BODY_CRC_FIELD.pack
        checksum = crc32c.crc32c
        join = b"".join
        bodies: list[bytes] = []
        append = bodies.append
        entry_id = first_entry_id
        for payload in payloads:
            # encode_body, inlined (as in entry_requests): the call would cost a tenth
            fields = pack_fields(len(payload), ledger_id, entry_id, last_add_confirmed)
            append(join((pack_crc(checksum(payload, checksum(fields))), fields, payload)))
            entry_id += 1
        return Request.entry_run(
            ledger_id,
            first_entry_id,
            bodies,
            last_add_confirmed,
            RecordFlag.RECOVERY_ADD if recovery else RecordFlag.NONE,
            master_key,
            on_done,
            _NO_RUN_TAGS,
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
        """
        await self._perform_one(
            self.entry_request(
                ledger_id,
                entry_id,
                payload,
                master_key=master_key,
                recovery=recovery,
                last_add_confirmed=last_add_confirmed,
            )
        )

    async def add_entries(
        self, entries: Sequence[tuple[int, int, bytes]], *, master_key: bytes = b""
    ) -> list[PoraError | None]:
        """Store many `(ledger_id, entry_id, payload)` entries with one submission.

        Returns once every entry is durable or failed: one outcome per entry, in
        order (None for stored). For writers that keep many adds in flight, this
        costs a fraction of one `add_entry` call per entry. Arguments are checked
        before anything is submitted: a bad one raises and nothing is stored.
        """
        runs = _as_runs([self.entry_request(*entry, master_key=master_key) for entry in entries])
        if not runs:
            await trio.lowlevel.checkpoint()
            return []
        await self._perform(runs)
        return [_as_pora_error(run.error_of(i)) for run in runs for i in range(run.count)]

    async def fence_ledger(self, ledger_id: int, *, master_key: bytes = b"") -> int:
        """Shut the ledger's writer out (durably); returns its last entry id here."""
        _check_id("ledger_id", ledger_id)
        result = await self._perform_one(
            Request(RecordKind.FENCE, ledger_id, -1, master_key=master_key)
        )
        assert result is not None
        return result

    async def close_ledger(
        self, ledger_id: int, last_entry_id: int | None = None, *, master_key: bytes = b""
    ) -> int:
        """Seal the ledger (durably) at `last_entry_id`, or at its last stored entry.

        Returns the last entry id the closed ledger keeps; reads past it fail.
        """
        _check_id("ledger_id", ledger_id)
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
        self._registry.meta(ledger_id)  # NoSuchLedger without journalling anything
        known = self._master_keys.get(ledger_id)
        if known is not None and not hmac.compare_digest(known, master_key):
            raise Unauthorized(ledger_id)
        await self._perform_one(Request(RecordKind.DELETE, ledger_id, -1, master_key=master_key))

    # --- reads -------------------------------------------------------------------------------

    async def read_entry(self, ledger_id: int, entry_id: int, *, wait_s: float = 0.0) -> bytes:
        """The entry's payload. With `wait_s` > 0, a long poll: if the entry is not
        stored yet, wait for it up to `wait_s` seconds (then NoSuchEntry); a tail
        reader's way to follow a ledger without polling."""
        _check_id("ledger_id", ledger_id)
        _check_id("entry_id", entry_id)
        if wait_s <= 0:
            return await self._registry.read_entry(ledger_id, entry_id)
        deadline = trio.current_time() + wait_s
        polls = self._long_polls
        polls[ledger_id] = polls.get(ledger_id, 0) + 1
        try:
            while True:
                arrived = self._arrivals.get(ledger_id)
                if arrived is None:
                    arrived = self._arrivals[ledger_id] = trio.Event()
                try:
                    return await self._registry.read_entry(ledger_id, entry_id)
                except (NoSuchEntry, NoSuchLedger) as error:
                    meta = self._registry.metas.get(ledger_id)
                    if meta is not None and meta.state is LedgerState.CLOSED:
                        raise  # nothing more will come
                    if meta is None:
                        self._wait_for_unknown_ledger(error, ledger_id)
                    with trio.move_on_at(deadline):
                        await arrived.wait()
                        continue
                    raise
        finally:
            left = polls[ledger_id] - 1
            if left:
                polls[ledger_id] = left
            else:
                del polls[ledger_id]
                self._long_polled_unknown.discard(ledger_id)
                self._arrivals.pop(ledger_id, None)

    def _wait_for_unknown_ledger(self, error: PoraError, ledger_id: int) -> None:
        """Count a long poll's ledger among those waited for that do not exist here,
        or raise `error` when there are long_polls_unknown_ledgers_max of them."""
        unknown = self._long_polled_unknown
        if ledger_id in unknown:
            return
        limit = self.config.long_polls_unknown_ledgers_max
        if len(unknown) >= limit:
            error.args = (
                f"{error}; long polls already wait for {limit} ledgers that do not exist "
                "on this node (long_polls_unknown_ledgers_max): read without waiting, or "
                "retry later",
            )
            raise error
        unknown.add(ledger_id)

    async def read_range(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        max_entries: int = RANGE_ENTRIES_MAX,
        max_bytes: int = RANGE_BYTES_MAX,
    ) -> list[tuple[int, bytes]]:
        """The entries stored with ids in [first, last], ascending, as `(entry_id,
        payload)`: at most `max_entries`, and stopping before `max_bytes` of payload
        is passed (but always at least one entry when there is one). Ids that are not
        stored here (striping leaves gaps) are simply absent."""
        _check_id("ledger_id", ledger_id)
        _check_id("first_entry_id", first_entry_id)
        _check_id("last_entry_id", last_entry_id)
        if max_entries < 1 or max_bytes < 1:
            raise InvalidArgument("max_entries and max_bytes must be >= 1")
        return await self._registry.read_range(
            ledger_id, first_entry_id, last_entry_id, max_entries, max_bytes
        )

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
        self._commit_listeners.append(listener)

        def notify(records: int, written: int, seconds: float) -> None:
            for each in self._commit_listeners:
                each(records, written, seconds)

        self._journal.on_commit = notify

    def statistics(self) -> NodeStatistics:
        return NodeStatistics(
            journal=self._journal.statistics(),
            ledgers=self._registry.statistics(),
            journal_segments_trimmed=self._segments_trimmed,
            recovery=self._recovery,
        )

    # --- journal trimming --------------------------------------------------------------------

    async def trim_journal(self) -> int:
        """Delete the journal segments whose every record is durable elsewhere (or
        keep them as spares: `GroupCommitConfig.recycle_segments`).

        Returns how many went. Runs periodically, and before the journal makes a
        spare segment (`Journal.reclaim`); callable by hand (tests).
        """
        async with self._trim_lock:
            return await self._trim_journal()

    async def _trim_journal(self) -> int:
        oldest = self._registry.oldest_undurable_seq()
        watermark = self._journal.dispatched_seq
        if oldest is not None:
            watermark = min(watermark, oldest)
        journal_dir = self.data_dir.journal_dir
        segments = await trio.to_thread.run_sync(list_segments, journal_dir)
        victims = trimmable_segments(segments, watermark)
        if not victims:
            return 0
        index = self._registry.storage.index
        # the index writes of flushes were not synced one by one: sync them all now,
        # before the journal that could redo them goes away
        try:
            await trio.to_thread.run_sync(index.sync)
        except OSError as error:
            # a full or failing index disk: the flushes meet it too and say what to do;
            # the node goes on serving, and the journal keeps these segments meanwhile
            _log.warning(
                "journal trim put off: the index could not be synced (%s); the journal "
                "keeps %d segment(s) that could go until a sync succeeds",
                error,
                len(victims),
            )
            return 0
        pool = self._journal.recycle_pool
        # the journal must hold everything from the first segment it keeps on
        kept_from = Watermark(JournalState.HOLDING, segments[len(victims)].first_seq)
        await trio.to_thread.run_sync(
            functools.partial(
                delete_segments, journal_dir, victims, watermark=kept_from, recycle_into=pool
            )
        )
        self._segments_trimmed += len(victims)
        return len(victims)

    async def reclaim_journal(self) -> int:
        """Flush the ledgers whose unflushed entries are in a closed journal segment,
        then trim (`trim_journal`); returns how many segments went.

        A ledger flushes when its memtable fills or its flush interval passes. Under
        load a segment closes every second or so, and a ledger that went quiet with
        a little unflushed would keep it, and every segment after it, for up to its
        flush interval: the journal grows by gigabytes, spares must be zero-filled
        instead of recycled, and syncs slow down (a node loaded again right after
        another load ran at 60 % of a fresh one's adds/s). Flushing such a ledger
        early costs what its next flush would have cost. The periodic trimmer and
        the journal, before it makes a spare, reclaim this way.
        """
        segment = self._journal.open_segment
        if segment is not None:
            # a ledger whose flush fails keeps its segments (its oldest undurable seq
            # stays) and retries on its own schedule; the others' flushes went through
            with contextlib.suppress(FlushFailed):
                await self._registry.flush_all(undurable_before=segment.first_seq)
        return await self.trim_journal()

    async def _trim_periodically(self) -> None:
        interval_s = self.config.trim_interval_ms / 1000.0
        while True:
            await trio.sleep(interval_s)
            await self.reclaim_journal()


@contextlib.asynccontextmanager
async def open_node(
    data_dir: str | Path = "pora-data",
    *,
    recovery_progress: ProgressCallback | None = None,
    accept_journal_gap: bool = False,
    **options: Any,
) -> AsyncIterator[Node]:
    """Run a node on `data_dir` for the duration of the `async with` block.

    Options are the fields of NodeConfig, GroupCommitConfig and LedgerConfig, by
    name (for example `group_wait_ms_max=2`, `memtable_flush_bytes=8 << 20`).
    `recovery_progress`, if given, is called now and then during recovery with the
    journal bytes scanned so far (for progress bars). `accept_journal_gap` is the
    operator's override (`pora recover --accept-journal-gap`): recovery replays what
    the journal holds past a gap, or a missing or damaged watermark, instead of
    refusing; what may be lost is logged and in `statistics().recovery`.
    """
    config = NodeConfig.from_options(**options)
    root = Path(data_dir)
    directory = await trio.to_thread.run_sync(lambda: open_data_dir(root))
    lock = DataDirLock(directory.root)
    lock.acquire()
    try:
        directory = await trio.to_thread.run_sync(upgrade_data_dir, directory)
        # before LevelDB is asked: it would create an empty index in place of a lost one
        await trio.to_thread.run_sync(refuse_entry_logs_without_index, directory)
        index = await trio.to_thread.run_sync(
            lambda: Index(
                directory.index_dir,
                cache_bytes=config.index_cache_bytes,
                bloom_bits=config.index_bloom_bits,
                paranoid_checks=True,
            )
        )
        try:
            if await trio.to_thread.run_sync(index.is_empty):
                await trio.to_thread.run_sync(
                    functools.partial(refuse_entry_logs_without_index, directory, index_empty=True)
                )
            async with _running_node(
                directory, config, index, recovery_progress, accept_journal_gap
            ) as node:
                yield node
        finally:
            await trio.to_thread.run_sync(index.close)
    finally:
        lock.release()


@contextlib.asynccontextmanager
async def _running_node(
    directory: DataDir,
    config: NodeConfig,
    index: Index,
    recovery_progress: ProgressCallback | None,
    accept_journal_gap: bool = False,
) -> AsyncIterator[Node]:
    metas = await trio.to_thread.run_sync(index.load_all_meta)
    storage = LedgerStorage(directory.ledgers_dir, index, config.ledger)
    registry = LedgerRegistry(storage, metas)
    clean_exit = False
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(registry.run)
            _log.info("recovering %s: %d ledgers known", directory.root, len(metas))
            report = await replay_journal(
                directory.journal_dir,
                registry,
                progress=recovery_progress,
                require_watermark=directory.journal_watermark_required,
                accept_gaps=accept_journal_gap,
            )
            _log.info(
                "recovered in %.2fs: %d segments, %d of %d records replayed into %d ledgers",
                report.seconds,
                report.segments,
                report.records_replayed,
                report.records_scanned,
                len(report.ledgers_touched),
            )
            # the keys replay restored, and those the index had, are checked from now on
            storage.master_keys.update(
                (ledger_id, meta.master_key)
                for ledger_id, meta in registry.metas.items()
                if meta.master_key is not None
            )
            journal = Journal(
                directory.journal_dir,
                config.journal,
                first_seq=report.next_seq,
                dispatch=registry.dispatch,
                dispatch_nowait=registry.dispatch_nowait,
            )
            journal_done = trio.Event()

            async def run_journal(task_status: trio.TaskStatus[None]) -> None:
                try:
                    await journal.run(task_status=task_status)
                finally:
                    journal_done.set()

            try:
                await nursery.start(run_journal)
            except OSError as error:  # no room for a new segment, say
                raise JournalError(
                    f"cannot start the journal in {directory.journal_dir}: "
                    f"{describe_os_error(error)}. Nothing acknowledged is lost: every "
                    "journal segment is kept. Free space on that filesystem (or fix the "
                    "disk), then start the node again"
                ) from error
            # before the first record: from now on the journal holds what it gets (and
            # the segments a replay could not flush, which come before)
            await trio.to_thread.run_sync(_mark_journal_holding, directory.journal_dir)
            node = Node(directory, config, journal, registry, report)
            trimmer = trio.CancelScope()

            async def run_trimmer() -> None:
                with trimmer:
                    await node._trim_periodically()

            nursery.start_soon(run_trimmer)
            try:
                yield node
            finally:
                # stop taking requests, write what is queued, let every ledger
                # apply and flush it, then stop
                node._closed = True
                journal.close_input()
                with trio.CancelScope(shield=True):
                    await journal_done.wait()
                    trimmer.cancel()
                    registry.close()
        clean_exit = True
    finally:
        storage.files.close_all()
    if clean_exit:
        unflushed = registry.unflushed_ledgers()
        if unflushed:
            # their entries are durable in the journal only: keep all of it (the next
            # start replays what the index does not hold yet)
            raise _journal_kept(directory, unflushed)
        # every record is durable in entry logs and index: start next time with an
        # empty journal (nothing to replay)
        await trio.to_thread.run_sync(index.sync)
        segments = await trio.to_thread.run_sync(list_segments, directory.journal_dir)
        emptied = Watermark(JournalState.EMPTY, journal.next_seq)
        await trio.to_thread.run_sync(
            functools.partial(delete_segments, directory.journal_dir, segments, watermark=emptied)
        )


def _journal_kept(directory: DataDir, unflushed: dict[int, str]) -> FlushFailed:
    ledgers = sorted(unflushed)
    return FlushFailed(
        ledgers,
        f"the node closed, but {len(ledgers)} ledger(s) could not be flushed to their "
        f"entry logs (ledgers {ledger_list(ledgers)}; first: {unflushed[ledgers[0]]}). "
        f"Nothing acknowledged is lost: the journal in {directory.journal_dir} is kept "
        "with their entries. Free space on the disk (or fix it), then start the node "
        "again or run `pora recover`: the journal is replayed then",
    )


def _mark_journal_holding(journal_dir: Path) -> None:
    """Set the watermark to the oldest segment: the journal just opened its first one
    (after recovery emptied the journal, the only one), and must hold it all."""
    segments = list_segments(journal_dir)
    assert segments, "the journal opens its segment before it starts"
    write_watermark(journal_dir, Watermark(JournalState.HOLDING, segments[0].first_seq))
