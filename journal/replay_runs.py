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

import mmap
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


class _OpenRun:
    """The run a ledger's next ENTRY record may still extend."""

    __slots__ = ("bodies", "first_entry_id", "first_seq", "flags", "lac", "next_entry_id")

    def __init__(
        self,
        first_entry_id: int,
        next_entry_id: int,
        flags: RecordFlag,
        bodies: list[bytes],
        lac: int,
        first_seq: int,
    ) -> None:
        self.first_entry_id = first_entry_id
        self.next_entry_id = next_entry_id
        self.flags = flags
        self.bodies = bodies
        self.lac = lac
        self.first_seq = first_seq

    def request(self, ledger_id: int) -> Request:
        request = Request.entry_run(
            ledger_id, self.first_entry_id, self.bodies, self.lac, self.flags, None, None, []
        )
        request.seq = self.first_seq
        return request


class ReplayRuns:
    """The records to replay of a stretch of the journal, by ledger, merged into runs
    (see the module's docstring). `add` takes a verified batch's framed records,
    `take` hands over what was gathered and starts afresh."""

    __slots__ = ("_durable_seq", "_last_seqs", "_open", "_parts", "records", "tally")

    def __init__(self, durable_seqs: Mapping[int, int], tally: ReplayTally) -> None:
        #: a ledger's records up to this seq are durable in its entry log and index
        self._durable_seq = durable_seqs.get
        self.tally = tally
        #: closed requests per ledger, in journal order (its open run follows them)
        self._parts: dict[int, list[Request]] = {}
        self._open: dict[int, _OpenRun] = {}
        #: per ledger, the seq of the last record gathered
        self._last_seqs: dict[int, int] = {}
        #: entries and other records gathered since the last `take`
        self.records = 0

    def add(self, framed: list[Framed], mapped: mmap.mmap) -> None:
        """Gather a whole batch's records past their ledger's durable seq (-1 if it
        has none). Bodies are copied out of the mapping once, here.

        The hot loop of replay: locals only, one dict lookup and a few compares for a
        record that extends its ledger's run."""
        durable_seq = self._durable_seq
        open_runs = self._open
        open_run = open_runs.get
        last_seqs = self._last_seqs
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
            last_seqs[ledger_id] = seq
            run = open_run(ledger_id)
            if (
                run is not None
                and run.next_entry_id == entry_id
                and kind is entry_kind
                and run.flags is flags
            ):
                if bodies is None:
                    run.bodies.append(mapped[body_start:end])
                else:
                    run.bodies += bodies
                run.next_entry_id = entry_id + body_count
                if lac > run.lac:  # noqa: PLR1730 (a compare is cheaper than max())
                    run.lac = lac
                continue
            if run is not None:
                self._close_run(ledger_id, run)
            if kind is entry_kind:
                open_runs[ledger_id] = _OpenRun(
                    entry_id,
                    entry_id + body_count,
                    flags,
                    [mapped[body_start:end]] if bodies is None else bodies,
                    lac,
                    seq,
                )
            else:
                request = Request(
                    kind, ledger_id, entry_id, b"", flags, None, lac, None, mapped[body_start:end]
                )
                request.seq = seq
                self._part(ledger_id).append(request)
        self.records += selected
        tally = self.tally
        tally.records_scanned += scanned
        tally.payload_bytes_scanned += scanned_bytes
        tally.records_selected += selected
        tally.payload_bytes_selected += selected_bytes

    def take(self) -> dict[int, LedgerPart]:
        """Each ledger's part gathered since the last `take`, its runs closed."""
        for ledger_id, run in self._open.items():
            self._part(ledger_id).append(run.request(ledger_id))
        last_seqs = self._last_seqs
        parts = {
            ledger_id: LedgerPart(requests, last_seqs[ledger_id])
            for ledger_id, requests in self._parts.items()
        }
        self.tally.ledgers_selected.update(parts)
        self._parts = {}
        self._open = {}
        self._last_seqs = {}
        self.records = 0
        return parts

    def _close_run(self, ledger_id: int, run: _OpenRun) -> None:
        self._part(ledger_id).append(run.request(ledger_id))
        del self._open[ledger_id]

    def _part(self, ledger_id: int) -> list[Request]:
        part = self._parts.get(ledger_id)
        if part is None:
            part = self._parts[ledger_id] = []
        return part
