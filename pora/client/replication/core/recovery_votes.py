"""A recovery's quorum bookkeeping: fencing coverage (R17), where reading starts
(R18), and each entry's present/absent vote (R19).

Both trackers count answers per member of the write set, by address, so a repeated
answer never counts twice; the I/O layer turns the nodes' responses into the calls
below and acts on `covered` and `outcome`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

from pora.client.replication.core.entry_format import ReplicatedEntry, decode_entry
from pora.client.replication.core.quorum import entry_write_set, write_set_positions
from pora.client.replication.errors import EntryDamaged
from pora.meta.records import Ensemble, EnsembleMember, LedgerMetadata


def absence_quorum(write_quorum: int, ack_quorum: int) -> int:
    """Qw - Qa + 1: that many members of a write set fenced, or answering "no such
    entry", leave at most Qa - 1 that could acknowledge or hold the entry."""
    if not write_quorum >= ack_quorum >= 1:
        raise ValueError(f"quorums Qw={write_quorum} Qa={ack_quorum} break Qw >= Qa >= 1")
    return write_quorum - ack_quorum + 1


class FenceCoverage:
    """R17: fencing covers the last ensemble once every write set has Qw - Qa + 1
    fenced members; then no write set has Qa unfenced members and the old writer can
    acknowledge nothing more. Any answer to a fencing read fences that node, whatever
    its instance id: a wiped node fences the ledger like any other."""

    def __init__(self, ensemble: Ensemble, write_quorum: int, ack_quorum: int) -> None:
        self.ensemble = ensemble
        self.needed = absence_quorum(write_quorum, ack_quorum)
        size = len(ensemble.members)
        if write_quorum > size:
            raise ValueError(f"write quorum {write_quorum} exceeds the ensemble's {size} nodes")
        # every distinct write set of the ensemble: one per starting position
        self._write_sets = sorted(
            {tuple(sorted(write_set_positions(start, size, write_quorum))) for start in range(size)}
        )
        self._addresses = [member.address for member in ensemble.members]
        self._fenced: set[int] = set()

    def record_fenced(self, address: str) -> bool:
        """The node at `address` answered a fencing read. Returns `covered`."""
        if address in self._addresses:
            self._fenced.add(self._addresses.index(address))
        return self.covered

    @property
    def fenced(self) -> frozenset[str]:
        return frozenset(self._addresses[p] for p in self._fenced)

    @property
    def covered(self) -> bool:
        return not self.uncovered_write_sets()

    def uncovered_write_sets(self) -> list[tuple[EnsembleMember, ...]]:
        """The write sets still short of fenced members (for the error a recovery that
        times out raises)."""
        members = self.ensemble.members
        return [
            tuple(members[p] for p in positions)
            for positions in self._write_sets
            if len(self._fenced.intersection(positions)) < self.needed
        ]


def recovery_start(reported_lacs: Iterable[int], last_ensemble: Ensemble) -> int:
    """R18: the first entry a recovery reads: after the highest LAC the fenced nodes
    reported, and never before the last ensemble's first entry (every entry before it
    was acknowledged before the ensemble change that created it, while the new
    ensemble's members report LAC -1).

    A last ensemble written by a recovery (members that joined in it, R20) is read
    from its first entry whatever the LACs: its joined members hold only the entries
    that recovery re-added before it died, and every entry from there on must be
    added to them again. Entries before it were re-added by that recovery (it went
    through them in order before it replaced a member)."""
    if last_ensemble.stands_for:
        return last_ensemble.first_entry_id
    highest = max(reported_lacs, default=-1)
    return max(highest, last_ensemble.first_entry_id - 1) + 1


def recovery_vote(metadata: LedgerMetadata, entry_id: int) -> EntryRecoveryVote:
    """R19 for one entry of an IN_RECOVERY record: the writer's members of its write
    set decide (the writer's view: members that joined in an earlier recovery put back
    to the ones they stand for); the members that joined are asked as well, for
    presence only."""
    writers = entry_write_set(metadata.writer_view(), entry_id)
    current = entry_write_set(metadata, entry_id)
    joined = [member for member in current if member not in writers]
    return EntryRecoveryVote(
        metadata.ledger_id,
        entry_id,
        writers,
        metadata.ack_quorum,
        joined,
        token=metadata.token,
    )


class VoteOutcome(enum.Enum):
    PRESENT = "present"  # a member of the right instance returned it, crc valid
    ABSENT = "absent"  # Qw - Qa + 1 members of the right instance said no such entry
    WAITING = "waiting"  # answers missing that could still decide
    UNKNOWN = "unknown"  # every member answered and nothing decided: ask again


class EntryRecoveryVote:
    """R19: whether one entry exists, from fencing reads to its write set.

    Only answers from a member whose instance id is the ensemble's count: a node whose
    data dir was wiped never held what the old one did (BookKeeper #2612). Errors,
    CORRUPT, timeouts and crc failures leave a member undecided, never negative
    (#2908). Absence needs Qw - Qa + 1 negatives, not the whole write set, so one
    hung node cannot stall recovery (#1067). Present wins over absent: recovering an
    entry that was never acknowledged is allowed, losing an acknowledged one is not.
    """

    def __init__(
        self,
        ledger_id: int,
        entry_id: int,
        write_set: Sequence[EnsembleMember],
        ack_quorum: int,
        joined: Sequence[EnsembleMember] = (),
        *,
        token: int = 0,
    ) -> None:
        self.ledger_id = ledger_id
        #: the record's incarnation token: an entry of an earlier ledger of this id
        #: fails its crc, a damaged copy that never counts as present
        self.token = token
        self.entry_id = entry_id
        #: the members the writer wrote this entry to: they decide absence
        self.write_set = tuple(write_set)
        self.needed = absence_quorum(len(self.write_set), ack_quorum)
        self._instances = {member.address: member.instance_id for member in self.write_set}
        #: members that joined in a recovery (R20), asked too: one may hold the entry
        #: (a recovery gave it), but its "no such entry" proves nothing. One at an
        #: address of the write set (a new instance of a writer's member) is left out:
        #: the writer's member there decides.
        self.joined = tuple(m for m in joined if m.address not in self._instances)
        self._instances.update({member.address: member.instance_id for member in self.joined})
        self._joined = {member.address for member in self.joined}
        self._joined_lacking: set[str] = set()
        self._negative: set[str] = set()
        self._undecided: dict[str, str] = {}  # address -> why its answer did not count
        self._entry: ReplicatedEntry | None = None
        #: replicas whose bytes failed the crc check, to report (R24: never returned)
        self.damaged: list[tuple[str, EntryDamaged]] = []

    def _ours(self, address: str, instance_id: str) -> bool:
        expected = self._instances.get(address)
        if expected is None:
            return False
        if instance_id != expected:
            self._undecided[address] = (
                f"instance {instance_id}, not the ensemble's {expected} (data dir replaced)"
            )
            return False
        return True

    def record_entry(self, address: str, instance_id: str, data: bytes | memoryview) -> None:
        """`address` returned the entry's bytes."""
        if not self._ours(address, instance_id):
            return
        try:
            entry = decode_entry(self.ledger_id, self.entry_id, data, token=self.token)
        except EntryDamaged as damage:
            self.damaged.append((address, damage))
            self._undecided[address] = damage.what
            return
        self._undecided.pop(address, None)
        if self._entry is None:
            self._entry = entry

    def record_no_such_entry(self, address: str, instance_id: str) -> None:
        """`address` answered NO_SUCH_ENTRY to the fencing read."""
        if self._ours(address, instance_id):
            self._undecided.pop(address, None)
            if address in self._joined:
                self._joined_lacking.add(address)  # answered, and counts for nothing
            else:
                self._negative.add(address)

    def record_error(self, address: str, reason: str) -> None:
        """Any other answer (an error, CORRUPT, a timeout, a lost connection)."""
        if address in self._instances and address not in self._negative | self._joined_lacking:
            self._undecided[address] = reason

    def ask_again(self) -> tuple[EnsembleMember, ...]:
        """Forget the undecided answers; returns the members to ask again."""
        self._undecided.clear()
        return self.members_to_ask()

    def members_to_ask(self) -> tuple[EnsembleMember, ...]:
        decided = self._negative | self._joined_lacking | set(self._undecided)
        return tuple(m for m in self.write_set + self.joined if m.address not in decided)

    @property
    def entry(self) -> ReplicatedEntry | None:
        return self._entry

    @property
    def negatives(self) -> frozenset[str]:
        return frozenset(self._negative)

    @property
    def undecided(self) -> dict[str, str]:
        """Members whose answer did not count, and why (for the error message)."""
        return dict(self._undecided)

    @property
    def outcome(self) -> VoteOutcome:
        if self._entry is not None:
            return VoteOutcome.PRESENT
        if len(self._negative) >= self.needed:
            return VoteOutcome.ABSENT
        if self.members_to_ask():
            return VoteOutcome.WAITING
        return VoteOutcome.UNKNOWN
