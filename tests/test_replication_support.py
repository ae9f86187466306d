"""The in-process cluster harness does what the replicating client's tests rely on:
nodes registered with their instance ids, channels that reach them, and faults."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from replication_support import Fault, local_cluster

from netio.errors import ConnectionLost
from pora.client.replication.config import ClientConfig


async def test_nodes_are_registered_and_reachable_and_faults_apply(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, nodes=3, racks=["a", "b", None]) as cluster:
        registered = {n.address: n for n in await cluster.store.list_nodes(writable_only=True)}
        assert sorted(registered) == cluster.addresses
        first = cluster.addresses[0]
        assert registered[first].rack == "a"
        channel = await cluster.channel_for(first)
        identity = await channel.identity()
        assert identity.instance_id == registered[first].instance_id
        outcomes = await channel.add_entries(7, [(0, b"x")], master_key=b"k", last_add_confirmed=-1)
        assert outcomes == [None]
        assert (await channel.read_entry(7, 0))[0] == b"x"

        cluster.set_fault(first, Fault.FAIL)
        with pytest.raises(ConnectionLost):
            await channel.read_entry(7, 0)
        cluster.set_fault(first, Fault.HANG)
        with trio.move_on_after(0.05) as hung:
            await channel.read_entry(7, 0)
        assert hung.cancelled_caught
        cluster.set_fault(first, Fault.NONE)
        assert (await channel.read_entry(7, 0))[0] == b"x"

        await cluster.replace_data_dir(first)
        fresh = await channel.identity()
        assert fresh.instance_id != identity.instance_id
        registered = {n.address: n for n in await cluster.store.list_nodes()}
        assert registered[first].instance_id == fresh.instance_id


def test_client_config_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="node_timeout_s"):
        ClientConfig(node_timeout_s=0)
    with pytest.raises(ValueError, match="pending_bytes_max"):
        ClientConfig(pending_bytes_max=0)
