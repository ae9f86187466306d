"""What `pora status` computes from the metadata store alone: which fragments of a
ledger have a replica on a node that is gone, and the hook for a node's draining mark.

A fragment is one ensemble of a ledger and the entries it covers: from its
`first_entry_id` to the entry before the next ensemble's, the last one up to the
ledger's last entry once closed (open: still growing). One of its members is
missing when no live node is registered at its address, or the node registered
there has another instance id (its data dir was wiped or replaced: it does not hold
what the old one held). This is the cheap, registration-only half of an audit; the
deep check (is every entry really there) is `pora audit --deep`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pora.client.replication.quorum import write_set_positions
from pora.meta.records import EnsembleMember, LedgerMetadata, LedgerState, NodeRegistration


@dataclass(frozen=True)
class Fragment:
    """A fragment with at least one missing replica."""

    ledger_id: int
    first_entry_id: int
    #: the last entry it covers; None while it is the open ledger's growing tail
    last_entry_id: int | None
    missing: tuple[EnsembleMember, ...]
    #: the fewest live copies any of its entries has (Qw minus the missing members of
    #: the worst write set)
    copies_left: int

    def as_json(self) -> dict[str, object]:
        return {
            "ledger_id": self.ledger_id,
            "first_entry_id": self.first_entry_id,
            "last_entry_id": self.last_entry_id,
            "missing": [
                {"address": member.address, "instance_id": member.instance_id}
                for member in self.missing
            ],
            "copies_left": self.copies_left,
        }


def is_live(member: EnsembleMember, live: Mapping[str, NodeRegistration]) -> bool:
    """The member's node is registered, and with the instance id the member names."""
    registration = live.get(member.address)
    return registration is not None and registration.instance_id == member.instance_id


def under_replicated(meta: LedgerMetadata, live: Mapping[str, NodeRegistration]) -> list[Fragment]:
    """The ledger's fragments that hold entries (or may: an open ledger's last one)
    and have a member that is not live. `live`: the registrations by address."""
    found = []
    for index, ensemble in enumerate(meta.ensembles):
        last: int | None
        if index + 1 < len(meta.ensembles):
            last = meta.ensembles[index + 1].first_entry_id - 1
        elif meta.state is LedgerState.CLOSED:
            last = meta.last_entry_id
        else:
            last = None
        if last is not None and last < ensemble.first_entry_id:
            continue  # covers no entry: nothing is at risk
        missing = [p for p, member in enumerate(ensemble.members) if not is_live(member, live)]
        if not missing:
            continue
        size = len(ensemble.members)
        worst = max(
            len(set(write_set_positions(start, size, meta.write_quorum)) & set(missing))
            for start in range(size)
        )
        found.append(
            Fragment(
                meta.ledger_id,
                ensemble.first_entry_id,
                last,
                tuple(ensemble.members[p] for p in missing),
                meta.write_quorum - worst,
            )
        )
    return found


def draining(node: NodeRegistration) -> bool | None:
    """Whether `node` is marked draining (decommissioned: placement puts nothing new
    on it); None when this build's registrations carry no such mark. The mark is set
    by `pora node decommission`; this reads it by the name `draining` when the
    registration has it, so `pora status` shows it as soon as registrations do."""
    value = getattr(node, "draining", None)
    return value if isinstance(value, bool) else None
