"""Running a test's coroutine under each event loop the client supports (asyncio and
trio), for tests of the public API, which must behave the same under both."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import trio

#: runs a test's coroutine function to completion under one event loop
Runner = Callable[[Callable[[], Awaitable[None]]], None]


def under_asyncio(main: Callable[[], Awaitable[None]]) -> None:
    async def wrapped() -> None:
        await main()

    asyncio.run(wrapped())


#: parametrizes a test's `runner` argument: asyncio, then trio
EVENT_LOOPS = pytest.mark.parametrize("runner", [under_asyncio, trio.run], ids=["asyncio", "trio"])
