"""A slow replica and the writer's memory (R8, R10; docs/replication.md "Bounds"):
a member that answers, but far slower than the others, must not make the writer
keep every entry the fast members already acknowledged. Past
`node_backlog_bytes_max` it is failed for the ledger and replaced, and the writer
goes on with no error."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from replication_support import FaultyChannel, LocalCluster, local_cluster

from pora.client.node_channel import AddAnswer, AddRequest, NodeChannel
from pora.client.replication.client import Client, connect
from pora.client.replication.config import ClientConfig
from pora.client.replication.core.entry_format import HEADER_BYTES
from pora.meta.records import EnsembleMember

ENTRY = 8 << 10
TASKS = 64
APPENDS_EACH = 40  # 64 x 40 x 8 KiB: 20 MiB written
BACKLOG_MAX = 1 << 20
CALL_MAX = 256 << 10


class HeldBack(FaultyChannel):
    """The cluster's channel, whose add calls are answered `delay_s` late while the
    node's address is in `slow`: a node that keeps up with nothing but is not dead
    (every call answered well within `node_timeout_s`)."""

    def __init__(self, cluster: LocalCluster, address: str, slow: set[str], delay_s: float) -> None:
        super().__init__(cluster, address)
        self._slow = slow
        self._delay_s = delay_s
        self.largest_call = 0

    async def add_entries_many(
        self, requests: Sequence[AddRequest], **options: Any
    ) -> list[AddAnswer]:
        if self.address in self._slow:
            size = sum(
                len(entry) - HEADER_BYTES for request in requests for _, entry in request.entries
            )
            self.largest_call = max(self.largest_call, size)
            await trio.sleep(self._delay_s)
        return await super().add_entries_many(requests, **options)


@asynccontextmanager
async def held_back_client(
    cluster: LocalCluster, slow: set[str], channels: dict[str, HeldBack], **config: Any
) -> AsyncIterator[Client]:
    @asynccontextmanager
    async def open_channel(address: str) -> AsyncIterator[NodeChannel]:
        await trio.lowlevel.checkpoint()
        channel = channels[address] = HeldBack(cluster, address, slow, delay_s=0.3)
        yield channel

    async with connect(cluster.store.url, ClientConfig(**config), open_channel=open_channel) as c:
        yield c


def queued_bytes(client: Client, member: EnsembleMember) -> int:
    """The payload bytes the client's node calls hold queued for `member` (the unit
    of the pending bytes)."""
    return client._node_calls.queued_bytes(member)


async def test_a_slow_member_is_replaced_before_its_backlog_outgrows_the_bound(
    tmp_path: Path,
) -> None:
    slow: set[str] = set()
    channels: dict[str, HeldBack] = {}
    async with (
        local_cluster(tmp_path, nodes=4) as cluster,
        held_back_client(
            cluster,
            slow,
            channels,
            node_backlog_bytes_max=BACKLOG_MAX,
            add_call_bytes_max=CALL_MAX,
            # the laggard stays out for the whole run, however slow the machine: it
            # must not come back (R9) before the test looks at the last ensemble
            node_quarantine_s=3600.0,
        ) as client,
    ):
        writer = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
        laggard = writer.metadata.ensembles[0].members[0]
        slow.add(laggard.address)
        # queued for the laggard, at most: the bound is checked against the pending
        # bytes as each batch is queued, and the pending bytes (at most one entry per
        # task here) may fall after that, as the fast members acknowledge
        worst = 0
        acknowledged: list[int] = []

        async def watch() -> None:
            nonlocal worst
            while True:
                worst = max(worst, queued_bytes(client, laggard))
                await trio.sleep(0.001)

        async def appender(task: int) -> None:
            for k in range(APPENDS_EACH):
                payload = bytes([task]) * (ENTRY - 4) + k.to_bytes(4, "big")
                acknowledged.append(await writer.append(payload))

        async with trio.open_nursery() as watching:
            watching.start_soon(watch)
            async with trio.open_nursery() as appenders:
                for task in range(TASKS):
                    appenders.start_soon(appender, task)
            watching.cancel_scope.cancel()

        # every append acknowledged, no error, while the laggard was left behind
        assert sorted(acknowledged) == list(range(TASKS * APPENDS_EACH))
        last = writer.metadata.ensembles[-1].members
        assert laggard not in last, f"the slow member was never replaced: {last}"
        assert worst <= BACKLOG_MAX + TASKS * ENTRY, f"{worst} bytes queued for the slow member"
        # a backlog goes out in calls of at most add_call_bytes_max
        assert channels[laggard.address].largest_call <= CALL_MAX
        await writer.close()
        assert writer.metadata.last_entry_id == TASKS * APPENDS_EACH - 1
