"""Write sets (R3) and the writer's acknowledgement bookkeeping (R4, R6, R10).

`AckTracker` is the one owner of a writer's quorum state: which entries are pending,
which members of each write set acknowledged them, which ensemble they belong to and
whether that ensemble is durable in the metadata. The I/O layer feeds it answers and
completes waiters from the ranges it returns; it never decides an acknowledgement
itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ledger.errors import LedgerFenced
from pora.meta.records import Ensemble, EnsembleMember, LedgerMetadata


def write_set_positions(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """R3: the ensemble positions that store `entry_id`: `(entry_id + k) mod E` for
    k = 0 .. Qw-1. The entry id is the ledger's, not an offset into the ensemble, so
    an ensemble change keeps every entry's positions."""
    if entry_id < 0:
        raise ValueError(f"entry id {entry_id} is negative")
    if not ensemble_size >= write_quorum >= 1:
        raise ValueError(f"write quorum {write_quorum} must be in 1..E={ensemble_size}")
    return tuple((entry_id + k) % ensemble_size for k in range(write_quorum))


def write_set_table(ensemble_size: int, write_quorum: int) -> tuple[tuple[int, ...], ...]:
    """R3 by residue: row r is `write_set_positions(r, ...)`, the positions of every
    entry whose id is r modulo E. A batch is striped, and an acknowledgement checked,
    with one index per entry instead of the rule worked out again."""
    return tuple(write_set_positions(r, ensemble_size, write_quorum) for r in range(ensemble_size))


def _position_masks(table: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """Each row of a `write_set_table` as bits (1 << position)."""
    return tuple(sum(1 << position for position in row) for row in table)


def write_set(
    entry_id: int, members: Sequence[EnsembleMember], write_quorum: int
) -> tuple[EnsembleMember, ...]:
    """R3: the members that store `entry_id`, first replica first."""
    return tuple(members[p] for p in write_set_positions(entry_id, len(members), write_quorum))


def ensemble_of(metadata: LedgerMetadata, entry_id: int) -> Ensemble:
    """The ensemble whose range holds `entry_id`: the last one starting at or before it."""
    if entry_id < 0:
        raise ValueError(f"ledger {metadata.ledger_id}: entry id {entry_id} is negative")
    covering = metadata.ensembles[0]
    for ensemble in metadata.ensembles:
        if ensemble.first_entry_id > entry_id:
            break
        covering = ensemble
    return covering


def entry_write_set(metadata: LedgerMetadata, entry_id: int) -> tuple[EnsembleMember, ...]:
    """R3 over a ledger's record: who stores `entry_id`."""
    return write_set(entry_id, ensemble_of(metadata, entry_id).members, metadata.write_quorum)


@dataclass(frozen=True)
class EnsembleChange:
    """R9/R10: the ensemble to write to the metadata (compare-and-set), and for each
    replacement the pending entries it must be sent."""

    ensemble: Ensemble
    resend: Mapping[EnsembleMember, tuple[int, ...]]


class AckTracker:
    """A writer's pending entries and their acknowledgements.

    - R4: an entry is acknowledged once Qa distinct members of its write set answered
      OK and every earlier entry is acknowledged; `record_ack` returns the range of ids
      that became acknowledged, in order.
    - R10: nothing at or after the first entry of an ensemble not yet durable in the
      metadata is acknowledged before `ensemble_durable` names that ensemble.
    - R9: `change_ensemble` replaces failed members; surviving members' acks keep
      counting, a replaced member's acks stop counting, and the change says which
      pending entries each replacement must be sent.

    Every pending entry belongs to the current ensemble: a new ensemble starts at
    LAC + 1, the first entry not yet acknowledged.
    """

    def __init__(
        self,
        ledger_id: int,
        write_quorum: int,
        ack_quorum: int,
        ensemble: Ensemble,
        last_add_confirmed: int = -1,
    ) -> None:
        if not len(ensemble.members) >= write_quorum >= ack_quorum >= 1:
            raise ValueError(
                f"ledger {ledger_id}: quorums E={len(ensemble.members)} Qw={write_quorum} "
                f"Qa={ack_quorum} break E >= Qw >= Qa >= 1"
            )
        if ensemble.first_entry_id > last_add_confirmed + 1:
            raise ValueError(
                f"ledger {ledger_id}: ensemble at entry {ensemble.first_entry_id} leaves a "
                f"gap after the last confirmed entry {last_add_confirmed}"
            )
        self.ledger_id = ledger_id
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self._ensemble = ensemble
        self._positions = {member: p for p, member in enumerate(ensemble.members)}
        #: R3 as bits, by entry id modulo E: E and Qw never change, nor then the masks
        self._masks = _position_masks(write_set_table(len(ensemble.members), write_quorum))
        self._durable = True  # the ensemble a writer starts on is read from the metadata
        self._lac = last_add_confirmed
        #: the id the next entry added takes. Read-only outside; a plain attribute, not
        #: a property, as the writer's path reads it on every append
        self.next_entry_id = last_add_confirmed + 1
        # pending entry id -> the positions that acked, as bits (1 << position): an int
        # per entry is cheaper to make on every append than a set
        self._acks: dict[int, int] = {}
        self._failed: set[EnsembleMember] = set()
        self._fenced = False

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def ensemble(self) -> Ensemble:
        return self._ensemble

    @property
    def ensemble_is_durable(self) -> bool:
        return self._durable

    @property
    def pending(self) -> range:
        """The ids sent and not yet acknowledged (none once fenced: they failed)."""
        return (
            range(self.next_entry_id, self.next_entry_id)
            if self._fenced
            else range(self._lac + 1, self.next_entry_id)
        )

    @property
    def failed_members(self) -> frozenset[EnsembleMember]:
        """Current members that failed (R8) and are not replaced yet."""
        return frozenset(self._failed)

    @property
    def fenced(self) -> bool:
        return self._fenced

    def add(self, entry_id: int) -> tuple[EnsembleMember, ...]:
        """Take the next entry; returns its write set, the members to send it to (R4)."""
        self.add_pending(entry_id)
        return self.write_set(entry_id)

    def add_pending(self, entry_id: int) -> None:
        """`add` without computing the write set: the writer's sender stripes a whole
        turn at once, so the append path skips building a tuple per entry."""
        if self._fenced:
            raise LedgerFenced(self.ledger_id)
        if entry_id != self.next_entry_id:
            raise ValueError(
                f"ledger {self.ledger_id}: entry {entry_id} added, expected {self.next_entry_id} "
                "(entries are added in order, each once: R5)"
            )
        self._acks[entry_id] = 0
        self.next_entry_id += 1

    def write_set(self, entry_id: int) -> tuple[EnsembleMember, ...]:
        return write_set(entry_id, self._ensemble.members, self.write_quorum)

    def record_ack(self, entry_id: int, member: EnsembleMember) -> range:
        """`member` holds `entry_id` durably. Returns the ids that became acknowledged
        (empty when none did). An answer from a member no longer in the entry's write
        set (replaced since) does not count."""
        self._count_ack(entry_id, member)
        return self._advance()

    def record_acks(self, member: EnsembleMember, entry_ids: Iterable[int]) -> range:
        """`member` holds every one of `entry_ids` (a run or batch answered at once):
        counted as one `record_ack` each, the acknowledged range computed once."""
        position = self._positions.get(member)
        if position is None or self._fenced:
            return self._advance()
        acks, masks = self._acks, self._masks
        bit = 1 << position
        size = len(masks)
        # one lookup of the member for the whole batch: `_count_ack` inlined
        for entry_id in entry_ids:
            held = acks.get(entry_id)
            if held is not None and masks[entry_id % size] & bit:
                acks[entry_id] = held | bit
        return self._advance()

    def record_failure(self, member: EnsembleMember) -> bool:
        """R8: a request to `member` failed. True when that is news about a current
        member: the I/O layer then starts an ensemble change for it."""
        if member not in self._ensemble.members or member in self._failed:
            return False
        self._failed.add(member)
        return True

    def change_ensemble(
        self, replacements: Mapping[EnsembleMember, EnsembleMember]
    ) -> EnsembleChange:
        """R9: the current ensemble with each key replaced by its value, starting at
        LAC + 1. Not durable until `ensemble_durable` (R10)."""
        if self._fenced:
            raise LedgerFenced(self.ledger_id)
        members = list(self._ensemble.members)
        current = set(members)
        # a member replaced by itself takes its position back (R9: its quarantine
        # ended): it is sent every pending entry of its write sets again
        moved = {old: new for old, new in replacements.items() if old != new}
        newcomers = set(moved.values())
        if not replacements or not current.issuperset(replacements):
            raise ValueError(f"ledger {self.ledger_id}: replacements must name current members")
        if len(newcomers) != len(moved) or newcomers & current:
            raise ValueError(
                f"ledger {self.ledger_id}: replacements must be distinct nodes outside the ensemble"
            )
        positions = {members.index(old): new for old, new in replacements.items()}
        for position, new in positions.items():
            members[position] = new
        resend: dict[EnsembleMember, list[int]] = {new: [] for new in replacements.values()}
        acks = self._acks
        for entry_id in acks:
            for position in write_set_positions(entry_id, len(members), self.write_quorum):
                if position in positions:
                    acks[entry_id] &= ~(1 << position)
                    resend[positions[position]].append(entry_id)
        self._ensemble = Ensemble(self._lac + 1, tuple(members))
        self._positions = {member: p for p, member in enumerate(members)}
        self._durable = False
        self._failed.difference_update(replacements)
        return EnsembleChange(self._ensemble, {new: tuple(ids) for new, ids in resend.items()})

    def ensemble_durable(self, ensemble: Ensemble) -> range:
        """R10: `ensemble` is in the metadata (its compare-and-set succeeded). Returns the
        ids that became acknowledged. An ensemble superseded by a later change (same
        first entry, other members) makes nothing durable: its members are not all the
        ones that counted acks."""
        if ensemble != self._ensemble or self._fenced:
            return range(0)
        self._durable = True
        return self._advance()

    def fence(self) -> range:
        """R11/R13: the writer is fenced. Returns the pending ids, which fail with
        LedgerFenced; no later answer acknowledges anything."""
        failed = self.pending
        self._fenced = True
        self._acks.clear()
        return failed

    def _count_ack(self, entry_id: int, member: EnsembleMember) -> None:
        held = self._acks.get(entry_id)
        position = self._positions.get(member)
        if held is None or position is None or self._fenced:
            return
        bit = 1 << position
        masks = self._masks
        if masks[entry_id % len(masks)] & bit:  # R3: in the entry's write set
            self._acks[entry_id] = held | bit

    def _advance(self) -> range:
        if not self._durable:
            return range(0)
        acks, quorum = self._acks, self.ack_quorum
        first = following = self._lac + 1
        while acks.get(following, 0).bit_count() >= quorum:
            del acks[following]
            following += 1
        self._lac = following - 1
        return range(first, following)
