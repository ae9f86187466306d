"""A node's draining mark (docs/rereplication.md, A14) as both backends list it: the
node stays listed, marked, and is left out of the writable ones placement takes."""

from __future__ import annotations

from pathlib import Path

import pytest
from zookeeper_support import fresh_zk_url

from pora.cluster_ops.inventory import mark_draining, unmark_draining
from pora.meta import NodeRegistration, open_metadata


@pytest.fixture(params=["sqlite", "zk"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "zk":
        return fresh_zk_url(request)
    return f"sqlite:///{tmp_path}/meta.db"


async def test_a_draining_node_is_listed_marked_and_not_writable(store_url: str) -> None:
    async with open_metadata(store_url) as store:
        for address in ("127.0.0.1:4001", "[::1]:4002"):
            await store.register_node(NodeRegistration(address, f"i-{address}"), 30.0)
        assert {n.address for n in await store.list_nodes(writable_only=True)} == {
            "127.0.0.1:4001", "[::1]:4002",
        }  # fmt: skip
        await mark_draining(store, "[::1]:4002", "test", 0)
        await mark_draining(store, "[::1]:4002", "test", 0)  # marked once
        listed = {n.address: n.draining for n in await store.list_nodes()}
        assert listed == {"127.0.0.1:4001": False, "[::1]:4002": True}
        writable = [n.address for n in await store.list_nodes(writable_only=True)]
        assert writable == ["127.0.0.1:4001"]
        assert await unmark_draining(store, "[::1]:4002")
        assert not await unmark_draining(store, "[::1]:4002")
        assert len(await store.list_nodes(writable_only=True)) == 2
