"""`pora rereplicate`: a worker that repairs under-replicated fragments
(docs/rereplication.md, A4..A13). One ledger at a time under its lock; each fragment
copied (copying.py), then its members replaced by compare-and-set (record_change.py).
Everything it does is reported as an event (a dict: JSON lines, or a line of text)."""

from __future__ import annotations

import logging
import os
import random
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import anyio

from journal.errors import PoraError
from ledger.errors import Unauthorized
from netio.security import master_key_from_password
from pora.client.lone_errors import lone_error_unwrapped
from pora.client.replication.config import ClientConfig
from pora.client.replication.core.ledger_records import check_password
from pora.client.replication.core.placement import choose_replacements
from pora.client.replication.errors import NotEnoughNodes
from pora.client.replication.reader import open_ledger
from pora.client.replication.replica_reads import ChannelFor
from pora.cluster_ops.audit import short_members
from pora.cluster_ops.copying import CopyCount, CopyFailed, CopyJob, copy_fragment
from pora.cluster_ops.fragments import DRAINING, MISSING_ENTRIES, LostMember, lost_members
from pora.cluster_ops.inventory import (
    StreamLedger,
    all_ledgers,
    draining_addresses,
    live_nodes,
    stream_ledgers,
)
from pora.cluster_ops.record_change import replace_members
from pora.cluster_ops.stream_takeover import take_over_stream
from pora.cluster_ops.throttle import Throttle
from pora.meta.errors import LockLost, MetadataError, NoSuchLedgerMetadata
from pora.meta.records import EnsembleMember, LedgerMetadata, LedgerState, NodeRegistration
from pora.meta.store import MetadataStore

log = logging.getLogger("pora.cluster_ops")

Report = Callable[[dict[str, object]], None]
#: whether a lost member is to be repaired in this round (A13's delay); all by default
Ready = Callable[[LostMember], bool]


def lock_name(ledger_id: int) -> str:
    return f"rereplicate-ledger-{ledger_id}"


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"


@dataclass(frozen=True)
class WorkerOptions:
    password: str | bytes = ""
    entries_per_s: float = 0.0
    bytes_per_s: float = 0.0
    #: A10, A11: how long an open ledger's last fragment stays lost before the worker
    #: fences and recovers the ledger (a stream's open segment: takes the stream over)
    open_grace_s: float = 60.0
    lock_lease_s: float = 10.0
    #: also repair live members that miss entries (A1 with --deep), in place
    deep: bool = False
    #: entry ids per batch (one range read per source, one add call per replacement)
    batch_entries: int = 1000
    holder: str = field(default_factory=default_holder)


@dataclass
class Totals:
    repaired: int = 0
    skipped: int = 0
    failed: int = 0
    copied: CopyCount = field(default_factory=CopyCount)

    def to_json(self) -> dict[str, object]:
        return {
            "event": "summary",
            "fragments_repaired": self.repaired,
            "skipped": self.skipped,
            "failed": self.failed,
            "entries_copied": self.copied.entries,
            "bytes_copied": self.copied.bytes,
        }


class Rereplicator:
    def __init__(
        self,
        store: MetadataStore,
        channel_for: ChannelFor,
        config: ClientConfig,
        options: WorkerOptions,
        report: Report,
    ) -> None:
        self._store = store
        self._channel_for = channel_for
        self._config = config
        self._options = options
        self._report = report
        self._master_key = master_key_from_password(options.password)
        self._throttle = Throttle(options.entries_per_s, options.bytes_per_s)
        self.totals = Totals()
        #: A10: open ledgers whose last fragment is lost -> when this worker first saw it
        self._open_lost_since: dict[int, float] = {}
        #: A11: which of those are a stream's open segment -> the stream's name
        self._open_streams: dict[int, str] = {}
        #: the round's filter (A13): a ledger's members not yet lost long enough wait
        self._ready: Ready = lambda _: True

    def _event(self, event: str, ledger_id: int, **details: object) -> None:
        if event == "skipped":
            self.totals.skipped += 1
        elif event == "failed":
            self.totals.failed += 1
        self._report({"event": event, "ledger": ledger_id, **details})

    async def run_once(self, ready: Ready = lambda _: True) -> None:
        """One pass over every ledger: each with a lost member `ready` is repaired,
        or reported skipped and why. Open ledgers past their grace are recovered."""
        self._ready = ready
        live = await live_nodes(self._store)
        draining = await draining_addresses(self._store)
        streams = await stream_ledgers(self._store)
        async for versioned in all_ledgers(self._store):
            record = versioned.value
            lost = [m for m in lost_members(record, live, draining) if ready(m)]
            if not lost and not self._options.deep:
                self._open_lost_since.pop(record.ledger_id, None)
                self._open_streams.pop(record.ledger_id, None)
                continue
            if not lost:
                lost = await short_members(record, live, [], self._channel_for, self._config)
                if not lost:
                    continue
            await self._consider(record, lost, streams.get(record.ledger_id))

    async def wait_for_open_ledgers(self) -> None:
        """A10 for a run that ends: wait out the grace of the open ledgers seen with a
        lost last fragment, then recover and repair those still so."""
        while self._open_lost_since:
            now = anyio.current_time()
            ledger_id, since = min(self._open_lost_since.items(), key=lambda item: item[1])
            await anyio.sleep(max(0.0, since + self._options.open_grace_s - now))
            await self._repair_open_end(ledger_id)

    async def _consider(
        self, record: LedgerMetadata, lost: list[LostMember], stream: StreamLedger | None
    ) -> None:
        ledger_id = record.ledger_id
        if record.state is LedgerState.IN_RECOVERY:
            self._event("skipped", ledger_id, why="in recovery: its recovery owns the record (A12)")
            return
        open_end = [m for m in lost if m.fragment.is_open_end]
        if len(open_end) < len(lost):
            await self._repair_ledger(ledger_id)
        if any(m.why == DRAINING for m in open_end):
            # the node still works, and so does the writer on it: nothing to fence
            self._event(
                "skipped",
                ledger_id,
                why="the open last fragment is on a draining node: repaired once the "
                "ledger is closed (A14)",
            )
        open_end = [m for m in open_end if m.why != DRAINING]
        if not open_end:
            return
        if stream is not None and stream.open and stream.seq is None:
            self._event(
                "skipped",
                ledger_id,
                stream=stream.describe(),
                why="a pending transaction's segment: its commit or abort closes it (A11)",
            )
            return
        if stream is not None and stream.open:
            self._open_streams[ledger_id] = stream.stream
        first_seen = self._open_lost_since.setdefault(ledger_id, anyio.current_time())
        if anyio.current_time() - first_seen >= self._options.open_grace_s:
            await self._repair_open_end(ledger_id)

    async def _repair_open_end(self, ledger_id: int) -> None:
        """A10: fence and recover the ledger if its last fragment is still lost (A11: a
        stream's open segment by taking the stream over), then repair it as a closed
        one."""
        self._open_lost_since.pop(ledger_id, None)
        stream = self._open_streams.pop(ledger_id, None)
        try:
            record = (await self._store.read_ledger(ledger_id)).value
        except NoSuchLedgerMetadata:
            return
        live = await live_nodes(self._store)
        draining = await draining_addresses(self._store)
        still = [
            m
            for m in lost_members(record, live, draining)
            if m.fragment.is_open_end and m.why != DRAINING  # a draining node still works
        ]
        if record.state is LedgerState.OPEN and still:
            await self._repair_ledger(ledger_id, recover_first=True, stream=stream)

    async def _repair_ledger(
        self, ledger_id: int, recover_first: bool = False, stream: str | None = None
    ) -> None:
        store, holder, lease_s = self._store, self._options.holder, self._options.lock_lease_s
        name = lock_name(ledger_id)
        if not await store.acquire_lock(name, holder, lease_s):
            self._event("skipped", ledger_id, why="another worker holds its lock (A4)")
            return
        lost_lock: list[LockLost] = []
        try:
            # the lock keeper ends without raising: an error of the repair is itself
            with lone_error_unwrapped():
                await self._repair_holding(ledger_id, recover_first, stream, name, lost_lock)
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self._config.node_timeout_s):
                try:
                    await store.release_lock(name, holder)
                except MetadataError as error:
                    log.warning("re-replication: releasing %s: %s", name, error)
        if lost_lock:
            self._event("failed", ledger_id, why=str(lost_lock[0]))

    async def _repair_holding(
        self,
        ledger_id: int,
        recover_first: bool,
        stream: str | None,
        name: str,
        lost_lock: list[LockLost],
    ) -> None:
        """The repair, with a task renewing the lock; LockLost cancels the repair."""
        store, holder, lease_s = self._store, self._options.holder, self._options.lock_lease_s
        async with anyio.create_task_group() as group:

            async def keep_lock() -> None:
                while True:
                    await anyio.sleep(lease_s / 3)
                    try:
                        await store.renew_lock(name, holder, lease_s)
                    except LockLost as error:
                        lost_lock.append(error)
                        group.cancel_scope.cancel()
                        return
                    except MetadataError as error:  # unreachable a moment: try again
                        log.warning("re-replication: renewing %s: %s", name, error)

            group.start_soon(keep_lock)
            try:
                await self._repair_locked(ledger_id, recover_first, stream)
            finally:
                group.cancel_scope.cancel()

    async def _repair_locked(self, ledger_id: int, recover_first: bool, stream: str | None) -> None:
        if recover_first and not await self._end_writer(ledger_id, stream):
            return
        try:
            versioned = await self._store.read_ledger(ledger_id)
        except NoSuchLedgerMetadata:
            return  # deleted meanwhile: nothing to keep
        record = versioned.value
        try:
            check_password(record, self._master_key)
        except Unauthorized:
            self._event(
                "skipped", ledger_id, why="the password given is not the ledger's (--password)"
            )
            return
        if record.state is LedgerState.IN_RECOVERY:
            self._event("skipped", ledger_id, why="in recovery: its recovery owns the record (A12)")
            return
        live = await live_nodes(self._store)
        draining = await draining_addresses(self._store)
        lost = [
            m
            for m in lost_members(record, live, draining)
            if not m.fragment.is_open_end and self._ready(m)
        ]
        if self._options.deep:
            lost += await short_members(record, live, lost, self._channel_for, self._config)
        by_fragment: dict[int, list[LostMember]] = {}
        for member in lost:
            by_fragment.setdefault(member.fragment.first_entry_id, []).append(member)
        for members in by_fragment.values():
            await self._repair_fragment(versioned.version, record, members, draining)
            # the next fragment's compare-and-set goes on the version this one made
            try:
                versioned = await self._store.read_ledger(ledger_id)
            except NoSuchLedgerMetadata:
                return  # deleted meanwhile: nothing left to keep
            record = versioned.value

    async def _end_writer(self, ledger_id: int, stream: str | None) -> bool:
        """A10: fence and recover the ledger; A11: for a stream's open segment, take the
        stream over by its own rules instead (the takeover recovers and closes the
        segment, and the document says where it ends). False: leave the ledger."""
        try:
            if stream is None:
                reader = await open_ledger(
                    self._store,
                    self._channel_for,
                    self._config,
                    random.Random(),
                    ledger_id,
                    self._options.password,
                    True,
                )
                await reader.aclose()
            else:
                # the password first: a worker that cannot repair it fences no writer
                record = (await self._store.read_ledger(ledger_id)).value
                check_password(record, self._master_key)
                if not await take_over_stream(
                    self._store, self._channel_for, self._config, stream, ledger_id
                ):
                    return True  # no longer the open segment: repaired as it now is
        except NoSuchLedgerMetadata:
            return False  # deleted meanwhile: nothing to keep
        except Unauthorized:
            self._event(
                "skipped", ledger_id, why="the password given is not the ledger's (--password)"
            )
            return False
        except PoraError as error:
            what = "fencing and recovering it" if stream is None else f"taking {stream} over"
            self._event("failed", ledger_id, why=f"{what}: {error}")
            return False
        if stream is None:
            why = "its last fragment was lost past the grace (A10)"
            self._event("recovered", ledger_id, why=why)
        else:
            why = (
                "its stream's open segment's last fragment was lost past the grace: the "
                "stream taken over, the segment closed (A11)"
            )
            self._event("recovered", ledger_id, stream=stream, why=why)
        return True

    async def _repair_fragment(
        self,
        version: int,
        record: LedgerMetadata,
        members: list[LostMember],
        draining: set[str],
    ) -> None:
        fragment = members[0].fragment
        ledger_id = record.ledger_id
        where = {"first_entry": fragment.first_entry_id, "last_entry": fragment.last_entry_id}
        in_place = {m.position: m.member for m in members if m.why == MISSING_ENTRIES}
        lost = {m.position: m.member for m in members if m.position not in in_place}
        try:
            nodes = await self._store.list_nodes(writable_only=True) if lost else []
            chosen = self._choose(record, fragment.first_entry_id, lost, nodes, draining)
        except NotEnoughNodes as error:
            self._event("skipped", ledger_id, **where, why=f"no replacement: {error}")
            return
        replacements = {p: chosen[m] for p, m in lost.items()} | in_place
        bad = set(replacements)
        sources = tuple((p, m) for p, m in enumerate(fragment.ensemble.members) if p not in bad)
        # a draining member still holds its copies: the last source to ask
        sources += tuple((m.position, m.member) for m in members if m.why == DRAINING)
        survivors = len(sources) - sum(m.why == DRAINING for m in members)
        shift = ledger_id % max(1, survivors)  # spread the reads over the survivors
        spread = sources[shift:survivors] + sources[:shift] + sources[survivors:]
        job = CopyJob(record, fragment, replacements, spread)
        count = CopyCount()
        try:
            await copy_fragment(
                self._channel_for,
                self._config,
                job,
                self._master_key,
                self._throttle,
                count,
                self._options.batch_entries,
            )
        except CopyFailed as error:
            self._event("failed", ledger_id, **where, why=str(error))
            return
        finally:
            self.totals.copied.entries += count.entries
            self.totals.copied.bytes += count.bytes
        changes = {p: (lost[p], replacements[p]) for p in lost}
        if changes and not await replace_members(
            self._store, ledger_id, version, record, fragment.first_entry_id, changes
        ):
            self._event("skipped", ledger_id, **where, why="the fragment changed meanwhile")
            return
        self.totals.repaired += 1
        self._event(
            "repaired",
            ledger_id,
            **where,
            replaced={lost[p].address: replacements[p].address for p in lost},
            refilled=sorted(m.address for m in in_place.values()),
            entries_copied=count.entries,
            bytes_copied=count.bytes,
        )

    def _choose(
        self,
        record: LedgerMetadata,
        first_entry_id: int,
        lost: Mapping[int, EnsembleMember],
        nodes: list[NodeRegistration],
        draining: set[str],
    ) -> dict[EnsembleMember, EnsembleMember]:
        """A5: replacements by the client's placement rules, seeded by the fragment so
        that a worker resuming another's work picks the same nodes."""
        if not lost:
            return {}
        ensemble = next(e for e in record.ensembles if e.first_entry_id == first_entry_id)
        # never a node a position of this ensemble stands for (A8), never a draining
        # one, and for a closed ledger never a member of its last ensemble: the close
        # sealed it there, and it refuses every add of the ledger
        refused = {m.address for p, m in enumerate(ensemble.writer_members()) if p not in lost}
        refused |= draining
        if record.state is LedgerState.CLOSED:
            refused |= {m.address for m in record.ensembles[-1].members}
        return choose_replacements(
            [n for n in nodes if n.address not in refused],
            ensemble.members,
            set(lost.values()),
            random.Random(f"{record.ledger_id}:{first_entry_id}:{sorted(lost)}"),
        )
