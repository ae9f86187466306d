"""The copy rate bound of a re-replication worker (docs/rereplication.md, A15): a token
bucket per unit (entries, bytes) holding at most one second's worth."""

from __future__ import annotations

import anyio


class Throttle:
    """`take(entries, nbytes)` waits until both buckets allow the batch; a rate of 0
    is no bound. A batch larger than a second's worth waits for the whole of it, so
    the average rate holds whatever the batch size."""

    def __init__(self, entries_per_s: float = 0.0, bytes_per_s: float = 0.0) -> None:
        if entries_per_s < 0 or bytes_per_s < 0:
            raise ValueError("a copy rate is a number of at least 0 (0: no bound)")
        self._rates = (entries_per_s, bytes_per_s)
        self._levels = [entries_per_s, bytes_per_s]  # full: one second's worth
        self._at: float | None = None

    @property
    def bounded(self) -> bool:
        return any(self._rates)

    async def take(self, entries: int, nbytes: int) -> None:
        if not self.bounded:
            return
        now = anyio.current_time()
        if self._at is not None:
            elapsed = now - self._at
            for unit, rate in enumerate(self._rates):
                self._levels[unit] = min(rate, self._levels[unit] + elapsed * rate)
        self._at = now
        wait = 0.0
        for unit, (rate, amount) in enumerate(zip(self._rates, (entries, nbytes), strict=True)):
            if rate:
                self._levels[unit] -= amount
                wait = max(wait, -self._levels[unit] / rate)
        if wait > 0:
            await anyio.sleep(wait)
