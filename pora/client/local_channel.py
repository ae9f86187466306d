"""`LocalChannel`: a `NodeChannel` over an in-process `Node` (`pora.open_node`),
with no sockets: for tests and the deterministic simulation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import trio

from journal.errors import PoraError
from ledger.errors import EntryTooLarge, NoSuchEntry
from netio.errors import InstanceMismatch
from pora.client.node_channel import (
    AddAnswer,
    AddRequest,
    NodeIdentity,
    RangeAnswer,
    add_entries_each,
    complete_through,
)


class _HasInstanceId(Protocol):
    @property
    def instance_id(self) -> str: ...


class _HasEntryLimit(Protocol):
    @property
    def entry_bytes_max(self) -> int: ...


class InProcessNode(Protocol):
    """What `LocalChannel` uses of a node: `pora.Node` (from `pora.open_node`)."""

    @property
    def data_dir(self) -> _HasInstanceId: ...
    @property
    def config(self) -> _HasEntryLimit: ...
    @property
    def read_only(self) -> str | None: ...

    async def add_entry(
        self,
        ledger_id: int,
        entry_id: int,
        payload: bytes,
        *,
        master_key: bytes = b"",
        recovery: bool = False,
        last_add_confirmed: int = -1,
    ) -> None: ...
    async def add_batch(
        self,
        ledger_id: int,
        entry_ids: Sequence[int],
        payloads: Sequence[bytes],
        *,
        master_key: bytes = b"",
        recovery: bool = False,
        last_add_confirmed: int = -1,
    ) -> list[PoraError | None]: ...
    async def fence_ledger(self, ledger_id: int, *, master_key: bytes = b"") -> int: ...
    async def read_entry(self, ledger_id: int, entry_id: int, *, wait_s: float = 0.0) -> bytes: ...
    def last_add_confirmed(self, ledger_id: int) -> int: ...
    async def read_range_page(
        self,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        max_entries: int = ...,
        max_bytes: int = ...,
    ) -> tuple[list[tuple[int, bytes]], bool]: ...
    async def read_lac(
        self, ledger_id: int, *, known_lac: int = -1, wait_s: float = 0.0
    ) -> tuple[int, int]: ...
    async def write_lac(
        self, ledger_id: int, last_add_confirmed: int, *, master_key: bytes = b""
    ) -> int: ...
    async def close_ledger(
        self, ledger_id: int, last_entry_id: int | None = None, *, master_key: bytes = b""
    ) -> int: ...
    async def delete_ledger(self, ledger_id: int, *, master_key: bytes = b"") -> None: ...


class LocalChannel:
    """A `NodeChannel` over an in-process `Node`: no sockets, the same outcomes and
    error types as `TcpChannel` to a node serving that `Node`. Timeouts are the
    caller's to apply (trio's cancel scopes); `timeout_s` is accepted and unused."""

    def __init__(self, node: InProcessNode, address: str = "local") -> None:
        self.node = node
        self._address = address

    @property
    def address(self) -> str:
        return self._address

    def _check(self, instance_id: str | None) -> None:
        actual = self.node.data_dir.instance_id
        if instance_id is not None and instance_id != actual:
            raise InstanceMismatch(self._address, instance_id, actual)

    async def identity(self) -> NodeIdentity:
        await trio.lowlevel.checkpoint()
        node = self.node
        return NodeIdentity(self._address, node.data_dir.instance_id, node.read_only)

    def post_adds(
        self,
        requests: Sequence[AddRequest],
        *,
        instance_id: str | None,
        timeout_s: float | None,
        on_answers: Callable[[Sequence[AddAnswer] | PoraError], object],
    ) -> bool:
        return False  # an in-process node's adds are awaited (`add_entries_many`)

    async def add_entries_many(
        self,
        requests: Sequence[AddRequest],
        *,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> list[AddAnswer]:
        # each ledger's adds are one submission to the node already; the node's
        # group commit shares the journal's writes between them
        return await add_entries_each(self, requests, instance_id=instance_id, timeout_s=timeout_s)

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
        self._check(instance_id)
        outcomes: list[PoraError | None] = [None] * len(entries)
        # as over TCP: an entry the node refuses by itself goes alone, not sinking its
        # neighbours; the rest in one submission, by id
        entry_max = self.node.config.entry_bytes_max
        order = sorted(range(len(entries)), key=lambda i: entries[i][0])
        taken: list[int] = []
        for index in order:
            entry_id, payload = entries[index]
            if len(payload) > entry_max:
                outcomes[index] = EntryTooLarge(ledger_id, len(payload), entry_max, entry_id)
            elif taken and entries[taken[-1]][0] == entry_id:
                outcomes[index] = await self._add_alone(
                    ledger_id, entries[index], master_key, last_add_confirmed, recovery
                )
            else:
                taken.append(index)
        if not taken:
            await trio.lowlevel.checkpoint()
            return outcomes
        try:
            results = await self.node.add_batch(
                ledger_id,
                [entries[i][0] for i in taken],
                [entries[i][1] for i in taken],
                master_key=master_key,
                recovery=recovery,
                last_add_confirmed=last_add_confirmed,
            )
        except PoraError as error:  # refused before submission (a bad id, say)
            results = [error] * len(taken)
        for index, result in zip(taken, results, strict=True):
            outcomes[index] = result
        return outcomes

    async def _add_alone(
        self,
        ledger_id: int,
        entry: tuple[int, bytes],
        master_key: bytes,
        last_add_confirmed: int,
        recovery: bool,
    ) -> PoraError | None:
        try:
            await self.node.add_entry(
                ledger_id,
                entry[0],
                entry[1],
                master_key=master_key,
                recovery=recovery,
                last_add_confirmed=last_add_confirmed,
            )
        except PoraError as error:
            return error
        return None

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
        self._check(instance_id)
        node = self.node
        if fence_key is not None:
            await node.fence_ledger(ledger_id, master_key=fence_key)
        payload = await node.read_entry(ledger_id, entry_id, wait_s=wait_s)
        return payload, node.last_add_confirmed(ledger_id)

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
        self._check(instance_id)
        node = self.node
        if fence_key is not None:
            await node.fence_ledger(ledger_id, master_key=fence_key)
        entries, more = await node.read_range_page(
            ledger_id,
            first_entry_id,
            last_entry_id,
            max_entries=max(1, max_entries),
            max_bytes=max(1, max_bytes),
        )
        lac = node.last_add_confirmed(ledger_id)
        return RangeAnswer(entries, lac, complete_through(entries, last_entry_id, more))

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
        self._check(instance_id)
        if fence_key is not None:
            await self.node.fence_ledger(ledger_id, master_key=fence_key)
        return await self.node.read_lac(ledger_id, known_lac=known_lac, wait_s=wait_s)

    async def read_lac_and_entry(
        self,
        ledger_id: int,
        *,
        known_lac: int,
        wait_s: float = 0.0,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, int, bytes | None]:
        self._check(instance_id)
        lac, last = await self.node.read_lac(ledger_id, known_lac=known_lac, wait_s=wait_s)
        if last <= known_lac:
            return lac, last, None
        try:
            return lac, last, await self.node.read_entry(ledger_id, known_lac + 1)
        except NoSuchEntry:
            return lac, last, None

    async def write_lac(
        self,
        ledger_id: int,
        last_add_confirmed: int,
        *,
        master_key: bytes,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> int:
        self._check(instance_id)
        return await self.node.write_lac(ledger_id, last_add_confirmed, master_key=master_key)

    async def close_ledger(
        self,
        ledger_id: int,
        last_entry_id: int,
        *,
        master_key: bytes,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> int:
        self._check(instance_id)
        return await self.node.close_ledger(ledger_id, last_entry_id, master_key=master_key)

    async def delete_ledger(
        self,
        ledger_id: int,
        *,
        master_key: bytes,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self._check(instance_id)
        await self.node.delete_ledger(ledger_id, master_key=master_key)


__all__ = ["InProcessNode", "LocalChannel"]
