"""Truncation and retention on an in-process cluster (SQLite metadata): whole segments
leave the document and their ledgers go; readers, subscribers and cursors asking for
what was removed get EntriesTruncated naming the first position held, never a silent
skip (also a reader racing a truncation of the segment it reads next); trim by age
and size spares what a cursor needs, except past the hard limits. The pure decisions
are tested beside them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from replication_support import local_cluster
from writer_support import client_on

import pora
import pora.streams.stream
from pora import Position
from pora.client.replication.client import Client
from pora.streams.document import (
    Segment,
    SegmentState,
    StreamChangeRefused,
    StreamConfig,
    add_segment,
    close_segment,
    decode_document,
    encode_document,
    new_stream,
    take_over,
    truncate,
)
from pora.streams.retention import trim_count, wholly_before
from pora.streams.stream import Stream

SMALL = 64 * 1024


async def three_segments(client: Client, name: str = "events", **config: object) -> Stream:
    """Segments 0, 1, 2 of entries 0..2 each ("s.e" payloads), all closed: each
    writer's block ends its segment."""
    stream = await client.create_stream(name, segment_bytes_max=SMALL, **config)  # type: ignore[arg-type]
    for seq in range(3):
        async with stream.open_writer() as writer:
            positions = await writer.append_many([b"%d.%d" % (seq, k) for k in range(3)])
        assert positions[0] == Position(seq, 0)
    return stream


async def payloads(stream: Stream, from_: Position | None = None) -> list[bytes]:
    return [payload async for _, payload in stream.read(from_=from_)]


async def test_truncate_removes_whole_segments_and_their_ledgers(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await three_segments(client)
        ledgers = [s.ledger_id for s in (await stream.info()).segments]
        # a position inside segment 1 removes segment 0 only
        assert await stream.truncate(before=Position(1, 1)) == Position(1, 0)
        assert await stream.truncate(before=Position(2, 0)) == Position(2, 0)
        # nothing more before it: the same answer, no change
        assert await stream.truncate(before=Position(2, 0)) == Position(2, 0)
        info = await stream.info()
        assert [s.seq for s in info.segments] == [2]
        assert info.first_held == Position(2, 0)
        for ledger_id in ledgers[:2]:
            with pytest.raises(pora.NoSuchLedger):
                await client.open_ledger(ledger_id)

        assert await payloads(stream) == [b"2.0", b"2.1", b"2.2"]
        # just past the last removed segment's end is the first held position
        assert await payloads(stream, Position(1, 3)) == [b"2.0", b"2.1", b"2.2"]
        for removed in [Position(0, 0), Position(1, 2)]:
            with pytest.raises(pora.EntriesTruncated, match="first position still held is 2:0"):
                await payloads(stream, removed)
            with pytest.raises(pora.EntriesTruncated) as raised:
                async for _ in stream.subscribe(from_=removed):
                    pass
            assert raised.value.first_held == Position(2, 0)
            assert raised.value.requested == removed

        with pytest.raises(pora.InvalidArgumentType, match=r"pora\.Position"):
            await stream.truncate(before="2:0")  # type: ignore[arg-type]


async def test_truncate_never_removes_the_open_segment(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await three_segments(client)
        async with stream.open_writer() as writer:
            await writer.append(b"3.0")
            assert await stream.truncate(before=Position(99, 0)) == Position(3, 0)
            assert await writer.append(b"3.1") == Position(3, 1)
        assert await payloads(stream) == [b"3.0", b"3.1"]


async def test_trims_while_a_writer_rolls_over_lose_nothing_held(tmp_path: Path) -> None:
    """Trims racing a writer's rollovers (both compare-and-set the document) and a
    cursor's acks: the writer's appends all land, the cursor's subscriber sees each
    once, in order (the cursor pins what it has not acked), and the stream keeps its
    newest segments."""
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("busy", segment_bytes_max=SMALL, retention_bytes=SMALL)
        cursor = await stream.cursor("tail")
        total = 300
        written: list[Position] = []
        seen: list[Position] = []

        async def follow() -> None:
            async for position, _ in cursor.subscribe():
                seen.append(position)
                await cursor.ack(position)
                if len(seen) == total:
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            async with stream.open_writer() as writer:
                for k in range(total):
                    written.append(await writer.append(b"%04d" % k + bytes(1000)))
                    if k % 25 == 0:
                        await stream.trim()
        assert seen == written
        first_held = await stream.trim()
        assert first_held > Position(0, 0)
        assert [p async for p, _ in stream.read()] == [p for p in written if p >= first_held]


async def test_a_subscriber_in_a_removed_segment_gets_entries_truncated(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await three_segments(client)
        subscriber = stream.subscribe()
        try:
            assert await anext(subscriber) == (Position(0, 0), b"0.0")
            await stream.truncate(before=Position(2, 0))
            # what it had read already may still come; then the error, never 2:0
            seen = []
            with pytest.raises(pora.EntriesTruncated) as raised:
                while True:
                    seen.append((await anext(subscriber))[0])
            assert all(position.segment == 0 for position in seen)
            assert raised.value.first_held == Position(2, 0)
        finally:
            await subscriber.aclose()  # type: ignore[attr-defined]
        # a subscriber that starts after the truncation starts at the first held
        after = stream.subscribe()
        try:
            assert await anext(after) == (Position(2, 0), b"2.0")
        finally:
            await after.aclose()  # type: ignore[attr-defined]


async def test_trim_by_size_and_age(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        # each segment holds 9 bytes: 10 bytes keep only the newest segment
        sized = await three_segments(client, "sized", retention_bytes=10)
        assert await sized.trim() == Position(2, 0)
        assert await payloads(sized) == [b"2.0", b"2.1", b"2.2"]

        aged = await three_segments(client, "aged", retention_s=3600)
        assert await aged.trim() == Position(0, 0)  # nothing is an hour old yet
        closed = [s.closed_ms for s in (await aged.info()).segments]
        assert all(ms > 0 for ms in closed)
        # the clock an hour past segment 1's close: segments 0 and 1 are that old
        monkeypatch.setattr(pora.streams.stream, "_now_ms", lambda: closed[1] + 3600_000)
        # (segment 2 closed in the same millisecond as 1 would be as old)
        expected = Position(2, 0) if closed[2] > closed[1] else Position(3, 0)
        assert await aged.trim() == expected
        assert (await aged.info()).segments[0].seq == expected.segment


async def test_a_cursor_pins_retention_until_the_hard_limit(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await three_segments(client, retention_bytes=10, retention_bytes_max=30)
        cursor = await stream.cursor("billing")
        assert await stream.trim() == Position(0, 0)  # the cursor needs everything
        await cursor.ack(Position(0, 1))
        assert await stream.trim() == Position(0, 0)  # it still needs 0:2
        await cursor.ack(Position(0, 2))
        assert await stream.trim() == Position(1, 0)  # segment 0 is done with
        assert [p async for p, _ in cursor.read()][:1] == [Position(1, 0)]

        # past the hard limit: segments 1..4 hold 36 bytes, over 30
        for seq in (3, 4):
            async with stream.open_writer() as writer:
                await writer.append_many([b"%d.%d" % (seq, k) for k in range(3)])
        assert await stream.trim() == Position(2, 0)  # 1 goes though the cursor needs it
        with pytest.raises(pora.EntriesTruncated, match="first position still held is 2:0") as e:
            [item async for item in cursor.read()]
        assert e.value.first_held == Position(2, 0)
        # acking the last removed entry moves the cursor to the first held position
        await cursor.ack(Position(1, 2))
        assert [p async for p, _ in cursor.read()][:1] == [Position(2, 0)]


def closed(seq: int, length: int, closed_ms: int) -> Segment:
    return Segment(seq, 100 + seq, SegmentState.CLOSED, seq + 1, 0, 2, length, closed_ms)


def test_trim_decisions() -> None:
    held = (closed(0, 10, 1000), closed(1, 10, 2000), closed(2, 10, 0))
    open_ = Segment(3, 103, SegmentState.OPEN, 4, 0)
    config = StreamConfig(retention_s=1, retention_bytes=15, retention_bytes_max=25)
    # by size: 30 bytes held, 15 allowed: two go (the OPEN one counts nothing)
    assert trim_count((*held, open_), config, 0, []) == 2
    # by age at 3 s: 0 and 1 closed over a second ago; 2's close time is unknown
    assert trim_count(held, StreamConfig(retention_s=1), 3000, []) == 2
    # a cursor reading next from 1:0 needs 1 onwards; one past 0's end does not need 0
    soft = StreamConfig(retention_bytes=15)
    assert trim_count(held, soft, 0, [Position(1, 0)]) == 1
    assert trim_count(held, soft, 0, [Position(0, 3)]) == 1
    assert trim_count(held, soft, 0, [Position(0, 2)]) == 0
    assert trim_count(held, soft, 0, [Position(2, 0), Position(0, 0)]) == 0
    # the hard limit (25 bytes) removes one whatever the cursor needs
    assert trim_count(held, config, 0, [Position(0, 0)]) == 1
    # the OPEN segment never goes
    assert wholly_before((*held, open_), Position(99, 0)) == 3
    assert trim_count((open_,), StreamConfig(retention_bytes=1), 0, []) == 0


async def test_truncation_drops_whole_pages_and_keeps_a_page_it_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a head of at most 4 segments and pages of 3, a truncation in the middle of
    the second page drops the first page's document, keeps the second (part of its
    segments still held), and reads begin at the first held segment."""
    monkeypatch.setattr(pora.streams.document, "HEAD_SEGMENTS_MAX", 4)
    monkeypatch.setattr(pora.streams.document, "PAGE_SEGMENTS", 3)
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("paged", segment_bytes_max=SMALL)
        async with stream.open_writer() as writer:  # some 12 segments, rolled over
            written = [await writer.append(b"%04d" % k + bytes(2000)) for k in range(400)]
        info = await stream.info()
        assert [(ref.first_seq, ref.last_seq) for ref in info.pages][:2] == [(0, 2), (3, 5)]
        assert await stream.truncate(before=Position(4, 0)) == Position(4, 0)
        info = await stream.info()
        assert info.pages[0].first_seq == 3
        pages = await client.store.list_documents("stream-pages")
        assert "paged/0" not in pages and "paged/3" in pages
        held = [position for position in written if position.segment >= 4]
        assert [position async for position, _ in stream.read()] == held
        with pytest.raises(pora.EntriesTruncated):
            await payloads(stream, Position(3, 0))
        subscriber = stream.subscribe()
        try:
            assert (await anext(subscriber))[0] == Position(4, 0)
        finally:
            await subscriber.aclose()  # type: ignore[attr-defined]


def test_the_truncate_change() -> None:
    doc = new_stream("events", StreamConfig(), 0)
    for seq in range(3):
        doc = add_segment(take_over(doc), seq + 1, 100 + seq, 0)
        doc = close_segment(doc, seq + 1, 2, 9, 1000 + seq)
    doc = add_segment(doc, 3, 103, 0)  # segment 3 OPEN
    with pytest.raises(StreamChangeRefused, match="leading segments"):
        truncate(doc, (doc.segments[1],))
    with pytest.raises(StreamChangeRefused, match="open segment"):
        truncate(doc, doc.segments)
    with pytest.raises(StreamChangeRefused, match="removes some"):
        truncate(doc, ())
    cut = truncate(doc, doc.segments[:2])
    assert (cut.first_held_seq, cut.removed_last_entry_id, cut.commit) == (2, 2, doc.commit + 1)
    assert cut.first_held == Position(2, 0)
    assert [s.seq for s in cut.segments] == [2, 3]
    assert cut.is_removed(Position(1, 2)) and cut.is_removed(Position(0, 9))
    assert not cut.is_removed(Position(1, 3)) and not cut.is_removed(Position(2, 0))
    assert decode_document(encode_document(cut)) == cut
    assert cut.segments[0].closed_ms == 1002
    # a document from before truncation and close times: nothing removed, none known
    old = json.loads(encode_document(doc))
    del old["truncation"], old["config"]["retention_s_max"], old["config"]["retention_bytes_max"]
    old["segments"] = [row[:7] for row in old["segments"]]
    decoded = decode_document(json.dumps(old).encode())
    assert decoded.first_held_seq == 0 and decoded.segments[0].closed_ms == 0


async def test_a_reader_whose_next_segment_is_removed_gets_entries_truncated(
    tmp_path: Path,
) -> None:
    """`read` crosses the segments of the document as of its call: a truncation
    racing it removes the next segment's ledger before the reader reaches it. What
    it had fetched may still come, then EntriesTruncated, never an entry past the gap
    (read it as an error to not mistake the next held entries for the next ones)."""
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await three_segments(client)
        reader = stream.read()
        try:
            assert await anext(reader) == (Position(0, 0), b"0.0")
            assert await stream.truncate(before=Position(2, 0)) == Position(2, 0)
            seen = []
            with pytest.raises(pora.EntriesTruncated) as raised:
                async for position, _ in reader:
                    seen.append(position)
            assert all(position.segment == 0 for position in seen)
            assert raised.value.first_held == Position(2, 0)
        finally:
            await reader.aclose()  # type: ignore[attr-defined]
