"""`stream.extents()`: what `read` with the same arguments would read, per segment,
without reading it (the Spark reader plans its partitions on it): CLOSED segments
with their sizes, the OPEN one up to its LAC, `from_`/`to`/`as_of_commit` and a
removed start as `read` has them."""

from __future__ import annotations

from pathlib import Path

import pytest
from replication_support import local_cluster
from writer_support import client_on

import pora
from pora import Position, SegmentExtent

SMALL = 64 * 1024


async def test_extents_match_what_read_returns(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        assert await stream.extents() == []
        async with stream.begin() as txn:
            segment = await txn.open_segment()
            await segment.append_many([b"x" * 10] * 5)
        async with stream.open_writer() as writer:
            await writer.append_many([b"live0", b"live1"])
            live = await writer.append(b"live2")
            extents = await stream.extents()
            assert extents[0] == SegmentExtent(0, 0, 4, 5, 50)
            # the OPEN segment: up to the LAC its nodes know (trails the last append)
            assert extents[1].seq == live.segment and extents[1].segment_bytes is None
            read = [p async for p, _ in stream.read()]
            assert sum(e.entries for e in extents) == len(read)
        assert await stream.extents(as_of_commit=1) == [SegmentExtent(0, 0, 4, 5, 50)]
        assert await stream.extents(from_=Position(0, 2), to=Position(1, 1)) == [
            SegmentExtent(0, 2, 4, 5, 50),
            SegmentExtent(1, 0, 0, 3, 15),
        ]
        assert await stream.extents(from_="end") == []
        async with stream.open_writer() as writer:
            await writer.append(b"next")
        await stream.truncate(before=Position(2, 0))
        with pytest.raises(pora.EntriesTruncated):
            await stream.extents(from_=Position(0, 0))
        assert [e.seq for e in await stream.extents()] == [2]
        with pytest.raises(pora.InvalidArgument, match="past stream"):
            await stream.extents(as_of_commit=99)
