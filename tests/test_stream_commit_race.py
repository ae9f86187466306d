"""Two processes committing one transaction with different choices (one with
`only` or `replace`, one without; docs/streams.md, "Transactions"): the plain commit
takes first, and the other committer, finding it applied, deletes no ledger the
stream still holds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from replication_support import local_cluster
from writer_support import client_on

import pora
from pora.meta.records import Versioned
from pora.streams.document import StreamDocument
from pora.streams.records import StreamRecord

WriteDocument = Callable[[StreamRecord, StreamDocument, int], Awaitable[Versioned[StreamDocument]]]


def plain_commit_first(elsewhere: pora.Transaction) -> WriteDocument:
    """A document write that, the first time one removes the transaction (a
    commit), lets `elsewhere` (the same transaction resumed by another client)
    commit it first with no options: that write then finds the version moved, and
    its committer re-reads."""
    write = StreamRecord.write
    racing = [False]

    async def racing_write(
        self: StreamRecord, doc: StreamDocument, expected_version: int
    ) -> Versioned[StreamDocument]:
        committing = all(txn.id != elsewhere.id for txn in doc.transactions)
        if committing and not racing[0]:
            racing[0] = True
            await elsewhere.commit()
        return await write(self, doc, expected_version)

    return racing_write


async def test_a_commit_with_only_that_loses_to_a_full_commit_deletes_nothing_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        local_cluster(tmp_path) as cluster,
        client_on(cluster) as client,
        client_on(cluster) as other,
    ):
        stream = await client.create_stream("race")
        txn = stream.begin()
        await txn.begin()
        one, two = await txn.open_segment(), await txn.open_segment()
        await one.append(b"one")
        await two.append(b"two")
        elsewhere = await (await other.open_stream("race")).resume(txn.id)
        monkeypatch.setattr(StreamRecord, "write", plain_commit_first(elsewhere))
        assert await txn.commit(only=[one.ledger_id]) == 1
        monkeypatch.undo()
        assert [payload async for _, payload in stream.read()] == [b"one", b"two"]
        assert not any(segment.lost for segment in (await stream.info()).segments)


async def test_a_replacing_commit_that_loses_to_a_plain_one_deletes_nothing_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The segments a replace would have removed are still visible after the plain
    commit: the replacing committer leaves their ledgers alone."""
    async with (
        local_cluster(tmp_path) as cluster,
        client_on(cluster) as client,
        client_on(cluster) as other,
    ):
        stream = await client.create_stream("kept")
        async with stream.open_writer() as writer:
            await writer.append(b"old")
        txn = stream.begin()
        await txn.begin()
        await (await txn.open_segment()).append(b"new")
        elsewhere = await (await other.open_stream("kept")).resume(txn.id)
        monkeypatch.setattr(StreamRecord, "write", plain_commit_first(elsewhere))
        committed = await txn.commit(replace=True)
        monkeypatch.undo()
        assert committed == (await stream.info()).segments[-1].commit
        assert [payload async for _, payload in stream.read()] == [b"old", b"new"]
