"""The journal reader's record layer: the records inside a whole batch, each checked,
and what the two kinds of reader make of them.

A record is a 16-byte prefix (crc, kind, flags, body_count, seq) and its bodies
(entry-log records: a 32-byte header with its own crc, then the payload); the
prefix crc covers the prefix fields after it and every body's crc field
(docs/formats.md, "Journal"). `frame_records` checks every record of a batch
(bounds, both crcs, seqs, kinds, a run's ids) and frames those at or above a seq;
any failure raises BatchDamage for the torn-tail layer. Then:

- `journal_records`: one `JournalRecord` per body, for the tools and tests;
- for crash recovery, journal/replay_runs.py gathers the records past their
  ledger's durable seq into each ledger's runs, straight from the mapped bytes.

Replay is bound by this per-record Python work: the loops use locals only, and a
one-body record (the common one) is unpacked and checked with one unpack and two
crc calls over views of the mapping, with no bytes copied: replay hands the
ledgers each body as a view of the mapping (`mapped_body`), which keeps the mapping
alive until the body is flushed and dropped (ledger/memtable.py); the tools copy.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Final, NamedTuple

import crc32c

from journal.format import (
    BODY_CRC_FIELD_END,
    BODY_CRC_START,
    BODY_HEADER,
    BODY_HEADER_SIZE,
    PREFIX_CRC_START,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    RECORD_PREFIX_SIZE,
    RecordFlag,
    RecordKind,
)
from journal.framing import BatchDamage


class JournalRecord(NamedTuple):
    seq: int
    kind: RecordKind
    flags: RecordFlag
    ledger_id: int
    entry_id: int
    payload: bytes
    segment: Path
    offset: int  # byte offset of the record (its prefix) holding it, within its segment
    lac: int  # the last-add-confirmed an ENTRY carried (-1 for none and other kinds)
    body: bytes  # the record's body: an entry-log record, header and payload


_KINDS: Final = {kind.value: kind for kind in RecordKind}
# flags are a byte: look them up rather than build an IntFlag per record (hot path);
# unknown bits are kept, the record's crc vouches for them
_FLAGS: Final = tuple(RecordFlag(bits) for bits in range(256))
# tuple.__new__ skips NamedTuple's Python-level __new__: a third of a record's cost
_new_record: Final = tuple.__new__
#: a one-body record's prefix crc covers its bytes [4, 20): the prefix fields after
#: the crc, then the body's crc field, which follows them
_SINGLE_PREFIX_CRC_END: Final = RECORD_PREFIX_SIZE + BODY_CRC_FIELD_END

#: one record as `frame_records` read and checked it: seq, kind, flags, ledger id,
#: (first) entry id, lac, the record's offset, where its one body starts and where
#: the record ends, its bodies when it carries a run (else None), payload bytes and
#: how many bodies it carries
Framed = tuple[
    int, RecordKind, RecordFlag, int, int, int, int, int, int, list[memoryview] | None, int, int
]


def frame_records(
    mapped: mmap.mmap,
    view: memoryview,
    records_start: int,
    records_end: int,
    first_seq: int,
    count: int,
    from_seq: int,
) -> list[Framed]:
    """The batch's records at or above from_seq, framed; every record of it checked
    (bounds, crcs, seqs, kinds), those below from_seq too. Raises BatchDamage.

    The hot loop of replay: locals only, no per-record method calls."""
    unpack_header = RECORD_HEADER.unpack_from
    checksum = crc32c.crc32c
    kinds = _KINDS
    flags_by_bits = _FLAGS
    framed: list[Framed] = []
    append = framed.append
    position = records_start
    seq = first_seq
    for _ in range(count):
        if position + RECORD_HEADER_SIZE > records_end:
            raise BatchDamage(
                f"record {seq} at byte {position}: its header runs past the batch end",
                valid_header=True,
            )
        (crc, kind, flags, body_count, record_seq, body_crc, length, ledger_id, entry_id, lac) = (
            unpack_header(mapped, position)
        )
        body_start = position + RECORD_PREFIX_SIZE
        if body_count == 1:
            end = body_start + BODY_HEADER_SIZE + length
            if end > records_end or checksum(view[body_start + BODY_CRC_START : end]) != body_crc:
                raise _body_damage(seq, position, None, length, past_end=end > records_end)
            # prefix fields and body crc field lie side by side: one crc over both
            prefix_crc = checksum(
                view[position + PREFIX_CRC_START : position + _SINGLE_PREFIX_CRC_END]
            )
            bodies = None
            payload_bytes = length
        else:
            ledger_id, entry_id, lac, bodies, end = _read_run(
                view, mapped, position, records_end, seq, body_count
            )
            crc_fields = b"".join([body[:BODY_CRC_FIELD_END] for body in bodies])
            prefix_crc = checksum(
                crc_fields, checksum(view[position + PREFIX_CRC_START : body_start])
            )
            payload_bytes = end - body_start - body_count * BODY_HEADER_SIZE
        if prefix_crc != crc:
            raise BatchDamage(
                f"record {seq} at byte {position}: prefix crc mismatch", valid_header=True
            )
        # checked only now: a damaged prefix is reported as such, not by its fields
        if record_seq != seq:
            raise BatchDamage(
                f"record at byte {position} has seq {record_seq}, expected {seq}",
                valid_header=True,
            )
        record_kind = kinds.get(kind)
        if record_kind is None:
            raise BatchDamage(
                f"record {seq} at byte {position}: unknown kind {kind}", valid_header=True
            )
        if body_count == 0 or (body_count > 1 and record_kind is not RecordKind.ENTRY):
            raise BatchDamage(
                f"record {seq} at byte {position}: a {record_kind.name} record with "
                f"{body_count} bodies",
                valid_header=True,
            )
        if seq >= from_seq:
            append(
                (
                    seq,
                    record_kind,
                    flags_by_bits[flags],
                    ledger_id,
                    entry_id,
                    lac,
                    position,
                    body_start,
                    end,
                    bodies,
                    payload_bytes,
                    body_count,
                )
            )
        position = end
        seq += 1
    if position != records_end:
        raise BatchDamage(
            f"the batch header says its records take {records_end - records_start} bytes, "
            f"they take {position - records_start}",
            valid_header=True,
        )
    return framed


def journal_records(framed: list[Framed], mapped: memoryview, path: Path) -> list[JournalRecord]:
    """A whole batch's records as JournalRecords, one per body (a run's entries
    each get one)."""
    new_record = _new_record
    records: list[JournalRecord] = []
    append = records.append
    for record in framed:
        # (the tools' path: a slice per record costs nothing that matters here)
        seq, kind, flags, ledger_id, entry_id, lac, position, body_start, end, bodies = record[:10]
        single = bodies is None
        for index, view in enumerate([mapped[body_start:end]] if bodies is None else bodies):
            body = bytes(view)  # a copy: a tool may keep records past the mapping
            append(
                new_record(
                    JournalRecord,
                    (
                        seq,
                        kind,
                        flags,
                        ledger_id,
                        entry_id + index,
                        body[BODY_HEADER_SIZE:],
                        path,
                        position,
                        lac if single else _body_lac(body),
                        body,
                    ),
                )
            )
    return records


def _read_run(
    view: memoryview,
    mapped: mmap.mmap,
    position: int,
    records_end: int,
    seq: int,
    body_count: int,
) -> tuple[int, int, int, list[memoryview], int]:
    """The bodies of the run record at `position` (its prefix crc not yet checked):
    (ledger_id, first entry id, largest lac, bodies, end). Raises BatchDamage. With no
    bodies (a zeroed prefix, say) it returns none: the prefix crc then decides."""
    unpack_body = BODY_HEADER.unpack_from
    checksum = crc32c.crc32c
    bodies: list[memoryview] = []
    start = position + RECORD_PREFIX_SIZE
    first_ledger = first_entry = -1
    lac_max = -1
    for index in range(body_count):
        if start + BODY_HEADER_SIZE > records_end:
            raise BatchDamage(
                f"record {seq} at byte {position}: body {index} runs past the batch end",
                valid_header=True,
            )
        body_crc, length, ledger_id, entry_id, lac = unpack_body(mapped, start)
        end = start + BODY_HEADER_SIZE + length
        if end > records_end or checksum(view[start + BODY_CRC_START : end]) != body_crc:
            raise _body_damage(seq, position, index, length, past_end=end > records_end)
        if index == 0:
            first_ledger, first_entry = ledger_id, entry_id
        elif ledger_id != first_ledger or entry_id != first_entry + index:
            raise BatchDamage(
                f"record {seq} at byte {position}: body {index} is ledger {ledger_id} entry "
                f"{entry_id} in a run of ledger {first_ledger} from entry {first_entry}",
                valid_header=True,
            )
        if lac > lac_max:  # noqa: PLR1730 (a compare is cheaper than max())
            lac_max = lac
        bodies.append(view[start:end])
        start = end
    return first_ledger, first_entry, lac_max, bodies, start


def _body_damage(
    seq: int, position: int, index: int | None, length: int, *, past_end: bool
) -> BatchDamage:
    """A body of record `seq` (at `position`) that runs past the batch end or fails
    its crc; `index`: its place in a run, None for a record's one body."""
    where = f"record {seq} at byte {position}"
    if past_end:
        whose = "its" if index is None else f"body {index}'s"
        return BatchDamage(
            f"{where}: {whose} {length} payload bytes run past the batch end", valid_header=True
        )
    body = "body" if index is None else f"body {index}"
    return BatchDamage(f"{where}: {body} crc mismatch", valid_header=True)


def _body_lac(body: bytes) -> int:
    """The last-add-confirmed field of a body."""
    lac: int = BODY_HEADER.unpack_from(body)[4]
    return lac
