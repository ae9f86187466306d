"""The simulation's nodes: in-process `pora.open_node`s on real data dirs, registered
in a real SQLite metadata store, which the fault schedule crashes, restarts (on the
same data dir: same instance, same entries), wipes (a new data dir at the same
address: a new instance id, nothing stored), copies and rolls back (the data dir put
back from a copy taken earlier, as an operator restoring a backup would).

Every node checks its data dir against its instance's mark in the store when it
starts, answers a fence only once its mark is past it, and raises the mark when it
stops, as `pora serve` does (R27): a data dir put back from an older copy starts as
a new instance. The simulation's nodes raise their mark at every stop but one:
`roll_back(..., killed_in_mark_interval=True)` kills the node with the mark as its
start and its fences left it (a copy taken within the last mark interval before a
node was killed). Only fences are safe in that window (R27; the entries the node
acknowledged since its last mark write are at risk, as docs/replication.md says),
so the random plans do not draw it: a planned scenario does.

Each node is served by its own `Server` (`Server.serve_connection`), over the
in-memory connections `SimNetwork` makes (wire.py), as `pora serve` serves TCP.

A crash is a crash: once no disk thread is at work, the node's disk (disk.py) fails
every write and sync under its data dir, its connections are reset (nothing it
sends from then on reaches a client), and the node's in-process shutdown runs
against that dead disk; then whatever was not synced is lost (reverted, or left as
a torn tail). The mark is raised to the journal's durable seq as the crash found
it. LevelDB's files are outside the disk's seam: the index is as the shutdown left
it."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

import pora
from pora.meta.records import NodeRegistration
from pora.meta.store import MetadataStore
from pora.node.node import Node
from pora.server.config import ServerConfig
from pora.server.membership import start_mark
from pora.server.node_mark import NodeMark
from pora.server.server import Server
from simulation.disk import SimDisk
from simulation.wire import ServerEnd

#: registrations outlive any simulation: nothing renews them
LEASE_S = 3600.0


@dataclass
class SimCluster:
    store: MetadataStore
    folder: Path
    addresses: list[str]
    nursery: trio.Nursery
    node_options: dict[str, Any] = field(default_factory=dict)
    #: returns once no disk thread is at work (SimTime.quiet)
    quiet: Callable[[], Awaitable[None]] = trio.lowlevel.checkpoint
    #: the disk under every node's journal and entry logs (None: the real OS)
    disk: SimDisk | None = None
    nodes: dict[str, Node] = field(default_factory=dict)
    #: the data dir each address runs on (a wipe moves it to a new one)
    paths: dict[str, Path] = field(default_factory=dict)
    wipes: dict[str, int] = field(default_factory=dict)
    #: a copy of each address's data dir, taken by `copy` for a later `roll_back`
    copies: dict[str, Path] = field(default_factory=dict)
    #: the instance registered at each address (a crashed node's stays registered)
    registered: dict[str, str] = field(default_factory=dict)
    _stops: dict[str, tuple[trio.Event, trio.Event]] = field(default_factory=dict)
    _locks: dict[str, trio.Lock] = field(default_factory=dict)
    #: each running node's server and the nursery of its connections
    #: the server ends of each node's connections (a crash resets them)
    _ends: dict[str, set[ServerEnd]] = field(default_factory=dict)
    #: nodes crashed and not yet back (their shutdown's errors are swallowed)
    _crashed: set[str] = field(default_factory=set)
    _servers: dict[str, tuple[Server, trio.Nursery]] = field(default_factory=dict)

    def instance_id(self, address: str) -> str:
        return self.nodes[address].data_dir.instance_id

    def _lock(self, address: str) -> trio.Lock:
        """One change of a node at a time: a restart that is still checking its mark
        must not meet a second start on the same data dir (DataDirLocked)."""
        return self._locks.setdefault(address, trio.Lock())

    async def start(self, address: str) -> None:
        async with self._lock(address):
            await self._start(address)

    async def _start(self, address: str) -> None:
        path = self.paths.setdefault(address, self.folder / address.replace(":", "_"))
        stop, stopped = trio.Event(), trio.Event()
        mark = NodeMark(self.store)
        node: Node = await self.nursery.start(self._hold, address, path, mark, stop, stopped)
        # a node open is a node known: a cancelled start must not leave it running,
        # its data dir locked, out of `nodes`
        with trio.CancelScope(shield=True):
            # before anything reaches it: a data dir behind its mark serves as a new
            # instance
            await start_mark(mark, node, lambda: node.statistics().journal.dispatched_seq)
            self._stops[address] = (stop, stopped)
            self.nodes[address] = node
            self.registered[address] = node.data_dir.instance_id
            await self.store.register_node(
                NodeRegistration(address, node.data_dir.instance_id), LEASE_S
            )

    async def _hold(
        self,
        address: str,
        path: Path,
        mark: NodeMark,
        stop: trio.Event,
        stopped: trio.Event,
        *,
        task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run the node and its server's connections until `stop`: a crash ends every
        connection first (their peers read the end of the stream), then the node. Its
        fences wait behind `mark` (R27), which `_start` starts."""
        options = {**self.node_options, "fence_barrier": mark.cover}
        try:
            async with self._crashing(address), pora.open_node(path, **options) as node:
                server = Server(node, ServerConfig())
                async with trio.open_nursery() as connections:
                    self._servers[address] = (server, connections)
                    task_status.started(node)
                    await stop.wait()
                    connections.cancel_scope.cancel()
                del self._servers[address]
        finally:
            stopped.set()

    @asynccontextmanager
    async def _crashing(self, address: str) -> AsyncIterator[None]:
        """A crashed node's shutdown meets EIO at every write and sync: what it
        raises then is not the node's to report (its process is gone)."""
        try:
            yield
        except BaseException as error:
            if address not in self._crashed:
                raise
            if isinstance(error, BaseExceptionGroup):
                rest = error.subgroup(lambda e: not isinstance(e, Exception))
                if rest is not None:
                    raise rest from None
            elif not isinstance(error, Exception):
                raise

    def accept(self, address: str, stream: ServerEnd) -> None:
        """Serve a connection to the node at `address` on `stream` (a connect that
        reached it); a node that is down refuses it."""
        if address not in self.nodes:
            raise ConnectionRefusedError(f"node {address} is down (simulated)")
        server, connections = self._servers[address]
        ends = self._ends.setdefault(address, set())
        ends.add(stream)

        async def serve() -> None:
            try:
                await server.serve_connection(stream)
            finally:
                ends.discard(stream)

        connections.start_soon(serve)

    async def crash(self, address: str) -> None:
        """Stop the node at once: its requests in flight are cut off; its data dir and
        its registration stay (a crashed node's lease has not run out)."""
        async with self._lock(address):
            await self._crash(address)

    async def _crash(self, address: str, *, raise_mark: bool = True) -> None:
        node = self.nodes.pop(address, None)
        if node is None:
            return
        stop, stopped = self._stops.pop(address)
        root = node.data_dir.root
        if self.disk is not None:
            # no disk thread is at work from here to the disk's failing: which of the
            # node's writes and syncs made it depends on the seed alone
            await self.quiet()
            self.disk.crash(root)
        # the journal's durable seq as the crash found it (its records dispatched were
        # synced; a sync under way is lost): the mark `pora serve` may have raised
        durable_seq = node.statistics().journal.dispatched_seq
        # before any other task runs: nothing the node does from now on reaches a client
        for end in self._ends.pop(address, set()):
            end.reset()
        self._crashed.add(address)
        stop.set()
        await stopped.wait()
        self._crashed.discard(address)
        if self.disk is not None:
            self.disk.lose_unsynced(root)
        if raise_mark:
            await self.store.advance_node_mark(node.data_dir.instance_id, durable_seq)

    async def fail_disk(self, address: str, errno: int, calls: Sequence[str]) -> None:
        """The disk under the node at `address` fails its `calls` ("write", "sync")
        with `errno` until `mend_disk`."""
        node = self.nodes.get(address)
        if node is None or self.disk is None:
            return
        await self.quiet()  # (no checkpoint from here on: see crash)
        self.disk.fail(node.data_dir.root, errno, calls)

    async def mend_disk(self, address: str) -> None:
        """The disk works again; a node whose journal failed meanwhile refuses every
        write until it is restarted (docs/operations.md), so it is, as its operator
        would."""
        node = self.nodes.get(address)
        if node is None or self.disk is None:
            return
        await self.quiet()
        self.disk.mend(node.data_dir.root)
        if node.statistics().journal.failed:
            async with self._lock(address):
                await self._crash(address)
                await self._start(address)

    async def restart(self, address: str) -> None:
        async with self._lock(address):
            if address not in self.nodes:
                await self._start(address)

    async def wipe(self, address: str) -> None:
        """The node comes back on a new, empty data dir: a new instance id."""
        async with self._lock(address):
            await self._crash(address)
            await self.store.unregister_node(address, self.registered[address])
            self.wipes[address] = self.wipes.get(address, 0) + 1
            self.paths[address] = (
                self.folder / f"{address.replace(':', '_')}-wiped-{self.wipes[address]}"
            )
            await self._start(address)

    async def copy(self, address: str) -> None:
        """Copy the node's data dir as it is now, while it serves: taken when no disk
        write is under way, the copy is what a crash at that moment would leave."""
        async with self._lock(address):
            path = self.paths.setdefault(address, self.folder / address.replace(":", "_"))
            copy = path.with_name(path.name + "-copy")
            await self.quiet()
            # no checkpoint from here to the end of the copy: no write can start meanwhile
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(path, copy)
            self.copies[address] = copy

    async def roll_back(self, address: str, *, killed_in_mark_interval: bool = False) -> None:
        """The node comes back on its data dir put back from the last `copy`: the same
        instance id on disk, behind what that instance acknowledged since the copy.
        `killed_in_mark_interval`: the node's mark is where its start and its fences
        left it (killed before a renewal raised it), not raised at the kill."""
        copy = self.copies.get(address)
        if copy is None:
            return
        async with self._lock(address):
            await self._crash(address, raise_mark=not killed_in_mark_interval)
            await self.store.unregister_node(address, self.registered[address])
            shutil.rmtree(self.paths[address])
            shutil.copytree(copy, self.paths[address])
            await self._start(address)

    async def aclose(self) -> None:
        for address in list(self.nodes):
            await self.crash(address)


@asynccontextmanager
async def sim_cluster(
    store: MetadataStore,
    folder: Path,
    nodes: int,
    quiet: Callable[[], Awaitable[None]] = trio.lowlevel.checkpoint,
    disk: SimDisk | None = None,
    **node_options: Any,
) -> AsyncIterator[SimCluster]:
    """`nodes` nodes at `10.0.0.1:3181`, ... (names only: nothing listens)."""
    async with trio.open_nursery() as nursery:
        addresses = [f"10.0.0.{k}:3181" for k in range(1, nodes + 1)]
        cluster = SimCluster(store, folder, addresses, nursery, node_options, quiet, disk)
        try:
            for address in addresses:
                await cluster.start(address)
            yield cluster
        finally:
            with trio.CancelScope(shield=True):
                await cluster.aclose()
            nursery.cancel_scope.cancel()
