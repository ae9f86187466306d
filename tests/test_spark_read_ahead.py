"""`BlockingClient.iterate_ahead`, the readers' hand-over from the client's loop:
every item in order, the producer's error raised after what came before it, and a
caller that stops early stops the producer (no fetching on behind its back)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import anyio
import anyio.lowlevel
import pytest
from anyio.from_thread import start_blocking_portal

from spark.blocking import BlockingClient


@contextmanager
def loop_client() -> Iterator[BlockingClient]:
    with start_blocking_portal(backend="asyncio") as portal:
        yield BlockingClient(portal, client=None)


def test_every_item_in_order() -> None:
    async def numbers() -> AsyncIterator[int]:
        for number in range(100):
            if number % 7 == 0:
                await anyio.lowlevel.checkpoint()  # the loop switches as a network read would
            yield number

    with loop_client() as pora:
        assert list(pora.iterate_ahead(numbers, chunk=8)) == list(range(100))
        assert list(pora.iterate_ahead(numbers, chunk=1000)) == list(range(100))


def test_the_producers_error_comes_after_what_it_produced() -> None:
    async def failing() -> AsyncIterator[int]:
        for number in range(10):
            yield number
        raise KeyError("gone")

    got: list[int] = []
    with loop_client() as pora, pytest.raises(KeyError, match="gone"):
        got.extend(pora.iterate_ahead(failing, chunk=4))
    assert got == list(range(8))  # whole chunks only: the last two died with it


def test_stopping_early_stops_the_producer() -> None:
    produced: list[int] = []

    async def endless() -> AsyncIterator[int]:
        number = 0
        while True:
            produced.append(number)
            yield number
            number += 1

    with loop_client() as pora:
        items = pora.iterate_ahead(endless, chunk=4, chunks_ahead=2)
        assert [next(items) for _ in range(3)] == [0, 1, 2]
        items.close()  # type: ignore[attr-defined]
        seen = len(produced)
        pora.call(anyio.sleep, 0.05)
        assert len(produced) == seen <= 4 * (2 + 2)  # bounded, and stopped
