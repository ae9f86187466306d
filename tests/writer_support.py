"""A replicating client on the in-process cluster (`replication_support`), and reads
of what each in-process node holds, for the writer's tests."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio
from replication_support import LocalCluster, harness_metadata_config

from ledger.errors import NoSuchEntry, NoSuchLedger
from pora.client.node_channel import NodeChannel
from pora.client.replication.client import Client, connect
from pora.client.replication.config import ClientConfig
from pora.client.replication.core.entry_format import HEADER_BYTES, decode_entry
from pora.client.replication.writer import LedgerWriter
from pora.meta.errors import NoSuchLedgerMetadata

ErrorT = TypeVar("ErrorT", bound=BaseException)


@asynccontextmanager
async def client_on(cluster: LocalCluster, **config: Any) -> AsyncIterator[Client]:
    """A client whose node channels are the cluster's in-process ones (with faults),
    its metadata config the harness's (replication_support) unless `config` has one."""
    config.setdefault("metadata", harness_metadata_config())

    @asynccontextmanager
    async def open_channel(address: str) -> AsyncIterator[NodeChannel]:
        yield await cluster.channel_for(address)

    async with connect(
        cluster.store.url,
        ClientConfig(**config),
        open_channel=open_channel,
        rng=random.Random(7),
    ) as client:
        yield client


async def payload_on(
    cluster: LocalCluster, address: str, ledger_id: int, entry_id: int
) -> bytes | None:
    """The application payload node `address` stores for the entry, or None."""
    try:
        data = await cluster.nodes[address].read_entry(ledger_id, entry_id)
    except (NoSuchEntry, NoSuchLedger):
        return None
    try:
        token = (await cluster.store.read_ledger(ledger_id)).value.token
    except NoSuchLedgerMetadata:  # deleted: what the node keeps, unchecked
        return bytes(data[HEADER_BYTES:])
    return decode_entry(ledger_id, entry_id, data, token=token).payload


async def holders(cluster: LocalCluster, ledger_id: int, entry_id: int) -> set[str]:
    """The addresses of the nodes that store the entry."""
    found = set()
    for address in list(cluster.nodes):
        if await payload_on(cluster, address, ledger_id, entry_id) is not None:
            found.add(address)
    return found


async def append_all(ledger: LedgerWriter, count: int, first: int = 0) -> list[int]:
    """Append `first..first+count-1` (as b"entry <k>") from one task each; the ids
    the writer gave them, sorted."""
    ids: list[int] = []

    async def one(k: int) -> None:
        ids.append(await ledger.append(b"entry %d" % k))

    async with trio.open_nursery() as nursery:
        for k in range(first, first + count):
            nursery.start_soon(one, k)
    return sorted(ids)


def start_failing_appends(
    nursery: trio.Nursery,
    ledger: LedgerWriter,
    count: int,
    error_type: type[ErrorT],
    label: bytes = b"entry",
) -> list[ErrorT]:
    """Start `count` appends in `nursery`, each of which must fail with `error_type`;
    the list their errors land in as they fail. An append acknowledged, or failing
    otherwise, fails the nursery."""
    errors: list[ErrorT] = []

    async def one(k: int) -> None:
        try:
            entry_id = await ledger.append(b"%s %d" % (label, k))
        except error_type as error:
            errors.append(error)
        else:
            raise AssertionError(
                f"append {k} of ledger {ledger.ledger_id} was acknowledged as entry "
                f"{entry_id}; the test expected {error_type.__name__}"
            )

    for k in range(count):
        nursery.start_soon(one, k)
    return errors


async def failing_appends(
    ledger: LedgerWriter, count: int, error_type: type[ErrorT], label: bytes = b"entry"
) -> list[ErrorT]:
    """`start_failing_appends` in a nursery of its own: every error, once all failed."""
    async with trio.open_nursery() as nursery:
        errors = start_failing_appends(nursery, ledger, count, error_type, label)
    return errors
