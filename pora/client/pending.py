"""What waits in a connection's pending map: one protocol for every operation sent
and not answered yet, and the waiter of a plain request.

The map (`Session.pending`) holds, per request id, the operation the response
goes to and the response's index in it. Three kinds of operation live there: a
caller's requests (`RequestWaiter`), a frame of coalesced adds
(`coalescer.AddFrame`) and a frame of a writer's batches
(`ledger_frames.BatchFrame`). The connection's reader, its loss and the deadline
sweep treat them alike, through `PendingOperation`: none of them asks which kind
it holds.
"""

from __future__ import annotations

from typing import Protocol

from journal.errors import PoraError
from netio.messages import ResponseMessage
from pora.client.waiting import Event


class PendingOperation(Protocol):
    """An operation sent on a connection and not answered yet."""

    @property
    def deadline(self) -> float:
        """When its earliest caller gives up, on the event loop's clock (the sweep
        looks no closer before then)."""

    def deliver(self, response: ResponseMessage, index: int) -> None:
        """The response to its frame number `index` arrived."""

    def fail(self, error: PoraError) -> None:
        """The connection is lost (or the node said why it drops it): every caller
        still waiting gets `error`."""

    def time_out(self, now: float) -> None:
        """`now` is past `deadline`: wake the callers whose time is up."""


class RequestWaiter:
    """One caller waiting for `remaining` responses, one per frame it sent (one
    request, or the ADD_RUN frames of an `add_entries`); woken once by the last
    response, the connection's loss or its deadline."""

    __slots__ = ("deadline", "error", "event", "remaining", "responses", "timed_out")

    def __init__(self, count: int, event: Event, deadline: float) -> None:
        self.event = event
        self.deadline = deadline
        self.remaining = count
        self.responses: list[ResponseMessage | None] = [None] * count
        self.error: PoraError | None = None
        self.timed_out = False

    def deliver(self, response: ResponseMessage, index: int) -> None:
        self.responses[index] = response
        self.remaining -= 1
        if self.remaining == 0:
            self.event.set()

    def fail(self, error: PoraError) -> None:
        if self.remaining and self.error is None and not self.timed_out:
            self.error = error
            self.event.set()

    def time_out(self, now: float) -> None:
        if self.remaining and self.error is None and not self.timed_out:
            self.timed_out = True
            self.event.set()


__all__ = ["PendingOperation", "RequestWaiter"]
