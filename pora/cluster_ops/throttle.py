"""The copy rate bound of a re-replication worker (docs/rereplication.md, A15): a token
bucket per unit (entries, bytes) holding at most `burst_s` seconds' worth, and the
cut of a batch into pieces no larger than one burst.

Why a tenth of a second: the bucket bounds how long the copy may run at full speed
after a pause, and that run is what the foreground's appends queue behind on the
replacement's journal and event loop. A second's worth lets a throttled repair send
a second's worth of entries at full speed at once, one batch of `--batch-entries`
after another; a tenth keeps each burst, and the foreground's wait behind it, short."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import anyio

#: the burst a bucket holds, in seconds of its rate
BURST_S = 0.1

Item = TypeVar("Item", bound=tuple[int, bytes])


class Throttle:
    """`take(entries, nbytes)` waits until both buckets allow the batch; a rate of 0
    is no bound. A batch larger than a burst waits for the whole of it, so the
    average rate holds whatever the batch size; `cut` keeps batches within a burst,
    so that the copy never runs at full speed for longer than `burst_s`."""

    def __init__(
        self, entries_per_s: float = 0.0, bytes_per_s: float = 0.0, *, burst_s: float = BURST_S
    ) -> None:
        if entries_per_s < 0 or bytes_per_s < 0:
            raise ValueError("a copy rate is a number of at least 0 (0: no bound)")
        if burst_s <= 0:
            raise ValueError("a throttle's burst is a number of seconds above 0")
        self._rates = (entries_per_s, bytes_per_s)
        self._capacities = (entries_per_s * burst_s, bytes_per_s * burst_s)
        self._levels = list(self._capacities)  # full: one burst's worth
        self._at: float | None = None

    @property
    def bounded(self) -> bool:
        return any(self._rates)

    def cut(self, batch: Sequence[Item]) -> list[Sequence[Item]]:
        """`batch` in order, in pieces of at most one burst (entries and payload
        bytes; at least one entry a piece); the whole batch when unbounded."""
        if not self.bounded or not batch:
            return [batch]
        entries_max, bytes_max = self._capacities
        pieces: list[Sequence[Item]] = []
        start = 0
        size = 0
        for index, (_, data) in enumerate(batch):
            count = index - start
            if count and (
                (entries_max and count + 1 > entries_max)
                or (bytes_max and size + len(data) > bytes_max)
            ):
                pieces.append(batch[start:index])
                start, size = index, 0
            size += len(data)
        pieces.append(batch[start:])
        return pieces

    async def take(self, entries: int, nbytes: int) -> None:
        if not self.bounded:
            return
        now = anyio.current_time()
        if self._at is not None:
            elapsed = now - self._at
            for unit, rate in enumerate(self._rates):
                capacity = self._capacities[unit]
                self._levels[unit] = min(capacity, self._levels[unit] + elapsed * rate)
        self._at = now
        wait = 0.0
        for unit, (rate, amount) in enumerate(zip(self._rates, (entries, nbytes), strict=True)):
            if rate:
                self._levels[unit] -= amount
                wait = max(wait, -self._levels[unit] / rate)
        if wait > 0:
            await anyio.sleep(wait)
