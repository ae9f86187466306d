"""Rebuilding a lost or damaged index from the self-describing entry logs.

Every entry-log record names its ledger and entry and carries a CRC, and a log's
header names its ledger, so the positions and most of the metadata of every ledger
can be recomputed by scanning the logs. What the logs cannot say (how far each
ledger was durable in the journal) is set to "nothing", so that the journal replay
that follows (`pora.offline_recovery`) applies every journal record again: records
already in a log are recognised as retries of the same bytes, the others are added.

The damaged index is moved aside, never deleted: it is an operator's data.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import crc32c

from journal.fileio import fsync_directory
from ledger.entrylog import EntryLog, ScannedRecord
from ledger.entrylog_format import (
    FIRST_RECORD_OFFSET,
    RECORD_CRC_START,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    RECORD_PAYLOAD_MAX,
    STATE_ENTRY_ID,
    decode_state_record,
)
from ledger.errors import StorageCorruption
from ledger.index import Index
from ledger.state import NO_ENTRY, LedgerMeta
from pora.node.datadir import DataDir
from pora.tools.inspection import data_bytes, find_entry_logs, open_entry_log

#: positions installed in the index per write batch (bounds memory on huge ledgers)
_INSTALL_BATCH_ENTRIES: Final = 8192
#: where the ledger id sits in a record header (after crc and payload_length)
_LEDGER_ID_AT: Final = 8
_ZERO_HEADER: Final = bytes(RECORD_HEADER_SIZE)
_NONZERO_BYTE: Final = re.compile(rb"[^\x00]")

Advance = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class Damage:
    """A stretch of an entry log whose records could not be read."""

    ledger_id: int
    file: str
    offset: int
    #: where readable records start again; None if none follow (the end of the log)
    resumes_at: int | None
    reason: str
    #: the entry id and record length the damaged record's header names (the header
    #: may be damaged too: then they are wrong)
    claimed_entry_id: int
    claimed_record_length: int
    #: a state record, with an intact state record after it (which wins anyway)
    superseded: bool = False

    @property
    def kind(self) -> str:
        """torn-end: nothing readable follows (what a flush cut by a crash leaves);
        corruption: readable records follow."""
        return "torn-end" if self.resumes_at is None else "corruption"

    @property
    def single_record(self) -> bool:
        """Whether the damaged stretch is exactly the one record its header describes."""
        return self.resumes_at is None or (
            self.resumes_at == self.offset + self.claimed_record_length
        )

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **dataclasses.asdict(self)}


@dataclass(slots=True)
class RebuildReport:
    moved_aside: str | None = None
    ledgers: int = 0
    entries: int = 0
    payload_bytes: int = 0
    state_records: int = 0
    #: damaged records: their entries are not indexed (the journal replay that follows
    #: may restore them: see `unrestored`)
    damage: list[Damage] = field(default_factory=list)
    #: entry logs that could not be used at all (bad header)
    unreadable_logs: list[dict[str, Any]] = field(default_factory=list)
    #: state records (closed, fenced, master key) that could not be decoded
    unreadable_state: list[dict[str, Any]] = field(default_factory=list)
    strays: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No unreadable logs or state records (damage is judged after the replay)."""
        return not self.unreadable_logs and not self.unreadable_state

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "moved_aside": self.moved_aside,
            "ledgers": self.ledgers,
            "entries": self.entries,
            "payload_bytes": self.payload_bytes,
            "state_records": self.state_records,
            "damage": [d.to_json() for d in self.damage],
            "unreadable_logs": list(self.unreadable_logs),
            "unreadable_state": list(self.unreadable_state),
            "strays": list(self.strays),
        }


def entry_log_bytes(directory: DataDir) -> int:
    """The written bytes of every entry log, not their preallocated rest (the work of
    a rebuild, for progress)."""
    logs, _ = find_entry_logs(directory)
    return sum(max(data_bytes(path) - FIRST_RECORD_OFFSET, 0) for path in logs.values())


def move_index_aside(directory: DataDir) -> Path | None:
    """Rename the index directory to index.damaged-<UTC time>; None if there is none."""
    index_dir = directory.index_dir
    if not index_dir.exists():
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = index_dir.with_name(f"{index_dir.name}.damaged-{stamp}")
    suffix = 1
    while target.exists():
        suffix += 1
        target = index_dir.with_name(f"{index_dir.name}.damaged-{stamp}-{suffix}")
    os.rename(index_dir, target)
    fsync_directory(directory.root)
    return target


def rebuild_index(directory: DataDir, *, advance: Advance | None = None) -> RebuildReport:
    """Move the index aside and build a new one from the entry logs (no journal replay:
    the caller replays afterwards)."""
    step: Advance = advance if advance is not None else _ignore
    report = RebuildReport()
    logs, strays = find_entry_logs(directory)
    report.strays = [str(path) for path in strays]
    # built aside and renamed into place whole: a rebuild cut short (killed) leaves no
    # index, which the node refuses, rather than a part of one, which it would serve
    # as if the ledgers not yet in it did not exist
    building = building_index_dir(directory)
    if building.exists():  # left by a rebuild cut short
        shutil.rmtree(building)
    moved = move_index_aside(directory)
    report.moved_aside = None if moved is None else str(moved)
    with Index(building, create=True) as index:
        for ledger_id, path in sorted(logs.items()):
            share = _Share(step, max(data_bytes(path) - FIRST_RECORD_OFFSET, 0))
            try:
                log = open_entry_log(path, ledger_id)
            except StorageCorruption as error:
                report.unreadable_logs.append(
                    {"ledger_id": ledger_id, "file": str(path), "reason": error.reason}
                )
                share.finish()
                continue
            with log:
                _rebuild_ledger(index, log, report, share.advance)
            share.finish()
            report.ledgers += 1
        index.sync()
    fsync_directory(building)
    os.rename(building, directory.index_dir)
    fsync_directory(directory.root)
    return report


def building_index_dir(directory: DataDir) -> Path:
    """Where `rebuild_index` builds the new index before it takes the index's place."""
    return directory.index_dir.with_name(directory.index_dir.name + ".rebuilding")


class _Share:
    """One log's share of the rebuild's progress: it advances by exactly its size
    (`entry_log_bytes` counts it so), however much of it the scan reads."""

    def __init__(self, step: Advance, size: int) -> None:
        self._step = step
        self._left = size

    def advance(self, units: int) -> None:
        units = min(units, self._left)
        self._left -= units
        self._step(units)

    def finish(self) -> None:
        self.advance(self._left)


def _ignore(_units: int) -> None:
    pass


def _rebuild_ledger(index: Index, log: EntryLog, report: RebuildReport, step: Advance) -> None:
    ledger_id = log.ledger_id
    meta = LedgerMeta(ledger_id, created_ms=log.created_ms, durable_seq=-1)
    positions: list[tuple[int, int, int]] = []
    end_of_data = FIRST_RECORD_OFFSET
    start = FIRST_RECORD_OFFSET
    last_state_at = -1
    damage: list[Damage] = []
    while True:
        damaged = None
        for record in log.scan(start):
            if (
                not record.crc_ok
                or record.ledger_id != ledger_id
                or record.entry_id < STATE_ENTRY_ID
            ):
                damaged = record
                break
            step(record.record_length)
            end_of_data = record.offset + record.record_length
            if record.entry_id == STATE_ENTRY_ID:
                if _read_state_record(log, record, meta, report):
                    last_state_at = record.offset
                continue
            positions.append((record.entry_id, record.offset, record.record_length))
            _count_entry(meta, record)
            if len(positions) >= _INSTALL_BATCH_ENTRIES:
                meta.log_end = end_of_data
                index.apply_flush(ledger_id, positions, meta)
                positions = []
        if damaged is None:
            break
        found = _damage_at(log, damaged)
        damage.append(found)
        if found.resumes_at is None:
            break
        step(found.resumes_at - damaged.offset)
        start = found.resumes_at
    for found in damage:
        superseded = found.claimed_entry_id == STATE_ENTRY_ID and last_state_at > found.offset
        report.damage.append(dataclasses.replace(found, superseded=superseded))
    meta.log_end = end_of_data
    index.apply_flush(ledger_id, positions, meta)
    report.entries += meta.entry_count
    report.payload_bytes += meta.payload_bytes


def _read_state_record(
    log: EntryLog, record: ScannedRecord, meta: LedgerMeta, report: RebuildReport
) -> bool:
    """Apply a ledger-state record to `meta`; whether it could be read (an unreadable
    one is reported and leaves `meta` as it was)."""
    try:
        _apply_state_record(log, record.offset, record.record_length, record.entry_id, meta)
    except (StorageCorruption, ValueError) as error:
        report.unreadable_state.append(
            {
                "ledger_id": log.ledger_id,
                "file": str(log.path),
                "offset": record.offset,
                "reason": str(error),
            }
        )
        return False
    report.state_records += 1
    return True


def _count_entry(meta: LedgerMeta, record: ScannedRecord) -> None:
    """Account for one intact entry record in the ledger's metadata."""
    entry_id = record.entry_id
    if meta.first_entry_id == NO_ENTRY or entry_id < meta.first_entry_id:
        meta.first_entry_id = entry_id
    meta.last_entry_id = max(meta.last_entry_id, entry_id)
    meta.entry_count += 1
    meta.payload_bytes += record.payload_length
    meta.lac = max(meta.lac, record.lac)


def _damage_at(log: EntryLog, damaged: ScannedRecord) -> Damage:
    """The damaged stretch that starts at `damaged`: why it cannot be read, and where
    the next readable record of the ledger starts (None: none does)."""
    ledger_id = log.ledger_id
    if not damaged.crc_ok:
        reason = "checksum fails or the length cannot be right"
    elif damaged.ledger_id != ledger_id:
        reason = f"the record names ledger {damaged.ledger_id}"
    else:
        reason = f"the record names entry {damaged.entry_id}, which no entry can be"
    resumes_at = find_next_record(log.path, ledger_id, damaged.offset + 1)
    return Damage(
        ledger_id,
        str(log.path),
        damaged.offset,
        resumes_at,
        reason,
        damaged.entry_id,
        damaged.record_length,
    )


def _apply_state_record(
    log: EntryLog, offset: int, record_length: int, entry_id: int, meta: LedgerMeta
) -> None:
    """A ledger-state record (entry id STATE_ENTRY_ID): the last one in a log wins.
    Raises StorageCorruption / ValueError if it cannot be read."""
    state = decode_state_record(log.read_record(offset, record_length, entry_id))
    meta.state = state.state
    meta.fenced = state.fenced
    meta.sealed_last_entry_id = state.sealed_last_entry_id
    meta.master_key = state.master_key


def unrestored(index: Index, damage: list[Damage]) -> list[Damage]:
    """The damage that the journal replay after the rebuild did not make good.

    A flush cut by a crash leaves damaged records (usually at the end of the log, but
    pages may reach the disk out of order); the journal then still holds what that
    flush was writing, so the replay adds those entries again (a rebuild never indexes
    a damaged record, so an indexed entry afterwards is an intact copy) and writes a
    fresh state record. Damage is made good when it is one record whose entry is
    indexed after the replay, or a state record that a later one supersedes or that
    the replay wrote over. Anything else (several records in one damaged stretch, a
    header too damaged to name its entry, an entry the journal no longer held) may
    have lost data on this node.
    """
    left: list[Damage] = []
    for found in damage:
        entry_id = found.claimed_entry_id
        if entry_id >= 0 and found.single_record:
            restored = index.get_position(found.ledger_id, entry_id) is not None
        elif entry_id == STATE_ENTRY_ID and found.single_record:
            restored = found.superseded or _intact_record_in_file(Path(found.file), found.offset)
        else:
            restored = False
        if not restored:
            left.append(found)
    return left


def _intact_record_in_file(path: Path, offset: int) -> bool:
    try:
        file = open(path, "rb")  # noqa: SIM115 -- closed below, mmap needs its fd
    except FileNotFoundError:
        return False
    with file:
        size = os.fstat(file.fileno()).st_size
        if size <= offset:
            return False
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return _intact_record_at(mapped, offset, size)


def find_next_record(path: Path, ledger_id: int, start: int) -> int | None:
    """The offset of the first intact record of `ledger_id` at or after `start`.

    Used past a damaged record, whose length cannot be trusted: every place where the
    ledger id appears at a record header's ledger-id field is tried, and the first
    whose CRC matches wins. A CRC32C match by chance is one in four billion.
    """
    needle = ledger_id.to_bytes(8, "little")
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size <= max(start, FIRST_RECORD_OFFSET):
            return None
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            found = mapped.find(needle, max(start, FIRST_RECORD_OFFSET) + _LEDGER_ID_AT)
            while found >= 0:
                offset = found - _LEDGER_ID_AT
                if mapped[offset : offset + RECORD_HEADER_SIZE] == _ZERO_HEADER:
                    # zero fill (a ledger id with zero bytes matches all over it): jump
                    # to where data starts again, in C rather than byte by byte
                    data = _NONZERO_BYTE.search(mapped, found)
                    if data is None:
                        return None
                    found = mapped.find(needle, max(data.start() - 16, found + 1))
                    continue
                if _intact_record_at(mapped, offset, size):
                    return offset
                found = mapped.find(needle, found + 1)
    return None


def _intact_record_at(mapped: mmap.mmap, offset: int, size: int) -> bool:
    if offset + RECORD_HEADER_SIZE > size:
        return False
    header = RECORD_HEADER.unpack_from(mapped, offset)
    stored_crc, payload_length = header[0], header[1]  # crc and length lead every version
    end = offset + RECORD_HEADER_SIZE + payload_length
    if payload_length > RECORD_PAYLOAD_MAX or end > size:
        return False
    view = memoryview(mapped)
    try:
        return bool(int(crc32c.crc32c(view[offset + RECORD_CRC_START : end])) == stored_crc)
    finally:
        view.release()
