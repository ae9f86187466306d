"""A commit that replaces the stream's contents (`txn.commit(replace=True)`, what a
Spark job's `mode("overwrite")` stands on): every segment visible before leaves in the
same compare-and-set as the commit's segments arrive, their ledgers are deleted after,
and a live writer's OPEN segment makes it refuse with WriterActive."""

from __future__ import annotations

from pathlib import Path

import pytest
from replication_support import local_cluster
from writer_support import client_on

import pora
import pora.streams.document
from pora import Position
from pora.streams.stream import Stream

SMALL = 64 * 1024


async def payloads(stream: Stream) -> list[bytes]:
    return [payload async for _, payload in stream.read()]


async def test_replace_leaves_only_the_commit_and_deletes_the_old_ledgers(
    tmp_path: Path,
) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        async with stream.open_writer() as writer:
            await writer.append(b"live")
        async with stream.begin() as txn:
            await (await txn.open_segment()).append(b"old txn")
        old = [s.ledger_id for s in (await stream.info()).segments]
        assert await payloads(stream) == [b"live", b"old txn"]
        txn = stream.begin()
        await txn.begin()
        await (await txn.open_segment()).append_many([b"new 0", b"new 1"])
        before = (await stream.info()).commit
        assert await txn.commit(replace=True) == before + 1
        assert await payloads(stream) == [b"new 0", b"new 1"]
        info = await stream.info()
        assert [s.seq for s in info.segments] == [2]
        assert info.first_held == Position(2, 0)
        for ledger_id in old:
            with pytest.raises(pora.NoSuchLedger):
                await client.open_ledger(ledger_id, recover=False)
        with pytest.raises(pora.EntriesTruncated):
            _ = [item async for item in stream.read(from_=Position(0, 0))]
        # the writer goes on after the replaced contents
        async with stream.open_writer() as writer:
            assert await writer.append(b"after") == Position(3, 0)
        assert await payloads(stream) == [b"new 0", b"new 1", b"after"]


async def test_replace_of_an_empty_stream_is_a_commit(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        async with stream.begin() as txn:
            await (await txn.open_segment()).append(b"only")
            await txn.commit(replace=True)
        assert await payloads(stream) == [b"only"]


async def test_replace_is_refused_while_a_writer_holds_an_open_segment(
    tmp_path: Path,
) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        async with stream.open_writer() as writer:
            await writer.append(b"live")
            txn = stream.begin()
            await txn.begin()
            await (await txn.open_segment()).append(b"new")
            with pytest.raises(pora.WriterActive, match="close the writer"):
                await txn.commit(replace=True)
            assert [p for p in await payloads(stream) if p != b"live"] == []
        # still pending: once the writer closed, the same commit replaces
        await txn.commit(replace=True)
        assert await payloads(stream) == [b"new"]


async def test_replace_removes_the_paged_segments_and_their_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a head of at most 4 segments and pages of 3, a stream of some 12 segments
    keeps most in pages: a replacing commit removes them all, pages included."""
    monkeypatch.setattr(pora.streams.document, "HEAD_SEGMENTS_MAX", 4)
    monkeypatch.setattr(pora.streams.document, "PAGE_SEGMENTS", 3)
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("paged", segment_bytes_max=SMALL)
        async with stream.open_writer() as writer:  # rolled over into some 12 segments
            for k in range(400):
                await writer.append(b"%04d" % k + bytes(2000))
        info = await stream.info()
        assert info.pages
        old = {ledger.ledger_id async for ledger in client.list_ledgers()}
        async with stream.begin() as txn:
            await (await txn.open_segment()).append(b"new")
            await txn.commit(replace=True)
        assert await payloads(stream) == [b"new"]
        info = await stream.info()
        assert info.pages == () and len(info.segments) == 1
        assert await client.store.list_documents("stream-pages") == []
        left = {ledger.ledger_id async for ledger in client.list_ledgers()}
        assert left == {info.segments[0].ledger_id}
        assert not old & left
