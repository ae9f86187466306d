"""`TcpChannel`: a `NodeChannel` over a `NodeClient` (`connect_node`).

A writer's adds to the node in one scheduler turn are one call: several ledgers'
batches as one caller, encoded straight into frames, posted with its answers going
to a callback (`post_adds`) when the connection is ready for it, else awaited
(`add_entries_many`). The adds are pora.client.adds' operations made on the
client's connection directly (the client's add methods are the same operations,
for its own users); the reads and ledger operations are the client's. The node's
instance id is learnt from the INFO asked first on every connection.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from journal.errors import PoraError
from pora.client import adds
from pora.client.node_channel import (
    AddAnswer,
    AddRequest,
    NodeIdentity,
    RangeAnswer,
    complete_through,
)
from pora.client.node_client import NodeClient


class TcpChannel:
    """A `NodeChannel` over a `NodeClient` (made by `connect_node`)."""

    def __init__(self, client: NodeClient) -> None:
        self.client = client
        self._connection = client.connection

    @property
    def address(self) -> str:
        return self.client.address

    async def identity(self) -> NodeIdentity:
        info = await self.client.identity()
        return NodeIdentity(self.client.address, info.instance_id, info.read_only_reason)

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
        return await adds.add_coalesced(
            self._connection,
            ledger_id,
            entries,
            master_key=master_key,
            last_add_confirmed=last_add_confirmed,
            recovery=recovery,
            timeout_s=timeout_s,
            instance_id=instance_id,
        )

    async def add_entries_many(
        self,
        requests: Sequence[AddRequest],
        *,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> list[AddAnswer]:
        answers = await adds.add_batches_many(
            self._connection, requests, timeout_s=timeout_s, instance_id=instance_id
        )
        return list(answers)

    def post_adds(
        self,
        requests: Sequence[AddRequest],
        *,
        instance_id: str | None,
        timeout_s: float | None,
        on_answers: Callable[[Sequence[AddAnswer] | PoraError], object],
    ) -> bool:
        return adds.post_batches(
            self._connection,
            requests,
            timeout_s=timeout_s,
            instance_id=instance_id,
            on_answers=on_answers,
        )

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
        return await self.client.read_entry_and_lac(
            ledger_id,
            entry_id,
            wait_s=wait_s,
            fence=fence_key is not None,
            master_key=fence_key or b"",
            timeout_s=timeout_s,
            instance_id=instance_id,
        )

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
        entries, lac, more = await self.client.read_range_page(
            ledger_id,
            first_entry_id,
            last_entry_id,
            max_entries=max_entries,
            max_bytes=max_bytes,
            fence_key=fence_key,
            timeout_s=timeout_s,
            instance_id=instance_id,
        )
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
        return await self.client.read_lac(
            ledger_id,
            known_lac=known_lac,
            wait_s=wait_s,
            fence_key=fence_key,
            timeout_s=timeout_s,
            instance_id=instance_id,
        )

    async def read_lac_and_entry(
        self,
        ledger_id: int,
        *,
        known_lac: int,
        wait_s: float = 0.0,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, int, bytes | None]:
        return await self.client.read_lac_and_entry(
            ledger_id,
            known_lac=known_lac,
            wait_s=wait_s,
            timeout_s=timeout_s,
            instance_id=instance_id,
        )

    async def write_lac(
        self,
        ledger_id: int,
        last_add_confirmed: int,
        *,
        master_key: bytes,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> int:
        return await self.client.write_lac(
            ledger_id,
            last_add_confirmed,
            master_key=master_key,
            timeout_s=timeout_s,
            instance_id=instance_id,
        )

    async def close_ledger(
        self,
        ledger_id: int,
        last_entry_id: int,
        *,
        master_key: bytes,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> int:
        return await self.client.close_ledger(
            ledger_id,
            last_entry_id,
            master_key=master_key,
            timeout_s=timeout_s,
            instance_id=instance_id,
        )

    async def delete_ledger(
        self,
        ledger_id: int,
        *,
        master_key: bytes,
        instance_id: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        await self.client.delete_ledger(
            ledger_id, master_key=master_key, timeout_s=timeout_s, instance_id=instance_id
        )


__all__ = ["TcpChannel"]
