"""`NodePool`: one channel per address however many tasks ask at once, each held by a
task of its own, all closed with the pool."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
import trio
import trio.testing
from replication_support import local_cluster

from netio.errors import ConnectionLost
from pora.client.node_channel import NodeChannel
from pora.client.node_pool import NodePool
from pora.client.replication.errors import ClientClosed


async def test_one_channel_per_address_opened_once_and_closed_with_the_pool(
    tmp_path: Path,
) -> None:
    opened: list[str] = []
    closed: list[str] = []
    async with local_cluster(tmp_path, nodes=2) as cluster:

        @asynccontextmanager
        async def open_channel(address: str) -> AsyncIterator[NodeChannel]:
            opened.append(address)
            await trio.sleep(0.01)  # two askers meet while the first one connects
            try:
                yield await cluster.channel_for(address)
            finally:
                closed.append(address)

        async with anyio.create_task_group() as tasks:
            pool = NodePool(tasks, open_channel, closed_error=lambda what: ClientClosed(None, what))
            got: list[NodeChannel] = []

            async def ask(address: str) -> None:
                got.append(await pool.channel(address))

            async with trio.open_nursery() as askers:
                for _ in range(10):
                    for address in cluster.addresses:
                        askers.start_soon(ask, address)
            assert sorted(opened) == sorted(cluster.addresses)
            assert len({id(channel) for channel in got}) == 2
            assert pool.addresses == sorted(cluster.addresses)
            await pool.aclose()
            assert sorted(closed) == sorted(cluster.addresses)
            with pytest.raises(ClientClosed, match="the client was closed: it opens no channel"):
                await pool.channel(cluster.addresses[0])


async def test_a_channel_that_cannot_open_raises_to_its_caller_and_the_pool_goes_on(
    tmp_path: Path,
) -> None:
    async with local_cluster(tmp_path, nodes=1) as cluster, anyio.create_task_group() as tasks:

        @asynccontextmanager
        async def open_channel(address: str) -> AsyncIterator[NodeChannel]:
            yield await cluster.channel_for(address)

        pool = NodePool(tasks, open_channel)
        with pytest.raises(ConnectionLost):
            await pool.channel("127.0.0.1:1")  # no node there
        assert (await pool.channel(cluster.addresses[0])).address == cluster.addresses[0]
        await pool.aclose()
