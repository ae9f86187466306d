"""Replicated ledgers built by hand on a `LocalCluster`: the record made with
ledger_records, entries encoded with entry_format and stored straight on the nodes
(on their whole write set, or on the members a test names), so a test can build the
exact state a writer would leave behind, however it died.

`Scripted` wraps the cluster's channels so a test can make one node answer one kind
of request with an error (a CORRUPT read, a lost fencing read) while it answers the
rest normally."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from replication_support import LocalCluster

from ledger.errors import StorageCorruption
from netio.security import master_key_from_password
from pora.client.node_channel import (
    AddAnswer,
    AddRequest,
    NodeChannel,
    NodeIdentity,
    RangeAnswer,
    add_entries_each,
)
from pora.client.replication.core.entry_format import encode_entry
from pora.client.replication.core.ledger_records import new_ledger, with_ensemble_change
from pora.client.replication.core.quorum import entry_write_set
from pora.meta.records import Ensemble, EnsembleMember, LedgerMetadata, Versioned
from pora.node.node import Node

PASSWORD = "pw"
KEY = master_key_from_password(PASSWORD)


def payload(entry_id: int) -> bytes:
    return f"entry-{entry_id}".encode() * (1 + entry_id % 3)


def length_after(entry_id: int) -> int:
    return sum(len(payload(k)) for k in range(entry_id + 1))


def stored_bytes(ledger_id: int, entry_id: int) -> bytes:
    return encode_entry(ledger_id, entry_id, length_after(entry_id), payload(entry_id))


def member(cluster: LocalCluster, address: str) -> EnsembleMember:
    return EnsembleMember(address, cluster.nodes[address].data_dir.instance_id)


async def make_ledger(
    cluster: LocalCluster,
    addresses: Sequence[str] | None = None,
    write_quorum: int = 3,
    ack_quorum: int = 2,
) -> Versioned[LedgerMetadata]:
    ledger_id = await cluster.store.allocate_ledger_id()
    members = [member(cluster, a) for a in (addresses or cluster.addresses[:3])]
    record = new_ledger(ledger_id, write_quorum, ack_quorum, members, KEY, created_ms=0)
    return await cluster.store.create_ledger(record)


async def add_ensemble(
    cluster: LocalCluster, current: Versioned[LedgerMetadata], first: int, addresses: Sequence[str]
) -> Versioned[LedgerMetadata]:
    """The ensemble change a writer would make (R9), compare-and-set in the store."""
    ensemble = Ensemble(first, tuple(member(cluster, a) for a in addresses))
    return await cluster.store.update_ledger(
        with_ensemble_change(current.value, ensemble), current.version
    )


async def put(
    cluster: LocalCluster,
    metadata: LedgerMetadata,
    entry_ids: Iterable[int],
    *,
    on: Iterable[str] | None = None,
    lac: Callable[[int], int] = lambda entry_id: entry_id - 1,
) -> None:
    """Store each entry on its write set (only the members at `on`, if given), with
    `lac(entry_id)` piggybacked (by default: every earlier entry acknowledged)."""
    await put_on_nodes(cluster.nodes, metadata, entry_ids, on=on, lac=lac)


async def put_on_nodes(
    nodes: Mapping[str, Node],
    metadata: LedgerMetadata,
    entry_ids: Iterable[int],
    *,
    on: Iterable[str] | None = None,
    lac: Callable[[int], int] = lambda entry_id: entry_id - 1,
) -> None:
    """`put` on nodes by address (served ones, say, rather than a cluster's)."""
    only = None if on is None else set(on)
    for entry_id in entry_ids:
        for target in entry_write_set(metadata, entry_id):
            if only is None or target.address in only:
                await nodes[target.address].add_entry(
                    metadata.ledger_id,
                    entry_id,
                    stored_bytes(metadata.ledger_id, entry_id),
                    master_key=KEY,
                    last_add_confirmed=lac(entry_id),
                )


class Scripted:
    """A cluster's channels, with `faults[(address, method)] = exception` raised by
    that node for that method (the exception is built by a function of the request's
    entry id, or -1, so one entry can fail alone)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.faults: dict[tuple[str, str], Callable[[int], Exception | None]] = {}

    async def channel_for(self, address: str) -> NodeChannel:
        return _ScriptedChannel(self, await self.cluster.channel_for(address))


class _ScriptedChannel:
    def __init__(self, script: Scripted, inner: NodeChannel) -> None:
        self._script = script
        self._inner = inner

    @property
    def address(self) -> str:
        return self._inner.address

    def _check(self, method: str, entry_id: int = -1) -> None:
        fault = self._script.faults.get((self._inner.address, method))
        error = None if fault is None else fault(entry_id)
        if error is not None:
            raise error

    async def identity(self) -> NodeIdentity:
        return await self._inner.identity()

    def post_adds(self, requests: Sequence[AddRequest], **options: Any) -> bool:
        return False  # (adds are awaited: `add_entries_many`)

    async def add_entries_many(
        self, requests: Sequence[AddRequest], **options: Any
    ) -> list[AddAnswer]:
        return await add_entries_each(self, requests, **options)

    async def add_entries(
        self, ledger_id: int, entries: Sequence[tuple[int, bytes]], **options: Any
    ) -> list[Any]:
        self._check("add_entries")
        return await self._inner.add_entries(ledger_id, entries, **options)

    async def read_entry(self, ledger_id: int, entry_id: int, **options: Any) -> tuple[bytes, int]:
        self._check("read_entry", entry_id)
        return await self._inner.read_entry(ledger_id, entry_id, **options)

    async def read_range(
        self, ledger_id: int, first_entry_id: int, last_entry_id: int, **options: Any
    ) -> RangeAnswer:
        self._check("read_range", first_entry_id)
        return await self._inner.read_range(ledger_id, first_entry_id, last_entry_id, **options)

    async def read_lac(self, ledger_id: int, **options: Any) -> tuple[int, int]:
        self._check("read_lac")
        return await self._inner.read_lac(ledger_id, **options)

    async def read_lac_and_entry(
        self, ledger_id: int, **options: Any
    ) -> tuple[int, int, bytes | None]:
        self._check("read_lac")
        return await self._inner.read_lac_and_entry(ledger_id, **options)

    async def write_lac(self, ledger_id: int, last_add_confirmed: int, **options: Any) -> int:
        self._check("write_lac")
        return await self._inner.write_lac(ledger_id, last_add_confirmed, **options)

    async def close_ledger(self, ledger_id: int, last_entry_id: int, **options: Any) -> int:
        self._check("close_ledger")
        return await self._inner.close_ledger(ledger_id, last_entry_id, **options)

    async def delete_ledger(self, ledger_id: int, **options: Any) -> None:
        self._check("delete_ledger")
        await self._inner.delete_ledger(ledger_id, **options)


def corrupt(path: Path = Path("entries.log")) -> Exception:
    return StorageCorruption(path, 0, "checksum mismatch (test)")
