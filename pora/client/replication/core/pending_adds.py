"""`PendingAdds`: a ledger writer's pending adds as one state machine (R3..R10, R13),
the client's counterpart of BookKeeper's pending-add queue.

It is the one owner of the writer's state: the next entry id and the encoded entries
not yet acknowledged, the entries added since the last turn and the resends queued
for replacements (R10), the acknowledgements and the LAC (through its `AckTracker`),
the length of the ledger's payload, and the highest LAC a node was sent (R7). The
writer and the ensemble changer feed it what happened (an append, a turn, an
answer, a failure, a replacement) and act on the plain values it returns;
none of them keeps a copy of any of it.

Pure: no I/O, no awaits, no clock (tests/test_import_rules.py keeps it so).
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from typing import NamedTuple

from pora.client.batch import Batch
from pora.client.replication.core.entry_format import (
    HEADER_BYTES,
    LENGTH_MAX,
    encode_checked_entry,
)
from pora.client.replication.core.quorum import AckTracker, EnsembleChange, write_set_table
from pora.meta.records import Ensemble, EnsembleMember, LedgerMetadata


class Send(NamedTuple):
    """One batch for one member, of `payload_bytes` payload bytes (what the client's
    pending bytes count, so that a node's backlog and the pending bytes compare)."""

    member: EnsembleMember
    entries: Batch
    payload_bytes: int


class Released(NamedTuple):
    """Pending entries that left the machine, acknowledged (R4) or failed (a fence):
    their ids, in order, and their payload bytes."""

    ids: range
    payload_bytes: int


NOTHING_RELEASED = Released(range(0), 0)


class PendingAdds:
    """A writer's pending adds, from `add` to acknowledged or failed.

    - `add` takes the next id and encodes the entry; `take_batches` returns, once
      per turn, what each member must be sent: the resends queued for replacements
      (R10), then every entry added since the last turn striped by R3, each cut to
      `call_bytes_max` payload bytes (a single larger entry alone).
    - `acked` counts a member's answer (R4) and returns what became acknowledged;
      `answered` notes the LAC the call carried (R7).
    - `failed` (R8), `replace` (R9, queuing R10's resends) and `ensemble_durable`
      (R10) drive an ensemble change; `fence` (R11, R13) fails every pending entry.
    """

    def __init__(
        self,
        ledger_id: int,
        token: int,
        write_quorum: int,
        ack_quorum: int,
        ensemble: Ensemble,
        *,
        call_bytes_max: int,
    ) -> None:
        if call_bytes_max < 1:
            raise ValueError(f"ledger {ledger_id}: call_bytes_max {call_bytes_max} must be >= 1")
        self.ledger_id = ledger_id
        #: the record's incarnation token, covered by every entry's crc
        self._token = token
        self._tracker = AckTracker(ledger_id, write_quorum, ack_quorum, ensemble)
        self._call_bytes_max = call_bytes_max
        size = len(ensemble.members)
        self._stripes = write_set_table(size, write_quorum)
        #: R3 with Qw = E: every position holds every entry, one list serves them all
        self._everyone_holds_all = all(len(row) == size for row in self._stripes)
        #: pending id -> (id, encoded entry): the item itself is what the batches
        #: carry, made once per entry
        self._entries: dict[int, tuple[int, bytes]] = {}
        self._length = 0  # length_after of the last entry added
        self._acked_length = 0  # length_after of the LAC: the payload bytes acknowledged
        #: the first id no turn took yet (`next_entry_id` when every one was): the
        #: entries from here on go out together in the next turn. Read-only outside;
        #: a plain attribute, not a property, as the writer reads it on every append
        self.first_untaken = 0
        #: the ledger's length when the last turn took its entries: the untaken ones'
        #: payload bytes are what it grew by since (no sum kept up per append)
        self._taken_length = 0
        self._untaken: Batch = []  # their items, in id order
        self._resends: list[Send] = []
        self._lac_sent = -1
        self._answers = 0

    @classmethod
    def of_ledger(cls, metadata: LedgerMetadata, *, call_bytes_max: int) -> PendingAdds:
        """The pending adds of a new writer of `metadata`, on its last ensemble."""
        return cls(
            metadata.ledger_id,
            metadata.token,
            metadata.write_quorum,
            metadata.ack_quorum,
            metadata.ensembles[-1],
            call_bytes_max=call_bytes_max,
        )

    # -- what the I/O side reads ----------------------------------------------------------

    @property
    def last_add_confirmed(self) -> int:
        """R4: the highest id acknowledged with every one before it (-1: none)."""
        return self._tracker.last_add_confirmed

    @property
    def next_entry_id(self) -> int:
        return self._tracker.next_entry_id

    @property
    def acked_length(self) -> int:
        """The ledger's payload bytes up to and including the LAC (R14's length)."""
        return self._acked_length

    @property
    def pending(self) -> range:
        """The ids added and not yet acknowledged (none once fenced)."""
        return self._tracker.pending

    @property
    def ensemble(self) -> Ensemble:
        return self._tracker.ensemble

    @property
    def failed_members(self) -> frozenset[EnsembleMember]:
        """Current members that failed (R8) and are not replaced yet."""
        return self._tracker.failed_members

    @property
    def fenced(self) -> bool:
        return self._tracker.fenced

    @property
    def lac_sent(self) -> int:
        """The highest LAC a node was sent, piggybacked on adds or flushed (R4, R7)."""
        return self._lac_sent

    @property
    def answers(self) -> int:
        """Add calls answered so far: the LAC flush's measure of idleness (R7)."""
        return self._answers

    def sends_to(self, member: EnsembleMember) -> bool:
        """Whether a batch for `member` is still to be sent: not fenced, and `member`
        not replaced meanwhile (its replacement is sent those entries, R10)."""
        tracker = self._tracker
        if tracker.fenced:
            return False
        members = tracker.ensemble.members
        for current in members:  # (by identity first: the member the batch was made for)
            if current is member:
                return True
        return member in members  # (an equal member, another object)

    # -- adding and sending ---------------------------------------------------------------

    def add(self, payload: bytes) -> int:
        """Take the next id for `payload` and encode its entry; returns the id (R5).
        Raises LedgerFenced once fenced, ValueError when the ledger's length would
        overflow the entries' 64-bit length field."""
        tracker = self._tracker
        entry_id = tracker.next_entry_id
        length_after = self._length + len(payload)
        if length_after > LENGTH_MAX:
            raise ValueError(
                f"ledger {self.ledger_id}: {length_after} payload bytes in all would not fit "
                "the entries' 64-bit length: start a new ledger"
            )
        entry = encode_checked_entry(self.ledger_id, entry_id, length_after, payload, self._token)
        tracker.add_pending(entry_id)
        self._length = length_after
        item = (entry_id, entry)
        self._entries[entry_id] = item
        self._untaken.append(item)
        return entry_id

    def take_batches(self) -> list[Send]:
        """The turn's sends: the resends queued for replacements still current (R10),
        then every entry added since the last turn, one batch per member that is not
        failed (R3: a failed member's entries go to its replacement). Nothing once
        fenced."""
        tracker = self._tracker
        size = self._length - self._taken_length
        everything, self._untaken = self._untaken, []
        resends, self._resends = self._resends, []
        self.first_untaken, self._taken_length = tracker.next_entry_id, self._length
        if tracker.fenced:
            return []
        members = tracker.ensemble.members
        failed = tracker.failed_members
        sends: list[Send] = []
        limit = self._call_bytes_max
        for resend in resends:
            if resend.member in members and resend.member not in failed:
                self._cut(sends, resend)
        if not everything:
            return sends
        if self._everyone_holds_all:
            for member in members:
                if failed and member in failed:  # (hashing a member costs a call)
                    continue
                if size <= limit:  # the common case, without a call
                    sends.append(Send(member, everything, size))
                else:
                    self._cut(sends, Send(member, everything, size))
            return sends
        self._stripe(sends, everything, members, failed)
        return sends

    def _stripe(
        self,
        sends: list[Send],
        everything: Batch,
        members: tuple[EnsembleMember, ...],
        failed: frozenset[EnsembleMember],
    ) -> None:
        """R3 with Qw < E: each member's share of a turn's entries."""
        stripes: list[Batch] = [[] for _ in members]
        rows, count = self._stripes, len(members)
        for item in everything:
            for position in rows[item[0] % count]:
                stripes[position].append(item)
        for member, mine in zip(members, stripes, strict=True):
            if mine and member not in failed:
                self._cut(sends, Send(member, mine, _payload_bytes(mine)))

    def _cut(self, sends: list[Send], send: Send) -> None:
        """`send` as pieces of at most `call_bytes_max` payload bytes (a single larger
        entry alone), so that no call carries more."""
        limit = self._call_bytes_max
        member, batch, size = send
        if size > limit and len(batch) > 1:
            start, used = 0, 0
            for index, (_, entry) in enumerate(batch):
                cost = len(entry) - HEADER_BYTES
                if index > start and used + cost > limit:
                    sends.append(Send(member, batch[start:index], used))
                    start, used = index, 0
                used += cost
            send = Send(member, batch[start:], used)
        sends.append(send)

    # -- answers --------------------------------------------------------------------------

    def answered(self, lac: int) -> None:
        """A node answered an add call that carried `lac` (R4, R7), refusing some
        entry of it (`acked` counts an answer storing them all)."""
        self._answers += 1
        self._lac_sent = max(self._lac_sent, lac)

    def acked(self, member: EnsembleMember, batch: Batch, lac: int) -> Released:
        """`member` stored every entry of `batch` (one batch sent to it) in a call that
        carried `lac` (R7). Returns what became acknowledged (R4). An answer of a
        member replaced since, or after a fence, counts nothing."""
        self._answers += 1
        self._lac_sent = max(self._lac_sent, lac)
        # the ids the items hold, not a range's: a range makes an int per id it yields
        return self._release(self._tracker.record_acks(member, map(_ID, batch)))

    def failed(self, member: EnsembleMember) -> bool:
        """R8: a call to `member` failed. True when that is news about a current
        member: an ensemble change is due."""
        return self._tracker.record_failure(member)

    def lac_to_flush(self) -> int | None:
        """R7: the LAC to write to the nodes after an idle interval, when no node was
        sent it yet (None: nothing to write); it counts as sent from here on."""
        lac = self._tracker.last_add_confirmed
        if self._tracker.fenced or lac <= self._lac_sent:
            return None
        self._lac_sent = lac
        return lac

    # -- ensemble changes and the end ------------------------------------------------------

    def replace(self, replacements: Mapping[EnsembleMember, EnsembleMember]) -> EnsembleChange:
        """R9: the ensemble with each key replaced by its value (not durable until
        `ensemble_durable`). Queues for the next turn, R10, what each replacement must
        be sent of the entries earlier turns took (the entries no turn took yet go
        out with their turn, to the new ensemble)."""
        change = self._tracker.change_ensemble(replacements)
        entries, untaken = self._entries, self.first_untaken
        for member, entry_ids in change.resend.items():
            batch = [entries[entry_id] for entry_id in entry_ids if entry_id < untaken]
            if batch:
                self._resends.append(Send(member, batch, _payload_bytes(batch)))
        return change

    def ensemble_durable(self, ensemble: Ensemble) -> Released:
        """R10: `ensemble` is in the metadata. Returns what became acknowledged."""
        return self._release(self._tracker.ensemble_durable(ensemble))

    def fence(self) -> Released:
        """R11/R13: the writer ends. Returns every pending entry, which fails; nothing
        is sent or acknowledged after."""
        failed = self._tracker.fence()
        entries = self._entries
        size = 0
        for entry_id in failed:
            size += len(entries.pop(entry_id)[1]) - HEADER_BYTES
        self.first_untaken, self._taken_length = self._tracker.next_entry_id, self._length
        self._untaken = []
        self._resends.clear()
        return Released(failed, size)

    def _release(self, acked: range) -> Released:
        """`acked` (the ids after the LAC it was, up to the LAC now) leave the machine:
        the ledger's length acknowledged grows by their payload bytes."""
        if not acked:
            return NOTHING_RELEASED
        pop = self._entries.pop
        size = 0
        for entry_id in acked:
            size += len(pop(entry_id)[1])
        size -= HEADER_BYTES * len(acked)
        self._acked_length += size
        return Released(acked, size)


#: an item's id
_ID = itemgetter(0)


def _payload_bytes(batch: Batch) -> int:
    """The payload bytes of encoded entries."""
    return sum(len(entry) for _, entry in batch) - HEADER_BYTES * len(batch)


__all__ = ["NOTHING_RELEASED", "Batch", "PendingAdds", "Released", "Send"]
