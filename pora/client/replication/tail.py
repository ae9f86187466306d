"""R25: following a ledger as it is written. Entries are returned once the LAC
confirms them (R23); between them the tail long-polls the LAC on the write set of the
next entry and watches the ledger's record, which tells of a new ensemble (the write
sets move) and of the close (the last entry is fixed; the tail ends after it).

A poll for the entry right after the LAC asks for that entry too (READ_LAC with
ENTRY, BookKeeper's readLastAddConfirmedAndEntry): when the answer's LAC covers it,
the tail returns it with no second round trip. An entry above the answer's LAC is
dropped, never returned (R23).

No task group is open across a `yield`: each wait runs its polls and its watch in a
group of its own that ends before the next entry is returned.

The tail follows a `FollowedLedger`: what it needs of a `LedgerReader` (reader.py,
whose `tail` is built on this module), named here so that this module does not
import the reader that imports it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager
from typing import Protocol

import anyio

from journal.errors import PoraError
from pora.client.replication.config import ClientConfig
from pora.client.replication.core.entry_format import decode_entry
from pora.client.replication.core.ledger_records import why_fenced
from pora.client.replication.core.quorum import entry_write_set
from pora.client.replication.errors import EntryDamaged
from pora.client.replication.replica_reads import ChannelFor
from pora.meta.errors import NoSuchLedgerMetadata
from pora.meta.records import EnsembleMember, LedgerMetadata, Versioned
from pora.meta.store import MetadataStore

log = logging.getLogger(__name__)

#: a node that failed a long poll is asked again after this (it may be restarting)
POLL_RETRY_DELAY_S = 0.1


class FollowedLedger(Protocol):
    """What the tail reads and tells of the ledger it follows (a `LedgerReader`)."""

    store: MetadataStore
    channel_for: ChannelFor
    config: ClientConfig
    record: Versioned[LedgerMetadata]
    #: damaged replicas seen (R24): (address, damage)
    damaged: list[tuple[str, EntryDamaged]]

    @property
    def ledger_id(self) -> int: ...
    @property
    def metadata(self) -> LedgerMetadata: ...
    @property
    def closed(self) -> bool: ...
    @property
    def last_add_confirmed(self) -> int: ...
    def learn(self, record: Versioned[LedgerMetadata]) -> None: ...
    def learn_lac(self, last_add_confirmed: int) -> None: ...
    def read_entries(self, first: int, last: int) -> AsyncIterator[tuple[int, bytes]]: ...
    def closed_client_guard(self) -> AbstractContextManager[None]: ...


async def tail_ledger(
    reader: FollowedLedger, from_entry_id: int
) -> AsyncIterator[tuple[int, bytes]]:
    next_id = max(0, from_entry_id)
    #: entries the long polls brought, confirmed by the LAC they came with
    polled: dict[int, bytes] = {}
    while True:
        payload = polled.pop(next_id, None)
        if payload is not None and next_id <= reader.last_add_confirmed:
            yield next_id, payload
            next_id += 1
            continue
        polled.clear()
        if next_id <= reader.last_add_confirmed:
            async for entry_id, payload in reader.read_entries(next_id, reader.last_add_confirmed):
                yield entry_id, payload
                next_id = entry_id + 1
            continue
        if reader.closed:
            return  # after the last entry of a closed ledger
        with reader.closed_client_guard():  # ClientClosed once the client ended
            await wait_for_progress(reader, next_id, polled)


async def wait_for_progress(reader: FollowedLedger, next_id: int, polled: dict[int, bytes]) -> None:
    """Until the LAC passes `next_id - 1`, the record changes, or a poll's wait ends.
    A poll that brings entry `next_id` with a LAC covering it leaves it in `polled`.
    Streams' subscribers wait on it too, beside a watch of their stream's document."""
    config = reader.config
    known_lac = reader.last_add_confirmed
    version = reader.record.version
    deleted = False
    with_entry = next_id == known_lac + 1

    async def poll(member: EnsembleMember) -> None:
        data: bytes | None = None
        timeout_s = config.tail_poll_wait_s + config.node_timeout_s
        try:
            with anyio.fail_after(timeout_s):
                channel = await reader.channel_for(member.address)
                if with_entry:
                    lac, _, data = await channel.read_lac_and_entry(
                        reader.ledger_id,
                        known_lac=known_lac,
                        wait_s=config.tail_poll_wait_s,
                        instance_id=member.instance_id,
                        timeout_s=timeout_s,
                    )
                else:
                    lac, _ = await channel.read_lac(
                        reader.ledger_id,
                        known_lac=known_lac,
                        wait_s=config.tail_poll_wait_s,
                        instance_id=member.instance_id,
                        timeout_s=timeout_s,
                    )
        except (PoraError, TimeoutError) as error:
            log.info("ledger %d: long poll on %s: %s", reader.ledger_id, member.address, error)
            await anyio.sleep(POLL_RETRY_DELAY_S)
            return
        if lac <= known_lac:
            return
        if data is not None and lac >= next_id:  # R23: only a confirmed entry
            try:
                polled[next_id] = decode_entry(
                    reader.ledger_id, next_id, data, token=reader.metadata.token
                ).payload
            except EntryDamaged as damage:  # read again from the write set (R24)
                reader.damaged.append((member.address, damage))
        reader.learn_lac(lac)
        group.cancel_scope.cancel()

    async def watch() -> None:
        nonlocal deleted
        changes = reader.store.watch_ledger(reader.ledger_id, after_version=version)
        try:
            async for record in changes:
                reader.learn(record)
                group.cancel_scope.cancel()
                return
            deleted = True
            group.cancel_scope.cancel()
        except NoSuchLedgerMetadata:  # gone before the watch began
            deleted = True
            group.cancel_scope.cancel()
        finally:
            close = getattr(changes, "aclose", None)
            if close is not None:
                with anyio.CancelScope(shield=True):
                    await close()

    with anyio.move_on_after(config.tail_poll_wait_s):
        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            for member in entry_write_set(reader.metadata, next_id):
                group.start_soon(poll, member)
    if deleted:  # R26: the tail ends with LedgerDeleted, a NoSuchLedger
        raise why_fenced(reader.ledger_id, None)
