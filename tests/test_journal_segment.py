"""Segment names, the batch encoding and the SegmentWriter, checked against real files."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from journal.errors import JournalError, JournalFormatError
from journal.format import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    BATCH_MAGIC,
    BLOCK_SIZE,
    BODY_HEADER,
    BODY_HEADER_SIZE,
    FORMAT_VERSION,
    RECORD_BODIES_MAX,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    RECORD_PREFIX,
    RECORD_PREFIX_SIZE,
    SEGMENT_HEADER,
    SEGMENT_HEADER_SIZE,
    SEGMENT_MAGIC,
    RecordFlag,
    RecordKind,
    body_crc,
    encode_body,
    prefix_crc,
)
from journal.request import Request
from journal.segment import (
    SegmentInfo,
    SegmentWriter,
    batch_header_crc,
    encode_batch,
    list_segments,
    segment_file_name,
    segment_header_crc,
)


def entry(entry_id: int, payload: bytes = b"x" * 100, ledger_id: int = 7) -> Request:
    return Request(RecordKind.ENTRY, ledger_id, entry_id, payload)


# --- names ------------------------------------------------------------------------------


def test_segment_file_name_sorts_by_first_seq_and_parses_back(tmp_path: Path) -> None:
    name = segment_file_name(42, 1_700_000_000_123)
    assert name == "00000000000000000042-1700000000123.journal"
    for first_seq, created_ms in [(0, 5), (10**12, 1), (42, 1_700_000_000_123)]:
        (tmp_path / segment_file_name(first_seq, created_ms)).touch()
    (tmp_path / "LOCK").touch()
    (tmp_path / "notes.txt").touch()
    assert list_segments(tmp_path) == [
        SegmentInfo(tmp_path / segment_file_name(0, 5), 0, 5),
        SegmentInfo(tmp_path / name, 42, 1_700_000_000_123),
        SegmentInfo(tmp_path / segment_file_name(10**12, 1), 10**12, 1),
    ]


def test_segments_with_the_same_first_seq_sort_by_creation_time(tmp_path: Path) -> None:
    for created_ms in (300, 100, 200):
        (tmp_path / segment_file_name(9, created_ms)).touch()
    assert [s.created_ms for s in list_segments(tmp_path)] == [100, 200, 300]


@pytest.mark.parametrize(
    "name",
    [
        "42-5.journal",
        "00000000000000000042.journal",
        "0000000000000000004x-5.journal",
        "00000000000000000042-.journal",
        "00000000000000000042-5-6.journal",
    ],
)
def test_a_journal_file_with_a_bad_name_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / name).touch()
    with pytest.raises(JournalFormatError, match="not a journal segment name") as caught:
        list_segments(tmp_path)
    assert caught.value.path == tmp_path / name


def test_a_missing_directory_holds_no_segments(tmp_path: Path) -> None:
    assert list_segments(tmp_path / "nowhere") == []


# --- encoding ---------------------------------------------------------------------------


def test_encode_batch_lays_out_header_records_and_padding() -> None:
    requests = [
        entry(0, b"hello"),
        Request(RecordKind.FENCE, 3, -1, b"", RecordFlag.NONE),
        Request(RecordKind.ENTRY, 2**64 - 1, 2**63 - 1, b"\x00" * 600, RecordFlag.RECOVERY_ADD),
    ]
    batch = encode_batch(requests, 1000)
    records_length = 3 * RECORD_HEADER_SIZE + 5 + 0 + 600
    assert len(batch) == 2 * BLOCK_SIZE
    assert [r.seq for r in requests] == [1000, 1001, 1002]
    magic, crc, length, count, first_seq = BATCH_HEADER.unpack_from(batch)
    assert (magic, length, count, first_seq) == (BATCH_MAGIC, records_length, 3, 1000)
    assert crc == batch_header_crc(batch, 0)
    position = BATCH_HEADER_SIZE
    for seq, request in enumerate(requests, start=1000):
        fields = RECORD_HEADER.unpack_from(batch, position)
        end = position + RECORD_HEADER_SIZE + len(request.payload)
        body_start = position + RECORD_PREFIX_SIZE
        assert fields == (
            prefix_crc(batch[position + 4 : body_start], batch[body_start : body_start + 4]),
            request.kind,
            request.flags,
            1,  # one body
            seq,
            body_crc(batch, body_start, end),
            len(request.payload),
            request.ledger_id,
            request.entry_id,
            -1,
        )
        assert batch[position + RECORD_HEADER_SIZE : end] == request.payload
        # the body is what a flush copies into the entry log, as it is
        assert bytes(request.bodies[0]) == bytes(batch[body_start:end])
        position = end
    assert not any(batch[position:])  # zero padding to the block boundary


def run(
    ledger_id: int, first_entry_id: int, payloads: list[bytes], lacs: list[int] | None = None
) -> Request:
    """An ENTRY run request: entries first_entry_id, first_entry_id + 1, ... of a ledger."""
    lacs = lacs if lacs is not None else [-1] * len(payloads)
    bodies = [
        encode_body(ledger_id, first_entry_id + i, lac, payload)
        for i, (payload, lac) in enumerate(zip(payloads, lacs, strict=True))
    ]
    return Request.entry_run(
        ledger_id, first_entry_id, bodies, max(lacs), RecordFlag.NONE, None, None, []
    )


def test_a_run_is_one_prefix_then_its_bodies_back_to_back() -> None:
    payloads = [b"one", b"", b"three" * 30]
    requests = [entry(0, b"before"), run(9, 40, payloads, [38, 39, 37]), entry(1, b"after")]
    batch = encode_batch(requests, 500)
    bodies_bytes = sum(BODY_HEADER_SIZE + len(p) for p in payloads)
    records_length = 3 * RECORD_PREFIX_SIZE + 2 * BODY_HEADER_SIZE + 6 + 5 + bodies_bytes
    magic, _crc, length, count, first_seq = BATCH_HEADER.unpack_from(batch)
    # the run is one record: one seq, one prefix
    assert (magic, length, count, first_seq) == (BATCH_MAGIC, records_length, 3, 500)
    assert [r.seq for r in requests] == [500, 501, 502]
    position = BATCH_HEADER_SIZE + RECORD_HEADER_SIZE + len(b"before")
    crc, kind, flags, body_count, seq = RECORD_PREFIX.unpack_from(batch, position)
    assert (kind, flags, body_count, seq) == (RecordKind.ENTRY, RecordFlag.NONE, 3, 501)
    starts = []
    start = position + RECORD_PREFIX_SIZE
    for index, payload in enumerate(payloads):
        starts.append(start)
        end = start + BODY_HEADER_SIZE + len(payload)
        stored_crc, stored_length, ledger_id, entry_id, lac = BODY_HEADER.unpack_from(batch, start)
        assert (stored_length, ledger_id, entry_id, lac) == (
            len(payload),
            9,
            40 + index,
            [38, 39, 37][index],
        )
        assert stored_crc == body_crc(batch, start, end)
        # each body is what a flush copies into the entry log, as it is
        assert bytes(batch[start:end]) == requests[1].bodies[index]
        start = end
    # the prefix crc covers the prefix fields, then every body's crc field in order
    prefix_fields = batch[position + 4 : position + RECORD_PREFIX_SIZE]
    body_crc_fields = b"".join(batch[s : s + 4] for s in starts)
    assert crc == prefix_crc(prefix_fields, body_crc_fields)
    assert crc != prefix_crc(prefix_fields, body_crc_fields[:4])  # not the first body's only
    assert RECORD_PREFIX.unpack_from(batch, start)[3:] == (1, 502)  # the next record
    assert batch[start + RECORD_HEADER_SIZE : start + RECORD_HEADER_SIZE + 5] == b"after"


@pytest.mark.parametrize("body_count", [0, RECORD_BODIES_MAX + 1])
def test_a_record_carries_one_to_65535_bodies(body_count: int) -> None:
    body = encode_body(3, 0, -1, b"")
    request = Request.entry_run(3, 0, [body] * body_count, -1, RecordFlag.NONE, None, None, [])
    with pytest.raises(ValueError, match=f"1 to 65535 bodies, not {body_count}"):
        encode_batch([entry(0), request], 0)
    most = Request.entry_run(3, 0, [body] * RECORD_BODIES_MAX, -1, RecordFlag.NONE, None, None, [])
    batch = encode_batch([most], 0)
    assert RECORD_PREFIX.unpack_from(batch, BATCH_HEADER_SIZE)[3] == RECORD_BODIES_MAX


@given(st.lists(st.binary(max_size=1500), min_size=1, max_size=20), st.integers(0, 2**62))
def test_encoded_batches_fill_whole_blocks(payloads: list[bytes], first_seq: int) -> None:
    batch = encode_batch([entry(i, p) for i, p in enumerate(payloads)], first_seq)
    used = BATCH_HEADER_SIZE + sum(RECORD_HEADER_SIZE + len(p) for p in payloads)
    assert len(batch) % BLOCK_SIZE == 0
    assert used <= len(batch) < used + BLOCK_SIZE


def test_an_empty_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        encode_batch([], 0)


# --- the writer -------------------------------------------------------------------------


def read_segment_header(path: Path) -> tuple[object, ...]:
    block = path.read_bytes()[:SEGMENT_HEADER_SIZE]
    fields = SEGMENT_HEADER.unpack_from(block)
    assert fields[-1] == segment_header_crc(block)
    assert not any(block[SEGMENT_HEADER.size :])
    return tuple(fields[:-1])


def test_a_new_writer_creates_the_directory_and_a_preallocated_segment(tmp_path: Path) -> None:
    directory = tmp_path / "data" / "journal"
    writer = SegmentWriter(directory, segment_bytes=64 * 1024, first_seq=77)
    segment = writer.open_segment
    assert list_segments(directory) == [segment]
    assert segment.first_seq == 77
    assert os.stat(segment.path).st_size == 64 * 1024
    assert read_segment_header(segment.path) == (
        SEGMENT_MAGIC,
        FORMAT_VERSION,
        1,  # unsynced_batches_max: by default a batch is synced before the next
        BLOCK_SIZE,
        77,
        segment.created_ms,
    )
    assert writer.next_seq == 77
    writer.close()
    writer.close()  # idempotent


def test_every_segment_header_records_how_many_batches_may_be_unsynced(
    tmp_path: Path,
) -> None:
    writer = SegmentWriter(tmp_path, segment_bytes=4096, first_seq=0, unsynced_batches_max=3)
    for seq in range(0, 40, 4):  # rolls several times
        writer.write_batch(
            [Request(RecordKind.ENTRY, 1, seq + i, b"r" * 200) for i in range(4)], seq
        )
        writer.sync()
    writer.close()
    segments = list_segments(tmp_path)
    assert len(segments) > 2
    assert {read_segment_header(segment.path)[2] for segment in segments} == {3}
    for wrong in (0, 0x10000):
        with pytest.raises(ValueError, match="unsynced_batches_max"):
            SegmentWriter(
                tmp_path / "other", segment_bytes=4096, first_seq=0, unsynced_batches_max=wrong
            )


def test_write_batch_appends_at_block_boundaries_and_tracks_seq(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, segment_bytes=64 * 1024, first_seq=5, preallocate=False)
    first = [entry(0, b"a" * 1000), entry(1)]
    written = writer.write_batch(first, 5)
    writer.sync()
    assert written == 3 * BLOCK_SIZE
    assert [r.seq for r in first] == [5, 6]
    assert writer.next_seq == 7
    second = [entry(2)]
    assert writer.write_batch(second, 7) == BLOCK_SIZE
    writer.close()
    data = writer.open_segment.path.read_bytes()
    assert len(data) == SEGMENT_HEADER_SIZE + 4 * BLOCK_SIZE  # not preallocated: it grew
    assert bytes(data[SEGMENT_HEADER_SIZE:]) == bytes(
        encode_batch([entry(0, b"a" * 1000), entry(1)], 5) + encode_batch([entry(2)], 7)
    )


def test_write_batch_refuses_a_seq_gap(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, segment_bytes=4096, first_seq=0, fsync=False)
    with pytest.raises(ValueError, match="expected 0"):
        writer.write_batch([entry(0)], 1)
    writer.close()
    with pytest.raises(JournalError, match="closed"):
        writer.write_batch([entry(0)], 0)


def test_segments_roll_when_the_next_batch_does_not_fit(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, segment_bytes=4096, first_seq=0, fsync=False)
    seq = 0
    for _ in range(20):
        batch = [entry(seq + i, bytes([i]) * 400) for i in range(3)]  # 3 blocks each
        writer.write_batch(batch, seq)
        seq += 3
    writer.close()
    segments = list_segments(tmp_path)
    # a 4096-byte segment holds its header block and two 3-block batches
    assert [s.first_seq for s in segments] == list(range(0, 60, 6))
    assert writer.open_segment == segments[-1]
    for segment in segments:
        assert os.stat(segment.path).st_size == 4096
        assert read_segment_header(segment.path)[4:] == (segment.first_seq, segment.created_ms)


def test_a_batch_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, segment_bytes=4096, first_seq=0, fsync=False)
    writer.write_batch([entry(0)], 0)
    big = writer.write_batch([entry(1, b"b" * 10_000)], 1)
    writer.write_batch([entry(2)], 2)
    writer.close()
    first, second, third = list_segments(tmp_path)
    assert (first.first_seq, second.first_seq, third.first_seq) == (0, 1, 2)
    assert os.stat(second.path).st_size == SEGMENT_HEADER_SIZE + big > 4096


def test_the_first_batch_of_a_segment_never_rolls(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, segment_bytes=1024, first_seq=0, fsync=False)
    writer.write_batch([entry(0, b"c" * 5000)], 0)
    writer.close()
    assert len(list_segments(tmp_path)) == 1


def test_an_existing_segment_name_is_never_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_234_000_000)
    SegmentWriter(tmp_path, segment_bytes=4096, first_seq=3).close()
    with pytest.raises(JournalError, match="already exists: segments are never appended to"):
        SegmentWriter(tmp_path, segment_bytes=4096, first_seq=3)


def test_a_writer_cannot_start_behind_existing_segments(tmp_path: Path) -> None:
    SegmentWriter(tmp_path, segment_bytes=4096, first_seq=100).close()
    with pytest.raises(JournalError, match="already starts at seq 100"):
        SegmentWriter(tmp_path, segment_bytes=4096, first_seq=50)


def test_a_failed_roll_leaves_no_file_and_keeps_the_open_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = SegmentWriter(tmp_path, segment_bytes=4096, first_seq=0)
    writer.write_batch([entry(0, b"d" * 2000)], 0)
    writer.sync()

    def disk_full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", disk_full)
    with pytest.raises(OSError, match="No space left"):
        writer.write_batch([entry(1, b"e" * 2000)], 1)
    assert list_segments(tmp_path) == [writer.open_segment]
    assert writer.next_seq == 1
    writer.write_batch([entry(1)], 1)  # a batch that fits still goes in
    writer.close()


def test_ids_out_of_range_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, segment_bytes=4096, first_seq=0, fsync=False)
    # the record body is encoded when the request is made: a bad id fails right there
    with pytest.raises(ValueError, match=r"ledger -1 entry 1 .* cannot be a record"):
        writer.write_batch([entry(0), entry(1, ledger_id=-1)], 0)
    assert writer.next_seq == 0
    writer.write_batch([entry(0)], 0)
    writer.close()
