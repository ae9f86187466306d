"""Cursors, truncation and retention through the public API as issue 27 names it,
over TCP to three `pora serve` processes, with SQLite and with ZooKeeper metadata
(the cursors' own documents, names with a '/', and the truncation fields in each
store), under asyncio and trio."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cluster_process import pora_cluster_process
from event_loops import EVENT_LOOPS, Runner
from zookeeper_support import fresh_zk_url

import pora


@pytest.fixture(scope="module", params=["sqlite", "zk"])
def cluster_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("cursors") / "cluster"
    url = fresh_zk_url(request) if request.param == "zk" else f"sqlite://{folder / 'meta.db'}"
    with pora_cluster_process(folder, nodes=3, metadata=url):
        yield url


async def the_cursor_contract(url: str, name: str) -> None:
    async with pora.connect(url) as client:
        stream = await client.create_stream(
            name, segment_bytes_max=64 << 10, retention_bytes=10, retention_bytes_max=30
        )
        for seq in range(3):  # segments 0..2 of 3 entries, 9 bytes each
            async with stream.open_writer() as writer:
                await writer.append_many([b"%d.%d" % (seq, k) for k in range(3)])
        cursor = await stream.cursor("billing")
        assert await stream.trim() == pora.Position(0, 0)  # the cursor pins it all
        read = [position async for position, _ in cursor.read()]
        assert len(read) == 9
        await cursor.ack(read[2])  # segment 0 done
        await cursor.ack(read[0])  # older: ignored
        assert await stream.trim() == pora.Position(1, 0)

    async with pora.connect(url) as restarted:  # a new client sees the acked position
        stream = await restarted.open_stream(name)
        cursor = await stream.cursor("billing")
        assert await cursor.position() == pora.Position(0, 3)
        assert [c.name for c in await stream.cursors()] == ["billing"]
        assert [p async for p, _ in cursor.read()][:1] == [pora.Position(1, 0)]
        # truncation ignores cursors: the cursor's next read says what it lost
        assert await stream.truncate(before=pora.Position(2, 0)) == pora.Position(2, 0)
        with pytest.raises(pora.EntriesTruncated) as raised:
            [item async for item in cursor.read()]
        assert raised.value.first_held == pora.Position(2, 0)
        with pytest.raises(pora.EntriesTruncated):
            [item async for item in stream.read(from_=pora.Position(1, 0))]
        await cursor.delete()
        assert await stream.cursors() == []
        await restarted.delete_stream(name)


@pytest.mark.slow
@EVENT_LOOPS
def test_cursors_and_retention_as_documented(
    cluster_url: str,
    runner: Runner,
    request: pytest.FixtureRequest,
) -> None:
    name = "events-" + request.node.callspec.id.replace("[", "").replace("]", "")
    runner(lambda: the_cursor_contract(cluster_url, name))
