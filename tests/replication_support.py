"""An in-process cluster for the replicating client's tests: real nodes
(`pora.open_node`, real files and fdatasync) reached through `LocalChannel`s, no
sockets, registered in a real SQLite metadata store; and faults a test turns on per
node: every request fails (as a lost connection), or hangs until cancelled.

    async with local_cluster(tmp_path, nodes=3) as cluster:
        channel = await cluster.channel_for(cluster.addresses[0])
        cluster.set_fault(cluster.addresses[1], Fault.HANG)
        await cluster.replace_data_dir(cluster.addresses[2])   # a wiped node, new instance

The channels check the fault on every call, so a fault turned on affects requests
sent after it; one turned off lets the node answer again. Trio only (in-process
nodes run on trio).
"""

from __future__ import annotations

import enum
import math
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing

import pora
from journal.errors import PoraError
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
from pora.meta.backends import open_metadata
from pora.meta.config import MetadataConfig
from pora.meta.records import NodeRegistration
from pora.meta.store import MetadataStore
from pora.node.node import Node

#: registrations outlive any test: nothing renews them
LEASE_S = 3600.0


class Fault(enum.Enum):
    NONE = "none"
    #: every request raises ConnectionLost, as a node that went away
    FAIL = "fail"
    #: every request waits until cancelled, as a node that stopped answering
    HANG = "hang"


@dataclass
class LocalCluster:
    store: MetadataStore
    folder: Path
    addresses: list[str]
    nodes: dict[str, Node] = field(default_factory=dict)
    faults: dict[str, Fault] = field(default_factory=dict)
    node_options: dict[str, Any] = field(default_factory=dict)
    #: each node is held open by a task of its own (a node holds a nursery, which must
    #: be exited by the task that entered it, in any order of stops)
    _nursery: trio.Nursery | None = None
    _stops: dict[str, tuple[trio.Event, trio.Event]] = field(default_factory=dict)
    _generation: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    async def channel_for(self, address: str) -> NodeChannel:
        """A channel to the node at `address` (what a client's node pool would give)."""
        await trio.lowlevel.checkpoint()
        if address not in self.nodes:
            raise ConnectionLost(f"no node at {address}")
        return FaultyChannel(self, address)

    def set_fault(self, address: str, fault: Fault) -> None:
        self.faults[address] = fault

    async def start_node(self, address: str, *, register: bool = True, **registration: Any) -> None:
        assert self._nursery is not None
        generation = self._generation.get(address, -1) + 1
        self._generation[address] = generation
        path = self.folder / f"{address.replace(':', '_')}-{generation}"
        stop, stopped = trio.Event(), trio.Event()
        node: Node = await self._nursery.start(self._hold, path, stop, stopped)
        self._stops[address] = (stop, stopped)
        self.nodes[address] = node
        self.faults.setdefault(address, Fault.NONE)
        if register:
            await self.store.register_node(
                NodeRegistration(address, node.data_dir.instance_id, **registration), LEASE_S
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

    async def stop_node(self, address: str, *, unregister: bool = True) -> None:
        node = self.nodes.pop(address)
        stop, stopped = self._stops.pop(address)
        stop.set()
        await stopped.wait()
        if unregister:
            await self.store.unregister_node(address, node.data_dir.instance_id)

    async def replace_data_dir(self, address: str) -> None:
        """The node at `address` comes back with a new, empty data dir (a new instance
        id), as an operator who wiped a disk would bring it back."""
        await self.stop_node(address)
        await self.start_node(address)

    async def aclose(self) -> None:
        for address in list(self.nodes):
            await self.stop_node(address, unregister=False)


#: a metadata call's timeout, in virtual time, for a test on trio's MockClock: its
#: autojump moves the clock on while a SQLite call runs in its worker thread (every
#: task waits), so on a loaded machine a slow thread looked like the 10 s default
#: running out (the store's open failed so). The tests of the metadata timeouts run
#: on the real clock, with the timeouts they test.
MOCK_CLOCK_METADATA = MetadataConfig(call_timeout_s=24 * 3600.0)


@contextmanager
def autojump_held() -> Iterator[None]:
    """A MockClock's autojump held off (any other clock: nothing). For opening the
    harness's store: its call timeout is the only deadline then, and the autojump,
    seeing every task wait on the SQLite thread that opens the file for its threshold
    of real time, jumps straight to it (a loaded machine failed a test's start so, 24 h
    of virtual time notwithstanding). Later calls have the nodes' timers about them."""
    clock = trio.lowlevel.current_clock()
    if not isinstance(clock, trio.testing.MockClock):
        yield
        return
    threshold, clock.autojump_threshold = clock.autojump_threshold, math.inf
    try:
        yield
    finally:
        clock.autojump_threshold = threshold


def harness_metadata_config() -> MetadataConfig:
    """The metadata config of the harness's stores: MOCK_CLOCK_METADATA under a
    MockClock, else the default."""
    if isinstance(trio.lowlevel.current_clock(), trio.testing.MockClock):
        return MOCK_CLOCK_METADATA
    return MetadataConfig()


@asynccontextmanager
async def local_cluster(
    folder: Path,
    nodes: int = 3,
    *,
    racks: Sequence[str | None] | None = None,
    **node_options: Any,
) -> AsyncIterator[LocalCluster]:
    """`nodes` in-process nodes at addresses `127.0.0.1:41001..`, registered writable in
    `sqlite:///folder/meta.db` (with rack labels from `racks`, if given)."""
    async with AsyncExitStack() as stack:
        with autojump_held():
            url = f"sqlite:///{folder}/meta.db"
            store = await stack.enter_async_context(open_metadata(url, harness_metadata_config()))
        nursery = await stack.enter_async_context(trio.open_nursery())
        addresses = [f"127.0.0.1:{41000 + k}" for k in range(1, nodes + 1)]
        cluster = LocalCluster(store, folder, addresses, node_options=node_options)
        cluster._nursery = nursery
        try:
            for k, address in enumerate(addresses):
                rack = None if racks is None else racks[k]
                await cluster.start_node(address, rack=rack)
            yield cluster
        finally:
            with trio.CancelScope(shield=True):
                await cluster.aclose()


class FaultyChannel:
    """A `LocalChannel` to the cluster's current node at an address, through the
    test's faults (looked up on every call, so they can change mid-test)."""

    def __init__(self, cluster: LocalCluster, address: str) -> None:
        self._cluster = cluster
        self._address = address

    @property
    def address(self) -> str:
        return self._address

    async def _inner(self) -> LocalChannel:
        cluster = self._cluster
        cluster.calls[self._address] = cluster.calls.get(self._address, 0) + 1
        fault = cluster.faults.get(self._address, Fault.NONE)
        if fault is Fault.HANG:
            await trio.sleep_forever()
        node = cluster.nodes.get(self._address)
        if fault is Fault.FAIL or node is None:
            await trio.lowlevel.checkpoint()
            raise ConnectionLost(f"node {self._address} is unreachable (test fault)")
        return LocalChannel(node, self._address)

    async def identity(self) -> NodeIdentity:
        return await (await self._inner()).identity()

    def post_adds(self, requests: Sequence[AddRequest], **options: Any) -> bool:
        return False  # (adds are awaited: `add_entries_many`)

    async def add_entries_many(
        self, requests: Sequence[AddRequest], **options: Any
    ) -> list[AddAnswer]:
        return await add_entries_each(self, requests, **options)

    async def add_entries(
        self, ledger_id: int, entries: Sequence[tuple[int, bytes]], **options: Any
    ) -> list[PoraError | None]:
        return await (await self._inner()).add_entries(ledger_id, entries, **options)

    async def read_entry(self, ledger_id: int, entry_id: int, **options: Any) -> tuple[bytes, int]:
        return await (await self._inner()).read_entry(ledger_id, entry_id, **options)

    async def read_range(
        self, ledger_id: int, first_entry_id: int, last_entry_id: int, **options: Any
    ) -> RangeAnswer:
        return await (await self._inner()).read_range(
            ledger_id, first_entry_id, last_entry_id, **options
        )

    async def read_lac(self, ledger_id: int, **options: Any) -> tuple[int, int]:
        return await (await self._inner()).read_lac(ledger_id, **options)

    async def read_lac_and_entry(
        self, ledger_id: int, **options: Any
    ) -> tuple[int, int, bytes | None]:
        return await (await self._inner()).read_lac_and_entry(ledger_id, **options)

    async def write_lac(self, ledger_id: int, last_add_confirmed: int, **options: Any) -> int:
        return await (await self._inner()).write_lac(ledger_id, last_add_confirmed, **options)

    async def close_ledger(self, ledger_id: int, last_entry_id: int, **options: Any) -> int:
        return await (await self._inner()).close_ledger(ledger_id, last_entry_id, **options)

    async def delete_ledger(self, ledger_id: int, **options: Any) -> None:
        await (await self._inner()).delete_ledger(ledger_id, **options)
