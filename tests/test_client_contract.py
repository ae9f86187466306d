"""The replicating client's public API exactly as applications use it (the names are a
contract), under asyncio and under trio, over TCP to a real `pora cluster` of three
`pora serve` processes registered in SQLite metadata and in ZooKeeper."""

from __future__ import annotations

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
    folder = tmp_path_factory.mktemp("contract") / "cluster"
    url = fresh_zk_url(request) if request.param == "zk" else f"sqlite://{folder / 'meta.db'}"
    with pora_cluster_process(folder, nodes=3, metadata=url):
        yield url


async def the_contract(url: str) -> None:
    async with pora.connect(url) as client:
        ledger = await client.create_ledger(
            ensemble_size=3,
            write_quorum=3,
            ack_quorum=2,
            password="pw",
            custom_metadata={"app": b"demo"},
        )
        assert isinstance(ledger.ledger_id, int)
        assert await ledger.append(b"payload") == 0
        assert await ledger.append_many([b"a", b"b"]) == [1, 2]
        assert ledger.last_add_confirmed == 2

        # a follower reads the open ledger as it grows, never past the LAC
        follower = await client.open_ledger(ledger.ledger_id, password="pw", recover=False)
        followed: list[tuple[int, bytes]] = []

        async def follow() -> None:
            async for entry_id, payload in follower.tail(from_entry_id=0):
                followed.append((entry_id, payload))

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(follow)
            assert await ledger.append(b"c") == 3
            await ledger.close()  # the tail ends at the close
        assert followed == [(0, b"payload"), (1, b"a"), (2, b"b"), (3, b"c")]

        reader = await client.open_ledger(ledger.ledger_id, password="pw")
        assert reader.last_entry_id == 3
        assert await reader.read(1) == b"a"
        assert [entry async for entry in reader.read_entries(0, 3)] == followed
        assert reader.metadata.custom == {"app": b"demo"}
        with pytest.raises(pora.Unauthorized):
            await client.open_ledger(ledger.ledger_id, password="not it")

        listed = [info.ledger_id async for info in client.list_ledgers()]
        assert ledger.ledger_id in listed
        await client.delete_ledger(ledger.ledger_id, password="pw")
        with pytest.raises(pora.NoSuchLedger):
            await client.open_ledger(ledger.ledger_id, password="pw")


@pytest.mark.slow
@EVENT_LOOPS
def test_the_public_api_as_documented(cluster_url: str, runner: Runner) -> None:
    runner(lambda: the_contract(cluster_url))
