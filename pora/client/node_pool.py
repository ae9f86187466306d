"""`NodePool`: one `NodeChannel` per node address, opened on first use and shared by
every ledger of a client.

A TCP channel (`connect_node`) holds a task group, which must be entered and exited
by one task: the pool runs one holder task per connection in the client's task
group, opens a connection once however many tasks ask for it at the same time (a
lock per address), and closes every connection when the client ends.

`open_channel(address)` is the seam: an async context manager giving the channel
for an address. `tcp_channels` opens TCP (`connect_node` + `TcpChannel`) with the
timeouts given; tests pass in-process channels. The pool knows no more of its
owner than the error a call after its end raises (`closed_error`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import anyio
import anyio.abc

from journal.errors import PoraError
from netio.errors import ConnectionLost
from pora.client.node_channel import NodeChannel
from pora.client.node_client import connect_node
from pora.client.tcp_channel import TcpChannel

ChannelOpener = Callable[[str], AbstractAsyncContextManager[NodeChannel]]


def tcp_channels(node_timeout_s: float, connect_timeout_s: float) -> ChannelOpener:
    """A `connect_node` connection per address, its requests bounded by
    `node_timeout_s` and its connects by `connect_timeout_s`."""

    @asynccontextmanager
    async def open_channel(address: str) -> AsyncIterator[NodeChannel]:
        async with connect_node(
            address, timeout_s=node_timeout_s, connect_timeout_s=connect_timeout_s
        ) as client:
            yield TcpChannel(client)

    return open_channel


def _pool_closed(what: str) -> PoraError:
    return ConnectionLost(f"the node pool is closed: {what}")


class NodePool:
    def __init__(
        self,
        task_group: anyio.abc.TaskGroup,
        open_channel: ChannelOpener,
        *,
        closed_error: Callable[[str], PoraError] = _pool_closed,
    ) -> None:
        self._task_group = task_group
        self._open_channel = open_channel
        #: what a call after `aclose` raises, given what it could not do
        self._closed_error = closed_error
        self._channels: dict[str, NodeChannel] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._stops: dict[str, anyio.Event] = {}
        self._stopped: dict[str, anyio.Event] = {}
        self._closed = False

    @property
    def addresses(self) -> list[str]:
        """The addresses with a channel open."""
        return sorted(self._channels)

    def channel_nowait(self, address: str) -> NodeChannel | None:
        """The channel to `address` when it is open, else None (`channel` opens it)."""
        return self._channels.get(address)

    async def channel(self, address: str) -> NodeChannel:
        """The channel to `address`, opened by the first caller."""
        channel = self._channels.get(address)
        if channel is not None:
            return channel
        lock = self._locks.setdefault(address, anyio.Lock())
        async with lock:
            channel = self._channels.get(address)
            if channel is None:
                if self._closed:
                    raise self._closed_error(f"it opens no channel to {address}")
                channel = await self._task_group.start(self._hold, address)
                self._channels[address] = channel
        return channel

    async def _hold(self, address: str, *, task_status: anyio.abc.TaskStatus[NodeChannel]) -> None:
        stop, stopped = anyio.Event(), anyio.Event()
        self._stops[address], self._stopped[address] = stop, stopped
        try:
            async with self._open_channel(address) as channel:
                task_status.started(channel)
                await stop.wait()
        finally:
            self._channels.pop(address, None)
            stopped.set()

    async def aclose(self) -> None:
        """Close every connection (each by its holder task) and wait for them."""
        self._closed = True
        for stop in self._stops.values():
            stop.set()
        for stopped in list(self._stopped.values()):
            await stopped.wait()
