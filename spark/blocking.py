"""The async client from the synchronous code Spark runs (a driver's `commit`, an
executor's `write` and `read`): one event loop in a thread of its own per use, the
client connected in it, and calls handed over to it and waited for.

    with blocking_client(url) as pora:
        stream = pora.call(pora.client.open_stream, "events")
        for position, payload in pora.iterate(lambda: stream.read(), chunk=64):
            ...

The loop runs asyncio (the client runs on asyncio and trio alike; asyncio needs no
extra package in a Spark worker's Python). Each task of a Spark job opens its own:
Python workers are separate processes, and a connection outlives no task.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal

import pora

T = TypeVar("T")


class BlockingClient:
    """A connected `pora` client driven from synchronous code."""

    def __init__(self, portal: BlockingPortal, client: Any) -> None:
        self._portal = portal
        #: the async client (pora.connect's): pass its bound methods to `call`
        self.client = client

    def call(self, function: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`await function(*args)` in the client's loop; its result or its error."""
        return self._portal.call(function, *args)

    def start(self, function: Callable[..., Awaitable[T]], *args: Any) -> Future[T]:
        """`await function(*args)` started in the client's loop without waiting: its
        future (several appends in flight while the caller encodes the next)."""
        return self._portal.start_task_soon(function, *args)

    def iterate(self, make: Callable[[], AsyncIterator[T]], chunk: int = 256) -> Iterator[T]:
        """The items of the async iterator `make()` (made in the client's loop),
        fetched `chunk` at a time so a hand-over costs one loop wake-up per chunk."""
        box: list[AsyncIterator[T]] = []

        async def start() -> None:
            box.append(make())

        async def take() -> list[T]:
            items: list[T] = []
            async for item in box[0]:
                items.append(item)
                if len(items) >= chunk:
                    break
            return items

        async def close() -> None:
            aclose = getattr(box[0], "aclose", None)
            if aclose is not None:
                await aclose()

        self._portal.call(start)
        try:
            while True:
                items = self._portal.call(take)
                yield from items
                if len(items) < chunk:
                    return
        finally:
            self._portal.call(close)

    def iterate_ahead(
        self, make: Callable[[], AsyncIterator[T]], chunk: int = 16, chunks_ahead: int = 2
    ) -> Iterator[T]:
        """`iterate`, with the loop fetching up to `chunks_ahead` chunks ahead while
        the caller works on the one it has (a reader's network waits then overlap
        its decoding); at most `chunks_ahead + 2` chunks are held."""

        async def open_channel() -> tuple[Any, Any]:
            return anyio.create_memory_object_stream[list[T]](chunks_ahead)

        async def produce(send: Any) -> None:
            async with send:
                items: list[T] = []
                async for item in make():
                    items.append(item)
                    if len(items) >= chunk:
                        await send.send(items)
                        items = []
                if items:
                    await send.send(items)

        send, receive = self._portal.call(open_channel)
        producing = self._portal.start_task_soon(produce, send)
        try:
            while True:
                try:
                    items = self._portal.call(receive.receive)
                except anyio.EndOfStream:
                    break
                yield from items
            producing.result()  # the producer's error, if it ended with one
        finally:
            producing.cancel()
            self._portal.call(receive.aclose)


@contextmanager
def blocking_client(url: str) -> Iterator[BlockingClient]:
    """A client on the metadata store at `url`, for synchronous code; closed (and its
    loop's thread ended) on leaving the block."""
    with start_blocking_portal(backend="asyncio") as portal:  # noqa: SIM117 (order)
        with portal.wrap_async_context_manager(pora.connect(url)) as client:
            yield BlockingClient(portal, client)
