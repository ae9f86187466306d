"""The replicating client's view of one node: the `NodeChannel` interface and the
identity and answer types it speaks in.

The replicating client talks to each node of an ensemble through this one
interface, over TCP (`TcpChannel`) or in process (`LocalChannel`). Both give the
same outcomes and raise the same error types for the same node.

Every call may name the node instance it expects (`instance_id`, as an ensemble
records it): a node answering from another instance (its data dir was wiped or
replaced) raises `InstanceMismatch`, and the request is not sent to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio

from journal.errors import PoraError


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    #: where the node is reached ("host:port", or a name for an in-process node)
    address: str
    #: its data dir's instance id
    instance_id: str
    #: why it refuses writes, or None when it takes them
    read_only_reason: str | None


@dataclass(frozen=True, slots=True)
class RangeAnswer:
    """A range read's answer: the entries stored on the node in [first, last], in
    order; every id in [first, complete_through] not among them is not stored
    there (complete_through < last when the node stopped at a cap: ask again
    after it)."""

    entries: list[tuple[int, bytes]]
    last_add_confirmed: int
    complete_through: int


@dataclass(slots=True)
class AddRequest:
    """One ledger's part of a multi-ledger add (`NodeChannel.add_entries_many`): its
    `(entry_id, payload)` entries and the writer's LAC to piggyback."""

    ledger_id: int
    entries: Sequence[tuple[int, bytes]]
    master_key: bytes
    last_add_confirmed: int


#: one request's answer: None when every entry of it was stored, else an outcome per
#: entry (None: stored), or the error that left every outcome of that request
#: unknown (a lost connection, a timeout)
AddAnswer = list[PoraError | None] | None | PoraError | OSError


class NodeChannel(Protocol):
    """One node, as the replicating client uses it. Errors are the engine's types
    (`NoSuchEntry`, `LedgerFenced`, `StorageCorruption`, ...), plus the network's
    (`ConnectionLost`, `RequestTimeout`) over TCP, and `InstanceMismatch`."""

    @property
    def address(self) -> str:
        """Where the node is reached."""
        ...

    async def identity(self) -> NodeIdentity:
        """Who the node is now (over TCP: as it said on the current connection)."""
        ...

    async def add_entries(
        self,
        ledger_id: int,
        entries: Sequence[tuple[int, bytes]],
        *,
        master_key: bytes,
        last_add_confirmed: int,
        recovery: bool = False,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> list[PoraError | None]:
        """Store `(entry_id, payload)` entries of one ledger (explicit ids, strictly
        increasing or not); returns once each is durable or failed: one outcome per
        entry, in order (None: stored). A refusal of the ledger (fenced, closed,
        unauthorized) is every entry's outcome; a conflict only its entry's.
        `recovery` marks a recovery's adds (a fenced ledger takes them). Raises
        only what leaves every outcome unknown (timeout, lost connection) and
        InstanceMismatch (nothing sent)."""
        ...

    async def add_entries_many(
        self,
        requests: Sequence[AddRequest],
        *,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> list[AddAnswer]:
        """`add_entries` for several ledgers at once (a writer's adds of one turn to
        this node, every ledger of the client): one answer per request, in order
        (None when every entry of it was stored, else one outcome per entry).
        Raises what leaves every request's outcomes unknown (timeout, lost
        connection, InstanceMismatch); a channel may also answer one request with
        such an error (`add_entries_each`)."""
        ...

    def post_adds(
        self,
        requests: Sequence[AddRequest],
        *,
        instance_id: str | None,
        timeout_s: float | None,
        on_answers: Callable[[Sequence[AddAnswer] | PoraError], object],
    ) -> bool:
        """`add_entries_many` without a wait, when the channel can send at once: True
        when the requests are sent (or queued to be), and `on_answers` is then
        called exactly once, with no task of the caller's, with what
        `add_entries_many` would return or the error it would raise (RequestTimeout
        past `timeout_s`, ConnectionLost). False when it would have to wait
        (connecting, learning who the node is, no room, another instance): nothing
        was done, and the caller uses `add_entries_many`. A channel with nothing
        cheaper than its awaiting calls answers False always."""
        ...

    async def read_entry(
        self,
        ledger_id: int,
        entry_id: int,
        *,
        fence_key: bytes | None = None,
        wait_s: float = 0.0,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> tuple[bytes, int]:
        """`(payload, last_add_confirmed)`. `fence_key`: fence the ledger first (a
        recovery read; creates the ledger fenced if the node never saw it).
        `wait_s` > 0: a long poll for an entry not stored yet. An entry whose
        stored copy is damaged raises StorageCorruption, never NoSuchEntry."""
        ...

    async def read_range(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        fence_key: bytes | None = None,
        max_entries: int = 1000,
        max_bytes: int = 1 << 20,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> RangeAnswer:
        """The entries stored in [first, last] up to the caps, and through which id
        the answer is complete. A damaged entry in the range raises
        StorageCorruption (it is never skipped)."""
        ...

    async def read_lac(
        self,
        ledger_id: int,
        *,
        fence_key: bytes | None = None,
        known_lac: int = -1,
        wait_s: float = 0.0,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, int]:
        """`(last_add_confirmed, last_entry_id stored here or -1)`. `wait_s` > 0: a
        long poll answered once the LAC passes `known_lac`, the ledger is closed or
        fenced, or the wait ends. `fence_key`: fence first (as `read_entry`)."""
        ...

    async def read_lac_and_entry(
        self,
        ledger_id: int,
        *,
        known_lac: int,
        wait_s: float = 0.0,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, int, bytes | None]:
        """`read_lac`, with the stored bytes of entry `known_lac + 1` (None when the
        node does not hold it) in the same round trip (BookKeeper's
        readLastAddConfirmedAndEntry). The entry may be above the LAC answered."""
        ...

    async def write_lac(
        self,
        ledger_id: int,
        last_add_confirmed: int,
        *,
        master_key: bytes,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> int:
        """Tell the node the writer's LAC (kept in memory, the highest wins; a
        lower bound only); returns the node's LAC after."""
        ...

    async def close_ledger(
        self,
        ledger_id: int,
        last_entry_id: int,
        *,
        master_key: bytes,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> int:
        """Seal the ledger on the node at `last_entry_id` (-1: empty)."""
        ...

    async def delete_ledger(
        self,
        ledger_id: int,
        *,
        master_key: bytes,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        """Delete the ledger and its entries on the node."""
        ...


async def add_entries_each(
    channel: NodeChannel,
    requests: Sequence[AddRequest],
    *,
    instance_id: str | None = None,
    timeout_s: float | None = None,
) -> list[AddAnswer]:
    """`add_entries_many` as one `add_entries` call per request, run side by side:
    for channels with nothing cheaper (in-process nodes, test and simulated
    channels), so each request keeps a call of its own (its own faults)."""
    answers: list[AddAnswer] = [[] for _ in requests]

    async def add(index: int, request: AddRequest) -> None:
        try:
            answers[index] = await channel.add_entries(
                request.ledger_id,
                request.entries,
                master_key=request.master_key,
                last_add_confirmed=request.last_add_confirmed,
                instance_id=instance_id,
                timeout_s=timeout_s,
            )
        except (PoraError, OSError) as error:
            answers[index] = error

    if len(requests) == 1:
        await add(0, requests[0])
        return answers
    async with anyio.create_task_group() as tasks:
        for index, request in enumerate(requests):
            tasks.start_soon(add, index, request)
    return answers


def complete_through(entries: list[tuple[int, bytes]], last_entry_id: int, more: bool) -> int:
    return entries[-1][0] if more and entries else last_entry_id


__all__ = [
    "AddAnswer",
    "AddRequest",
    "NodeChannel",
    "NodeIdentity",
    "RangeAnswer",
    "add_entries_each",
    "complete_through",
]
