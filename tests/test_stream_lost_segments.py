"""LOST segments (docs/streams.md, "Lost segments") on an in-process cluster: the
ledger of a stream's OPEN segment deleted with the client's `delete_ledger` (an
operator's call outside the stream). The next writer's takeover marks the segment
LOST and writes on after it; readers, subscribers and cursors reaching it get
`EntriesLost` with the first position after it, and read on from there."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
import trio
from replication_support import local_cluster
from writer_support import client_on

import pora
from pora import Position
from pora.cli._stream_views import segment_row
from pora.client.replication.client import Client
from pora.client.replication.writer import LedgerWriter
from pora.meta.errors import InvalidMetadata
from pora.streams.document import (
    Segment,
    SegmentState,
    StreamConfig,
    add_segment,
    checked_document,
    decode_document,
    encode_document,
    lose_segments,
    new_stream,
    roll,
    take_over,
)
from pora.streams.records import StreamRecord
from pora.streams.stream import Stream


async def read_all(stream: Stream, from_: Position | None = None) -> list[tuple[Position, bytes]]:
    return [item async for item in stream.read(from_=from_)]


async def rolled_and_stopped(client: Client, name: str) -> LedgerWriter:
    """Stream `name` as a writer leaves it that rolled over and stopped before closing
    its old segment's ledger: segment 0 (one entry, b"rolled away") CLOSED in the
    document but its ledger still open, segment 1 OPEN with one entry (b"kept").
    Returns segment 0's ledger writer."""
    record = StreamRecord(client.store, name)
    current = await record.read()
    current = await record.write(take_over(current.value), current.version)
    epoch = current.value.writer_epoch
    old = await client.create_ledger(3, 3, 2)
    current = await record.write(
        add_segment(current.value, epoch, old.ledger_id, 0), current.version
    )
    assert await old.append(b"rolled away") == 0
    new = await client.create_ledger(3, 3, 2)
    assert await new.append(b"kept") == 0
    rolled = roll(current.value, epoch, 0, len(b"rolled away"), new.ledger_id, 0)
    await record.write(rolled, current.version)
    return old


async def lose_open_segment(client: Client, stream: Stream) -> int:
    """Append to the stream's OPEN segment, delete its ledger under the writer (whose
    appends then fail), and return that segment's seq."""
    async with stream.open_writer() as writer:
        position = await writer.append(b"doomed")
        segment = (await stream.info()).segments[-1]
        assert segment.seq == position.segment and segment.state is SegmentState.OPEN
        await client.delete_ledger(segment.ledger_id)
        with pytest.raises(pora.LedgerDeleted):
            await writer.append(b"refused")
    return segment.seq


async def test_a_takeover_marks_the_deleted_open_segment_lost_and_writes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("cut")
        async with stream.open_writer() as writer:
            assert await writer.append_many([b"a", b"b"]) == [Position(0, 0), Position(0, 1)]
        lost = await lose_open_segment(client, stream)
        assert lost == 1
        with caplog.at_level(logging.WARNING, logger="pora.streams"):
            async with stream.open_writer() as writer:
                assert await writer.append(b"after") == Position(2, 0)
        assert "segment 1 is LOST" in caplog.text and "'cut'" in caplog.text

        segments = (await stream.info()).segments
        assert [(s.seq, s.state, s.lost) for s in segments] == [
            (0, SegmentState.CLOSED, False),
            (1, SegmentState.CLOSED, True),
            (2, SegmentState.CLOSED, False),
        ]
        assert (segments[1].last_entry_id, segments[1].byte_length) == (-1, 0)
        # the document as stored round-trips, and another client reads it so
        doc = (await StreamRecord(client.store, "cut").read()).value
        assert decode_document(encode_document(doc)) == doc
        assert b'"LOST"' in encode_document(doc)

        # a read from the start: what is before the lost segment, then the error
        seen: list[tuple[Position, bytes]] = []
        with pytest.raises(pora.EntriesLost) as raised:
            async for item in stream.read():
                seen.append(item)
        assert seen == [(Position(0, 0), b"a"), (Position(0, 1), b"b")]
        error = raised.value
        assert isinstance(error, pora.PoraError)
        assert (error.stream, error.segment, error.resume_at) == ("cut", 1, Position(2, 0))
        assert "segment 1 is LOST" in str(error) and "2:0" in str(error)
        # from inside the lost segment too (any entry of it), and its extents
        with pytest.raises(pora.EntriesLost):
            await read_all(stream, Position(1, 5))
        with pytest.raises(pora.EntriesLost):
            await stream.extents()
        # from resume_at: the new writer's entries; a reader after it never meets it
        assert await read_all(stream, error.resume_at) == [(Position(2, 0), b"after")]
        assert [e.seq for e in await stream.extents(from_=Position(2, 0))] == [2]


async def test_subscribers_and_cursors_stop_at_a_lost_segment(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("subs")
        cursor = await stream.cursor("billing")
        async with stream.open_writer() as writer:
            await writer.append(b"first")
        await lose_open_segment(client, stream)
        async with stream.open_writer() as writer:
            await writer.append(b"later")

        seen: list[tuple[Position, bytes]] = []
        with trio.fail_after(10), pytest.raises(pora.EntriesLost) as raised:
            async for item in stream.subscribe():
                seen.append(item)
        assert seen == [(Position(0, 0), b"first")]
        assert raised.value.resume_at == Position(2, 0)
        with trio.fail_after(10):
            async for item in stream.subscribe(from_=raised.value.resume_at):
                assert item == (Position(2, 0), b"later")
                break

        with pytest.raises(pora.EntriesLost) as raised:
            async for _ in cursor.read():
                pass
        assert raised.value.resume_at == Position(2, 0)
        # to go on, the cursor moves to resume_at, durably
        await cursor.move_to(raised.value.resume_at)
        await cursor.move_to(Position(1, 0))  # backwards: nothing changes
        assert await (await stream.cursor("billing")).position() == Position(2, 0)
        assert [item async for item in cursor.read()] == [(Position(2, 0), b"later")]


async def test_a_subscriber_on_the_open_segment_learns_it_was_lost(tmp_path: Path) -> None:
    """The live segment's ledger deleted under a subscriber that caught up: it gets
    EntriesLost at once (no takeover needed), and resumes after it."""
    async with (
        local_cluster(tmp_path) as cluster,
        client_on(cluster) as client,
        client_on(cluster) as other,
    ):
        stream = await client.create_stream("live")
        async with stream.open_writer() as writer:
            await writer.append(b"seen")
            subscription = stream.subscribe()
            assert await subscription.__anext__() == (Position(0, 0), b"seen")
            async with trio.open_nursery() as nursery:
                (segment,) = (await stream.info()).segments
                nursery.start_soon(other.delete_ledger, segment.ledger_id)
                with trio.fail_after(10), pytest.raises(pora.EntriesLost) as raised:
                    await subscription.__anext__()
            await subscription.aclose()  # type: ignore[attr-defined]
        assert raised.value.resume_at == Position(1, 0)


async def test_a_takeover_marks_a_deleted_never_closed_segment_lost_too(
    tmp_path: Path,
) -> None:
    """A writer that rolled over and stopped before closing its old segment's ledger,
    which is then deleted: the takeover finds that segment's ledger without a record
    and marks it LOST, recovers the OPEN one after it, and writes on."""
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("rolled")
        old = await rolled_and_stopped(client, "rolled")
        await client.delete_ledger(old.ledger_id)  # never closed: it stays OPEN till then

        async with stream.open_writer() as writer:
            assert await writer.append(b"after") == Position(2, 0)
        segments = (await stream.info()).segments
        assert [(s.lost, s.last_entry_id) for s in segments] == [(True, -1), (False, 0), (False, 0)]
        with pytest.raises(pora.EntriesLost) as raised:
            await read_all(stream)
        assert raised.value.resume_at == Position(1, 0)
        assert await read_all(stream, Position(1, 0)) == [
            (Position(1, 0), b"kept"),
            (Position(2, 0), b"after"),
        ]


async def test_a_seal_marks_the_deleted_open_segment_lost(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("sealed")
        await lose_open_segment(client, stream)
        await stream.seal()
        info = await stream.info()
        assert info.state.value == "SEALED"
        assert [(s.state, s.lost) for s in info.segments] == [(SegmentState.CLOSED, True)]
        with pytest.raises(pora.EntriesLost):
            await read_all(stream)
        with pytest.raises(pora.StreamSealed):
            async with stream.open_writer():
                pass


async def test_a_truncation_removes_a_lost_segment(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("trunc")
        await lose_open_segment(client, stream)
        async with stream.open_writer() as writer:
            await writer.append(b"kept")
        assert await stream.truncate(before=Position(1, 0)) == Position(1, 0)
        assert await read_all(stream) == [(Position(1, 0), b"kept")]


def test_stream_show_prints_a_lost_segment_as_lost() -> None:
    lost = Segment(1, 7, SegmentState.CLOSED, 2, 0, lost=True)
    row = segment_row(lost)
    assert (row["state"], row["entries"], row["bytes"]) == ("LOST", 0, 0)


def test_the_document_keeps_lost_segments_closed_and_empty() -> None:
    doc = add_segment(take_over(new_stream("doc", StreamConfig(), 0)), 1, ledger_id=7, now_ms=0)
    lost = lose_segments(doc, 1, (0,), now_ms=5)
    assert lost.writer_segment is None and lost.commit == doc.commit
    assert lost.segments[0] == Segment(0, 7, SegmentState.CLOSED, 1, 0, -1, 0, 5, lost=True)
    assert decode_document(encode_document(lost)) == lost
    assert lose_segments(lost, 1, (0, 9), now_ms=6) == lost  # LOST already, 9 not held
    for broken in (
        replace(lost.segments[0], last_entry_id=3),
        replace(lost.segments[0], byte_length=10),
    ):
        with pytest.raises(InvalidMetadata, match="LOST segment 0"):
            checked_document(replace(lost, segments=(broken,)))
    open_lost = replace(lost.segments[0], state=SegmentState.OPEN)  # the writer's OPEN one
    with pytest.raises(InvalidMetadata, match="LOST segment 0"):
        checked_document(replace(lost, segments=(open_lost,), writer_segment=0))
    # a row of an unknown state is refused, never read as an empty segment
    with pytest.raises(InvalidMetadata, match="malformed"):
        decode_document(encode_document(lost).replace(b'"LOST"', b'"GONE"'))
