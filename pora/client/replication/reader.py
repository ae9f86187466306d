"""Reading a replicated ledger: `open_ledger` (the password check, recovery of an open
ledger when asked) and `LedgerReader` (R23 the LAC bound, R24 reads from the write
set, range reads for sequences, R25 the tail in `tail.py`)."""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel

from journal.errors import PoraError
from ledger.errors import NoSuchEntry
from netio.security import master_key_from_password
from pora.client.replication.config import ClientConfig
from pora.client.replication.core.entry_format import decode_entry
from pora.client.replication.core.ledger_records import check_password, why_fenced
from pora.client.replication.core.quorum import ensemble_of, entry_write_set
from pora.client.replication.errors import (
    ClientClosed,
    EntryDamaged,
    EntryLost,
    EntryUnreadable,
)
from pora.client.replication.recovery import recover_ledger
from pora.client.replication.replica_reads import (
    AllAnsweredNoSuchEntry,
    ChannelFor,
    ReplicaAnswer,
    read_from_write_set,
)
from pora.client.replication.tail import tail_ledger
from pora.meta.errors import NoSuchLedgerMetadata
from pora.meta.records import EnsembleMember, LedgerMetadata, LedgerState, Versioned
from pora.meta.store import MetadataStore

if TYPE_CHECKING:  # prometheus_client is imported only when the application asks
    from pora.client.replication.metrics import ClientMetrics

log = logging.getLogger(__name__)


async def open_ledger(
    store: MetadataStore,
    channel_for: ChannelFor,
    config: ClientConfig,
    rng: random.Random,
    ledger_id: int,
    password: str | bytes,
    recover: bool = True,
    metrics: ClientMetrics | None = None,
) -> LedgerReader:
    """A reader of the ledger. `Unauthorized` for a wrong password. An open ledger is
    recovered and closed first (`recover=True`, R16..R22), or read as it is, never past
    its LAC (`recover=False`, no fencing: its writer goes on)."""
    master_key = master_key_from_password(password)
    record = await store.read_ledger(ledger_id)
    check_password(record.value, master_key)
    if recover and record.value.state is not LedgerState.CLOSED:
        record = await recover_ledger(store, channel_for, config, ledger_id, master_key, rng)
        if metrics is not None:
            metrics.recovered()
    reader = LedgerReader(store, channel_for, config, rng, record, metrics)
    if record.value.state is not LedgerState.CLOSED:
        await reader.refresh_last_add_confirmed()
    return reader


class LedgerReader:
    def __init__(
        self,
        store: MetadataStore,
        channel_for: ChannelFor,
        config: ClientConfig,
        rng: random.Random,
        record: Versioned[LedgerMetadata],
        metrics: ClientMetrics | None = None,
    ) -> None:
        self.store = store
        #: counts the speculative reads (R24) when the application asked for metrics
        self._on_speculative = None if metrics is None else metrics.speculative_read
        self.channel_for = channel_for
        self.config = config
        self.rng = rng
        self.record = record
        self._lac = record.value.last_entry_id if self.closed else -1
        #: damaged replicas seen (R24: skipped, never returned): (address, damage)
        self.damaged: list[tuple[str, EntryDamaged]] = []
        self._shut = False
        #: set when the client that opened this reader ends (its channels are gone)
        self._client_closed = False

    @property
    def ledger_id(self) -> int:
        return self.record.value.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self.record.value

    @property
    def closed(self) -> bool:
        return self.record.value.state is LedgerState.CLOSED

    @property
    def last_add_confirmed(self) -> int:
        """R23: the highest entry this reader may return: a closed ledger's last entry,
        else the highest LAC learnt from the nodes."""
        return self.record.value.last_entry_id if self.closed else self._lac

    @property
    def last_entry_id(self) -> int:
        return self.last_add_confirmed

    def learn(self, record: Versioned[LedgerMetadata]) -> None:
        """A newer record (from the metadata watch, or a re-read)."""
        if record.version > self.record.version:
            self.record = record

    async def reread(self) -> Versioned[LedgerMetadata]:
        """The record as the store has it now; LedgerDeleted (a NoSuchLedger) when it
        is gone: the ledger was deleted under this reader (R26)."""
        try:
            return await self.store.read_ledger(self.ledger_id)
        except NoSuchLedgerMetadata as gone:
            raise why_fenced(self.ledger_id, None) from gone

    def learn_lac(self, last_add_confirmed: int) -> None:
        self._lac = max(self._lac, last_add_confirmed)

    async def refresh_last_add_confirmed(self, entry_id: int | None = None) -> int:
        """Ask the write set of `entry_id` (default: every member of the last
        ensemble, where the writer is) for its LAC, in parallel, no fencing; the
        highest answer counts (each is a lower bound)."""
        if self.closed:
            return self.last_add_confirmed
        if entry_id is None:
            members = self.metadata.ensembles[-1].members
        else:
            members = entry_write_set(self.metadata, entry_id)

        async def ask(member: EnsembleMember) -> None:
            try:
                with anyio.fail_after(self.config.node_timeout_s):
                    channel = await self.channel_for(member.address)
                    lac, _ = await channel.read_lac(
                        self.ledger_id,
                        instance_id=member.instance_id,
                        timeout_s=self.config.node_timeout_s,
                    )
            except (PoraError, TimeoutError) as error:
                log.info("ledger %d: LAC from %s: %s", self.ledger_id, member.address, error)
                return
            self.learn_lac(lac)

        async with anyio.create_task_group() as group:
            for member in members:
                group.start_soon(ask, member)
        return self._lac

    async def _bound_for(self, entry_id: int) -> int:
        """R23: the bound `entry_id` must be within; refreshed once (the nodes' LAC,
        then the record, which a close may have moved) when it is above."""
        if entry_id <= self.last_add_confirmed or self.closed:
            return self.last_add_confirmed
        await self.refresh_last_add_confirmed(entry_id)
        if entry_id > self._lac:
            seen = self.record.version
            self.learn(await self.reread())
            if self.record.version != seen and not self.closed:
                # a new ensemble: its members know the newer LAC
                await self.refresh_last_add_confirmed(entry_id)
        return self.last_add_confirmed

    async def read(self, entry_id: int) -> bytes:
        """R23, R24: the entry's payload. NoSuchEntry above the bound (the LAC of an
        open ledger, the last entry of a closed one); EntryLost when every replica of
        an entry within it says it holds none."""
        with self.closed_client_guard():
            return await self._read(entry_id)

    async def _read(self, entry_id: int) -> bytes:
        if entry_id < 0 or entry_id > await self._bound_for(entry_id):
            raise NoSuchEntry(self.ledger_id, entry_id)
        try:
            answer = await self._read_replicas(entry_id)
        except EntryUnreadable:
            await self.reread()  # deleted meanwhile (its nodes refuse it): LedgerDeleted
            raise
        except AllAnsweredNoSuchEntry:
            # an open ledger's writer may have moved the entry to a new ensemble this
            # reader has not seen yet: re-read the record once before calling it lost
            seen = self.record.version
            self.learn(await self.reread())
            if self.record.version == seen:
                raise EntryLost(
                    self.ledger_id,
                    entry_id,
                    [m.address for m in entry_write_set(self.metadata, entry_id)],
                ) from None
            try:
                answer = await self._read_replicas(entry_id)
            except AllAnsweredNoSuchEntry as none:
                raise EntryLost(self.ledger_id, entry_id, none.members) from None
        self.learn_lac(answer.last_add_confirmed)
        return answer.entry.payload

    async def _read_replicas(self, entry_id: int) -> ReplicaAnswer:
        return await read_from_write_set(
            self.channel_for,
            self.config,
            self.ledger_id,
            entry_id,
            entry_write_set(self.metadata, entry_id),
            on_damaged=self._report_damage,
            token=self.metadata.token,
            on_speculative=self._on_speculative,
        )

    def _report_damage(self, address: str, damage: EntryDamaged) -> None:
        self.damaged.append((address, damage))

    async def read_entries(self, first: int, last: int) -> AsyncIterator[tuple[int, bytes]]:
        """`(entry_id, payload)` for first..last in order, by range reads per node of
        at most `read_range_entries_max` entries at a time (memory stays bounded); an
        entry no range read gave is read alone (R24). NoSuchEntry when `last` is above
        the bound (R23), before anything is yielded."""
        with self.closed_client_guard():
            if first < 0 or last > await self._bound_for(last):
                raise NoSuchEntry(self.ledger_id, last if first >= 0 else first)
        next_id = first
        while next_id <= last:
            chunk_last = min(last, next_id + self.config.read_range_entries_max - 1)
            with self.closed_client_guard():
                found, complete_through = await self._range_from_covering_members(
                    next_id, chunk_last
                )
            while next_id <= chunk_last:
                payload = found.pop(next_id, None)
                if payload is None:
                    if next_id > complete_through:
                        break  # a node stopped at its cap: a new range read from here
                    payload = await self.read(next_id)
                yield next_id, payload
                next_id += 1

    async def _range_from_covering_members(
        self, first: int, last: int
    ) -> tuple[dict[int, bytes], int]:
        """Range reads of [first, last] (within one ensemble's span at a time) to the
        members at positions 0, Qw, 2Qw, ...: together they are on every write set.
        Returns the valid copies found and the id through which every answer was
        complete (a node stops at its caps). Whatever fails or is damaged is left out;
        the caller reads those alone."""
        found: dict[int, bytes] = {}
        complete = [last]
        metadata = self.metadata
        start = first
        while start <= last:
            ensemble = ensemble_of(metadata, start)
            later = [e.first_entry_id for e in metadata.ensembles if e.first_entry_id > start]
            end = min([last, *(f - 1 for f in later)])
            members = ensemble.members[:: metadata.write_quorum]
            async with anyio.create_task_group() as group:
                for member in members:
                    group.start_soon(self._range_one, member, start, end, found, complete)
            if min(complete) < end:
                return found, max(first - 1, min(complete))
            start = end + 1
        return found, last

    async def _range_one(
        self,
        member: EnsembleMember,
        first: int,
        last: int,
        found: dict[int, bytes],
        complete: list[int],
    ) -> None:
        try:
            with anyio.fail_after(self.config.node_timeout_s):
                channel = await self.channel_for(member.address)
                answer = await channel.read_range(
                    self.ledger_id,
                    first,
                    last,
                    max_entries=self.config.read_range_entries_max,
                    max_bytes=self.config.read_range_bytes_max,
                    instance_id=member.instance_id,
                    timeout_s=self.config.node_timeout_s,
                )
        except (PoraError, TimeoutError) as error:
            log.info("ledger %d: range read from %s: %s", self.ledger_id, member.address, error)
            return
        self.learn_lac(answer.last_add_confirmed)
        complete.append(answer.complete_through)
        for entry_id, data in answer.entries:
            try:
                entry = decode_entry(self.ledger_id, entry_id, data, token=self.metadata.token)
                found.setdefault(entry_id, entry.payload)
            except EntryDamaged as damage:
                log.warning("replica %s: %s", member.address, damage)
                self._report_damage(member.address, damage)

    def tail(self, from_entry_id: int = 0) -> AsyncIterator[tuple[int, bytes]]:
        """R25: `(entry_id, payload)` from `from_entry_id` on, as the LAC confirms them;
        ends after the last entry of a closed ledger."""
        self._check_open()
        return tail_ledger(self, from_entry_id)

    def _check_open(self) -> None:
        if self._client_closed:
            raise self._client_closed_error()
        if self._shut:
            raise RuntimeError(f"the reader of ledger {self.ledger_id} was closed (aclose)")

    def client_closed(self) -> None:
        """The client that opened this reader ended: its reads and tails raise
        ClientClosed from now on."""
        self._client_closed = True

    def _client_closed_error(self) -> ClientClosed:
        return ClientClosed(self.ledger_id, "the reader reads no more")

    @contextmanager
    def closed_client_guard(self) -> Iterator[None]:
        """A read that failed because the client ended under it (its channels closed,
        its store too) raises ClientClosed, not what each replica's failure said."""
        self._check_open()
        try:
            yield
        except Exception as error:
            if self._client_closed:
                raise self._client_closed_error() from error
            raise

    async def aclose(self) -> None:
        """The reader is done (its channels belong to the client's pool)."""
        self._shut = True
        await anyio.lowlevel.checkpoint()
