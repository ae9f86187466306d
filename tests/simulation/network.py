"""A simulated network between clients and the simulation's nodes.

Every client reaches a node the way `pora.connect` does, through the real wire: the
per-node client (`connect_node`, `TcpChannel`), netio's frames, and the node's
server (`Server.serve_connection`: its reader, executor and writer), over an
in-memory connection (wire.py) instead of a socket. Each segment written on a
connection arrives after a seeded delay, in order; one may be lost (the
connection is then reset, at once or after a while, and the client's requests on
it fail with `ConnectionLost` or time out); a partition or a paused client holds
the link's segments until it is mended (a connect meanwhile fails). Each (client,
node) link has its own `Random`, seeded from the simulation's seed and the link's
names: what one link draws does not depend on how other links' segments interleave.

With `SimTime` keeping the clock still while a disk thread works, when a segment
arrives depends on the seed alone.

    network = SimNetwork(cluster, seed=7)
    opener = network.opener("writer", config)    # a ChannelOpener for pora.connect
    network.partition("writer", address)         # cut one link ...
    network.heal("writer", address)              # ... and mend it
    network.pause("writer")                      # hold its messages (SIGSTOP) ...
    network.resume("writer")                     # ... and let them go (SIGCONT)
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio.abc
import trio

from netio.errors import ConnectionLost
from pora.client.node_channel import (
    AddAnswer,
    AddRequest,
    NodeChannel,
    NodeIdentity,
    RangeAnswer,
)
from pora.client.node_client import connect_node
from pora.client.node_pool import ChannelOpener
from pora.client.replication.config import ClientConfig
from pora.client.tcp_channel import TcpChannel
from simulation.cluster import SimCluster
from simulation.history import History
from simulation.wire import SimConnection


@dataclass
class LinkFaults:
    """How the network treats messages (all of them, or one node's)."""

    #: each segment is lost with this probability (its connection reset)
    drop_rate: float = 0.0
    #: one-way delay, uniform in [delay_min_s, delay_max_s], times `slowdown`
    delay_min_s: float = 0.0002
    delay_max_s: float = 0.004
    slowdown: dict[str, float] = field(default_factory=dict)


class SimNetwork:
    def __init__(
        self,
        cluster: SimCluster,
        seed: int,
        faults: LinkFaults | None = None,
        history: History | None = None,
    ) -> None:
        self.cluster = cluster
        self.history = history
        self.seed = seed
        self.faults = faults or LinkFaults()
        #: (client, node address) pairs that cannot talk
        self.cut: set[tuple[str, str]] = set()
        #: links whose adds fail (the node takes reads, fencing, everything else)
        self.adds_cut: set[tuple[str, str]] = set()
        self._links: dict[tuple[str, str], random.Random] = {}
        #: clients whose messages wait (a stopped process: SIGSTOP), and the event
        #: that lets them go
        self._paused: dict[str, trio.Event] = {}
        #: segments delivered to each node (the scenarios' sanity checks)
        self.delivered: dict[str, int] = {}
        self.dropped = 0
        #: the readers of held links, woken when a fault comes or goes
        self._watchers: set[Callable[[], None]] = set()

    def _changed(self) -> None:
        for wake in list(self._watchers):
            wake()

    def partition(self, client: str, address: str) -> None:
        self.cut.add((client, address))
        self._changed()

    def heal(self, client: str, address: str) -> None:
        self.cut.discard((client, address))
        self._changed()

    def cut_adds(self, client: str, address: str) -> None:
        """`client`'s adds to `address` are lost on the way; its other requests pass
        (a member a recovery can fence and read but not re-add to, R20)."""
        self.adds_cut.add((client, address))

    def mend_adds(self, client: str, address: str) -> None:
        self.adds_cut.discard((client, address))

    def pause(self, client: str) -> None:
        """Hold every message to and from `client` until `resume` (as a process
        stopped with SIGSTOP: nothing it sent is lost, nothing reaches it)."""
        self._paused.setdefault(client, trio.Event())
        self._changed()

    def resume(self, client: str) -> None:
        held = self._paused.pop(client, None)
        if held is not None:
            held.set()
        self._changed()

    def heal_all(self) -> None:
        for client in list(self._paused):
            self.resume(client)
        self.cut.clear()
        self.adds_cut.clear()
        self.faults.drop_rate = 0.0
        self.faults.slowdown.clear()
        self._changed()

    def link(self, client: str, address: str) -> random.Random:
        key = (client, address)
        generator = self._links.get(key)
        if generator is None:
            generator = self._links[key] = random.Random(f"{self.seed}/{client}/{address}")
        return generator

    def holds(self, client: str, address: str) -> bool:
        return client in self._paused or (client, address) in self.cut

    def opener(self, client: str, config: ClientConfig) -> ChannelOpener:
        """What `pora.connect(open_channel=...)` takes: channels from `client`, each a
        `TcpChannel` over `connect_node` with the timeouts `tcp_channels` gives it,
        connecting over this network."""

        @asynccontextmanager
        async def open_channel(address: str) -> AsyncIterator[NodeChannel]:
            async with connect_node(
                address,
                timeout_s=config.node_timeout_s,
                connect_timeout_s=config.connect_timeout_s,
                open_stream=lambda address: self._connect(client, address),
            ) as node_client:
                yield SimChannel(self, client, TcpChannel(node_client))

        return open_channel

    async def _connect(self, client: str, address: str) -> anyio.abc.ByteStream:
        """A connect over the link: refused (a node down, a partition) or hanging
        until the client's connect timeout, as the link's `Random` decides."""
        rules = _Link(self, client, address)
        await trio.sleep(2 * rules.delay_s())
        while client in self._paused:
            await self._paused[client].wait()
        if (client, address) in self.cut:
            if self.link(client, address).random() < 0.5:
                await trio.sleep_forever()
            raise ConnectionRefusedError(f"{client} cannot reach {address} (partition)")
        connection = SimConnection(rules)
        self.cluster.accept(address, connection.server_end)
        return connection.client_end

    def note_recovery_add(
        self, address: str, ledger_id: int, entries: Sequence[tuple[int, bytes]], answer: list[Any]
    ) -> None:
        """Which entries a node took from a recovery (R20's check): those it said it
        took (an answer lost on the way leaves the node's adds unrecorded)."""
        if self.history is None:
            return
        taken = [
            entry_id for (entry_id, _), error in zip(entries, answer, strict=True) if error is None
        ]
        self.history.recovery_added(address, ledger_id, taken)


class _Link:
    """The `LinkRules` of one connection from `client` to `address`."""

    def __init__(self, network: SimNetwork, client: str, address: str) -> None:
        self._network = network
        self._client = client
        self._address = address
        self._random = network.link(client, address)

    def delay_s(self) -> float:
        faults = self._network.faults
        delay = self._random.uniform(faults.delay_min_s, faults.delay_max_s)
        return delay * faults.slowdown.get(self._address, 1.0)

    def lost_after_s(self) -> float | None:
        lost = self._random.random() < self._network.faults.drop_rate
        if not lost:
            return None
        self._network.dropped += 1
        # reset at once, or after the peer's retransmissions went unanswered a while
        return 0.0 if self._random.random() < 0.5 else self._random.uniform(0.1, 1.0)

    def holds(self) -> bool:
        return self._network.holds(self._client, self._address)

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        watchers = self._network._watchers
        watchers.add(wake)
        return lambda: watchers.discard(wake)

    def delivered(self, to_node: bool) -> None:
        if to_node:
            delivered = self._network.delivered
            delivered[self._address] = delivered.get(self._address, 0) + 1


class SimChannel:
    """A client's `TcpChannel` to one node, with the adds a `cut_adds` fault loses
    failing as a lost connection, and a recovery's adds noted for R20's check."""

    def __init__(self, network: SimNetwork, client: str, channel: TcpChannel) -> None:
        self._network = network
        self._client = client
        self._channel = channel

    @property
    def address(self) -> str:
        return self._channel.address

    def _adds_cut(self) -> bool:
        if (self._client, self.address) in self._network.adds_cut:
            self._network.dropped += 1
            return True
        return False

    async def identity(self) -> NodeIdentity:
        return await self._channel.identity()

    def post_adds(self, requests: Sequence[AddRequest], **options: Any) -> bool:
        if (self._client, self.address) in self._network.adds_cut:
            return False  # (`add_entries_many` loses them, counted there)
        return self._channel.post_adds(requests, **options)

    async def add_entries_many(
        self, requests: Sequence[AddRequest], **options: Any
    ) -> list[AddAnswer]:
        if self._adds_cut():
            raise ConnectionLost(
                f"adds from {self._client} to node {self.address} lost (simulated)"
            )
        return await self._channel.add_entries_many(requests, **options)

    async def add_entries(
        self, ledger_id: int, entries: Sequence[tuple[int, bytes]], **options: Any
    ) -> list[Any]:
        if self._adds_cut():
            raise ConnectionLost(
                f"adds from {self._client} to node {self.address} lost (simulated)"
            )
        answer = await self._channel.add_entries(ledger_id, entries, **options)
        if options.get("recovery"):
            self._network.note_recovery_add(self.address, ledger_id, entries, answer)
        return answer

    async def read_entry(self, ledger_id: int, entry_id: int, **options: Any) -> tuple[bytes, int]:
        return await self._channel.read_entry(ledger_id, entry_id, **options)

    async def read_range(
        self, ledger_id: int, first_entry_id: int, last_entry_id: int, **options: Any
    ) -> RangeAnswer:
        return await self._channel.read_range(ledger_id, first_entry_id, last_entry_id, **options)

    async def read_lac(self, ledger_id: int, **options: Any) -> tuple[int, int]:
        return await self._channel.read_lac(ledger_id, **options)

    async def read_lac_and_entry(
        self, ledger_id: int, **options: Any
    ) -> tuple[int, int, bytes | None]:
        return await self._channel.read_lac_and_entry(ledger_id, **options)

    async def write_lac(self, ledger_id: int, last_add_confirmed: int, **options: Any) -> int:
        return await self._channel.write_lac(ledger_id, last_add_confirmed, **options)

    async def close_ledger(self, ledger_id: int, last_entry_id: int, **options: Any) -> int:
        return await self._channel.close_ledger(ledger_id, last_entry_id, **options)

    async def delete_ledger(self, ledger_id: int, **options: Any) -> None:
        await self._channel.delete_ledger(ledger_id, **options)
