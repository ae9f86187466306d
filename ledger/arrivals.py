"""Arrival signals for long-poll readers: one owner for the events and their waiters.

A reader that finds no entry waits on its ledger's arrival event; the ledger's worker
`signal`s after applying anything to that ledger, which wakes every waiter to look
again. Events exist only while someone waits: the last waiter to leave a ledger
removes its event, so that polls leave nothing behind. Waits on ledgers that do not
exist on the node are bounded (a client could otherwise make one event per id it
invents).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import trio

from journal.errors import PoraError


@dataclass(frozen=True, slots=True)
class ArrivalStatistics:
    #: long-poll reads waiting now, over every ledger
    long_polls_waiting: int
    #: ledgers with a long poll waiting (each holds one arrival event at most)
    ledgers_waited_for: int
    #: of those, ledgers that did not exist here when their poll began
    unknown_ledgers_waited_for: int


class Arrivals:
    def __init__(self, unknown_ledgers_max: int) -> None:
        #: most ledgers that do not exist here that long polls may wait for at once
        self._unknown_ledgers_max = unknown_ledgers_max
        #: by ledger, the event its waiters wait on; set and dropped by `signal`
        self._events: dict[int, trio.Event] = {}
        #: long polls waiting now, by ledger
        self._waiters: dict[int, int] = {}
        #: ledgers that did not exist when a long poll began to wait for them
        self._unknown: set[int] = set()

    def signal(self, ledger_id: int) -> None:
        """Something was applied to the ledger: its waiters look again."""
        arrived = self._events.pop(ledger_id, None)
        if arrived is not None:
            arrived.set()

    @contextlib.contextmanager
    def waiting(self, ledger_id: int) -> Iterator[None]:
        """Count a long poll on the ledger for the duration of the block; the last
        one to leave removes what the ledger's polls left."""
        waiters = self._waiters
        waiters[ledger_id] = waiters.get(ledger_id, 0) + 1
        try:
            yield
        finally:
            left = waiters[ledger_id] - 1
            if left:
                waiters[ledger_id] = left
            else:
                del waiters[ledger_id]
                self._unknown.discard(ledger_id)
                self._events.pop(ledger_id, None)

    def next_arrival(self, ledger_id: int) -> trio.Event:
        """The event the ledger's next `signal` sets. Take it before looking for the
        entry, so that an arrival between the look and the wait is not missed."""
        arrived = self._events.get(ledger_id)
        if arrived is None:
            arrived = self._events[ledger_id] = trio.Event()
        return arrived

    def wait_for_unknown_ledger(self, ledger_id: int, error: PoraError) -> None:
        """Count the ledger among those waited for that do not exist here, or raise
        `error` (saying why) when long polls already wait for the most allowed."""
        unknown = self._unknown
        if ledger_id in unknown:
            return
        limit = self._unknown_ledgers_max
        if len(unknown) >= limit:
            error.args = (
                f"{error}; long polls already wait for {limit} ledgers that do not exist "
                "on this node (long_polls_unknown_ledgers_max): read without waiting, or "
                "retry later",
            )
            raise error
        unknown.add(ledger_id)

    def statistics(self) -> ArrivalStatistics:
        return ArrivalStatistics(
            long_polls_waiting=sum(self._waiters.values()),
            ledgers_waited_for=len(self._waiters),
            unknown_ledgers_waited_for=len(self._unknown),
        )

    def __len__(self) -> int:
        """How many ledgers have an arrival event (someone waits for each)."""
        return len(self._events)
