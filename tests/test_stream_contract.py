"""The stream API exactly as issue 27 names it, under asyncio and trio, over TCP to
three `pora serve` processes with SQLite and with ZooKeeper metadata: create, open,
list; a writer rolling over while a subscriber follows; a second writer taking over
from another client; seal; delete."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anyio
import pytest
from cluster_process import pora_cluster_process
from event_loops import EVENT_LOOPS, Runner
from zookeeper_support import fresh_zk_url

import pora


@pytest.fixture(scope="module", params=["sqlite", "zk"])
def cluster_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("streams") / "cluster"
    url = fresh_zk_url(request) if request.param == "zk" else f"sqlite://{folder / 'meta.db'}"
    with pora_cluster_process(folder, nodes=3, metadata=url):
        yield url


async def the_stream_contract(url: str, name: str) -> None:
    async with pora.connect(url) as client, pora.connect(url) as other:
        stream = await client.create_stream(
            name,
            ensemble_size=3,
            write_quorum=3,
            ack_quorum=2,
            segment_bytes_max=64 << 10,
            segment_age_s_max=3600,
            retention_s=None,
            retention_bytes=None,
        )
        with pytest.raises(pora.StreamExists):
            await client.create_stream(name)
        assert name in [info.name async for info in client.list_streams()]

        acknowledged: list[tuple[pora.Position, bytes]] = []
        followed: list[tuple[pora.Position, bytes]] = []
        total = 300

        async def follow() -> None:
            async for position, payload in stream.subscribe(from_=None):
                followed.append((position, payload))
                if len(followed) == total:
                    return

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(follow)
            async with stream.open_writer() as writer:
                for k in range(0, 200, 2):
                    payloads = [b"%04d" % k + bytes(1000), b"%04d" % (k + 1) + bytes(1000)]
                    positions = await writer.append_many(payloads)
                    acknowledged.extend(zip(positions, payloads, strict=True))
                # another client takes over: this writer is fenced, nothing it
                # acknowledged is lost
                async with (await other.open_stream(name)).open_writer() as second:
                    with pytest.raises(pora.WriterFenced):
                        await writer.append(b"fenced")
                    for k in range(200, total):
                        payload = b"%04d" % k
                        acknowledged.append((await second.append(payload), payload))
        assert followed == acknowledged
        assert [item async for item in stream.read()] == acknowledged
        assert len((await stream.info()).segments) > 2

        # positions travel as text and as JSON
        position = acknowledged[150][0]
        assert pora.Position.parse(str(position)) == position
        assert pora.Position.from_dict(json.loads(json.dumps(position.to_dict()))) == position
        resumed = [item async for item in stream.read(from_=position)]
        assert resumed == acknowledged[150:]

        await stream.seal()
        with pytest.raises(pora.StreamSealed):
            async with stream.open_writer():
                pass
        await client.delete_stream(name)
        with pytest.raises(pora.NoSuchStream):
            await client.open_stream(name)


@pytest.mark.slow
@EVENT_LOOPS
def test_the_stream_api_as_documented(
    cluster_url: str,
    runner: Runner,
    request: pytest.FixtureRequest,
) -> None:
    name = "events-" + request.node.callspec.id.replace("[", "").replace("]", "")
    runner(lambda: the_stream_contract(cluster_url, name))
