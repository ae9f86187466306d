"""`pora verify`: check that a stopped node's index, ledger metadata and entry logs
agree, and report every disagreement with ledger, entry, file and offset.

Checked, per ledger in the index:
- every index position points inside the ledger's entry log, before its `log_end`,
  at a record whose length, ledger id, entry id and CRC are right;
- every record in the entry log (up to `log_end`) is intact and indexed at its offset,
  and the records end exactly at `log_end`;
- the metadata agrees with what is stored: entry count, first and last entry, payload
  bytes;
and for the whole data dir: every entry log and every index position belongs to a
ledger the index has metadata for, and the journal holds nothing that was not
replayed yet (else the figures are stale).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import plyvel

from journal.errors import JournalCorruption, JournalError, JournalFormatError, JournalGap
from ledger.entrylog import EntryLog, ScannedRecord
from ledger.entrylog_format import (
    FIRST_RECORD_OFFSET,
    RECORD_HEADER_SIZE,
    STATE_ENTRY_ID,
    LedgerStateRecord,
    decode_state_record,
)
from ledger.errors import StorageCorruption
from ledger.index import Index
from ledger.state import NO_ENTRY, LedgerMeta, LedgerState
from pora.node.datadir import DataDir
from pora.tools.inspection import (
    durable_seqs,
    entrylog_path,
    find_entry_logs,
    open_entry_log,
    plan_replay,
)
from pora.tools.rebuild import find_next_record

#: positions fetched from the index and read from the entry log at a time
_CHECK_BATCH_ENTRIES: Final = 1024

Advance = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class Problem:
    """One disagreement, located as precisely as the data allows."""

    kind: str
    message: str
    ledger_id: int | None = None
    entry_id: int | None = None
    file: str | None = None
    offset: int | None = None


@dataclass(slots=True)
class VerifyReport:
    ledgers: int = 0
    entries: int = 0
    entry_log_bytes: int = 0
    problems: list[Problem] = field(default_factory=list)
    #: facts worth knowing that are not damage (left-overs of a crash, stray files)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "ledgers": self.ledgers,
            "entries": self.entries,
            "entry_log_bytes": self.entry_log_bytes,
            "problems": [asdict(problem) for problem in self.problems],
            "notes": list(self.notes),
        }


def verify_total_bytes(metas: dict[int, LedgerMeta]) -> int:
    """The work `verify_data_dir` does, in entry-log bytes (each is read twice, by the
    index pass and by the log scan, which advance progress by half its bytes each)."""
    return sum(max(meta.log_end - FIRST_RECORD_OFFSET, 0) for meta in metas.values())


def verify_data_dir(
    directory: DataDir,
    index: Index,
    metas: dict[int, LedgerMeta],
    *,
    advance: Advance | None = None,
) -> VerifyReport:
    report = VerifyReport(ledgers=len(metas))
    step: Advance = advance if advance is not None else _ignore
    _check_journal(directory, metas, report)
    logs, strays = find_entry_logs(directory)
    for stray in strays:
        report.notes.append(f"{stray} is not an entry log (by its name); Pora ignores it")
    try:
        for ledger_id in sorted(metas):
            _verify_ledger(directory, index, metas[ledger_id], report, step)
        _check_orphan_positions(index, metas, report)
    except plyvel.CorruptionError as error:
        report.problems.append(
            Problem(
                "index-damaged",
                f"LevelDB finds the index damaged ({_cause(error)}); " + REBUILD_ADVICE,
                file=str(directory.index_dir),
            )
        )
    for ledger_id in sorted(set(logs) - set(metas)):
        report.problems.append(
            Problem(
                "orphan-entry-log",
                "an entry log of a ledger the index does not know: its index entries were "
                "lost (rebuild them with `pora verify --rebuild-index`), or a recovery is due",
                ledger_id=ledger_id,
                file=str(logs[ledger_id]),
            )
        )
    return report


#: what to do about damage in the index (the entry logs it locates are intact)
REBUILD_ADVICE: Final = (
    "the entry logs are not at fault: rebuild the index from them with "
    "`pora verify --rebuild-index`"
)


def _cause(error: plyvel.Error) -> str:
    raw = error.args[0] if error.args else error
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _check_orphan_positions(
    index: Index, metas: dict[int, LedgerMeta], report: VerifyReport
) -> None:
    """Index positions of ledgers without metadata: the node does not know these
    ledgers (they are in no listing and take no reads), so the positions only take
    space, or hide a ledger whose metadata was lost."""
    for ledger_id in index.ledgers_with_positions():
        if ledger_id in metas:
            continue
        count = index.count_positions(ledger_id)
        report.problems.append(
            Problem(
                "orphan-positions",
                f"the index holds {count} entry positions of ledger {ledger_id}, which "
                "has no metadata: the node does not know the ledger. Rebuild the index "
                "with `pora verify --rebuild-index` (it restores the ledger from its "
                "entry log if there is one, and drops the positions if there is none)",
                ledger_id=ledger_id,
            )
        )


def _ignore(_units: int) -> None:
    pass


def _check_journal(directory: DataDir, metas: dict[int, LedgerMeta], report: VerifyReport) -> None:
    try:
        plan = plan_replay(
            directory.journal_dir,
            durable_seqs(metas),
            require_watermark=directory.journal_watermark_required,
        )
    except JournalGap as error:
        report.problems.append(Problem("journal-gap", str(error), file=str(error.path)))
        return
    except JournalCorruption as error:
        report.problems.append(
            Problem("journal-corruption", error.reason, file=str(error.path), offset=error.offset)
        )
        return
    except JournalFormatError as error:
        report.problems.append(Problem("journal-format", error.reason, file=str(error.path)))
        return
    except JournalError as error:
        report.problems.append(Problem("journal", str(error)))
        return
    if plan.records_to_replay:
        report.problems.append(
            Problem(
                "journal-not-replayed",
                f"the journal holds {plan.records_to_replay} records of {len(plan.ledgers)} "
                "ledgers that are not in the entry logs and index yet: run `pora recover` "
                "first, then verify again",
            )
        )
    if plan.torn_tail is not None:
        torn = plan.torn_tail
        report.notes.append(f"the journal ends with a torn tail: {torn.describe()}")


def _verify_ledger(
    directory: DataDir, index: Index, meta: LedgerMeta, report: VerifyReport, step: Advance
) -> None:
    ledger_id = meta.ledger_id
    path = entrylog_path(directory, ledger_id)
    indexed = _IndexedFacts()
    if meta.log_end == 0 or not path.exists():
        # no entry log (yet): nothing may be indexed
        for entry_id, offset, _length in index.iter_positions(ledger_id):
            indexed.add(entry_id, _length)
            report.problems.append(
                Problem(
                    "missing-entry-log",
                    "the index places this entry in an entry log that does not exist",
                    ledger_id,
                    entry_id,
                    str(path),
                    offset,
                )
            )
        if meta.log_end != 0:
            report.problems.append(
                Problem(
                    "missing-entry-log",
                    f"the metadata says the entry log ends at byte {meta.log_end}, but the "
                    "file is missing",
                    ledger_id,
                    file=str(path),
                )
            )
        _check_meta(meta, indexed, report, path)
        return
    try:
        log = open_entry_log(path, ledger_id)
    except StorageCorruption as error:
        report.problems.append(
            Problem("entry-log-header", error.reason, ledger_id, None, str(path), error.offset)
        )
        return
    with log:
        reported_offsets: set[int] = set()
        finder = _EntryFinder(log)
        _check_positions(index, log, meta, indexed, report, reported_offsets, finder, step)
        logged = _check_records(
            index, log, meta, report, reported_offsets, finder.misplaced_offsets, step
        )
    report.entries += indexed.count
    report.entry_log_bytes += max(meta.log_end - FIRST_RECORD_OFFSET, 0)
    _check_meta(meta, indexed, report, path)
    if logged.complete:
        _check_logged_state(meta, logged, report, path)


@dataclass(slots=True)
class _IndexedFacts:
    count: int = 0
    first: int = NO_ENTRY
    last: int = NO_ENTRY
    payload_bytes: int = 0

    def add(self, entry_id: int, record_length: int) -> None:
        self.count += 1
        if self.first == NO_ENTRY or entry_id < self.first:
            self.first = entry_id
        self.last = max(self.last, entry_id)
        self.payload_bytes += record_length - RECORD_HEADER_SIZE


def _check_positions(
    index: Index,
    log: EntryLog,
    meta: LedgerMeta,
    indexed: _IndexedFacts,
    report: VerifyReport,
    reported_offsets: set[int],
    finder: _EntryFinder,
    step: Advance,
) -> None:
    """Every index position points at the right, intact record before log_end."""
    ledger_id = meta.ledger_id
    positions = index.iter_positions(ledger_id)
    while True:
        chunk = list(itertools.islice(positions, _CHECK_BATCH_ENTRIES))
        if not chunk:
            return
        readable: list[tuple[int, int, int]] = []
        for entry_id, offset, record_length in chunk:
            indexed.add(entry_id, record_length)
            if offset + record_length > meta.log_end:
                reported_offsets.add(offset)
                reason = (
                    f"the index places a {record_length}-byte record at byte {offset}, "
                    f"past the entry log's end ({meta.log_end}) in the metadata"
                )
                report.problems.append(
                    finder.problem("position-past-log-end", reason, entry_id, offset, record_length)
                )
            else:
                readable.append((entry_id, offset, record_length))
        readable.sort(key=lambda position: position[1])
        try:
            log.read_records(readable)
        except (StorageCorruption, ValueError):
            # find which ones, one by one
            for entry_id, offset, record_length in readable:
                try:
                    log.read_record(offset, record_length, entry_id)
                except StorageCorruption as error:
                    reported_offsets.add(offset)
                    report.problems.append(
                        finder.problem("bad-record", error.reason, entry_id, offset, record_length)
                    )
        step(sum(record_length for _, _, record_length in chunk) // 2)


class _EntryFinder:
    """Where a ledger's entries lie in its log, by a scan: to tell an index position
    that is wrong (the entry is intact elsewhere in the log: the index is damaged,
    and a rebuild restores it) from an entry-log record that is damaged."""

    def __init__(self, log: EntryLog) -> None:
        self._log = log
        self._found: dict[int, tuple[int, int]] | None = None
        #: offsets of intact records whose entry the index places elsewhere
        self.misplaced_offsets: set[int] = set()

    def problem(
        self, kind: str, reason: str, entry_id: int, offset: int, record_length: int
    ) -> Problem:
        """`kind` at the index's position, or index-damaged if the log holds the entry
        intact at another position."""
        log = self._log
        where = self._where(entry_id)
        if where is None or where == (offset, record_length):
            return Problem(kind, reason, log.ledger_id, entry_id, str(log.path), offset)
        found = where[0]
        self.misplaced_offsets.add(found)
        return Problem(
            "index-damaged",
            f"index damaged: ledger {log.ledger_id} entry {entry_id} is intact in "
            f"{log.path} at byte {found}, but the index places it at byte {offset} "
            f"({reason}); {REBUILD_ADVICE}",
            log.ledger_id,
            entry_id,
            str(log.path),
            found,
        )

    def _where(self, entry_id: int) -> tuple[int, int] | None:
        if self._found is None:
            self._found = _intact_entries(self._log)
        return self._found.get(entry_id)


def _intact_entries(log: EntryLog) -> dict[int, tuple[int, int]]:
    """`(offset, record_length)` of every intact entry record of the log's ledger,
    past any damage (the first one of an entry written twice)."""
    found: dict[int, tuple[int, int]] = {}
    start: int | None = FIRST_RECORD_OFFSET
    while start is not None:
        resume_at: int | None = None
        for record in log.scan(start):
            if not record.crc_ok:
                resume_at = find_next_record(log.path, log.ledger_id, record.offset + 1)
            elif record.ledger_id == log.ledger_id and record.entry_id >= 0:
                found.setdefault(record.entry_id, (record.offset, record.record_length))
        start = resume_at
    return found


@dataclass(slots=True)
class _LoggedFacts:
    """What a scan of an entry log found besides entries."""

    #: the scan reached log_end (no damage stopped it)
    complete: bool = True
    #: the last state record (None: there is none)
    state: LedgerStateRecord | None = None
    state_offset: int = -1
    #: the highest last-add-confirmed carried by an entry
    lac: int = -1


def _check_records(
    index: Index,
    log: EntryLog,
    meta: LedgerMeta,
    report: VerifyReport,
    reported_offsets: set[int],
    misplaced_offsets: set[int],
    step: Advance,
) -> _LoggedFacts:
    """Every record up to log_end is intact and indexed where it lies; they end at log_end."""
    logged = _LoggedFacts()
    ledger_id = meta.ledger_id
    path = str(log.path)
    walk = _RecordWalk(index, log, meta, report, reported_offsets)
    for record in walk.records():
        step(record.record_length // 2)
        if record.ledger_id != ledger_id:
            report.problems.append(
                Problem(
                    "foreign-record",
                    f"a record of ledger {record.ledger_id} in ledger {ledger_id}'s entry log",
                    ledger_id,
                    record.entry_id,
                    path,
                    record.offset,
                )
            )
            continue
        if record.entry_id < STATE_ENTRY_ID:
            report.problems.append(
                Problem(
                    "bad-record",
                    f"the record names entry {record.entry_id}, which no entry can be",
                    ledger_id,
                    record.entry_id,
                    path,
                    record.offset,
                )
            )
            continue
        if record.entry_id == STATE_ENTRY_ID:  # the ledger's state, not an entry
            try:
                payload = log.read_record(record.offset, record.record_length, STATE_ENTRY_ID)
                logged.state = decode_state_record(payload)
                logged.state_offset = record.offset
            except (StorageCorruption, ValueError) as error:
                report.problems.append(
                    Problem(
                        "bad-state-record",
                        f"the ledger-state record cannot be read: {error}",
                        ledger_id,
                        None,
                        path,
                        record.offset,
                    )
                )
                logged.complete = False
            continue
        logged.lac = max(logged.lac, record.lac)
        position = index.get_position(ledger_id, record.entry_id)
        if record.offset in misplaced_offsets:
            continue  # reported from the index side: index-damaged
        if position != (record.offset, record.record_length):
            where = (
                "the index has no position for it"
                if position is None
                else f"the index places entry {record.entry_id} at byte {position[0]} "
                f"({position[1]} bytes) instead"
            )
            report.problems.append(
                Problem("unindexed-record", where, ledger_id, record.entry_id, path, record.offset)
            )
    end_of_records = walk.end_of_records
    if walk.stopped:
        logged.complete = False
    elif end_of_records != meta.log_end:
        report.problems.append(
            Problem(
                "log-end-mismatch",
                f"the records end at byte {end_of_records} but the metadata says the log ends "
                f"at byte {meta.log_end}",
                ledger_id,
                None,
                path,
                end_of_records,
            )
        )
    left_over = sum(1 for _ in log.scan(meta.log_end)) if meta.log_end >= FIRST_RECORD_OFFSET else 0
    if left_over:
        report.notes.append(
            f"{path}: {left_over} records past the log's end (byte {meta.log_end}): written by "
            "a flush a crash cut short, never indexed; the next flush overwrites them"
        )
    return logged


class _RecordWalk:
    """The intact records of a log up to its log_end, for `_check_records`.

    A damaged record ends the walk (reported as bad-record: what follows cannot be
    found by its lengths), except the trace of a flush a crash cut short, once a
    rebuild and the journal replay made it good: one damaged record (the next intact
    one starts where its length says) whose entry is indexed, intact, elsewhere. It is
    noted, and the walk goes on after it.
    """

    def __init__(
        self,
        index: Index,
        log: EntryLog,
        meta: LedgerMeta,
        report: VerifyReport,
        reported_offsets: set[int],
    ) -> None:
        self._index = index
        self._log = log
        self._meta = meta
        self._report = report
        self._reported_offsets = reported_offsets
        self.end_of_records = FIRST_RECORD_OFFSET
        #: a damaged record ended the walk before log_end
        self.stopped = False

    def records(self) -> Iterator[ScannedRecord]:
        start: int | None = FIRST_RECORD_OFFSET
        while start is not None:
            resume_at: int | None = None
            for record in self._log.scan(start, self._meta.log_end):
                if record.crc_ok:
                    self.end_of_records = record.offset + record.record_length
                    yield record
                    continue
                resume_at = self._damaged(record)
            start = resume_at

    def _damaged(self, record: ScannedRecord) -> int | None:
        """Report or note a damaged record; where the walk goes on (None: it stops)."""
        path = str(self._log.path)
        ledger_id = self._meta.ledger_id
        resumes_at = find_next_record(self._log.path, ledger_id, record.offset + 1)
        intact_copy = (
            self._index.get_position(ledger_id, record.entry_id) if record.entry_id >= 0 else None
        )
        if (
            intact_copy is not None
            and intact_copy[0] != record.offset
            and intact_copy[0] not in self._reported_offsets
            and resumes_at in (None, record.offset + record.record_length)
            and record.offset + record.record_length <= self._meta.log_end
        ):
            self._report.notes.append(
                f"{path}: a damaged copy of entry {record.entry_id} at byte {record.offset} "
                f"(the trace of a flush a crash cut short); the entry is intact at byte "
                f"{intact_copy[0]}, where the index places it"
            )
            self.end_of_records = record.offset + record.record_length
            return resumes_at
        self.stopped = True
        if record.offset not in self._reported_offsets:
            self._report.problems.append(
                Problem(
                    "bad-record",
                    f"the record's checksum fails (or its length, {record.record_length} "
                    "bytes, cannot be right); the records after it cannot be checked from "
                    "the log side",
                    ledger_id,
                    record.entry_id,
                    path,
                    record.offset,
                )
            )
        return None


def _check_logged_state(
    meta: LedgerMeta, logged: _LoggedFacts, report: VerifyReport, path: Path
) -> None:
    """The ledger's state (closed, fenced, seal, master key) and LAC in the metadata
    agree with what the entry log says, from which a rebuilt index would take them."""
    in_meta = LedgerStateRecord(meta.state, meta.fenced, meta.sealed_last_entry_id, meta.master_key)
    state = logged.state
    if state is None:
        if in_meta != LedgerStateRecord(LedgerState.OPEN, False, NO_ENTRY, None):
            report.problems.append(
                Problem(
                    "state-mismatch",
                    f"the metadata says {_describe(in_meta)}, but the entry log holds no "
                    "state record: a rebuilt index would lose that",
                    meta.ledger_id,
                    None,
                    str(path),
                )
            )
    elif state != in_meta:
        report.problems.append(
            Problem(
                "state-mismatch",
                f"the metadata says {_describe(in_meta)}, the entry log's last state record "
                f"says {_describe(state)}",
                meta.ledger_id,
                None,
                str(path),
                logged.state_offset,
            )
        )
    if logged.lac != meta.lac:
        report.problems.append(
            Problem(
                "metadata-mismatch",
                f"the metadata says last_add_confirmed = {meta.lac}, the entries in the entry "
                f"log carry at most {logged.lac}",
                meta.ledger_id,
                None,
                str(path),
            )
        )


def _describe(state: LedgerStateRecord) -> str:
    words = [state.state.name.lower()]
    if state.state is LedgerState.CLOSED:
        words.append(f"at entry {state.sealed_last_entry_id}")
    if state.fenced:
        words.append("fenced")
    words.append("with a master key" if state.master_key is not None else "without a master key")
    return " ".join(words)


def _check_meta(meta: LedgerMeta, indexed: _IndexedFacts, report: VerifyReport, path: Path) -> None:
    """The metadata's figures agree with the indexed entries."""
    expected = {
        "entry_count": (meta.entry_count, indexed.count),
        "first_entry_id": (meta.first_entry_id, indexed.first),
        "last_entry_id": (meta.last_entry_id, indexed.last),
        "payload_bytes": (meta.payload_bytes, indexed.payload_bytes),
    }
    for name, (in_meta, stored) in expected.items():
        if in_meta != stored:
            report.problems.append(
                Problem(
                    "metadata-mismatch",
                    f"the metadata says {name} = {in_meta}, the index and entry log hold {stored}",
                    meta.ledger_id,
                    None,
                    str(path),
                )
            )
