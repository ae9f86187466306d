"""Offline views of a stopped node's data dir, shared by the operator commands.

Nothing here writes: the journal is read with `JournalScanner`, entry logs through
`EntryLog` (positioned reads only), the index through `Index` lookups.
"""

from __future__ import annotations

import errno
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from journal.reader import JournalScanner, TornTail
from journal.segment import list_segments
from ledger.entrylog import EntryLog
from ledger.index import Index
from ledger.state import LedgerMeta, LedgerState
from pora.node.datadir import DataDir

#: entry logs are opened only to read; the chunk size matters only to writers
_READ_ONLY_CHUNK_BYTES: Final = 1 << 20
#: positions read from the index and fetched from an entry log at a time (bounds memory)
_READ_BATCH_ENTRIES: Final = 1024
_ENTRYLOG_SUFFIX: Final = ".log"
_LEDGER_ID_HEX_DIGITS: Final = 16


# --- the journal -----------------------------------------------------------------------


@dataclass(slots=True)
class ReplayPlan:
    """What replaying the journal would do: records after each ledger's durable_seq."""

    segments: int = 0
    records_scanned: int = 0
    records_to_replay: int = 0
    bytes_scanned: int = 0
    bytes_to_replay: int = 0
    #: ledger id -> (records to replay, first seq, last seq)
    ledgers: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    torn_tail: TornTail | None = None

    def pending_for(self, ledger_id: int) -> int:
        found = self.ledgers.get(ledger_id)
        return 0 if found is None else found[0]


def journal_data_bytes(journal_dir: Path) -> int:
    """Bytes of written data in the journal's segments (not the preallocated rest),
    as the total for a progress bar."""
    return sum(data_bytes(segment.path) for segment in list_segments(journal_dir))


def data_bytes(path: Path) -> int:
    """Bytes up to the end of the last data region of `path` (its size where the file
    system cannot tell data from holes)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        size = os.fstat(fd).st_size
        end = 0
        position = 0
        while position < size:
            try:
                start = os.lseek(fd, position, os.SEEK_DATA)
            except OSError as error:
                if error.errno == errno.ENXIO:
                    break
                return size
            position = os.lseek(fd, start, os.SEEK_HOLE)
            end = position
        return min(end, size)
    finally:
        os.close(fd)


def plan_replay(
    journal_dir: Path,
    durable_seqs: dict[int, int],
    *,
    progress: Callable[[int], None] | None = None,
    require_watermark: bool = False,
) -> ReplayPlan:
    """Scan the journal and count what recovery would replay: each record whose seq
    is above its ledger's durable_seq (the rule `pora.node.replay` applies).

    Raises JournalCorruption / JournalFormatError as the scanner finds them.
    `progress` is called with the journal bytes passed so far.
    """
    plan = ReplayPlan()
    scanner = JournalScanner(journal_dir, require_watermark=require_watermark)
    starts = segment_starts(journal_dir)
    for batch in scanner.batches():
        for record in batch:
            size = len(record.payload)
            plan.records_scanned += 1
            plan.bytes_scanned += size
            if record.seq <= durable_seqs.get(record.ledger_id, -1):
                continue
            plan.records_to_replay += 1
            plan.bytes_to_replay += size
            found = plan.ledgers.get(record.ledger_id)
            if found is None:
                plan.ledgers[record.ledger_id] = (1, record.seq, record.seq)
            else:
                plan.ledgers[record.ledger_id] = (found[0] + 1, found[1], record.seq)
        if progress is not None and batch:
            last = batch[-1]
            progress(starts.get(last.segment, 0) + last.offset)
    plan.segments = scanner.summary.segments
    plan.torn_tail = scanner.summary.torn_tail
    return plan


def segment_starts(journal_dir: Path) -> dict[Path, int]:
    """Each segment's position in the journal's total data bytes (for progress)."""
    starts: dict[Path, int] = {}
    position = 0
    for segment in list_segments(journal_dir):
        starts[segment.path] = position
        position += data_bytes(segment.path)
    return starts


def torn_tail_json(torn: TornTail | None) -> dict[str, Any] | None:
    if torn is None:
        return None
    return {
        "segment": str(torn.segment),
        "offset": torn.offset,
        "reason": torn.reason,
        "batches_after": torn.batches_after,
        "kind": torn.kind,
        "records_dropped": torn.records_dropped,
        "first_seq_dropped": torn.first_seq_dropped,
        "message": torn.describe(),
    }


def durable_seqs(metas: dict[int, LedgerMeta]) -> dict[int, int]:
    return {ledger_id: meta.durable_seq for ledger_id, meta in metas.items()}


# --- entry logs ----------------------------------------------------------------------------


def entrylog_path(directory: DataDir, ledger_id: int) -> Path:
    """Where the node keeps the ledger's entry log (see LedgerStorage.entrylog_path)."""
    return directory.ledgers_dir / f"{ledger_id & 0xFF:02x}" / f"{ledger_id:016x}.log"


def find_entry_logs(directory: DataDir) -> tuple[dict[int, Path], list[Path]]:
    """Every entry log under ledgers/, by ledger id, and the files there that are not
    entry logs (by name)."""
    logs: dict[int, Path] = {}
    strays: list[Path] = []
    root = directory.ledgers_dir
    if not root.is_dir():
        return logs, strays
    for folder in sorted(root.iterdir()):
        if not folder.is_dir():
            strays.append(folder)
            continue
        for path in sorted(folder.iterdir()):
            ledger_id = _ledger_id_of(path)
            if ledger_id is None or path != entrylog_path(directory, ledger_id):
                strays.append(path)
            else:
                logs[ledger_id] = path
    return logs, strays


def _ledger_id_of(path: Path) -> int | None:
    stem = path.name.removesuffix(_ENTRYLOG_SUFFIX)
    if path.name == stem or len(stem) != _LEDGER_ID_HEX_DIGITS:
        return None
    try:
        return int(stem, 16)
    except ValueError:
        return None


def open_entry_log(path: Path, ledger_id: int) -> EntryLog:
    """An existing entry log, its header checked, for reading (StorageCorruption if
    the header is damaged, FileNotFoundError if it is missing)."""
    return EntryLog.open(path, ledger_id, prealloc_chunk_bytes=_READ_ONLY_CHUNK_BYTES, fsync=False)


def visible_last_entry(meta: LedgerMeta) -> int:
    """The last entry a reader may see: a closed ledger's seal, else its last entry."""
    if meta.state is LedgerState.CLOSED:
        return meta.sealed_last_entry_id
    return meta.last_entry_id


def read_entries(
    index: Index, log: EntryLog, ledger_id: int, first: int, last: int | None
) -> Iterator[tuple[int, bytes]]:
    """`(entry_id, payload)` of the ledger's stored entries in [first, last], in order,
    each checked against its record (StorageCorruption on a mismatch)."""
    positions = index.iter_positions(ledger_id, first, last)
    while True:
        chunk = list(itertools.islice(positions, _READ_BATCH_ENTRIES))
        if not chunk:
            return
        by_offset = sorted(chunk, key=lambda position: position[1])
        payloads = dict(
            zip(
                (entry_id for entry_id, _, _ in by_offset),
                log.read_records(by_offset),
                strict=True,
            )
        )
        for entry_id, _, _ in chunk:
            yield entry_id, payloads[entry_id]


# --- ledger metadata as operators see it --------------------------------------------------


def ledger_row(meta: LedgerMeta) -> dict[str, Any]:
    """The columns of `pora ledger list`, as JSON keys."""
    return {
        "ledger_id": meta.ledger_id,
        "state": meta.state_name(),
        "first_entry_id": meta.first_entry_id,
        "last_entry_id": visible_last_entry(meta),
        "entry_count": meta.entry_count,
        "payload_bytes": meta.payload_bytes,
    }


def ledger_details(meta: LedgerMeta, directory: DataDir) -> dict[str, Any]:
    """Everything the index holds about a ledger, for `pora ledger show`."""
    return {
        **ledger_row(meta),
        "fenced": meta.fenced,
        "sealed_last_entry_id": meta.sealed_last_entry_id
        if meta.state is LedgerState.CLOSED
        else None,
        "stored_last_entry_id": meta.last_entry_id,
        "last_add_confirmed": meta.lac,
        # whether one is fixed, not the key: it is the writers' credential
        "master_key_set": meta.master_key is not None,
        "log_end": meta.log_end,
        "durable_seq": meta.durable_seq,
        "created_ms": meta.created_ms,
        "entry_log": str(entrylog_path(directory, meta.ledger_id)),
    }
