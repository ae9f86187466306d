"""The simulation's nodes: in-process `pora.open_node`s on real data dirs, registered
in a real SQLite metadata store, which the fault schedule crashes, restarts (on the
same data dir: same instance, same entries), and wipes (a new data dir at the same
address: a new instance id, nothing stored).

A crash is the node's orderly stop after every request it is serving was cut off:
entries a node acknowledged are durable on its disk, so a stop loses nothing a
crash would keep, and the requests in flight end as a crash ends them (the caller
sees `ConnectionLost`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

import pora
from pora.meta.records import NodeRegistration
from pora.meta.store import MetadataStore
from pora.node.node import Node

#: registrations outlive any simulation: nothing renews them
LEASE_S = 3600.0


@dataclass
class SimCluster:
    store: MetadataStore
    folder: Path
    addresses: list[str]
    nursery: trio.Nursery
    node_options: dict[str, Any] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    #: the data dir each address runs on (a wipe moves it to a new one)
    paths: dict[str, Path] = field(default_factory=dict)
    wipes: dict[str, int] = field(default_factory=dict)
    #: the instance registered at each address (a crashed node's stays registered)
    registered: dict[str, str] = field(default_factory=dict)
    _stops: dict[str, tuple[trio.Event, trio.Event]] = field(default_factory=dict)
    _serving: dict[str, set[trio.CancelScope]] = field(default_factory=dict)

    @contextmanager
    def serving(self, address: str) -> Iterator[trio.CancelScope]:
        """A request the node at `address` works on; a crash cancels it."""
        scope = trio.CancelScope()
        scopes = self._serving.setdefault(address, set())
        scopes.add(scope)
        try:
            with scope:
                yield scope
        finally:
            scopes.discard(scope)

    def instance_id(self, address: str) -> str:
        return self.nodes[address].data_dir.instance_id

    async def start(self, address: str) -> None:
        path = self.paths.setdefault(address, self.folder / address.replace(":", "_"))
        stop, stopped = trio.Event(), trio.Event()
        node: Node = await self.nursery.start(self._hold, path, stop, stopped)
        self._stops[address] = (stop, stopped)
        self.nodes[address] = node
        self.registered[address] = node.data_dir.instance_id
        await self.store.register_node(
            NodeRegistration(address, node.data_dir.instance_id), LEASE_S
        )

    async def _hold(
        self,
        path: Path,
        stop: trio.Event,
        stopped: trio.Event,
        *,
        task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            async with pora.open_node(path, **self.node_options) as node:
                task_status.started(node)
                await stop.wait()
        finally:
            stopped.set()

    async def crash(self, address: str) -> None:
        """Stop the node at once: its requests in flight are cut off; its data dir and
        its registration stay (a crashed node's lease has not run out)."""
        node = self.nodes.pop(address, None)
        if node is None:
            return
        for scope in self._serving.get(address, set()):
            scope.cancel()
        stop, stopped = self._stops.pop(address)
        stop.set()
        await stopped.wait()

    async def restart(self, address: str) -> None:
        if address not in self.nodes:
            await self.start(address)

    async def wipe(self, address: str) -> None:
        """The node comes back on a new, empty data dir: a new instance id."""
        await self.crash(address)
        await self.store.unregister_node(address, self.registered[address])
        self.wipes[address] = self.wipes.get(address, 0) + 1
        self.paths[address] = (
            self.folder / f"{address.replace(':', '_')}-wiped-{self.wipes[address]}"
        )
        await self.start(address)

    async def aclose(self) -> None:
        for address in list(self.nodes):
            await self.crash(address)


@asynccontextmanager
async def sim_cluster(
    store: MetadataStore, folder: Path, nodes: int, **node_options: Any
) -> AsyncIterator[SimCluster]:
    """`nodes` nodes at `10.0.0.1:3181`, ... (names only: nothing listens)."""
    async with trio.open_nursery() as nursery:
        addresses = [f"10.0.0.{k}:3181" for k in range(1, nodes + 1)]
        cluster = SimCluster(store, folder, addresses, nursery, node_options)
        try:
            for address in addresses:
                await cluster.start(address)
            yield cluster
        finally:
            with trio.CancelScope(shield=True):
                await cluster.aclose()
            nursery.cancel_scope.cancel()
