"""Which segments the trimmer may delete, and that it really deletes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from journal.format import RecordKind
from journal.reader import JournalScanner
from journal.request import Request
from journal.segment import SegmentInfo, SegmentWriter, list_segments
from journal.trim import delete_segments, trimmable_segments
from journal.watermark import JournalState, Watermark


def segments_at(*first_seqs: int) -> list[SegmentInfo]:
    return [SegmentInfo(Path(f"/j/{seq}.journal"), seq, 0) for seq in first_seqs]


@pytest.mark.parametrize(
    ("durable_before_seq", "trimmable_count"),
    [
        (0, 0),
        (99, 0),  # segment 0 holds seqs 0..99: seq 99 is not durable yet
        (100, 1),  # boundary: every record of segment 0 is below 100
        (101, 1),
        (250, 2),
        (10**9, 2),  # the last segment is never trimmed, however durable
    ],
)
def test_trimmable_segments_is_a_prefix_ending_before_the_last(
    durable_before_seq: int, trimmable_count: int
) -> None:
    segments = segments_at(0, 100, 250)
    assert trimmable_segments(segments, durable_before_seq) == segments[:trimmable_count]


def test_nothing_is_trimmable_in_a_journal_of_one_or_no_segment() -> None:
    assert trimmable_segments(segments_at(0), 10**9) == []
    assert trimmable_segments([], 10**9) == []


def test_an_empty_segment_is_trimmable_once_the_records_before_it_are() -> None:
    # the first segment 100 holds no record: the next one starts at the same seq
    segments = segments_at(0, 100, 100, 300)
    assert trimmable_segments(segments, 99) == []
    assert trimmable_segments(segments, 100) == segments[:2]
    assert trimmable_segments(segments, 300) == segments[:3]


def test_unsorted_segments_are_refused() -> None:
    with pytest.raises(ValueError, match="out of order"):
        trimmable_segments(segments_at(100, 0, 200), 1000)


def test_delete_segments_removes_the_files_and_counts_their_bytes(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, segment_bytes=1024, first_seq=0)
    for seq in range(5):  # one batch per segment
        writer.write_batch([Request(RecordKind.ENTRY, 1, seq, b"z" * 100)], seq)
        writer.sync()
    writer.close()
    segments = list_segments(tmp_path)
    assert len(segments) == 5
    victims = trimmable_segments(segments, 3)
    assert [s.first_seq for s in victims] == [0, 1, 2]
    holding = Watermark(JournalState.HOLDING, 3)
    assert delete_segments(tmp_path, victims, watermark=holding) == 3 * 1024
    assert list_segments(tmp_path) == segments[3:]
    # what is left is still a readable journal: trimming from the front leaves no hole
    records = [r for batch in JournalScanner(tmp_path).batches() for r in batch]
    assert [r.seq for r in records] == [3, 4]
    # deleting again (a trim that crashed after unlinking) frees nothing more
    assert delete_segments(tmp_path, victims, watermark=holding) == 0
