"""Each layer of the journal reader held to its own rules: the batch layer's framing
and the torn-tail rule at every byte of a batch header, the segment chain's
continuity, and the record layer's checks (journal/reader.py names the layers)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest
from test_journal_reader import flip_bit

from journal.continuity import SegmentChain
from journal.errors import JournalCorruption, JournalGap
from journal.format import BATCH_HEADER, BATCH_HEADER_SIZE, RECORD_PREFIX_SIZE, RecordKind
from journal.framing import BatchDamage
from journal.reader import JournalScanner, ReplayTally
from journal.records import Framed, frame_records, journal_records
from journal.replay_runs import ReplayRuns
from journal.request import Request
from journal.segment import SegmentWriter, encode_batch, list_segments

PAYLOAD = b"q" * 200


def write_batches(directory: Path, sizes: list[int], *, unsynced_batches_max: int = 1) -> None:
    writer = SegmentWriter(
        directory,
        segment_bytes=1 << 16,
        first_seq=0,
        unsynced_batches_max=unsynced_batches_max,
    )
    seq = 0
    for size in sizes:
        batch = [Request(RecordKind.ENTRY, 3, seq + i, PAYLOAD) for i in range(size)]
        writer.write_batch(batch, seq)
        writer.sync()
        seq += size
    writer.close()


def batch_starts(directory: Path) -> tuple[Path, list[int]]:
    """The one segment, and where each of its batches starts."""
    starts = [batch[0].offset - BATCH_HEADER_SIZE for batch in JournalScanner(directory).batches()]
    return list_segments(directory)[0].path, starts


def damaged_header(
    directory: Path, sizes: list[int], index: int, byte: int, *, unsynced_batches_max: int = 1
) -> list[int]:
    """Write batches of `sizes`, flip a bit of byte `byte` of batch `index`'s header;
    where the batches start."""
    write_batches(directory, sizes, unsynced_batches_max=unsynced_batches_max)
    path, starts = batch_starts(directory)
    flip_bit(path, starts[index] + byte)
    return starts


def read_all(directory: Path) -> tuple[list[int], JournalScanner]:
    scanner = JournalScanner(directory)
    seqs = [record.seq for batch in scanner.batches() for record in batch]
    return seqs, scanner


# --- the batch layer and the torn-tail rule, at every byte of a batch header ----------


@pytest.mark.parametrize("cut", range(1, BATCH_HEADER_SIZE))
def test_a_file_ending_at_any_byte_of_the_last_batch_header_is_a_torn_tail(
    tmp_path: Path, cut: int
) -> None:
    write_batches(tmp_path, [2, 2])
    path, starts = batch_starts(tmp_path)
    os.truncate(path, starts[-1] + cut)
    seqs, scanner = read_all(tmp_path)
    torn = scanner.summary.torn_tail
    assert seqs == [0, 1]
    assert torn is not None
    assert (torn.offset, torn.kind, torn.first_seq_dropped) == (starts[-1], "incomplete", 2)
    assert torn.records_dropped is None  # its header is cut: how many is unknown


def test_a_file_ending_at_a_batch_boundary_is_a_clean_end(tmp_path: Path) -> None:
    write_batches(tmp_path, [2, 2])
    path, starts = batch_starts(tmp_path)
    os.truncate(path, starts[-1])
    seqs, scanner = read_all(tmp_path)
    assert (seqs, scanner.summary.torn_tail) == ([0, 1], None)


@pytest.mark.parametrize("byte", range(BATCH_HEADER_SIZE))
def test_damage_at_any_byte_of_the_last_batch_header_is_a_torn_tail(
    tmp_path: Path, byte: int
) -> None:
    starts = damaged_header(tmp_path, [2, 2], -1, byte)
    seqs, scanner = read_all(tmp_path)
    torn = scanner.summary.torn_tail
    assert seqs == [0, 1]
    assert torn is not None
    assert (torn.offset, torn.kind, torn.first_seq_dropped) == (starts[-1], "checksum", 2)


@pytest.mark.parametrize("byte", range(BATCH_HEADER_SIZE))
def test_damage_at_any_byte_of_a_batch_header_with_a_batch_after_it_is_corruption(
    tmp_path: Path, byte: int
) -> None:
    starts = damaged_header(tmp_path, [2, 2], 0, byte)
    with pytest.raises(JournalCorruption) as raised:
        read_all(tmp_path)
    assert raised.value.offset == starts[0]
    assert f"a valid batch follows at byte {starts[1]}" in raised.value.reason


@pytest.mark.parametrize("byte", range(BATCH_HEADER_SIZE))
def test_a_batch_written_while_the_damaged_one_synced_is_dropped_with_it(
    tmp_path: Path, byte: int
) -> None:
    # the writer overlapped two batches: the first may be torn with the second whole
    starts = damaged_header(tmp_path, [2, 2, 2], 1, byte, unsynced_batches_max=2)
    seqs, scanner = read_all(tmp_path)
    torn = scanner.summary.torn_tail
    assert seqs == [0, 1]
    assert torn is not None
    assert (torn.offset, torn.batches_after, torn.first_seq_dropped) == (starts[1], 1, 2)
    assert torn.records_dropped == 4  # its two, known from the next batch's seq, and two


# --- the segment chain --------------------------------------------------------------------


def test_each_segment_must_start_where_the_journal_before_it_ends(tmp_path: Path) -> None:
    chain = SegmentChain(tmp_path, require_watermark=False, accept_gaps=False)
    chain.start_segment(tmp_path / "a", 10)
    chain.advance(15)
    with pytest.raises(JournalGap) as gap:
        chain.start_segment(tmp_path / "b", 20)
    assert (gap.value.first_missing, gap.value.last_missing) == (15, 19)
    assert "seqs 15-19 are in no segment: a ends at seq 14" in gap.value.reason
    with pytest.raises(JournalCorruption, match="starts at seq 12 but the journal before"):
        chain.start_segment(tmp_path / "c", 12)


def test_an_accepted_gap_is_noted_and_the_chain_goes_on(tmp_path: Path) -> None:
    chain = SegmentChain(tmp_path, require_watermark=False, accept_gaps=True)
    chain.start_segment(tmp_path / "a", 0)
    chain.advance(5)
    chain.start_segment(tmp_path / "b", 9)
    assert [(g.first_missing, g.last_missing) for g in chain.gaps] == [(5, 8)]
    assert chain.next_seq == 9


def test_the_next_seq_only_rises(tmp_path: Path) -> None:
    chain = SegmentChain(tmp_path, require_watermark=False, accept_gaps=False)
    chain.start_segment(tmp_path / "a", 4)
    with pytest.raises(AssertionError):
        chain.advance(4)


# --- the record layer -------------------------------------------------------------------


def mapped(tmp_path: Path, data: bytes) -> mmap.mmap:
    """`data` in a file, mapped as the reader maps a segment."""
    path = tmp_path / "batch"
    path.write_bytes(data)
    with open(path, "rb") as file:
        return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)


def _frame(segment: mmap.mmap, from_seq: int) -> list[Framed]:
    """The records of the batch at the start of `segment`, framed from `from_seq`."""
    _magic, _crc, records_length, count, first_seq = BATCH_HEADER.unpack_from(segment)
    view = memoryview(segment)
    try:
        return frame_records(
            segment,
            view,
            BATCH_HEADER_SIZE,
            BATCH_HEADER_SIZE + records_length,
            first_seq,
            count,
            from_seq,
        )
    finally:
        view.release()


def test_records_below_from_seq_are_checked_but_not_framed(tmp_path: Path) -> None:
    requests = [Request(RecordKind.ENTRY, 3, i, PAYLOAD) for i in range(4)]
    batch = mapped(tmp_path, encode_batch(requests, 100))
    framed = _frame(batch, 102)
    assert [record.seq for record in journal_records(framed, memoryview(batch), tmp_path)] == [
        102,
        103,
    ]
    tally = ReplayTally()
    runs = ReplayRuns({3: 102}, tally)
    runs.add(framed, memoryview(batch))
    parts = runs.take()
    assert list(parts) == [3]
    replayed = parts[3]
    assert [(r.seq, r.entry_id, r.on_done) for r in replayed] == [(103, 3, None)]
    assert parts[3].last_seq == 103
    assert bytes(replayed[0].payload) == PAYLOAD
    assert (tally.records_scanned, tally.records_selected, tally.ledgers_selected) == (2, 1, {3})
    # replayed bodies are views of the mapping, not copies: it stays open while they live
    assert isinstance(replayed[0].bodies[0], memoryview)
    with pytest.raises(BufferError):
        batch.close()
    del parts, replayed
    batch.close()


def test_a_damaged_record_below_from_seq_is_still_damage(tmp_path: Path) -> None:
    requests = [Request(RecordKind.ENTRY, 3, i, PAYLOAD) for i in range(2)]
    data = bytearray(encode_batch(requests, 0))
    data[BATCH_HEADER_SIZE + RECORD_PREFIX_SIZE + 40] ^= 0x01  # the first record's payload
    batch = mapped(tmp_path, bytes(data))
    with pytest.raises(BatchDamage, match="record 0 at byte 24: body crc mismatch"):
        _frame(batch, 1)
    batch.close()


def test_the_prefix_crc_covers_the_body_crc_field(tmp_path: Path) -> None:
    # a body whose crc field and crc both change: the body checks, the prefix does not
    requests = [Request(RecordKind.ENTRY, 3, 0, PAYLOAD)]
    data = bytearray(encode_batch(requests, 0))
    other = Request(RecordKind.ENTRY, 3, 0, b"r" * len(PAYLOAD)).bodies[0]
    body_at = BATCH_HEADER_SIZE + RECORD_PREFIX_SIZE
    data[body_at : body_at + len(other)] = other
    batch = mapped(tmp_path, bytes(data))
    with pytest.raises(BatchDamage, match="prefix crc mismatch"):
        _frame(batch, 0)
    batch.close()
