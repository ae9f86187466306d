"""Two processes committing one transaction with different choices (one with
`only`, one without; docs/streams.md, "Transactions"): whichever commit takes, the
other finds it applied and deletes no ledger that commit made visible, nor any the
stream holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from replication_support import local_cluster
from writer_support import client_on

from pora.meta.records import Versioned
from pora.streams.document import StreamDocument
from pora.streams.records import StreamRecord


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

        write = StreamRecord.write
        raced: list[int] = []
        racing = [False]

        async def full_commit_first(
            self: StreamRecord, doc: StreamDocument, expected_version: int
        ) -> Versioned[StreamDocument]:
            if doc.commit == 1 and not racing[0]:
                racing[0] = True
                raced.append(await elsewhere.commit())  # takes first: both segments
            return await write(self, doc, expected_version)

        monkeypatch.setattr(StreamRecord, "write", full_commit_first)
        assert await txn.commit(only=[one.ledger_id]) == 1
        monkeypatch.undo()
        assert raced == [1]
        assert [payload async for _, payload in stream.read()] == [b"one", b"two"]
        assert not any(segment.lost for segment in (await stream.info()).segments)
