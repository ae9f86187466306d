"""Cursors on an in-process cluster (SQLite metadata): created at the first held
position, read from just after what was acked, moved forward only, durable across
clients, listed, deleted, and gone with their stream."""

from __future__ import annotations

from pathlib import Path

import pytest
from replication_support import local_cluster
from writer_support import client_on

import pora
from pora import Position
from pora.client.replication.client import Client
from pora.streams.cursors import CursorState, ack_forward, decode_cursor, encode_cursor
from pora.streams.stream import Stream

SMALL = 64 * 1024


async def written(client: Client, name: str = "events") -> Stream:
    """Two closed segments of entries 0..2 each, payloads "s.e"."""
    stream = await client.create_stream(name, segment_bytes_max=SMALL)
    for seq in range(2):
        async with stream.open_writer() as writer:
            await writer.append_many([b"%d.%d" % (seq, k) for k in range(3)])
    return stream


async def test_ack_moves_forward_only_and_survives_a_new_client(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster:
        async with client_on(cluster) as client:
            stream = await written(client)
            cursor = await stream.cursor("billing")
            read = [item async for item in cursor.read()]
            assert [payload for _, payload in read] == [
                b"0.0",
                b"0.1",
                b"0.2",
                b"1.0",
                b"1.1",
                b"1.2",
            ]
            await cursor.ack(read[3][0])  # 1:0 done
            assert await cursor.position() == Position(1, 1)
            await cursor.ack(Position(0, 1))  # older: ignored, not an error
            await cursor.ack(Position(1, 0))  # the same: ignored
            assert await cursor.position() == Position(1, 1)
            assert [p async for p, _ in cursor.read()] == [Position(1, 1), Position(1, 2)]
            with pytest.raises(pora.InvalidArgumentType, match=r"pora\.Position"):
                await cursor.ack("1:1")  # type: ignore[arg-type]
        async with client_on(cluster) as restarted:
            again = await (await restarted.open_stream("events")).cursor("billing")
            assert await again.position() == Position(1, 1)
            assert [payload async for _, payload in again.read()] == [b"1.1", b"1.2"]


async def test_a_cursor_follows_live_appends(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await written(client)
        cursor = await stream.cursor("live")
        await cursor.ack(Position(1, 2))
        following = cursor.subscribe()
        try:
            async with stream.open_writer() as writer:
                position = await writer.append(b"2.0")
                assert await anext(following) == (position, b"2.0")
        finally:
            await following.aclose()


async def test_list_and_delete_cursors(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await written(client)
        other = await written(client, "events2")  # its cursors are not this stream's
        await other.cursor("x")
        billing = await stream.cursor("billing")
        audit = await stream.cursor("audit")
        await billing.ack(Position(0, 0))
        assert [(c.name, c.next_position) for c in await stream.cursors()] == [
            ("audit", Position(0, 0)),
            ("billing", Position(0, 1)),
        ]
        await audit.delete()
        assert [c.name for c in await stream.cursors()] == ["billing"]
        with pytest.raises(pora.NoSuchCursor, match="no cursor 'audit'"):
            await audit.ack(Position(1, 0))
        with pytest.raises(pora.NoSuchCursor):
            await audit.delete()
        with pytest.raises(pora.InvalidArgument, match="'a/b' is not a cursor name: use 1 to"):
            await stream.cursor("a/b")  # (a Spark query's option "cursor" lands here)
        await client.delete_stream("events")
        assert [c.name for c in await other.cursors()] == ["x"]
        # the stream's cursors went with it
        recreated = await written(client)
        assert await recreated.cursors() == []
        await client.delete_stream("events2")
        with pytest.raises(pora.NoSuchStream):
            await other.cursor("y")


async def test_a_new_cursor_starts_at_the_first_held_position(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await written(client)
        await stream.truncate(before=Position(1, 0))
        cursor = await stream.cursor("late")
        assert await cursor.position() == Position(1, 0)
        assert [p async for p, _ in cursor.read()][:1] == [Position(1, 0)]


def test_cursor_state_round_trips_and_acks_forward() -> None:
    state = CursorState("events", "billing", Position(3, 7), 1234)
    assert decode_cursor(encode_cursor(state)) == state
    assert ack_forward(state, Position(3, 6)) is None
    assert ack_forward(state, Position(2, 100)) is None
    assert ack_forward(state, Position(3, 7)) == CursorState(
        "events", "billing", Position(3, 8), 1234
    )
    with pytest.raises(pora.InvalidMetadata, match="malformed"):
        decode_cursor(b'{"format_version":1}')
    with pytest.raises(pora.InvalidMetadata, match="newer Pora"):
        decode_cursor(encode_cursor(state).replace(b'"format_version":1', b'"format_version":2'))
