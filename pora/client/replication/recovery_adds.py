"""R20: a recovery's adds: the recovered entries, RECOVERY flag, to their whole write
set, one call per member with its entries in id order."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio

from journal.errors import PoraError
from pora.client.replication.config import ClientConfig
from pora.client.replication.core.entry_format import ReplicatedEntry, encode_entry
from pora.client.replication.core.quorum import entry_write_set
from pora.client.replication.replica_reads import ChannelFor
from pora.meta.records import EnsembleMember, LedgerMetadata

log = logging.getLogger(__name__)

#: once every entry reached Qa members, one that has not answered gets this much
#: longer; a hung one is left behind, under-replicated as after any failure (#1067)
STRAGGLER_GRACE_S = 1.0


@dataclass
class AddOutcome:
    #: entries stored on fewer than Qa members, with each failure
    short: dict[int, list[str]] = field(default_factory=dict)
    #: members whose adds failed (errors, timeouts)
    failed: set[EnsembleMember] = field(default_factory=set)

    def why(self) -> str:
        return "; ".join(
            f"entry {entry_id}: {', '.join(failures)}" for entry_id, failures in self.short.items()
        )


async def add_recovered(
    channel_for: ChannelFor,
    config: ClientConfig,
    metadata: LedgerMetadata,
    master_key: bytes,
    entries: Sequence[ReplicatedEntry],
) -> AddOutcome:
    ledger_id = metadata.ledger_id
    by_member: dict[EnsembleMember, list[tuple[int, bytes]]] = {}
    for entry in entries:
        data = encode_entry(
            ledger_id, entry.entry_id, entry.length_after, entry.payload, token=metadata.token
        )
        for member in entry_write_set(metadata, entry.entry_id):
            by_member.setdefault(member, []).append((entry.entry_id, data))
    stored: dict[int, int] = {entry.entry_id: 0 for entry in entries}
    failures: dict[int, list[str]] = {entry.entry_id: [] for entry in entries}
    outcome = AddOutcome()
    # the LAC piggybacked: what the recovery knows was acknowledged
    lac = entries[0].entry_id - 1

    async def add_to(member: EnsembleMember, batch: list[tuple[int, bytes]]) -> None:
        results: Sequence[PoraError | str | None]
        try:
            with anyio.fail_after(config.node_timeout_s):
                channel = await channel_for(member.address)
                results = await channel.add_entries(
                    ledger_id,
                    batch,
                    master_key=master_key,
                    last_add_confirmed=lac,
                    recovery=True,
                    instance_id=member.instance_id,
                    timeout_s=config.node_timeout_s,
                )
        except TimeoutError:
            results = [f"no answer in {config.node_timeout_s} s"] * len(batch)
        except PoraError as error:
            results = [error] * len(batch)
        for (entry_id, _), result in zip(batch, results, strict=True):
            if result is None:
                stored[entry_id] += 1
            else:
                failures[entry_id].append(f"{member.address}: {result}")
                outcome.failed.add(member)

    quorum_met, all_done = anyio.Event(), anyio.Event()
    unanswered = len(by_member)

    async def add_and_count(member: EnsembleMember, batch: list[tuple[int, bytes]]) -> None:
        nonlocal unanswered
        await add_to(member, batch)
        unanswered -= 1
        if all(count >= metadata.ack_quorum for count in stored.values()):
            quorum_met.set()
        if unanswered == 0:
            quorum_met.set()
            all_done.set()

    async with anyio.create_task_group() as group:
        for member, batch in by_member.items():
            group.start_soon(add_and_count, member, batch)
        await quorum_met.wait()
        with anyio.move_on_after(STRAGGLER_GRACE_S):
            await all_done.wait()
        group.cancel_scope.cancel()
    for entry_id, count in stored.items():
        if failures[entry_id]:
            log.warning(
                "recovery of ledger %d: entry %d reached %d member(s) of its write set; "
                "failed on %s",
                ledger_id,
                entry_id,
                count,
                failures[entry_id],
            )
        if count < metadata.ack_quorum:
            outcome.short[entry_id] = failures[entry_id]
    return outcome
