"""Which fragments of a ledger record are under-replicated (docs/rereplication.md,
A1..A3), decided from the record and the live registrations alone: no I/O, so the
audit, the re-replication worker and their tests share one answer."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass

from pora.meta.records import (
    Ensemble,
    EnsembleMember,
    LedgerMetadata,
    LedgerState,
    NodeRegistration,
)

#: why a member counts as lost (A1)
UNREGISTERED = "not registered"
OTHER_INSTANCE = "registered with another instance id"
DRAINING = "draining"
MISSING_ENTRIES = "missing entries"


@dataclass(frozen=True)
class Fragment:
    """One ensemble of a record with its entry range (A1). `last_entry_id` is None for
    an open ledger's last fragment: its end is what its writer has written."""

    ledger_id: int
    index: int
    ensemble: Ensemble
    first_entry_id: int
    last_entry_id: int | None

    @property
    def is_open_end(self) -> bool:
        return self.last_entry_id is None


def fragments_of(record: LedgerMetadata) -> list[Fragment]:
    """The record's fragments in order; a closed ledger's empty last fragments (A3)
    are left out."""
    ensembles = record.ensembles
    found = []
    for index, ensemble in enumerate(ensembles):
        if index + 1 < len(ensembles):
            last: int | None = ensembles[index + 1].first_entry_id - 1
        elif record.state is LedgerState.CLOSED:
            last = record.last_entry_id
        else:
            last = None
        if last is not None and last < ensemble.first_entry_id:
            continue
        found.append(Fragment(record.ledger_id, index, ensemble, ensemble.first_entry_id, last))
    return found


def holds(entry_id: int, position: int, ensemble_size: int, write_quorum: int) -> bool:
    """R3: whether the member at `position` is in entry `entry_id`'s write set."""
    return (position - entry_id) % ensemble_size < write_quorum


def entries_held(
    first: int, last: int, position: int, ensemble_size: int, write_quorum: int
) -> Iterator[int]:
    """The ids in [first, last] whose write set holds `position` (A2), in order."""
    for entry_id in range(first, last + 1):
        if holds(entry_id, position, ensemble_size, write_quorum):
            yield entry_id


def count_held(first: int, last: int, position: int, ensemble_size: int, write_quorum: int) -> int:
    """How many ids of [first, last] the member at `position` holds, without a walk:
    each run of E consecutive ids puts Qw of them on every position."""
    total = last - first + 1
    if total <= 0:
        return 0
    cycles, rest = divmod(total, ensemble_size)
    tail = sum(
        holds(first + cycles * ensemble_size + k, position, ensemble_size, write_quorum)
        for k in range(rest)
    )
    return cycles * write_quorum + tail


def copies_left(
    fragment: Fragment, lost_positions: Collection[int], ensemble_size: int, write_quorum: int
) -> int:
    """Qw less the lost members of the fragment's worst write set (A2)."""
    span = (
        None
        if fragment.last_entry_id is None
        else fragment.last_entry_id - fragment.first_entry_id + 1
    )
    residues = range(ensemble_size if span is None else min(span, ensemble_size))
    worst = 0
    for offset in residues:
        entry_id = fragment.first_entry_id + offset
        worst = max(
            worst, sum(holds(entry_id, p, ensemble_size, write_quorum) for p in lost_positions)
        )
    return write_quorum - worst


@dataclass(frozen=True)
class LostMember:
    """A member of a fragment that no longer holds what it should (A1)."""

    fragment: Fragment
    position: int
    member: EnsembleMember
    why: str
    #: entries of the fragment on that member (None: an open end, not yet known)
    entries_at_risk: int | None
    copies_left: int


def lost_members(
    record: LedgerMetadata,
    live: Mapping[str, NodeRegistration],
    draining: Collection[str] = (),
) -> list[LostMember]:
    """Every member of the record's fragments that is lost (A1) by the registrations
    `live` (address -> registration); members at a `draining` address count too (A14)."""
    e, qw = record.ensemble_size, record.write_quorum
    found: list[LostMember] = []
    for fragment in fragments_of(record):
        why_lost: dict[int, str] = {}
        for position, member in enumerate(fragment.ensemble.members):
            why = member_problem(member, live, draining)
            if why is not None:
                why_lost[position] = why
        left = copies_left(fragment, why_lost.keys(), e, qw)
        for position, why in why_lost.items():
            at_risk = (
                None
                if fragment.last_entry_id is None
                else count_held(fragment.first_entry_id, fragment.last_entry_id, position, e, qw)
            )
            member = fragment.ensemble.members[position]
            found.append(LostMember(fragment, position, member, why, at_risk, left))
    return found


def member_problem(
    member: EnsembleMember, live: Mapping[str, NodeRegistration], draining: Collection[str] = ()
) -> str | None:
    """Why `member` no longer counts as a copy (A1, A14), or None."""
    registration = live.get(member.address)
    if registration is None:
        return UNREGISTERED
    if registration.instance_id != member.instance_id:
        return OTHER_INSTANCE
    if member.address in draining:
        return DRAINING
    return None
