"""What crash recovery makes of the journal's records: each ledger's part, its
consecutive entries merged into runs.

The journal interleaves the records of many ledgers; a ledger worker applies its
own in journal order, and applying a run of consecutive entries is one step for it
(`LedgerWorker._append_run`) where a record each is one Python step per record.
So replay does not make a `Request` per record: for every ledger it extends one
open run with each ENTRY record that continues it (the next entry id, the same
flags), and only a record that does not (another kind, a gap or a repeated id,
other flags) closes the run and starts the next request. Applied in that order,
the runs reach exactly the state the records one by one would: a run's entries
are checked and stored entry by entry wherever the fast path does not take it,
its LAC is the largest of its records', and a record's outcome depends only on
its ledger's state, which only a record of another kind changes.

A merged request spans several journal seqs: its `seq` is its first record's, and
each ledger's part (`LedgerPart`) keeps the last seq it holds, which is what the
ledger becomes durable through once it is flushed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from journal.format import RecordFlag, RecordKind
from journal.records import Framed
from journal.request import LedgerPart, Request


@dataclass(slots=True)
class ReplayTally:
    """What replay read and what it selected. Records are counted as operations:
    each entry of a run counts."""

    records_scanned: int = 0
    payload_bytes_scanned: int = 0
    records_selected: int = 0
    payload_bytes_selected: int = 0
    ledgers_selected: set[int] = field(default_factory=set)


class _Gathered:
    """One ledger's records gathered since the last `take`: the requests closed so
    far, in journal order, then the run its next ENTRY record may still extend."""

    __slots__ = (
        "bodies",
        "first_entry_id",
        "first_seq",
        "flags",
        "lac",
        "last_seq",
        "next_entry_id",
        "requests",
    )

    def __init__(self) -> None:
        self.requests: list[Request] = []
        #: the open run's bodies (None: no run open), first entry id, first seq
        self.bodies: list[memoryview] | None = None
        self.first_entry_id = 0
        self.first_seq = 0
        #: the entry id that extends the open run (None: no run open)
        self.next_entry_id: int | None = None
        self.flags = RecordFlag.NONE
        self.lac = -1
        #: the seq of the ledger's last record gathered
        self.last_seq = -1

    def close_run(self, ledger_id: int) -> None:
        """The open run, if any, becomes the ledger's next request."""
        if self.bodies is None:
            return
        request = Request.entry_run(
            ledger_id, self.first_entry_id, self.bodies, self.lac, self.flags, None, None, []
        )
        request.seq = self.first_seq
        self.requests.append(request)
        self.bodies = self.next_entry_id = None


class ReplayRuns:
    """The records to replay of a stretch of the journal, by ledger, merged into runs
    (see the module's docstring). `add` takes a verified batch's framed records,
    `take` hands over what was gathered and starts afresh."""

    __slots__ = ("_durable_seq", "_gathered", "records", "tally")

    def __init__(self, durable_seqs: Mapping[int, int], tally: ReplayTally) -> None:
        #: a ledger's records up to this seq are durable in its entry log and index
        self._durable_seq = durable_seqs.get
        self.tally = tally
        self._gathered: dict[int, _Gathered] = {}
        #: entries and other records gathered since the last `take`
        self.records = 0

    def add(self, framed: list[Framed], mapped: memoryview) -> None:
        """Gather a whole batch's records past their ledger's durable seq (-1 if it
        has none). Bodies are views of the mapping (`mapped`), not copies: a copy
        here was a third of replay's time (a fresh page of memory every 4 KiB).

        The hot loop of replay: locals only, one dict lookup and a few compares for a
        record that extends its ledger's run."""
        durable_seq = self._durable_seq
        gathered = self._gathered
        gathered_for = gathered.get
        entry_kind = RecordKind.ENTRY
        scanned = scanned_bytes = selected = selected_bytes = 0
        for (
            seq,
            kind,
            flags,
            ledger_id,
            entry_id,
            lac,
            _position,
            body_start,
            end,
            bodies,
            payload_bytes,
            body_count,
        ) in framed:
            scanned += body_count
            scanned_bytes += payload_bytes
            if seq <= durable_seq(ledger_id, -1):
                continue
            selected += body_count
            selected_bytes += payload_bytes
            ledger = gathered_for(ledger_id)
            if (
                ledger is not None
                and ledger.next_entry_id == entry_id
                and kind is entry_kind
                and ledger.flags is flags
            ):
                run_bodies = ledger.bodies
                assert run_bodies is not None  # a run is open: next_entry_id is set
                if bodies is None:
                    run_bodies.append(mapped[body_start:end])
                else:
                    run_bodies += bodies
                ledger.next_entry_id = entry_id + body_count
                ledger.last_seq = seq
                if lac > ledger.lac:  # noqa: PLR1730 (a compare is cheaper than max())
                    ledger.lac = lac
                continue
            if ledger is None:
                ledger = gathered[ledger_id] = _Gathered()
            else:
                ledger.close_run(ledger_id)
            ledger.last_seq = seq
            if kind is entry_kind:
                ledger.bodies = [mapped[body_start:end]] if bodies is None else bodies
                ledger.first_entry_id = entry_id
                ledger.next_entry_id = entry_id + body_count
                ledger.first_seq = seq
                ledger.flags = flags
                ledger.lac = lac
            else:
                request = Request(
                    kind,
                    ledger_id,
                    entry_id,
                    b"",
                    flags,
                    None,
                    lac,
                    None,
                    bytes(mapped[body_start:end]),
                )
                request.seq = seq
                ledger.requests.append(request)
        self.records += selected
        tally = self.tally
        tally.records_scanned += scanned
        tally.payload_bytes_scanned += scanned_bytes
        tally.records_selected += selected
        tally.payload_bytes_selected += selected_bytes

    def take(self) -> dict[int, LedgerPart]:
        """Each ledger's part gathered since the last `take`, its run closed."""
        parts: dict[int, LedgerPart] = {}
        for ledger_id, ledger in self._gathered.items():
            ledger.close_run(ledger_id)
            parts[ledger_id] = LedgerPart(ledger.requests, ledger.last_seq)
        self.tally.ledgers_selected.update(parts)
        self._gathered = {}
        self.records = 0
        return parts
