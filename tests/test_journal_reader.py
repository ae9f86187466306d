"""Replay: round trips, and byte-editing real segment files (LevelDB's log_test style).

Each editing test writes a real journal, changes bytes on disk the way a crash or a
bad disk would, and checks that the scanner calls it a torn tail (the normal end of
the log) or corruption (reported with file and offset), exactly as the rules say.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journal.errors import JournalCorruption, JournalFormatError, JournalGap
from journal.format import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    BLOCK_SIZE,
    BODY_HEADER,
    BODY_HEADER_SIZE,
    FORMAT_VERSION,
    RECORD_HEADER_SIZE,
    RECORD_PREFIX,
    RECORD_PREFIX_SIZE,
    SEGMENT_HEADER,
    SEGMENT_HEADER_SIZE,
    RecordBody,
    RecordFlag,
    RecordKind,
    body_crc,
    encode_body,
    prefix_crc,
)
from journal.reader import JournalRecord, JournalScanner, ReplayRuns, ReplayTally, ScanSummary
from journal.request import LedgerPart, Request
from journal.segment import (
    SegmentInfo,
    SegmentWriter,
    batch_header_crc,
    list_segments,
    segment_header_crc,
)

PAYLOAD = b"p" * 100


def entry(entry_id: int, payload: bytes = PAYLOAD) -> Request:
    return Request(RecordKind.ENTRY, 7, entry_id, payload)


def write_journal(
    directory: Path,
    batch_sizes: Sequence[int],
    *,
    segment_bytes: int = 1 << 16,
    first_seq: int = 0,
    payload: bytes = PAYLOAD,
    unsynced_batches_max: int = 1,
) -> list[list[Request]]:
    """Write batches of `batch_sizes` records, syncing each as the journal task does;
    the segment headers say `unsynced_batches_max` (the writer's overlap)."""
    writer = SegmentWriter(
        directory,
        segment_bytes=segment_bytes,
        first_seq=first_seq,
        unsynced_batches_max=unsynced_batches_max,
    )
    batches = []
    seq = first_seq
    for size in batch_sizes:
        batch = [entry(seq + i, payload) for i in range(size)]
        writer.write_batch(batch, seq)
        writer.sync()
        batches.append(batch)
        seq += size
    writer.close()
    return batches


def run(
    ledger_id: int,
    first_entry_id: int,
    payloads: Sequence[bytes],
    lacs: Sequence[int] | None = None,
    flags: RecordFlag = RecordFlag.NONE,
) -> Request:
    """An ENTRY run request: entries first_entry_id, first_entry_id + 1, ... of a
    ledger, as `journal.request.entry_runs` makes them (ids unchecked: tests make bad runs)."""
    lacs = lacs if lacs is not None else [-1] * len(payloads)
    bodies = [
        encode_body(ledger_id, first_entry_id + i, lac, payload)
        for i, (payload, lac) in enumerate(zip(payloads, lacs, strict=True))
    ]
    return Request.entry_run(ledger_id, first_entry_id, bodies, max(lacs), flags, None, None, [])


def write_requests(
    directory: Path, batches: Sequence[Sequence[Request]], *, segment_bytes: int = 1 << 16
) -> None:
    """Write batches of any requests (runs too), from seq 0, syncing each."""
    writer = SegmentWriter(directory, segment_bytes=segment_bytes, first_seq=0)
    seq = 0
    for batch in batches:
        writer.write_batch(list(batch), seq)
        writer.sync()
        seq += len(batch)
    writer.close()


def scan(directory: Path, from_seq: int = 0) -> tuple[list[list[JournalRecord]], ScanSummary]:
    scanner = JournalScanner(directory, from_seq=from_seq)
    batches = list(scanner.batches())
    return batches, scanner.summary


def seqs(batches: list[list[JournalRecord]]) -> list[int]:
    return [record.seq for batch in batches for record in batch]


def batch_offsets(directory: Path) -> dict[Path, list[int]]:
    """Where each batch starts, per segment, read from an intact journal."""
    offsets: dict[Path, list[int]] = {}
    for batch in JournalScanner(directory).batches():
        first = batch[0]
        offsets.setdefault(first.segment, []).append(first.offset - BATCH_HEADER_SIZE)
    return offsets


def edit(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        file.write(data)


def rewrite_batch_header(path: Path, offset: int, *, first_seq: int) -> None:
    """Give the (valid) batch header at `offset` another first_seq, with a right crc."""
    data = bytearray(path.read_bytes()[offset : offset + BATCH_HEADER_SIZE])
    magic, _crc, length, count, _first_seq = BATCH_HEADER.unpack_from(data)
    BATCH_HEADER.pack_into(data, 0, magic, 0, length, count, first_seq)
    BATCH_HEADER.pack_into(data, 0, magic, batch_header_crc(data, 0), length, count, first_seq)
    edit(path, offset, bytes(data))


def flip_bit(path: Path, offset: int) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([byte ^ 0x10]))


# --- round trips --------------------------------------------------------------------------

requests_strategy = st.builds(
    Request,
    st.sampled_from(list(RecordKind)),
    st.integers(0, 2**64 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.binary(max_size=1200),
    st.sampled_from([RecordFlag.NONE, RecordFlag.RECOVERY_ADD]),
)


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.lists(requests_strategy, min_size=1, max_size=8), min_size=1, max_size=8),
    first_seq=st.integers(0, 2**48),
    segment_bytes=st.sampled_from([1024, 4096, 1 << 20]),
)
def test_records_come_back_identical_and_consecutive(
    batches: list[list[Request]], first_seq: int, segment_bytes: int
) -> None:
    with tempfile.TemporaryDirectory() as temporary:
        directory = Path(temporary)
        writer = SegmentWriter(
            directory, segment_bytes=segment_bytes, first_seq=first_seq, fsync=False
        )
        seq = first_seq
        for batch in batches:
            writer.write_batch(batch, seq)
            seq += len(batch)
        writer.close()
        read, summary = scan(directory)
    assert [
        [(r.seq, r.kind, r.flags, r.ledger_id, r.entry_id, r.payload) for r in b] for b in read
    ] == [
        [(r.seq, r.kind, r.flags, r.ledger_id, r.entry_id, bytes(r.payload)) for r in b]
        for b in batches
    ]
    assert seqs(read) == list(range(first_seq, seq))
    assert (summary.first_seq, summary.last_seq, summary.batches) == (
        first_seq,
        seq - 1,
        len(batches),
    )
    assert summary.torn_tail is None
    assert summary.record_bytes == sum(
        RECORD_HEADER_SIZE + len(r.payload) for b in batches for r in b
    )


def test_a_rolled_journal_reads_back_in_order(tmp_path: Path) -> None:
    # a 2048-byte segment holds its header block and three one-block batches
    write_journal(tmp_path, [3] * 30, segment_bytes=2048, first_seq=1000)
    segments = list_segments(tmp_path)
    assert [s.first_seq for s in segments] == list(range(1000, 1090, 9))
    read, summary = scan(tmp_path)
    assert seqs(read) == list(range(1000, 1090))
    assert [r.entry_id for b in read for r in b] == list(range(1000, 1090))
    assert summary.segments == 10
    assert summary.records == 90
    # records point at their place on disk
    for record in (read[0][0], read[-1][-1]):
        data = record.segment.read_bytes()
        start = record.offset + RECORD_HEADER_SIZE
        assert data[start : start + len(record.payload)] == record.payload


def test_an_empty_or_missing_journal_has_no_batches(tmp_path: Path) -> None:
    assert scan(tmp_path / "missing") == ([], ScanSummary())
    write_journal(tmp_path, [], first_seq=5)  # a segment with a header and nothing else
    read, summary = scan(tmp_path)
    assert read == []
    assert (summary.segments, summary.records, summary.torn_tail) == (1, 0, None)


# --- from_seq ---------------------------------------------------------------------------


def test_from_seq_leaves_out_earlier_records(tmp_path: Path) -> None:
    write_journal(tmp_path, [4] * 10, segment_bytes=4096)
    read, summary = scan(tmp_path, from_seq=10)
    assert seqs(read) == list(range(10, 40))
    assert [len(b) for b in read][:2] == [2, 4]  # the batch holding seq 10 is cut
    # the summary still describes the whole journal
    assert (summary.first_seq, summary.last_seq, summary.records) == (0, 39, 40)
    assert scan(tmp_path, from_seq=40)[0] == []


def test_from_seq_skips_earlier_batches_without_reading_their_records(tmp_path: Path) -> None:
    write_journal(tmp_path, [2, 2, 2])
    first_batch = batch_offsets(tmp_path)[list_segments(tmp_path)[0].path][0]
    path = list_segments(tmp_path)[0].path
    flip_bit(path, first_batch + BATCH_HEADER_SIZE + RECORD_HEADER_SIZE)
    # skipped by its header: the damage is not looked at
    assert seqs(scan(tmp_path, from_seq=2)[0]) == [2, 3, 4, 5]
    with pytest.raises(JournalCorruption):
        scan(tmp_path)


def test_from_seq_still_checks_the_last_batch(tmp_path: Path) -> None:
    write_journal(tmp_path, [2, 2, 2])
    path = list_segments(tmp_path)[0].path
    last_batch = batch_offsets(tmp_path)[path][-1]
    flip_bit(path, last_batch + BATCH_HEADER_SIZE + RECORD_HEADER_SIZE)
    read, summary = scan(tmp_path, from_seq=100)
    assert read == []
    assert summary.torn_tail is not None
    assert summary.torn_tail.offset == last_batch
    assert summary.last_seq == 3  # the torn batch's records were never there


# --- torn tails ---------------------------------------------------------------------------


def test_a_last_segment_cut_mid_batch_is_a_torn_tail(tmp_path: Path) -> None:
    write_journal(tmp_path, [3, 3, 3], payload=b"t" * 300)
    path = list_segments(tmp_path)[0].path
    last_batch = batch_offsets(tmp_path)[path][-1]
    os.truncate(path, last_batch + BATCH_HEADER_SIZE + 200)
    read, summary = scan(tmp_path)
    assert seqs(read) == list(range(6))
    assert summary.torn_tail is not None
    assert (summary.torn_tail.segment, summary.torn_tail.offset) == (path, last_batch)
    assert "runs past the end of the file" in summary.torn_tail.reason


def test_a_zeroed_tail_batch_is_a_torn_tail(tmp_path: Path) -> None:
    write_journal(tmp_path, [3, 3, 3])
    path = list_segments(tmp_path)[0].path
    last_batch = batch_offsets(tmp_path)[path][-1]
    # the header reached the disk, the records did not
    edit(path, last_batch + BATCH_HEADER_SIZE, bytes(3 * (RECORD_HEADER_SIZE + len(PAYLOAD))))
    read, summary = scan(tmp_path)
    assert seqs(read) == list(range(6))
    assert summary.torn_tail is not None
    assert summary.torn_tail.offset == last_batch
    assert "crc mismatch" in summary.torn_tail.reason


def test_a_wholly_zeroed_tail_batch_is_a_clean_end(tmp_path: Path) -> None:
    write_journal(tmp_path, [3, 3, 3])
    path = list_segments(tmp_path)[0].path
    last_batch = batch_offsets(tmp_path)[path][-1]
    edit(path, last_batch, bytes(BLOCK_SIZE))  # as if never written: nothing to report
    read, summary = scan(tmp_path)
    assert seqs(read) == list(range(6))
    assert summary.torn_tail is None


def test_a_flipped_bit_in_the_last_batch_is_a_torn_tail(tmp_path: Path) -> None:
    write_journal(tmp_path, [3, 3, 3])
    path = list_segments(tmp_path)[0].path
    last_batch = batch_offsets(tmp_path)[path][-1]
    second_record = last_batch + BATCH_HEADER_SIZE + RECORD_HEADER_SIZE + len(PAYLOAD)
    flip_bit(path, second_record + RECORD_HEADER_SIZE + 50)
    read, summary = scan(tmp_path)
    assert seqs(read) == list(range(6))  # none of the torn batch, not even its first record
    assert summary.torn_tail is not None
    assert summary.torn_tail.offset == last_batch
    assert f"record 7 at byte {second_record}: body crc mismatch" == summary.torn_tail.reason
    assert summary.last_seq == 5


def test_a_damaged_batch_header_at_the_end_is_a_torn_tail(tmp_path: Path) -> None:
    write_journal(tmp_path, [3, 3])
    path = list_segments(tmp_path)[0].path
    last_batch = batch_offsets(tmp_path)[path][-1]
    flip_bit(path, last_batch + 12)  # record_count
    read, summary = scan(tmp_path)
    assert seqs(read) == [0, 1, 2]
    assert summary.torn_tail is not None
    assert "batch header crc" in summary.torn_tail.reason


def test_a_last_segment_with_a_zero_header_is_a_torn_tail(tmp_path: Path) -> None:
    write_journal(tmp_path, [3] * 6, segment_bytes=1024)
    segments = list_segments(tmp_path)
    edit(segments[-1].path, 0, bytes(SEGMENT_HEADER_SIZE))
    edit(segments[-1].path, SEGMENT_HEADER_SIZE, bytes(BLOCK_SIZE))  # its batch never came
    read, summary = scan(tmp_path)
    assert seqs(read) == list(range(15))
    assert summary.torn_tail is not None
    assert (summary.torn_tail.segment, summary.torn_tail.offset) == (segments[-1].path, 0)


def test_a_last_segment_with_an_incomplete_header_is_a_torn_tail(tmp_path: Path) -> None:
    write_journal(tmp_path, [3] * 6, segment_bytes=1024)
    last = list_segments(tmp_path)[-1].path
    os.truncate(last, 100)
    read, summary = scan(tmp_path)
    assert seqs(read) == list(range(15))
    assert summary.torn_tail is not None
    assert summary.torn_tail.offset == 0
    assert "only 100 bytes" in summary.torn_tail.reason


# --- corruption -------------------------------------------------------------------------


def test_a_damaged_batch_followed_by_a_valid_one_is_corruption(tmp_path: Path) -> None:
    write_journal(tmp_path, [3, 3, 3])
    path = list_segments(tmp_path)[0].path
    offsets = batch_offsets(tmp_path)[path]
    flip_bit(path, offsets[1] + BATCH_HEADER_SIZE + RECORD_HEADER_SIZE + 10)
    with pytest.raises(JournalCorruption) as caught:
        scan(tmp_path)
    assert (caught.value.path, caught.value.offset) == (path, offsets[1])
    assert f"a valid batch follows at byte {offsets[2]}" in caught.value.reason
    assert str(path) in str(caught.value) and "pora journal verify" in str(caught.value)


def test_the_record_crcs_are_what_decides(tmp_path: Path) -> None:
    write_journal(tmp_path, [3, 3])
    path = list_segments(tmp_path)[0].path
    last_batch = batch_offsets(tmp_path)[path][-1]
    record = last_batch + BATCH_HEADER_SIZE
    flip_bit(path, record + RECORD_HEADER_SIZE)
    data = path.read_bytes()
    # fix both links of the chain: the body's crc, then the prefix crc that covers it
    body = record + RECORD_PREFIX_SIZE
    crc = body_crc(data, body, record + RECORD_HEADER_SIZE + len(PAYLOAD))
    edit(path, body, crc.to_bytes(4, "little"))
    data = path.read_bytes()
    prefix = prefix_crc(data[record + 4 : record + RECORD_PREFIX_SIZE], data[body : body + 4])
    edit(path, record, prefix.to_bytes(4, "little"))
    read, summary = scan(tmp_path)
    assert summary.torn_tail is None
    assert read[-1][0].payload == bytes([PAYLOAD[0] ^ 0x10]) + PAYLOAD[1:]
    assert seqs(read) == list(range(6))


def test_damage_in_a_segment_that_is_not_the_last_is_corruption(tmp_path: Path) -> None:
    write_journal(tmp_path, [3] * 6, segment_bytes=1024)
    segments = list_segments(tmp_path)
    last_batch_of_first = batch_offsets(tmp_path)[segments[0].path][-1]
    flip_bit(segments[0].path, last_batch_of_first + BATCH_HEADER_SIZE + 40)
    with pytest.raises(JournalCorruption, match="later segments follow") as caught:
        scan(tmp_path)
    assert (caught.value.path, caught.value.offset) == (segments[0].path, last_batch_of_first)


def test_a_missing_middle_segment_is_a_gap(tmp_path: Path) -> None:
    write_journal(tmp_path, [3] * 6, segment_bytes=1024)
    segments = list_segments(tmp_path)
    segments[1].path.unlink()
    with pytest.raises(JournalGap, match="seqs 3-5 are in no segment") as caught:
        scan(tmp_path)
    assert (caught.value.path, caught.value.offset) == (segments[2].path, 0)
    assert (caught.value.first_missing, caught.value.last_missing) == (3, 5)
    assert (
        f"{segments[0].path.name} ends at seq 2 and {segments[2].path.name} starts at seq 6"
        in caught.value.reason
    )
    assert "Acknowledged entries may be lost" in str(caught.value)


def test_a_zero_header_followed_by_a_valid_batch_is_a_hole(tmp_path: Path) -> None:
    write_journal(tmp_path, [3, 3, 3])
    path = list_segments(tmp_path)[0].path
    offsets = batch_offsets(tmp_path)[path]
    edit(path, offsets[1], bytes(BATCH_HEADER_SIZE))
    with pytest.raises(JournalCorruption, match="a hole in the journal") as caught:
        scan(tmp_path)
    assert caught.value.offset == offsets[1]


def test_a_zero_header_segment_before_the_last_is_corruption(tmp_path: Path) -> None:
    write_journal(tmp_path, [3] * 6, segment_bytes=1024)
    segments = list_segments(tmp_path)
    edit(segments[1].path, 0, bytes(SEGMENT_HEADER_SIZE))
    with pytest.raises(JournalCorruption, match="later segments follow") as caught:
        scan(tmp_path)
    assert (caught.value.path, caught.value.offset) == (segments[1].path, 0)


def test_an_intact_batch_with_the_wrong_seq_is_corruption_even_at_the_end(
    tmp_path: Path,
) -> None:
    write_journal(tmp_path, [3, 3])
    path = list_segments(tmp_path)[0].path
    last_batch = batch_offsets(tmp_path)[path][-1]
    rewrite_batch_header(path, last_batch, first_seq=4)
    with pytest.raises(JournalCorruption, match="starts at seq 4, expected 3"):
        scan(tmp_path)


# --- torn tails when batches are written while others sync ------------------------------
# With syncs_in_flight_max = N the writer may have N batches written and not yet
# synced; a crash can leave any of them torn and the later ones whole. None of them
# was acknowledged, so the damaged one and those after it are a torn tail.


def overlapping_journal(
    directory: Path, batch_count: int, unsynced_batches_max: int
) -> tuple[Path, list[int]]:
    """A one-segment journal of `batch_count` batches of 3 whose writer overlaps
    `unsynced_batches_max` batches; its path and batch offsets."""
    write_journal(directory, [3] * batch_count, unsynced_batches_max=unsynced_batches_max)
    path = list_segments(directory)[0].path
    return path, batch_offsets(directory)[path]


def test_a_torn_batch_with_one_written_while_it_synced_after_it_is_a_torn_tail(
    tmp_path: Path,
) -> None:
    path, offsets = overlapping_journal(tmp_path, 3, 2)
    second_record = offsets[1] + BATCH_HEADER_SIZE + RECORD_HEADER_SIZE + len(PAYLOAD)
    flip_bit(path, second_record + RECORD_HEADER_SIZE + 5)
    read, summary = scan(tmp_path)
    assert seqs(read) == [0, 1, 2]  # neither the torn batch nor the whole one after it
    assert summary.last_seq == 2
    torn = summary.torn_tail
    assert torn is not None
    assert (torn.segment, torn.offset, torn.batches_after) == (path, offsets[1], 1)
    assert torn.reason == (
        f"record 4 at byte {second_record}: body crc mismatch; the 1 batch(es) after it "
        "(seqs 6-8) were written while it synced and are dropped with it"
    )
    # the damaged batch's 3 records and the 3 after it: its header is intact
    assert (torn.kind, torn.records_dropped, torn.first_seq_dropped) == ("checksum", 6, 3)


def damage_batch_header(path: Path, offsets: list[int]) -> None:
    flip_bit(path, offsets[1] + 12)  # its record_count: the header's length is not trusted


def zero_batch(path: Path, offsets: list[int]) -> None:
    edit(path, offsets[1], bytes(offsets[2] - offsets[1]))  # none of it reached the disk


@pytest.mark.parametrize(
    ("damage", "reason_start"),
    [
        (damage_batch_header, "batch header crc is"),
        (zero_batch, "an all-zero batch header; the 1 batch(es)"),
    ],
)
def test_a_lost_batch_header_with_a_whole_batch_after_it_is_a_torn_tail(
    tmp_path: Path, damage: Callable[[Path, list[int]], None], reason_start: str
) -> None:
    path, offsets = overlapping_journal(tmp_path, 3, 2)
    damage(path, offsets)
    read, summary = scan(tmp_path)
    assert seqs(read) == [0, 1, 2]
    assert summary.torn_tail is not None
    assert (summary.torn_tail.offset, summary.torn_tail.batches_after) == (offsets[1], 1)
    assert summary.torn_tail.reason.startswith(reason_start)


def test_more_whole_batches_after_a_torn_one_than_the_writer_overlaps_is_corruption(
    tmp_path: Path,
) -> None:
    path, offsets = overlapping_journal(tmp_path, 4, 2)
    flip_bit(path, offsets[1] + BATCH_HEADER_SIZE + RECORD_HEADER_SIZE + 10)
    with pytest.raises(JournalCorruption) as caught:
        scan(tmp_path)
    assert (caught.value.path, caught.value.offset) == (path, offsets[1])
    assert caught.value.reason.endswith(
        f"; a valid batch follows at byte {offsets[2]}, and more than the 1 batch(es) "
        "that may be written while one syncs follow it"
    )


def test_the_overlap_a_segment_header_records_is_what_decides(tmp_path: Path) -> None:
    path, offsets = overlapping_journal(tmp_path, 4, 3)
    flip_bit(path, offsets[1] + BATCH_HEADER_SIZE + RECORD_HEADER_SIZE + 10)
    read, summary = scan(tmp_path)
    assert seqs(read) == [0, 1, 2]
    assert summary.torn_tail is not None
    assert (summary.torn_tail.offset, summary.torn_tail.batches_after) == (offsets[1], 2)
    assert "(seqs 6-11)" in summary.torn_tail.reason


def test_a_batch_after_a_torn_one_that_was_not_written_next_is_corruption(
    tmp_path: Path,
) -> None:
    path, offsets = overlapping_journal(tmp_path, 3, 2)
    flip_bit(path, offsets[1] + BATCH_HEADER_SIZE + RECORD_HEADER_SIZE + 10)
    rewrite_batch_header(path, offsets[2], first_seq=7)  # the torn batch holds 3..5
    with pytest.raises(JournalCorruption) as caught:
        scan(tmp_path)
    assert caught.value.offset == offsets[1]
    assert caught.value.reason.endswith(
        f"; a valid batch follows at byte {offsets[2]}, and the batch at byte "
        f"{offsets[2]} (seq 7) is not the one written next"
    )


def test_segments_from_before_the_overlap_was_recorded_keep_the_one_batch_rule(
    tmp_path: Path,
) -> None:
    write_journal(tmp_path, [3, 3, 3], unsynced_batches_max=2)
    segment = list_segments(tmp_path)[0]
    block = bytearray(segment.path.read_bytes()[:SEGMENT_HEADER_SIZE])
    fields = list(SEGMENT_HEADER.unpack_from(block))
    fields[2] = 0  # what every writer put there before
    SEGMENT_HEADER.pack_into(block, 0, *fields)
    fields[-1] = segment_header_crc(block)
    SEGMENT_HEADER.pack_into(block, 0, *fields)
    edit(segment.path, 0, bytes(block))
    offsets = batch_offsets(tmp_path)[segment.path]
    flip_bit(segment.path, offsets[1] + BATCH_HEADER_SIZE + RECORD_HEADER_SIZE + 10)
    with pytest.raises(JournalCorruption) as caught:
        scan(tmp_path)
    assert caught.value.reason.endswith(f"; a valid batch follows at byte {offsets[2]}")


def test_the_overlap_never_excuses_damage_before_the_last_segment(tmp_path: Path) -> None:
    write_journal(tmp_path, [3] * 6, segment_bytes=1024, unsynced_batches_max=2)
    segments = list_segments(tmp_path)
    last_batch_of_first = batch_offsets(tmp_path)[segments[0].path][-1]
    flip_bit(segments[0].path, last_batch_of_first + BATCH_HEADER_SIZE + 40)
    with pytest.raises(JournalCorruption, match="later segments follow"):
        scan(tmp_path)


def test_from_seq_still_checks_every_batch_that_may_have_been_unsynced(tmp_path: Path) -> None:
    path, offsets = overlapping_journal(tmp_path, 3, 2)
    flip_bit(path, offsets[1] + BATCH_HEADER_SIZE + RECORD_HEADER_SIZE + 10)
    # the torn batch is below from_seq, but only one batch follows it: not skipped unread
    read, summary = scan(tmp_path, from_seq=6)
    assert read == []
    assert summary.torn_tail is not None
    assert (summary.torn_tail.offset, summary.torn_tail.batches_after) == (offsets[1], 1)


# --- segment headers ----------------------------------------------------------------------


def rewrite_segment_header(segment: SegmentInfo, *, version: int, fix_crc: bool) -> None:
    block = bytearray(segment.path.read_bytes()[:SEGMENT_HEADER_SIZE])
    fields = list(SEGMENT_HEADER.unpack_from(block))
    fields[1] = version
    SEGMENT_HEADER.pack_into(block, 0, *fields)
    if fix_crc:
        fields[-1] = segment_header_crc(block)
        SEGMENT_HEADER.pack_into(block, 0, *fields)
    edit(segment.path, 0, bytes(block))


@pytest.mark.parametrize("fix_crc", [True, False])
def test_an_unknown_format_version_is_named(tmp_path: Path, fix_crc: bool) -> None:
    write_journal(tmp_path, [3] * 6, segment_bytes=1024)
    segment = list_segments(tmp_path)[-1]  # the last segment too: never a torn tail
    rewrite_segment_header(segment, version=7, fix_crc=fix_crc)
    with pytest.raises(
        JournalFormatError, match=f"format version 7; this build reads version {FORMAT_VERSION}"
    ):
        scan(tmp_path)


def test_a_bad_segment_magic_is_a_format_error(tmp_path: Path) -> None:
    write_journal(tmp_path, [3])
    path = list_segments(tmp_path)[0].path
    edit(path, 0, b"NOTPORA!")
    with pytest.raises(JournalFormatError, match="not a journal segment: magic") as caught:
        scan(tmp_path)
    assert caught.value.path == path


def test_a_damaged_segment_header_is_a_format_error(tmp_path: Path) -> None:
    write_journal(tmp_path, [3])
    path = list_segments(tmp_path)[0].path
    flip_bit(path, 20)  # in first_seq
    with pytest.raises(JournalFormatError, match="segment header crc"):
        scan(tmp_path)


def test_a_renamed_segment_is_a_format_error(tmp_path: Path) -> None:
    write_journal(tmp_path, [3], first_seq=10)
    segment = list_segments(tmp_path)[0]
    segment.path.rename(tmp_path / segment.path.name.replace("10-", "11-"))
    with pytest.raises(JournalFormatError, match="the file was renamed"):
        scan(tmp_path)


def test_a_last_segment_with_a_zero_header_but_a_batch_is_a_hole(tmp_path: Path) -> None:
    write_journal(tmp_path, [3] * 3, segment_bytes=1024)
    last = list_segments(tmp_path)[-1].path
    edit(last, 0, bytes(SEGMENT_HEADER_SIZE))
    with pytest.raises(JournalCorruption, match="a hole in the journal") as caught:
        scan(tmp_path)
    assert (caught.value.path, caught.value.offset) == (last, 0)


def test_a_batch_header_cut_by_the_end_of_the_file_is_a_torn_tail(tmp_path: Path) -> None:
    write_journal(tmp_path, [3, 3])
    path = list_segments(tmp_path)[0].path
    last_batch = batch_offsets(tmp_path)[path][-1]
    os.truncate(path, last_batch + 10)
    read, summary = scan(tmp_path)
    assert seqs(read) == [0, 1, 2]
    assert summary.torn_tail is not None
    assert summary.torn_tail.offset == last_batch
    assert summary.torn_tail.reason == "batch header cut short by the end of the file"


# --- reading for replay ----------------------------------------------------------------


def _replay(directory: Path, durable: dict[int, int]) -> tuple[dict[int, LedgerPart], ReplayTally]:
    """Every ledger's part of the whole journal, as crash recovery gathers it."""
    tally = ReplayTally()
    runs = ReplayRuns(durable, tally)
    for _ in JournalScanner(directory).replay(runs):
        pass
    return runs.take(), tally


def test_replay_gets_the_records_after_durable_seq_as_runs_per_ledger(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, segment_bytes=1 << 16, first_seq=0)
    written = [
        Request(RecordKind.ENTRY, ledger_id, entry_id, bytes([ledger_id, entry_id]) * 40, lac=3)
        for entry_id in range(4)
        for ledger_id in (1, 2)
    ]
    for seq in range(0, len(written), 3):
        writer.write_batch(written[seq : seq + 3], seq)
        writer.sync()
    writer.close()
    records = [r for batch in JournalScanner(tmp_path).batches() for r in batch]

    # ledger 1 is durable up to seq 4 (its entries 0..2), ledger 2 not at all
    parts, tally = _replay(tmp_path, {1: 4})

    # ledger 2's four records (seqs 1, 3, 5, 7) are one run; ledger 1 has seq 6 left
    assert sorted(parts) == [1, 2]
    assert [(r.seq, r.entry_id, r.count) for r in parts[2]] == [(1, 0, 4)]
    assert [(r.seq, r.entry_id, r.count) for r in parts[1]] == [(6, 3, 1)]
    assert (parts[1].last_seq, parts[2].last_seq) == (6, 7)
    for ledger_id, part in parts.items():
        expected = [
            r for r in records if r.ledger_id == ledger_id and r.seq > {1: 4}.get(r.ledger_id, -1)
        ]
        assert [body for request in part for body in request.bodies] == [
            r.body for r in expected
        ]  # the entry-log records, as journalled
        for request in part:
            assert (request.kind, request.flags, request.lac) == (
                RecordKind.ENTRY,
                RecordFlag.NONE,
                3,
            )
            assert (request.on_done, request.error) == (None, None)
    assert tally.records_scanned == len(records)
    assert tally.payload_bytes_scanned == sum(len(r.payload) for r in records)
    assert tally.records_selected == 5
    assert tally.payload_bytes_selected == 5 * 80
    assert tally.ledgers_selected == {1, 2}


def merged_by_ledger(
    written: Sequence[Request],
) -> dict[int, tuple[list[tuple[int, RecordKind, RecordFlag, int, list[bytes], int]], int]]:
    """What replay makes of journalled requests, worked out the plain way: per
    ledger, (seq, kind, flags, first entry id, bodies, largest LAC) of each request,
    and the ledger's last seq."""
    merged: dict[int, list[tuple[int, RecordKind, RecordFlag, int, list[bytes], int]]] = {}
    last_seqs: dict[int, int] = {}
    for request in written:
        part = merged.setdefault(request.ledger_id, [])
        last_seqs[request.ledger_id] = request.seq
        bodies = [bytes(body) for body in request.bodies]
        lac = max(body_lac(body) for body in request.bodies)  # a run's LAC is its largest
        if part:
            seq, kind, flags, first, merged_bodies, merged_lac = part[-1]
            if (
                kind is RecordKind.ENTRY
                and request.kind is RecordKind.ENTRY
                and flags == request.flags
                and first + len(merged_bodies) == request.entry_id
            ):
                part[-1] = (seq, kind, flags, first, merged_bodies + bodies, max(merged_lac, lac))
                continue
        part.append((request.seq, request.kind, request.flags, request.entry_id, bodies, lac))
    return {ledger_id: (part, last_seqs[ledger_id]) for ledger_id, part in merged.items()}


def test_replay_finds_a_torn_tail_even_in_durable_records(tmp_path: Path) -> None:
    write_journal(tmp_path, [3, 3, 3])
    path = list_segments(tmp_path)[0].path
    last_batch = batch_offsets(tmp_path)[path][-1]
    flip_bit(path, last_batch + BATCH_HEADER_SIZE + RECORD_HEADER_SIZE + 50)
    scanner = JournalScanner(tmp_path)
    tally = ReplayTally()
    runs = ReplayRuns({7: 100}, tally)
    # every record is durable: nothing to replay, but every batch is still checked
    assert len(list(scanner.replay(runs))) == 2
    assert runs.take() == {}
    assert scanner.summary.torn_tail is not None
    assert scanner.summary.torn_tail.offset == last_batch
    assert tally.records_scanned == 6  # the torn batch is not counted


def test_replay_reports_corruption_like_a_plain_scan(tmp_path: Path) -> None:
    write_journal(tmp_path, [3, 3, 3])
    path = list_segments(tmp_path)[0].path
    offsets = batch_offsets(tmp_path)[path]
    flip_bit(path, offsets[1] + BATCH_HEADER_SIZE + RECORD_HEADER_SIZE + 10)
    with pytest.raises(JournalCorruption) as caught:
        _replay(tmp_path, {})
    assert (caught.value.path, caught.value.offset) == (path, offsets[1])


# --- runs: ENTRY records carrying several bodies -----------------------------------------


@st.composite
def run_requests(draw: st.DrawFn) -> Request:
    """A run of 1 to 50 consecutive entries of one ledger, as the node makes them."""
    count = draw(st.integers(1, 50))
    payloads = draw(st.lists(st.binary(max_size=200), min_size=count, max_size=count))
    lacs = draw(st.lists(st.integers(-1, 2**63 - 1), min_size=count, max_size=count))
    return run(
        draw(st.integers(0, 2**64 - 1)),
        draw(st.integers(0, 2**63 - count)),
        payloads,
        lacs,
        draw(st.sampled_from([RecordFlag.NONE, RecordFlag.RECOVERY_ADD])),
    )


def body_lac(body: RecordBody) -> int:
    lac: int = BODY_HEADER.unpack_from(body)[4]
    return lac


@settings(max_examples=50, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.one_of(run_requests(), requests_strategy), min_size=1, max_size=6),
        min_size=1,
        max_size=5,
    ),
    segment_bytes=st.sampled_from([1024, 4096, 1 << 20]),
)
@pytest.mark.slow
def test_runs_read_back_per_entry_and_replay_merged_per_ledger(
    batches: list[list[Request]], segment_bytes: int
) -> None:
    with tempfile.TemporaryDirectory() as temporary:
        directory = Path(temporary)
        write_requests(directory, batches, segment_bytes=segment_bytes)
        read, summary = scan(directory)
        segment_bytes_by_path = {s.path: s.path.read_bytes() for s in list_segments(directory)}
        parts, tally = _replay(directory, {})
    # batches(): one JournalRecord per entry, every entry of a run with the run's seq
    assert [
        [(r.seq, r.kind, r.flags, r.ledger_id, r.entry_id, r.payload, r.lac, r.body) for r in batch]
        for batch in read
    ] == [
        [
            (
                request.seq,
                request.kind,
                request.flags,
                request.ledger_id,
                request.entry_id + index,
                bytes(body[BODY_HEADER_SIZE:]),
                body_lac(body),
                bytes(body),
            )
            for request in batch
            for index, body in enumerate(request.bodies)
        ]
        for batch in batches
    ]
    # ... all at the offset of the record's prefix, which the first body follows
    records = [r for batch in read for r in batch]
    for request in (request for batch in batches for request in batch):
        held = [r for r in records if r.seq == request.seq]
        assert {r.offset for r in held} == {held[0].offset}
        data = segment_bytes_by_path[held[0].segment]
        first_body = held[0].offset + RECORD_PREFIX_SIZE
        assert data[first_body : first_body + len(request.bodies[0])] == request.bodies[0]
        assert RECORD_PREFIX.unpack_from(data, held[0].offset)[3] == request.count
    # replay: per ledger, its records in journal order, those that continue an ENTRY
    # run (the next entry id, the same flags) merged into it
    written = [request for batch in batches for request in batch]
    assert {
        ledger_id: (
            [
                (r.seq, r.kind, r.flags, r.entry_id, [bytes(b) for b in r.bodies], r.lac)
                for r in part
            ],
            part.last_seq,
        )
        for ledger_id, part in parts.items()
    } == merged_by_ledger(written)
    entries = sum(r.count for r in written)
    payload_bytes = sum(r.payload_bytes for r in written)
    assert (tally.records_scanned, tally.payload_bytes_scanned) == (entries, payload_bytes)
    assert (tally.records_selected, tally.payload_bytes_selected) == (entries, payload_bytes)
    # the summary counts journal records, as the batch headers do
    assert (summary.records, summary.last_seq, summary.torn_tail) == (
        len(written),
        len(written) - 1,
        None,
    )
    assert summary.record_bytes == sum(RECORD_PREFIX_SIZE + r.body_bytes for r in written)


def written_batch_offsets(path: Path) -> list[int]:
    """Where each batch of a segment starts, by its headers alone (damaged or not)."""
    data = path.read_bytes()
    offsets = []
    offset = SEGMENT_HEADER_SIZE
    while offset + BATCH_HEADER_SIZE <= len(data) and any(
        data[offset : offset + BATCH_HEADER_SIZE]
    ):
        offsets.append(offset)
        records_length = BATCH_HEADER.unpack_from(data, offset)[2]
        offset += -(-(BATCH_HEADER_SIZE + records_length) // BLOCK_SIZE) * BLOCK_SIZE
    return offsets


def run_record_offsets(directory: Path) -> tuple[Path, int, list[int]]:
    """The last batch's run record (its second record): its segment, its offset, and
    where each of its bodies starts."""
    path = list_segments(directory)[-1].path
    last_batch = written_batch_offsets(path)[-1]
    record = last_batch + BATCH_HEADER_SIZE + RECORD_HEADER_SIZE + len(PAYLOAD)
    body_count = RECORD_PREFIX.unpack_from(path.read_bytes(), record)[3]
    bodies = [
        record + RECORD_PREFIX_SIZE + i * (BODY_HEADER_SIZE + len(PAYLOAD))
        for i in range(body_count)
    ]
    return path, record, bodies


def test_a_flipped_bit_in_a_runs_second_body_is_a_torn_tail_naming_it(tmp_path: Path) -> None:
    write_requests(tmp_path, [[entry(0), entry(1)], [entry(2), run(7, 3, [PAYLOAD] * 4)]])
    path, record, bodies = run_record_offsets(tmp_path)
    flip_bit(path, bodies[1] + BODY_HEADER_SIZE + 10)
    read, summary = scan(tmp_path)
    assert seqs(read) == [0, 1]  # none of the torn batch, not its intact first record
    assert summary.torn_tail is not None
    assert summary.torn_tail.offset == written_batch_offsets(path)[-1]
    assert summary.torn_tail.reason == f"record 3 at byte {record}: body 1 crc mismatch"
    assert summary.last_seq == 1
    parts, tally = _replay(tmp_path, {})
    # the two intact records, one run of ledger 7's entries 0 and 1
    assert [(r.seq, r.entry_id, r.count) for r in parts[7]] == [(0, 0, 2)]
    assert (list(parts), parts[7].last_seq) == ([7], 1)
    assert tally.records_scanned == 2


def test_a_damaged_run_in_a_segment_that_is_not_the_last_is_corruption(tmp_path: Path) -> None:
    # a 1024-byte segment holds its header block and one one-block batch
    write_requests(tmp_path, [[entry(0), run(7, 1, [PAYLOAD] * 3)]] * 3, segment_bytes=1024)
    segments = list_segments(tmp_path)
    assert len(segments) == 3
    first = segments[0].path
    record = SEGMENT_HEADER_SIZE + BATCH_HEADER_SIZE + RECORD_HEADER_SIZE + len(PAYLOAD)
    second_body = record + RECORD_PREFIX_SIZE + BODY_HEADER_SIZE + len(PAYLOAD)
    flip_bit(first, second_body + BODY_HEADER_SIZE + 99)
    with pytest.raises(JournalCorruption, match="later segments follow") as caught:
        scan(tmp_path)
    assert (caught.value.path, caught.value.offset) == (first, SEGMENT_HEADER_SIZE)
    assert caught.value.reason.startswith(f"record 1 at byte {record}: body 1 crc mismatch")
    with pytest.raises(JournalCorruption, match="body 1 crc mismatch"):
        _replay(tmp_path, {})


def test_the_prefix_crc_covers_every_body_crc_of_a_run(tmp_path: Path) -> None:
    write_requests(tmp_path, [[entry(0)], [entry(1), run(7, 2, [PAYLOAD] * 3)]])
    path, record, bodies = run_record_offsets(tmp_path)
    flip_bit(path, bodies[1] + BODY_HEADER_SIZE)
    # the body's own crc made right again, but not the prefix crc over it
    data = path.read_bytes()
    end = bodies[1] + BODY_HEADER_SIZE + len(PAYLOAD)
    edit(path, bodies[1], body_crc(data, bodies[1], end).to_bytes(4, "little"))
    read, summary = scan(tmp_path)
    assert seqs(read) == [0]
    assert summary.torn_tail is not None
    assert summary.torn_tail.reason == f"record 2 at byte {record}: prefix crc mismatch"
    # and with the prefix crc made right too, the chain holds: the crcs decide
    data = path.read_bytes()
    crc_fields = b"".join(data[b : b + 4] for b in bodies)
    prefix = prefix_crc(data[record + 4 : record + RECORD_PREFIX_SIZE], crc_fields)
    edit(path, record, prefix.to_bytes(4, "little"))
    read, summary = scan(tmp_path)
    assert summary.torn_tail is None
    assert [r.entry_id for r in read[-1]] == [1, 2, 3, 4]
    assert read[-1][2].payload == bytes([PAYLOAD[0] ^ 0x10]) + PAYLOAD[1:]


def hand_made(kind: RecordKind, bodies: list[tuple[int, int]]) -> Request:
    """A record of `kind` with a body per (ledger_id, entry_id), every crc right."""
    request = Request.entry_run(
        bodies[0][0],
        bodies[0][1],
        [encode_body(ledger_id, entry_id, -1, PAYLOAD) for ledger_id, entry_id in bodies],
        -1,
        RecordFlag.NONE,
        None,
        None,
        [],
    )
    request.kind = kind
    return request


@pytest.mark.parametrize(
    ("kind", "bodies", "reason"),
    [
        (RecordKind.FENCE, [(7, -1), (7, 0)], "a FENCE record with 2 bodies"),
        (RecordKind.DELETE, [(7, 3), (7, 4), (7, 5)], "a DELETE record with 3 bodies"),
        # bodies are checked before the prefix, so bodies that are not a run say so
        # first: the kind is trusted only once the prefix crc vouches for it
        (
            RecordKind.FENCE,
            [(7, -1), (7, -1)],
            "body 1 is ledger 7 entry -1 in a run of ledger 7 from entry -1",
        ),
        (
            RecordKind.ENTRY,
            [(7, 0), (8, 1)],
            "body 1 is ledger 8 entry 1 in a run of ledger 7 from entry 0",
        ),
        (
            RecordKind.ENTRY,
            [(7, 5), (7, 6), (7, 8)],
            "body 2 is ledger 7 entry 8 in a run of ledger 7 from entry 5",
        ),
        (
            RecordKind.ENTRY,
            [(7, 5), (7, 5)],
            "body 1 is ledger 7 entry 5 in a run of ledger 7 from entry 5",
        ),
    ],
)
def test_a_record_breaking_the_run_rules_is_damage(
    tmp_path: Path, kind: RecordKind, bodies: list[tuple[int, int]], reason: str
) -> None:
    write_requests(tmp_path, [[entry(0)], [entry(1), hand_made(kind, bodies)]])
    _, record, _ = run_record_offsets(tmp_path)
    read, summary = scan(tmp_path)
    assert seqs(read) == [0]
    assert summary.torn_tail is not None
    assert summary.torn_tail.reason == f"record 2 at byte {record}: {reason}"
    # with a valid batch after it, the same record is corruption, for the same reason
    write_requests(
        tmp_path / "followed", [[entry(0)], [entry(1), hand_made(kind, bodies)], [entry(3)]]
    )
    with pytest.raises(JournalCorruption) as caught:
        _replay(tmp_path / "followed", {})
    assert caught.value.reason.startswith(f"record 2 at byte {record}: {reason}; a valid batch")


def test_a_record_with_no_body_is_damage(tmp_path: Path) -> None:
    write_requests(tmp_path, [[entry(0)], [entry(1)]])
    path = list_segments(tmp_path)[0].path
    record = batch_offsets(tmp_path)[path][-1] + BATCH_HEADER_SIZE
    data = path.read_bytes()
    _crc, kind, flags, _count, seq = RECORD_PREFIX.unpack_from(data, record)
    fields = RECORD_PREFIX.pack(0, kind, flags, 0, seq)[4:]
    edit(path, record, prefix_crc(fields, b"").to_bytes(4, "little") + fields)
    read, summary = scan(tmp_path)
    assert seqs(read) == [0]
    assert summary.torn_tail is not None
    assert summary.torn_tail.reason == f"record 1 at byte {record}: a ENTRY record with 0 bodies"
