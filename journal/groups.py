"""A group commit's way from its write to the ledgers, as states with asserted moves.

The journal task (journal/task.py) writes a group, starts its fdatasync, and hands
it to the ledgers once it and every group before it are synced, in journal order.
Each written group is a `WrittenGroup`: it starts WRITTEN and ends exactly once
(`settle`): handed over, failed, or cancelled while it waited for the ledgers.
Ending gives its sync slot back and wakes whatever waits for it (`done`).
"""

from __future__ import annotations

import enum

import trio

from journal.request import Request
from journal.syncs import Sync


class GroupState(enum.Enum):
    """Where a written group is on its way to the ledgers. A group is made WRITTEN
    (its fdatasync started); every other state is reached once, along `_NEXT_STATES`,
    and the last three end it: its slot is given back and `done` set."""

    #: written into the page cache; its fdatasync runs or has ended unread
    WRITTEN = "written"
    #: synced, and waiting for room in a ledger channel (the ledgers' backpressure)
    WAITING_FOR_LEDGERS = "waiting for the ledgers"
    #: handed to the ledgers, which complete its requests
    HANDED_OVER = "handed over"
    #: its write or sync failed, or one before it did: its requests failed
    FAILED = "failed"
    #: its wait for the ledgers was cancelled (the node stops): its requests are
    #: neither completed nor failed by the journal
    CANCELLED = "cancelled"


_NEXT_STATES: dict[GroupState, frozenset[GroupState]] = {
    GroupState.WRITTEN: frozenset(
        {GroupState.WAITING_FOR_LEDGERS, GroupState.HANDED_OVER, GroupState.FAILED}
    ),
    GroupState.WAITING_FOR_LEDGERS: frozenset({GroupState.HANDED_OVER, GroupState.CANCELLED}),
    GroupState.HANDED_OVER: frozenset(),
    GroupState.FAILED: frozenset(),
    GroupState.CANCELLED: frozenset(),
}
_ENDED: frozenset[GroupState] = frozenset(
    {GroupState.HANDED_OVER, GroupState.FAILED, GroupState.CANCELLED}
)


class WrittenGroup:
    """A group written to the journal, on its way to the ledgers (`state`)."""

    __slots__ = ("done", "group", "state", "sync", "sync_slots", "written")

    def __init__(
        self,
        group: list[Request],
        written: int,
        sync: Sync,
        done: trio.Event,
        sync_slots: trio.Semaphore,
    ) -> None:
        self.group = group
        self.written = written
        self.sync = sync
        #: set once the group is handed over (or failed)
        self.done = done
        self.sync_slots = sync_slots
        self.state = GroupState.WRITTEN

    def move_to(self, state: GroupState) -> None:
        """Enter `state`; only the moves of `_NEXT_STATES` are allowed."""
        assert state in _NEXT_STATES[self.state], (
            f"a {self.state.value} group cannot become {state.value}"
        )
        self.state = state

    def settle(self, state: GroupState) -> None:
        """End the group in `state` (one of `_ENDED`): its sync slot is given back and
        the groups waiting for it are told, exactly once."""
        assert state in _ENDED, state
        self.move_to(state)
        self.done.set()
        self.sync_slots.release()
