"""A6: the entries at risk of one lost member, copied from the fragment's surviving
members to its replacement: range reads in id order, each copy checked against its
crc, RECOVERY adds in batches, what the replacement already holds not sent again."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from journal.errors import PoraError
from pora.client.replication.config import ClientConfig
from pora.client.replication.core.entry_format import decode_entry
from pora.client.replication.errors import EntryDamaged
from pora.client.replication.replica_reads import ChannelFor
from pora.cluster_ops.fragments import Fragment, holds
from pora.cluster_ops.throttle import Throttle
from pora.meta.records import EnsembleMember, LedgerMetadata

log = logging.getLogger("pora.cluster_ops")


class CopyFailed(PoraError):
    """Entries of a fragment could not be put on its replacement: none of the
    surviving members holds them (lost), or the replacement refused them."""

    def __init__(self, ledger_id: int, first: int, last: int, why: str) -> None:
        self.ledger_id = ledger_id
        super().__init__(f"ledger {ledger_id}, fragment {first}..{last}: {why}")


@dataclass
class CopyCount:
    entries: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class CopyJob:
    record: LedgerMetadata
    fragment: Fragment
    #: the lost positions of the fragment and who takes each
    replacements: dict[int, EnsembleMember]
    #: the members copies are read from, in the order they are asked
    sources: tuple[tuple[int, EnsembleMember], ...]


async def copy_fragment(
    channel_for: ChannelFor,
    config: ClientConfig,
    job: CopyJob,
    master_key: bytes,
    throttle: Throttle,
    count: CopyCount,
    batch_entries: int,
) -> None:
    """Put every entry of the fragment that a replaced position should hold on its
    replacement. CopyFailed when an entry is on no source or a replacement refuses."""
    fragment = job.fragment
    assert fragment.last_entry_id is not None, "an open end is copied only once closed"
    end = fragment.last_entry_id
    chunk = max(1, batch_entries)
    # two stages: the next batch is read while this one is added (one batch ahead:
    # memory stays at two batches)
    send, receive = anyio.create_memory_object_stream[Batches | CopyFailed](1)

    async def read_ahead() -> None:
        async with send:
            for first in range(fragment.first_entry_id, end + 1, chunk):
                try:
                    batches = await _gather(
                        channel_for, config, job, first, min(end, first + chunk - 1)
                    )
                except CopyFailed as error:
                    await send.send(error)
                    return
                await send.send(batches)

    failure: CopyFailed | None = None
    async with anyio.create_task_group() as group, receive:
        group.start_soon(read_ahead)
        try:
            async for item in receive:
                if isinstance(item, CopyFailed):
                    raise item
                for member, batch in item:
                    for piece in throttle.cut(batch):
                        size = sum(len(data) for _, data in piece)
                        await throttle.take(len(piece), size)
                        await _add(channel_for, config, job.record, member, master_key, piece)
                        count.entries += len(piece)
                        count.bytes += size
        except CopyFailed as error:
            failure = error  # raised outside the group, as itself
        group.cancel_scope.cancel()
    if failure is not None:
        raise failure


#: what one batch of ids brings: for each replacement, its (entry id, bytes) in order
Batches = list[tuple[EnsembleMember, list[tuple[int, bytes]]]]


async def _gather(
    channel_for: ChannelFor, config: ClientConfig, job: CopyJob, first: int, last: int
) -> Batches:
    """The copies each replacement lacks of ids first..last, read from the sources.
    CopyFailed when one is on no source."""
    record = job.record
    e, qw = record.ensemble_size, record.write_quorum
    wanted = {
        position: {i for i in range(first, last + 1) if holds(i, position, e, qw)}
        for position in job.replacements
    }
    for position, member in job.replacements.items():
        held = await read_held(channel_for, config, record, member, first, last, wanted[position])
        wanted[position].difference_update(held)
    needed = set().union(*wanted.values())
    if not needed:
        return []
    found: dict[int, bytes] = {}
    for _, source in job.sources:
        left = needed.difference(found)
        if not left:
            break
        found.update(
            await read_held(channel_for, config, record, source, min(left), max(left), left)
        )
    missing = needed.difference(found)
    if missing:
        raise CopyFailed(
            record.ledger_id,
            job.fragment.first_entry_id,
            last,
            f"entries {sorted(missing)[:10]}{' ...' if len(missing) > 10 else ''} are on no "
            "surviving member: lost; the record is left as it is",
        )
    return [
        (member, [(i, found[i]) for i in sorted(wanted[position])])
        for position, member in job.replacements.items()
        if wanted[position]
    ]


async def read_held(
    channel_for: ChannelFor,
    config: ClientConfig,
    record: LedgerMetadata,
    member: EnsembleMember,
    first: int,
    last: int,
    wanted: set[int],
) -> dict[int, bytes]:
    """The valid copies of `wanted` ids that `member` holds in [first, last] (range
    reads until complete); what fails is left out, for the next source to give."""
    found: dict[int, bytes] = {}
    start = first
    try:
        channel = await channel_for(member.address)
        while start <= last:
            with anyio.fail_after(config.node_timeout_s):
                answer = await channel.read_range(
                    record.ledger_id,
                    start,
                    last,
                    max_entries=config.read_range_entries_max,
                    max_bytes=config.read_range_bytes_max,
                    instance_id=member.instance_id,
                    timeout_s=config.node_timeout_s,
                )
            for entry_id, data in answer.entries:
                if entry_id not in wanted:
                    continue
                try:
                    decode_entry(record.ledger_id, entry_id, data, token=record.token)
                except EntryDamaged as damage:
                    log.warning("re-replication: replica %s: %s", member.address, damage)
                    continue
                found[entry_id] = bytes(data)
            if answer.complete_through < start:
                break  # no progress: leave the rest to the next source
            start = answer.complete_through + 1
    except (PoraError, TimeoutError, OSError) as error:
        log.info(
            "re-replication: ledger %d: range read %d..%d from %s: %s",
            record.ledger_id,
            first,
            last,
            member.address,
            error,
        )
    return found


async def _add(
    channel_for: ChannelFor,
    config: ClientConfig,
    record: LedgerMetadata,
    member: EnsembleMember,
    master_key: bytes,
    batch: Sequence[tuple[int, bytes]],
) -> None:
    try:
        channel = await channel_for(member.address)
        with anyio.fail_after(config.node_timeout_s):
            results = await channel.add_entries(
                record.ledger_id,
                batch,
                master_key=master_key,
                last_add_confirmed=batch[-1][0],
                recovery=True,
                instance_id=member.instance_id,
                timeout_s=config.node_timeout_s,
            )
    except (PoraError, TimeoutError, OSError) as error:
        raise CopyFailed(
            record.ledger_id, batch[0][0], batch[-1][0], f"adds to {member.address} failed: {error}"
        ) from error
    refused = [(entry_id, r) for (entry_id, _), r in zip(batch, results, strict=True) if r]
    if refused:
        entry_id, why = refused[0]
        raise CopyFailed(
            record.ledger_id,
            batch[0][0],
            batch[-1][0],
            f"{member.address} refused {len(refused)} entries (entry {entry_id}: {why})",
        )
