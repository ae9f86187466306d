"""A simulated network between clients and in-process nodes.

Every call a client makes to a node is a message: the request travels to the node
after a seeded delay, may be dropped on the way (the node never sees it), or cut by
a partition; the node's answer travels back the same way. A dropped message leaves
its caller with `ConnectionLost` or with no answer at all (until the caller's own
timeout), as the link's `Random` decides. Delays are drawn independently for every
message, so messages overtake each other. Each (client, node) link has its own
`Random`, seeded from the simulation's seed and the link's names: what one link
draws does not depend on how other links' messages interleave.

A node's answer is held until its seeded arrival time, however fast the node was:
with `SimTime` keeping the clock still while a disk thread works, when an answer
arrives depends on the seed alone.

    network = SimNetwork(cluster, seed=7)
    opener = network.opener("writer")            # a ChannelOpener for pora.connect
    network.partition("writer", address)         # cut one link ...
    network.heal("writer", address)              # ... and mend it
    network.pause("writer")                      # hold its messages (SIGSTOP) ...
    network.resume("writer")                     # ... and let them go (SIGCONT)
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import outcome
import trio

from netio.errors import ConnectionLost
from pora.client.local_channel import LocalChannel
from pora.client.node_channel import (
    AddAnswer,
    AddRequest,
    NodeChannel,
    NodeIdentity,
    RangeAnswer,
    add_entries_each,
)
from pora.client.node_pool import ChannelOpener
from simulation.cluster import SimCluster
from simulation.history import History


@dataclass
class LinkFaults:
    """How the network treats messages (all of them, or one node's)."""

    #: each message is lost with this probability
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
        #: messages delivered to each node (the scenarios' sanity checks)
        self.delivered: dict[str, int] = {}
        self.dropped = 0

    def partition(self, client: str, address: str) -> None:
        self.cut.add((client, address))

    def heal(self, client: str, address: str) -> None:
        self.cut.discard((client, address))

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

    def resume(self, client: str) -> None:
        held = self._paused.pop(client, None)
        if held is not None:
            held.set()

    def heal_all(self) -> None:
        for client in list(self._paused):
            self.resume(client)
        self.cut.clear()
        self.adds_cut.clear()
        self.faults.drop_rate = 0.0
        self.faults.slowdown.clear()

    def link(self, client: str, address: str) -> random.Random:
        key = (client, address)
        generator = self._links.get(key)
        if generator is None:
            generator = self._links[key] = random.Random(f"{self.seed}/{client}/{address}")
        return generator

    def opener(self, client: str) -> ChannelOpener:
        """What `pora.connect(open_channel=...)` takes: channels from `client`."""

        @asynccontextmanager
        async def open_channel(address: str) -> AsyncIterator[NodeChannel]:
            await trio.lowlevel.checkpoint()
            yield SimChannel(self, client, address)

        return open_channel

    async def _travel(self, client: str, address: str) -> None:
        """One message's trip over the link: a delay, then lost or through."""
        generator = self.link(client, address)
        faults = self.faults
        delay = generator.uniform(faults.delay_min_s, faults.delay_max_s)
        delay *= faults.slowdown.get(address, 1.0)
        lost = generator.random() < faults.drop_rate
        hang = generator.random() < 0.5
        await trio.sleep(delay)
        while client in self._paused:
            await self._paused[client].wait()
        if lost or (client, address) in self.cut:
            self.dropped += 1
            if hang:
                await trio.sleep_forever()
            raise ConnectionLost(
                f"message from {client} to node {address} lost (simulated network, "
                f"seed {self.seed})"
            )

    async def call(self, client: str, address: str, method: str, *args: Any, **options: Any) -> Any:
        await self._travel(client, address)
        if method == "add_entries" and (client, address) in self.adds_cut:
            self.dropped += 1
            raise ConnectionLost(f"adds from {client} to node {address} lost (simulated)")
        answer = await self._deliver(address, method, args, options)
        if method == "add_entries" and options.get("recovery") and self.history is not None:
            self._note_recovery_add(address, args, answer)
        await self._travel(client, address)
        return answer.unwrap()

    def _note_recovery_add(
        self, address: str, args: tuple[Any, ...], answer: outcome.Outcome[Any]
    ) -> None:
        """Which entries a node took from a recovery (R20's check), whether or not
        its answer reaches the recovery."""
        if not isinstance(answer, outcome.Value) or self.history is None:
            return
        ledger_id, entries = args
        taken = [
            entry_id
            for (entry_id, _), error in zip(entries, answer.value, strict=True)
            if error is None
        ]
        self.history.recovery_added(address, ledger_id, taken)

    async def _deliver(
        self, address: str, method: str, args: tuple[Any, ...], options: dict[str, Any]
    ) -> outcome.Outcome[Any]:
        """Run the request on the node in a task of the node's own, so a caller that
        gives up (its timeout) does not cancel the work the node has started, as over
        a real network. A node that stops meanwhile answers ConnectionLost."""
        node = self.cluster.nodes.get(address)
        if node is None:
            return outcome.Error(ConnectionLost(f"node {address} is down (simulated)"))
        self.delivered[address] = self.delivered.get(address, 0) + 1
        done = trio.Event()
        result: list[outcome.Outcome[Any]] = []

        async def serve() -> None:
            channel = LocalChannel(node, address)
            with self.cluster.serving(address) as scope:
                try:
                    value = await getattr(channel, method)(*args, **options)
                except Exception as error:  # the node's answer, an error one
                    result.append(outcome.Error(error))
                else:
                    result.append(outcome.Value(value))
            if scope.cancelled_caught:
                result.append(outcome.Error(ConnectionLost(f"node {address} crashed (simulated)")))
            done.set()

        self.cluster.nursery.start_soon(serve)
        await done.wait()
        return result[0]


class SimChannel:
    """A `NodeChannel` over the simulated network (what a client's pool holds)."""

    def __init__(self, network: SimNetwork, client: str, address: str) -> None:
        self._network = network
        self._client = client
        self._address = address

    @property
    def address(self) -> str:
        return self._address

    async def _call(self, method: str, *args: Any, **options: Any) -> Any:
        return await self._network.call(self._client, self._address, method, *args, **options)

    async def identity(self) -> NodeIdentity:
        answer: NodeIdentity = await self._call("identity")
        return answer

    async def add_entries_many(
        self, requests: Sequence[AddRequest], **options: Any
    ) -> list[AddAnswer]:
        return await add_entries_each(self, requests, **options)

    async def add_entries(
        self, ledger_id: int, entries: Sequence[tuple[int, bytes]], **options: Any
    ) -> list[Any]:
        answer: list[Any] = await self._call("add_entries", ledger_id, list(entries), **options)
        return answer

    async def read_entry(self, ledger_id: int, entry_id: int, **options: Any) -> tuple[bytes, int]:
        answer: tuple[bytes, int] = await self._call("read_entry", ledger_id, entry_id, **options)
        return answer

    async def read_range(
        self, ledger_id: int, first_entry_id: int, last_entry_id: int, **options: Any
    ) -> RangeAnswer:
        answer: RangeAnswer = await self._call(
            "read_range", ledger_id, first_entry_id, last_entry_id, **options
        )
        return answer

    async def read_lac(self, ledger_id: int, **options: Any) -> tuple[int, int]:
        answer: tuple[int, int] = await self._call("read_lac", ledger_id, **options)
        return answer

    async def read_lac_and_entry(
        self, ledger_id: int, **options: Any
    ) -> tuple[int, int, bytes | None]:
        answer: tuple[int, int, bytes | None] = await self._call(
            "read_lac_and_entry", ledger_id, **options
        )
        return answer

    async def write_lac(self, ledger_id: int, last_add_confirmed: int, **options: Any) -> int:
        answer: int = await self._call("write_lac", ledger_id, last_add_confirmed, **options)
        return answer

    async def close_ledger(self, ledger_id: int, last_entry_id: int, **options: Any) -> int:
        answer: int = await self._call("close_ledger", ledger_id, last_entry_id, **options)
        return answer

    async def delete_ledger(self, ledger_id: int, **options: Any) -> None:
        await self._call("delete_ledger", ledger_id, **options)
