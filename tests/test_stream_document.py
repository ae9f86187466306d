"""The stream document's pure changes: each returns a new document that keeps the
rules, refuses what does not apply, and survives encoding."""

from dataclasses import replace

import pytest
from depth import two_depths
from hypothesis import given, settings
from hypothesis import strategies as st

from pora import InvalidArgument, InvalidArgumentType
from pora.meta.errors import InvalidMetadata, MetadataRecordTooLarge
from pora.streams.document import (
    HEAD_SEGMENTS_MAX,
    PAGE_SEGMENTS,
    PageRef,
    Segment,
    SegmentPage,
    SegmentState,
    StreamChangeRefused,
    StreamConfig,
    StreamDocument,
    StreamState,
    add_segment,
    check_stream_name,
    close_segment,
    decode_document,
    decode_page,
    encode_document,
    encode_page,
    new_stream,
    page_out,
    roll,
    seal,
    take_over,
)

CONFIG = StreamConfig(segment_bytes_max=64 * 1024)


def round_trip(doc: StreamDocument) -> StreamDocument:
    again = decode_document(encode_document(doc))
    assert again == doc
    return again


def test_a_writers_life() -> None:
    doc = round_trip(new_stream("events", CONFIG, 1000))
    assert (doc.commit, doc.segments, doc.writer_epoch, doc.next_seq) == (0, (), 0, 0)
    doc = round_trip(take_over(doc))
    assert doc.writer_epoch == 1 and doc.commit == 0  # not a visible change
    doc = round_trip(add_segment(doc, 1, ledger_id=7, now_ms=2000))
    assert doc.commit == 1 and doc.writer_segment == 0
    assert doc.segments[0].state is SegmentState.OPEN and doc.segments[0].commit == 1
    doc = round_trip(roll(doc, 1, last_entry_id=41, byte_length=4200, next_ledger_id=9, now_ms=3))
    assert doc.commit == 2 and doc.writer_segment == 1
    first, second = doc.segments
    assert (first.state, first.last_entry_id, first.byte_length) == (SegmentState.CLOSED, 41, 4200)
    assert (second.seq, second.ledger_id, second.state, second.commit) == (
        1,
        9,
        SegmentState.OPEN,
        2,
    )
    doc = round_trip(take_over(doc))  # a second writer: the first's epoch is refused
    with pytest.raises(StreamChangeRefused, match="epoch 1"):
        close_segment(doc, 1, 3, 30)
    doc = round_trip(close_segment(doc, 2, -1, 0))  # recovered empty
    doc = round_trip(add_segment(doc, 2, 11, 4))
    doc = round_trip(close_segment(doc, 2, 0, 5))
    doc = round_trip(seal(doc))
    assert doc.state is StreamState.SEALED and doc.commit == 4
    assert seal(doc) == doc
    with pytest.raises(StreamChangeRefused, match="sealed"):
        take_over(doc)
    with pytest.raises(StreamChangeRefused, match="sealed"):
        add_segment(doc, 2, 12, 5)


def test_refused_changes() -> None:
    doc = add_segment(take_over(new_stream("s", CONFIG, 0)), 1, 5, 0)
    with pytest.raises(StreamChangeRefused, match="still open"):
        add_segment(doc, 1, 6, 0)
    with pytest.raises(StreamChangeRefused, match="close segment 0 before sealing"):
        seal(doc)
    closed = close_segment(doc, 1, 1, 10)
    with pytest.raises(StreamChangeRefused, match="no open segment"):
        close_segment(closed, 1, 1, 10)
    with pytest.raises(InvalidMetadata, match="bytes but no entries"):
        close_segment(doc, 1, -1, 10)


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "a b", "é", "x" * 129, "a\x00"])
def test_bad_names(name: str) -> None:
    with pytest.raises(InvalidArgument, match="stream name"):
        check_stream_name(name)


def test_good_names() -> None:
    for name in ["a", "A.b-c_d", "x" * 128, "-", "_x.", "0"]:
        assert check_stream_name(name) == name
    with pytest.raises(InvalidArgumentType):
        check_stream_name(b"abc")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"segment_bytes_max": 64 * 1024 - 1}, InvalidArgument, "64 KiB"),
        ({"segment_bytes_max": 1.5e6}, InvalidArgumentType, "segment_bytes_max"),
        ({"segment_age_s_max": 0}, InvalidArgument, "segment_age_s_max"),
        ({"segment_age_s_max": float("inf")}, InvalidArgument, "segment_age_s_max"),
        ({"segment_age_s_max": "1"}, InvalidArgumentType, "segment_age_s_max"),
        ({"retention_s": -1}, InvalidArgument, "retention_s"),
        ({"retention_bytes": 0}, InvalidArgument, "retention_bytes"),
        ({"retention_bytes": 1.0}, InvalidArgumentType, "retention_bytes"),
        ({"write_quorum": 4}, InvalidArgument, "E >= Qw"),
        ({"ack_quorum": True}, InvalidArgumentType, "ack_quorum"),
    ],
)
def test_bad_config(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        StreamConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda s: s.replace(b'"format_version":1', b'"format_version":2'), "newer Pora"),
        (lambda s: s.replace(b'"cursors":[]', b'"cursors":[1]'), "cursors"),
        (lambda s: s.replace(b'"next_seq":2', b'"next_seq":1'), "consecutive"),
        (lambda s: s.replace(b'"segment":1', b'"segment":0'), "open segments"),
        (lambda s: s.replace(b'"state":"ACTIVE"', b'"state":"GONE"'), "malformed"),
        (lambda s: s[:-1], "malformed"),
        (lambda s: s.replace(b'"commit":2', b'"commit":1'), "over 1"),
    ],
)
def test_decode_refuses(edit: object, match: str) -> None:
    doc = roll(add_segment(take_over(new_stream("s", CONFIG, 0)), 1, 5, 0), 1, 0, 1, 6, 0)
    data = edit(encode_document(doc))  # type: ignore[operator]
    with pytest.raises(InvalidMetadata, match=match):
        decode_document(data)


def test_a_document_over_a_record_is_refused() -> None:
    segments = tuple(
        Segment(seq, seq, SegmentState.CLOSED, seq + 1, 1_700_000_000_000, 10**6, 1 << 30)
        for seq in range(30_000)
    )
    doc = replace(new_stream("big", CONFIG, 0), segments=segments, next_seq=30_000, commit=30_000)
    with pytest.raises(MetadataRecordTooLarge, match="stream document 'big'"):
        encode_document(doc)


def closed_segments(first: int, count: int) -> tuple[Segment, ...]:
    return tuple(
        Segment(seq, 10**12 + seq, SegmentState.CLOSED, seq + 1, 1_700_000_000_000, 10**6, 1 << 30)
        for seq in range(first, first + count)
    )


def test_paging_out_keeps_the_head_small() -> None:
    doc = take_over(new_stream("paged", CONFIG, 0))
    for ledger_id in range(7):
        doc = (
            roll(doc, 1, 0, 1, ledger_id, 0)
            if doc.writer_segment is not None
            else add_segment(doc, 1, ledger_id, 0)
        )
    assert page_out(doc, head_segments_max=7, page_segments=3) is None
    doc = roll(doc, 1, 0, 1, 99, 0)  # 8 segments, the last OPEN
    split = page_out(doc, head_segments_max=7, page_segments=3)
    assert split is not None
    page, head = split
    assert [s.seq for s in page.segments] == [0, 1, 2] and page.name == "paged/0"
    assert head.pages == (PageRef(0, 2),) and head.head_first_seq == 3 and head.first_seq == 0
    assert round_trip(head) == head
    assert decode_page(encode_page(page)) == page
    with pytest.raises(InvalidMetadata, match="does not start where the pages end"):
        decode_document(encode_document(replace(head, pages=(PageRef(0, 1),))))


def test_a_hundred_thousand_segments_fit() -> None:
    """Issue 27: 100,000 segments. The head keeps HEAD_SEGMENTS_MAX of them and one
    reference per page; each page stays far below a record too."""
    pages = tuple(
        PageRef(first, first + PAGE_SEGMENTS - 1) for first in range(0, 100_000, PAGE_SEGMENTS)
    )
    head = replace(
        new_stream("huge", CONFIG, 0),
        segments=closed_segments(100_000, HEAD_SEGMENTS_MAX),
        next_seq=100_000 + HEAD_SEGMENTS_MAX,
        commit=200_000,
        pages=pages,
    )
    assert len(encode_document(head)) < 200_000
    page = SegmentPage("huge", closed_segments(99_500, PAGE_SEGMENTS))
    assert len(encode_page(page)) < 100_000


@two_depths(full=300)
def test_any_sequence_of_changes_keeps_the_rules(examples: int) -> None:
    """Writers taking over, adding, rolling, closing, paging out and sealing in any
    order: each change either is refused (StreamChangeRefused, the document as it
    was) or gives a document that round-trips; segments never change once CLOSED,
    sequence numbers and commits only grow, and a stale epoch changes nothing."""
    operations = st.lists(
        st.tuples(
            st.sampled_from(["take_over", "add", "roll", "close", "page", "seal"]),
            st.integers(min_value=-1, max_value=2),  # epoch offset: stale, current, future
            st.integers(min_value=-1, max_value=50),  # last entry
        ),
        max_size=60,
    )

    @settings(max_examples=examples, deadline=None)
    @given(operations)
    def check(steps: list[tuple[str, int, int]]) -> None:
        doc = new_stream("prop", CONFIG, 0)
        closed: dict[int, Segment] = {}
        ledger_ids = iter(range(10**6))
        for operation, offset, last in steps:
            epoch = doc.writer_epoch + offset
            length = 0 if last < 0 else last + 1
            before = doc
            try:
                if operation == "take_over":
                    doc = take_over(doc)
                elif operation == "add":
                    doc = add_segment(doc, epoch, next(ledger_ids), 0)
                elif operation == "roll":
                    doc = roll(doc, epoch, last, length, next(ledger_ids), 0)
                elif operation == "close":
                    doc = close_segment(doc, epoch, last, length)
                elif operation == "page":
                    doc = (page_out(doc, head_segments_max=3, page_segments=2) or (None, doc))[1]
                else:
                    doc = seal(doc)
            except StreamChangeRefused:
                assert doc == before
                continue
            if operation in ("add", "roll", "close"):
                assert epoch == before.writer_epoch  # only the current writer changes them
            assert round_trip(doc) == doc
            assert doc.next_seq >= before.next_seq and doc.commit >= before.commit
            assert doc.first_seq == 0
            for segment in doc.segments:
                if segment.seq in closed:
                    assert closed[segment.seq] == segment
                elif segment.state is SegmentState.CLOSED:
                    closed[segment.seq] = segment
            if doc.pages:
                assert doc.pages[-1].last_seq + 1 == doc.head_first_seq

    check()
