"""A replicating client on the in-process cluster (`replication_support`), and reads
of what each in-process node holds, for the writer's tests."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from replication_support import LocalCluster

from ledger.errors import NoSuchEntry, NoSuchLedger
from pora.client.channel import NodeChannel
from pora.client.replication.client import Client, connect
from pora.client.replication.config import ClientConfig
from pora.client.replication.entry_format import decode_entry


@asynccontextmanager
async def client_on(cluster: LocalCluster, **config: Any) -> AsyncIterator[Client]:
    """A client whose node channels are the cluster's in-process ones (with faults)."""

    @asynccontextmanager
    async def open_channel(address: str) -> AsyncIterator[NodeChannel]:
        yield await cluster.channel_for(address)

    async with connect(
        cluster.store.url,
        ClientConfig(**config),
        open_channel=open_channel,
        rng=random.Random(7),
    ) as client:
        yield client


async def payload_on(
    cluster: LocalCluster, address: str, ledger_id: int, entry_id: int
) -> bytes | None:
    """The application payload node `address` stores for the entry, or None."""
    try:
        data = await cluster.nodes[address].read_entry(ledger_id, entry_id)
    except (NoSuchEntry, NoSuchLedger):
        return None
    return decode_entry(ledger_id, entry_id, data).payload


async def holders(cluster: LocalCluster, ledger_id: int, entry_id: int) -> set[str]:
    """The addresses of the nodes that store the entry."""
    found = set()
    for address in list(cluster.nodes):
        if await payload_on(cluster, address, ledger_id, entry_id) is not None:
            found.add(address)
    return found
