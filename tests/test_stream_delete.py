"""`delete_stream` stops the stream's writers before it returns (docs/streams.md,
"Deleting a stream"), on an in-process cluster (real nodes, real files, a real SQLite
store): once it returns, no append of any writer is acknowledged; a delete that cannot
fence a writer's ledger fails, leaving the stream marked (gone for every client), and
a retry finishes it."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from cli_support import run_cli
from replication_support import FaultyChannel, LocalCluster, harness_metadata_config, local_cluster
from waiting import wait_until
from writer_support import client_on

import pora
from netio.errors import ConnectionLost
from pora.client.node_channel import NodeChannel
from pora.client.replication.client import Client, connect
from pora.client.replication.config import ClientConfig
from pora.meta import open_metadata
from pora.meta.errors import InvalidMetadata
from pora.streams.document import (
    SEGMENT_BYTES_MIN,
    STREAMS_SPACE,
    StreamConfig,
    decode_document,
    encode_document,
    mark_deleting,
    new_stream,
)
from pora.streams.orphans import ledger_stream
from pora.streams.writer import StreamWriter

Capsys = pytest.CaptureFixture[str]
#: payloads of 4 KiB roll a 64 KiB segment every 16 appends
PAYLOAD = b"x" * 4096


class CutOffChannel(FaultyChannel):
    """The cluster's channel as one client sees it: the addresses in `cut` are
    unreachable from this client only (a one-sided partition), the others as usual."""

    def __init__(self, cluster: LocalCluster, address: str, cut: set[str]) -> None:
        super().__init__(cluster, address)
        self._cut = cut

    async def _inner(self) -> Any:
        if self.address in self._cut:
            await trio.lowlevel.checkpoint()
            raise ConnectionLost(f"node {self.address} is cut off from this client (test)")
        return await super()._inner()


@asynccontextmanager
async def cut_off_client(cluster: LocalCluster, cut: set[str]) -> AsyncIterator[Client]:
    """A client that cannot reach the nodes in `cut` (changed as the test goes) while
    every other client can; it gives up a fence after 0.5 s."""

    @asynccontextmanager
    async def open_channel(address: str) -> AsyncIterator[NodeChannel]:
        yield CutOffChannel(cluster, address, cut)

    config = ClientConfig(metadata=harness_metadata_config(), recovery_fence_timeout_s=0.5)
    async with connect(
        cluster.store.url, config, open_channel=open_channel, rng=random.Random(3)
    ) as client:
        yield client


@dataclass
class Appenders:
    """Tasks appending to one writer until each fails: the positions acknowledged
    before and after the delete returned (`returned` set by the test), and each
    task's error."""

    payload: bytes
    acks: list[pora.Position] = field(default_factory=list)
    late: list[pora.Position] = field(default_factory=list)
    endings: list[BaseException] = field(default_factory=list)
    returned: bool = False

    async def append_until_it_fails(self, writer: StreamWriter) -> None:
        while True:
            try:
                position = await writer.append(self.payload)
            except pora.PoraError as error:
                self.endings.append(error)
                return
            (self.late if self.returned else self.acks).append(position)

    def segments(self) -> int:
        return len({position.segment for position in self.acks})


async def ledgers_of(client: Client, name: str) -> list[int]:
    return [
        ledger.ledger_id async for ledger in client.list_ledgers() if ledger_stream(ledger) == name
    ]


@asynccontextmanager
async def writer_and_deleter(
    tmp_path: Path,
) -> AsyncIterator[tuple[LocalCluster, Client, Client, set[str]]]:
    """Three nodes, a client for the writer, and a deleting client cut off from the
    nodes in the set (empty at first; the test changes it)."""
    cut: set[str] = set()
    async with (
        local_cluster(tmp_path) as cluster,
        client_on(cluster) as writing,
        cut_off_client(cluster, cut) as deleting,
    ):
        yield cluster, writing, deleting, cut


def test_the_delete_mark_round_trips_and_a_document_without_it_is_not_marked() -> None:
    doc = new_stream("events", StreamConfig(), 1)
    assert not decode_document(encode_document(doc)).deleting
    assert b"deleting" not in encode_document(doc)  # a document never marked lacks the key
    marked = mark_deleting(doc)
    assert decode_document(encode_document(marked)) == marked
    assert marked.deleting and marked.commit == doc.commit  # no visible change
    raw = json.loads(encode_document(doc))
    raw["deleting"] = "yes"
    with pytest.raises(InvalidMetadata, match="deleting"):
        decode_document(json.dumps(raw).encode())


async def test_a_delete_that_cannot_fence_the_writer_fails_and_a_retry_finishes(
    tmp_path: Path,
) -> None:
    """The deleting client cannot reach two of the OPEN segment's three members (Qw=3,
    Qa=2: a fence needs two) while the writer reaches all: the delete raises
    StreamDeleteFailed naming the stream and segment, and the stream is gone for
    every client; the retry, once the members are reachable, returns, and no append
    started after it is acknowledged."""
    async with writer_and_deleter(tmp_path) as (cluster, writing, deleting, cut):
        stream = await writing.create_stream("events")
        async with stream.open_writer() as writer:
            await writer.append(b"before")
            cut.update(cluster.addresses[:2])
            with pytest.raises(pora.StreamDeleteFailed) as failed:
                await deleting.delete_stream("events")
            assert isinstance(failed.value, pora.DeleteFailed)
            assert "stream 'events'" in str(failed.value) and "segment 0" in str(failed.value)
            assert "call delete_stream again" in str(failed.value)
            # marked: gone for every client, its name not free
            for client in (writing, deleting):
                with pytest.raises(pora.NoSuchStream):
                    await client.open_stream("events")
                assert [info.name async for info in client.list_streams()] == []
            with pytest.raises(pora.NoSuchStream):
                await stream.info()
            with pytest.raises(pora.NoSuchStream):
                [item async for item in stream.read()]
            with pytest.raises(pora.StreamDeleting, match=r"call client\.delete_stream"):
                await writing.create_stream("events")
            # (until the retry returns the writer may still be acknowledged: the fenced
            # member's FENCED answer, R13, can come after the other two acknowledged)

            cut.clear()
            await deleting.delete_stream("events")  # the retry finishes it
            with pytest.raises(pora.NoSuchStream):
                await writer.append(b"after the delete")
        # leaving the writer's block is quiet; nothing of the stream is left
        assert await ledgers_of(writing, "events") == []
        with pytest.raises(pora.NoSuchStream):
            await deleting.delete_stream("events")
        await writing.create_stream("events")  # the name is free again


async def test_a_writer_whose_delete_failed_is_stopped_by_the_retry(tmp_path: Path) -> None:
    """Cut off from every member, the delete fences none of them: the writer goes on
    being acknowledged into the marked stream (nothing reads it) until the retry,
    after which no append started is acknowledged and each ends with NoSuchStream."""
    async with writer_and_deleter(tmp_path) as (cluster, writing, deleting, cut):
        stream = await writing.create_stream("events")
        tasks = Appenders(b"payload")
        async with stream.open_writer() as writer, trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(tasks.append_until_it_fails, writer)
            await wait_until(lambda: len(tasks.acks) >= 50, 30)
            cut.update(cluster.addresses)
            with pytest.raises(pora.StreamDeleteFailed):
                await deleting.delete_stream("events")
            count = len(tasks.acks)
            await wait_until(lambda: len(tasks.acks) >= count + 50, 30)  # still acknowledged
            cut.clear()
            await deleting.delete_stream("events")
            tasks.returned = True
            await wait_until(lambda: len(tasks.endings) == 8, 30)
        assert tasks.late == []
        assert all(isinstance(e, pora.NoSuchStream) for e in tasks.endings), tasks.endings


@pytest.mark.parametrize("seed", range(6))
async def test_a_delete_racing_rollovers_leaves_no_acknowledgement_after_it(
    tmp_path: Path, seed: int
) -> None:
    """Appends roll a 64 KiB segment every 16 entries while the delete runs: whether
    its mark lands before or after a rollover's compare-and-set, no append started
    after it returned is acknowledged, every appending task ends with NoSuchStream,
    and no ledger of the stream is left (the spare a failed rollover made included)."""
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("rolling", segment_bytes_max=SEGMENT_BYTES_MIN)
        tasks = Appenders(PAYLOAD)
        async with stream.open_writer() as writer, trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(tasks.append_until_it_fails, writer)
            await wait_until(lambda: tasks.segments() >= 2, 30)
            # then a different point of the rollover cycle for each seed
            count = len(tasks.acks)
            await wait_until(lambda: len(tasks.acks) >= count + 3 * seed, 30)
            await client.delete_stream("rolling")
            tasks.returned = True
            await wait_until(lambda: len(tasks.endings) == 6, 30)
        assert tasks.late == []
        assert all(isinstance(e, pora.NoSuchStream) for e in tasks.endings), tasks.endings
        assert await ledgers_of(client, "rolling") == []


def test_the_cli_lists_an_unfinished_delete_and_finishes_it(tmp_path: Path, capsys: Capsys) -> None:
    """A stream a delete marked and did not finish shows as DELETING in `pora stream
    list` and `show`, and `pora stream delete` finishes it."""
    url = f"sqlite:///{tmp_path}/meta.db"

    async def leave_a_marked_stream() -> None:
        async with open_metadata(url) as store:
            marked = mark_deleting(new_stream("events", StreamConfig(), 1))
            await store.create_document(STREAMS_SPACE, "events", encode_document(marked))

    trio.run(leave_a_marked_stream)
    listing = run_cli(capsys, "stream", "list", "--metadata", url, "--json")
    assert [row["state"] for row in listing.json()["streams"]] == ["DELETING"]
    shown = run_cli(capsys, "stream", "show", "events", "--metadata", url, "--json")
    assert shown.json()["state"] == "DELETING"
    deleted = run_cli(capsys, "stream", "delete", "events", "--metadata", url)
    assert deleted.status == 0, deleted.err
    assert run_cli(capsys, "stream", "list", "--metadata", url, "--json").json() == {"streams": []}
    again = run_cli(capsys, "stream", "delete", "events", "--metadata", url)
    assert again.status == 2 and "does not exist" in again.err


async def test_a_delete_fences_a_pending_transactions_segments(tmp_path: Path) -> None:
    """A pending transaction's segments take appends until the delete fences them: its
    appends after the delete fail with LedgerDeleted and its commit with NoSuchStream;
    none of its ledgers is left."""
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events")
        txn = stream.begin()
        await txn.begin()
        segment = await txn.open_segment()
        await segment.append(b"pending")
        await client.delete_stream("events")
        with pytest.raises(pora.LedgerDeleted):
            await segment.append(b"after the delete")
        with pytest.raises(pora.NoSuchStream):
            await txn.commit()
        assert await ledgers_of(client, "events") == []
