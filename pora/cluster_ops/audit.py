"""`pora audit`: every under-replicated fragment of every ledger and stream segment
(docs/rereplication.md, A1..A3), from the metadata alone, and with `deep` also from
range reads of each live member (A1's short members)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pora.client.replication.config import ClientConfig
from pora.client.replication.replica_reads import ChannelFor
from pora.cluster_ops.copying import read_held
from pora.cluster_ops.fragments import (
    MISSING_ENTRIES,
    LostMember,
    copies_left,
    entries_held,
    fragments_of,
    lost_members,
)
from pora.cluster_ops.inventory import (
    StreamLedger,
    all_ledgers,
    draining_addresses,
    live_nodes,
    stream_ledgers,
)
from pora.meta.records import LedgerMetadata, NodeRegistration
from pora.meta.store import MetadataStore


@dataclass(frozen=True)
class Finding:
    """One under-replicated member of one fragment, as the audit lists it."""

    record: LedgerMetadata
    lost: LostMember
    stream: StreamLedger | None

    def to_json(self) -> dict[str, object]:
        fragment = self.lost.fragment
        return {
            "ledger": self.record.ledger_id,
            "state": self.record.state.value,
            "stream": None if self.stream is None else self.stream.describe(),
            "fragment": {
                "first_entry": fragment.first_entry_id,
                "last_entry": fragment.last_entry_id,
            },
            "position": self.lost.position,
            "node": self.lost.member.address,
            "instance_id": self.lost.member.instance_id,
            "why": self.lost.why,
            "entries_at_risk": self.lost.entries_at_risk,
            "copies_left": self.lost.copies_left,
        }

    def line(self) -> str:
        fragment = self.lost.fragment
        end = "open" if fragment.last_entry_id is None else str(fragment.last_entry_id)
        risk = "unknown" if self.lost.entries_at_risk is None else str(self.lost.entries_at_risk)
        owner = "" if self.stream is None else f" [{self.stream.describe()}]"
        return (
            f"ledger {self.record.ledger_id} ({self.record.state.value}){owner} entries "
            f"{fragment.first_entry_id}..{end}: {self.lost.member.address} {self.lost.why}; "
            f"entries at risk {risk}, copies left {self.lost.copies_left}"
        )


@dataclass
class AuditReport:
    ledgers: int = 0
    fragments: int = 0
    findings: list[Finding] = field(default_factory=list)


async def audit(
    store: MetadataStore,
    *,
    deep: bool = False,
    channel_for: ChannelFor | None = None,
    config: ClientConfig | None = None,
) -> AuditReport:
    """Every under-replicated member of every fragment. `deep` range-reads each live
    member's fragment (closed ranges only) and lists the ones missing entries."""
    if deep and channel_for is None:
        raise ValueError("a deep audit reads from the nodes: give it a channel_for")
    live = await live_nodes(store)
    draining = await draining_addresses(store)
    streams = await stream_ledgers(store)
    report = AuditReport()
    async for versioned in all_ledgers(store):
        record = versioned.value
        report.ledgers += 1
        report.fragments += len(fragments_of(record))
        lost = lost_members(record, live, draining)
        if deep:
            assert channel_for is not None
            lost += await short_members(record, live, lost, channel_for, config or ClientConfig())
        stream = streams.get(record.ledger_id)
        report.findings += [Finding(record, member, stream) for member in lost]
    return report


async def short_members(
    record: LedgerMetadata,
    live: Mapping[str, NodeRegistration],
    lost: list[LostMember],
    channel_for: ChannelFor,
    config: ClientConfig,
) -> list[LostMember]:
    """A1 with `--deep`: the live members of closed ranges that lack entries their
    position should hold, found by range reads."""
    e, qw = record.ensemble_size, record.write_quorum
    found: list[LostMember] = []
    already = {(m.fragment.first_entry_id, m.position) for m in lost}
    for fragment in fragments_of(record):
        last = fragment.last_entry_id
        if last is None:
            continue
        for position, member in enumerate(fragment.ensemble.members):
            if (fragment.first_entry_id, position) in already or member.address not in live:
                continue
            missing = 0
            chunk = config.read_range_entries_max
            for start in range(fragment.first_entry_id, last + 1, chunk):
                end = min(last, start + chunk - 1)
                wanted = set(entries_held(start, end, position, e, qw))
                held = await read_held(channel_for, config, record, member, start, end, wanted)
                missing += len(wanted) - len(held)
            if missing:
                positions = {m.position for m in lost if m.fragment == fragment} | {position}
                left = copies_left(fragment, positions, e, qw)
                found.append(LostMember(fragment, position, member, MISSING_ENTRIES, missing, left))
    return found
