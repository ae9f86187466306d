"""Stream transactions on an in-process cluster (SQLite metadata): a commit makes all
of a transaction's segments visible at once; abort deletes its ledgers; commit keys
and app versions apply a commit once, also when retried after a lost reply and when
two clients race; resume from another client; reads as of a commit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
from replication_support import local_cluster
from writer_support import client_on

import pora
import pora.streams.transaction
from pora import Position
from pora.client.replication.client import Client
from pora.meta.errors import MetadataTimeout
from pora.meta.records import Versioned
from pora.streams.document import StreamConfig, StreamDocument, encode_document, new_stream
from pora.streams.records import StreamRecord
from pora.streams.stream import Stream
from pora.streams.transaction_fields import CommitKey, commit_key_digest
from pora.streams.writer import recover_segment_ledger

SMALL = 64 * 1024


async def read_all(stream: Stream, **kwargs: object) -> list[tuple[Position, bytes]]:
    return [item async for item in stream.read(**kwargs)]  # type: ignore[arg-type]


async def pending_with(stream: Stream, payload: bytes) -> pora.Transaction:
    """A begun transaction with one segment holding `payload`."""
    txn = stream.begin()
    await txn.begin()
    await (await txn.open_segment()).append(payload)
    return txn


async def test_commit_makes_every_segment_visible_at_once(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        async with stream.begin() as txn:
            first = await txn.open_segment()
            second = await txn.open_segment()
            assert await first.append(b"a0") == 0
            assert await first.append_many([b"a1", b"a2"]) == [1, 2]
            assert await second.append(b"b0") == 0
            assert await read_all(stream) == []  # pending: durable, invisible
            info = await stream.info()
            assert info.commit == 0 and info.segments == ()
        info = await stream.info()
        assert info.commit == 1
        assert [s.commit for s in info.segments] == [1, 1]
        assert await read_all(stream) == [
            (Position(0, 0), b"a0"),
            (Position(0, 1), b"a1"),
            (Position(0, 2), b"a2"),
            (Position(1, 0), b"b0"),
        ]
        with pytest.raises(pora.TransactionAborted, match="was committed"):
            await txn.open_segment()


async def test_commit_in_a_given_order_and_as_of_commit(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        txn = stream.begin()
        await txn.begin()
        a = await txn.open_segment()
        b = await txn.open_segment()
        await a.append(b"a")
        await b.append(b"b")
        with pytest.raises(pora.InvalidArgument, match="each of the transaction's segments"):
            await txn.commit(order=[a.ledger_id])
        assert await txn.commit(order=[b.ledger_id, a.ledger_id]) == 1
        async with stream.open_writer() as writer:
            assert await writer.append(b"live") == Position(2, 0)
        assert [p for _, p in await read_all(stream)] == [b"b", b"a", b"live"]
        assert [p for _, p in await read_all(stream, as_of_commit=1)] == [b"b", b"a"]
        assert await read_all(stream, as_of_commit=0) == []
        with pytest.raises(pora.InvalidArgument, match="past stream"):
            await read_all(stream, as_of_commit=99)


async def test_abort_deletes_the_ledgers(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        with pytest.raises(RuntimeError, match="job failed"):
            async with stream.begin() as txn:
                segment = await txn.open_segment()
                await segment.append(b"x")
                raise RuntimeError("job failed")
        with pytest.raises(pora.NoSuchLedger):
            await client.open_ledger(segment.ledger_id, recover=False)
        with pytest.raises(pora.TransactionAborted):
            await segment.append(b"y")
        with pytest.raises(pora.TransactionAborted):
            await txn.commit()
        with pytest.raises(pora.TransactionAborted):
            await stream.resume(txn.id)
        assert (await stream.info()).commit == 0
        assert await read_all(stream) == []


async def test_a_key_applies_once_also_after_a_lost_reply(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        async with stream.begin() as txn:
            await (await txn.open_segment()).append(b"one")
            assert await txn.commit(key="job-17") == 1
        # the same job again: a skipped write is not an error; nothing changes
        async with stream.begin() as again:
            segment = await again.open_segment()
            await segment.append(b"one, again")
            assert await again.commit(key="job-17") == 1
        with pytest.raises(pora.NoSuchLedger):
            await client.open_ledger(segment.ledger_id, recover=False)
        assert [p for _, p in await read_all(stream)] == [b"one"]
        # a lost reply: the CAS took, the caller retries from a resumed transaction
        txn = await pending_with(stream, b"two")
        retry = await stream.resume(txn.id)
        assert await txn.commit(key="job-18") == 2
        assert await retry.commit(key="job-18") == 2
        # without a key, a transaction gone is an error
        with pytest.raises(pora.TransactionAborted, match="no commit of it is recorded"):
            await (pora.Transaction(client, StreamRecord(client.store, "events"), txn.id)).commit()
        assert [p for _, p in await read_all(stream)] == [b"one", b"two"]


async def test_app_versions_apply_only_above_the_last(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        for version, payload, expected in [
            (3, b"v3", 1),
            (3, b"v3 again", 1),
            (2, b"v2", 1),
            (4, b"v4", 2),
        ]:
            async with stream.begin() as txn:
                await (await txn.open_segment()).append(payload)
                assert await txn.commit(app_id="spark-q1", version=version) == expected
        assert [p for _, p in await read_all(stream)] == [b"v3", b"v4"]
        with pytest.raises(pora.InvalidArgument, match="together"):
            await stream.begin().commit(app_id="spark-q1")


async def test_two_clients_racing_with_one_key(tmp_path: Path) -> None:
    async with (
        local_cluster(tmp_path) as cluster,
        client_on(cluster) as one,
        client_on(cluster) as two,
    ):
        await one.create_stream("events", segment_bytes_max=SMALL)
        txns = []
        for client, payload in [(one, b"one"), (two, b"two")]:
            txn = (await client.open_stream("events")).begin()
            await txn.begin()
            await (await txn.open_segment()).append(payload)
            txns.append(txn)
        results: list[int] = []

        async def commit(txn: pora.Transaction) -> None:
            results.append(await txn.commit(key="k"))

        async with anyio.create_task_group() as group:
            for txn in txns:
                group.start_soon(commit, txn)
        assert results == [1, 1]
        stream = await one.open_stream("events")
        payloads = [p for _, p in await read_all(stream)]
        assert payloads in ([b"one"], [b"two"])
        assert (await stream.info()).commit == 1


async def test_resume_from_another_client_and_collect_abandoned(tmp_path: Path) -> None:
    async with (
        local_cluster(tmp_path) as cluster,
        client_on(cluster) as one,
        client_on(cluster) as two,
    ):
        stream_one = await one.create_stream("events", segment_bytes_max=SMALL)
        txn = await pending_with(stream_one, b"from one")
        stream_two = await two.open_stream("events")
        resumed = await stream_two.resume(txn.id)
        await (await resumed.open_segment()).append(b"from two")
        assert await resumed.commit() == 1  # recovers the segment one still has open
        assert [p for _, p in await read_all(stream_two)] == [b"from one", b"from two"]

        idle = stream_one.begin()
        await idle.begin()
        await idle.open_segment()
        assert await stream_one.collect_abandoned_transactions(idle_s=3600) == []
        assert await stream_one.collect_abandoned_transactions(idle_s=0) == [idle.id]
        with pytest.raises(pora.TransactionAborted):
            await idle.commit()


async def test_a_commit_while_a_live_segment_is_open(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        async with stream.open_writer() as writer:
            assert await writer.append(b"live 0") == Position(0, 0)
            async with stream.begin() as txn:
                await (await txn.open_segment()).append(b"txn")
            assert await writer.append(b"live 1") == Position(0, 1)
            # segments after an OPEN one are read once it closes: position order (the
            # open segment is read up to the LAC its nodes know, which may trail)
            seen = [p for _, p in await read_all(stream)]
            assert seen in ([b"live 0"], [b"live 0", b"live 1"])
        assert [p for _, p in await read_all(stream)] == [b"live 0", b"live 1", b"txn"]
        async with stream.open_writer() as writer:
            assert await writer.append(b"live 2") == Position(2, 0)


async def test_a_rollover_after_a_commit_acknowledges_where_the_entries_are(
    tmp_path: Path,
) -> None:
    """A commit while the live segment is OPEN takes the next seq: the writer's next
    segment comes after it, and the positions the writer returns say so."""
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        payloads = [bytes([i]) * (SMALL // 4) for i in range(8)]
        async with stream.open_writer() as writer:
            positions = [await writer.append(payloads[0])]
            async with stream.begin() as txn:
                await (await txn.open_segment()).append(b"txn")
            positions += [await writer.append(payload) for payload in payloads[1:]]
        assert positions[0].segment == 0 and positions[-1].segment >= 2
        assert Position(1, 0) not in positions  # the commit's segment
        read = dict(await read_all(stream))
        assert read[Position(1, 0)] == b"txn"
        assert [read[position] for position in positions] == payloads


def lose_one_reply(
    monkeypatch: pytest.MonkeyPatch, when: Callable[[StreamDocument], bool]
) -> list[int]:
    """From now on the first document write for which `when` holds takes, but its
    reply is lost (MetadataTimeout); the list gets that write's commit number."""
    write = StreamRecord.write
    lost: list[int] = []

    async def write_then_time_out(
        self: StreamRecord, doc: StreamDocument, expected_version: int
    ) -> Versioned[StreamDocument]:
        written = await write(self, doc, expected_version)
        if when(doc) and not lost:
            lost.append(doc.commit)
            raise MetadataTimeout("test:", "no answer", "the reply was lost")
        return written

    monkeypatch.setattr(StreamRecord, "write", write_then_time_out)
    return lost


async def test_a_commit_without_key_whose_reply_is_lost_is_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committer re-reads, finds its transaction gone and its segments visible:
    the commit applied (not TransactionAborted)."""
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        txn = await pending_with(stream, b"keyless")
        lost = lose_one_reply(monkeypatch, lambda doc: doc.commit == 1)
        assert await txn.commit() == 1
        assert lost == [1]
        assert [p for _, p in await read_all(stream)] == [b"keyless"]


async def test_ten_thousand_keys_keep_the_document_bounded(tmp_path: Path) -> None:
    doc = new_stream("events", StreamConfig(), 0)
    doc = replace(
        doc,
        commit=10_000,
        commit_keys=tuple(
            CommitKey(commit_key_digest(f"job-{i}" * 50), i + 1) for i in range(10_000)
        ),
    )
    assert len(encode_document(doc)) < 300_000


async def test_a_commit_whose_reply_is_lost_reports_success_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit's CAS takes but the store's answer times out: the committer re-reads,
    finds its key recorded and its transaction gone, and returns the commit number."""
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        lost = lose_one_reply(monkeypatch, lambda doc: bool(doc.commit_keys))
        async with stream.begin() as txn:
            await (await txn.open_segment()).append(b"once")
            assert await txn.commit(key="batch-1") == 1
        assert lost == [1]
        info = await stream.info()
        assert (info.commit, len(info.segments)) == (1, 1)
        assert [p for _, p in await read_all(stream)] == [b"once"]


async def test_a_subscriber_sees_whole_commits_only(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        commits, per_segment = 5, 3
        expected = [
            f"{c}.{s}.{e}".encode()
            for c in range(commits)
            for s in range(2)
            for e in range(per_segment)
        ]
        seen: list[bytes] = []
        snapshots: list[int] = []

        async def subscribe() -> None:
            async for _, payload in stream.subscribe():
                seen.append(payload)
                if len(seen) == len(expected):
                    return

        async def check_snapshots() -> None:
            # every read of the stream holds whole commits: a multiple of one commit
            while len(seen) < len(expected):
                snapshots.append(len(await read_all(stream)))
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as group:
            group.start_soon(subscribe)
            group.start_soon(check_snapshots)
            for c in range(commits):
                async with stream.begin() as txn:
                    for s in range(2):
                        segment = await txn.open_segment()
                        await segment.append_many(
                            [f"{c}.{s}.{e}".encode() for e in range(per_segment)]
                        )
        assert seen == expected
        assert all(n % (2 * per_segment) == 0 for n in snapshots)


async def test_sealed_and_deleted_streams(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        txn = stream.begin()
        await txn.begin()
        segment = await txn.open_segment()
        await segment.append(b"x")
        await stream.seal()
        with pytest.raises(pora.StreamSealed):
            await txn.commit()
        with pytest.raises(pora.StreamSealed):
            await stream.begin().begin()
        await client.delete_stream("events")  # a pending transaction's ledgers go too
        with pytest.raises(pora.NoSuchLedger):
            await client.open_ledger(segment.ledger_id, recover=False)


async def test_bad_arguments(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        with pytest.raises(pora.InvalidArgument, match="not a transaction id"):
            await stream.resume("job-17")
        with pytest.raises(pora.InvalidArgumentType, match="transaction id must be a str"):
            await stream.resume(17)  # type: ignore[arg-type]
        with pytest.raises(pora.TransactionAborted, match="is not pending"):
            await stream.resume("0" * 32)
        txn = stream.begin()
        with pytest.raises(pora.InvalidArgumentType, match="commit key must be a str"):
            await txn.commit(key=17)  # type: ignore[arg-type]
        with pytest.raises(pora.InvalidArgument, match="1 to 1024 characters"):
            await txn.commit(key="")
        with pytest.raises(pora.InvalidArgumentType, match="version must be an int"):
            await txn.commit(app_id="a", version="3")  # type: ignore[arg-type]
        with pytest.raises(pora.InvalidArgumentType, match="as_of_commit"):
            stream.read(as_of_commit="1")  # type: ignore[arg-type]
        with pytest.raises(pora.InvalidArgument, match="commit_keys_max"):
            StreamConfig(commit_keys_max=0)
        with pytest.raises(pora.InvalidArgument, match="txn_idle_s_max"):
            StreamConfig(txn_idle_s_max=-1)


async def test_a_segment_opened_elsewhere_during_a_commit_is_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        local_cluster(tmp_path) as cluster,
        client_on(cluster) as one,
        client_on(cluster) as two,
    ):
        stream = await one.create_stream("events", segment_bytes_max=SMALL)
        txn = await pending_with(stream, b"first")
        elsewhere = await (await two.open_stream("events")).resume(txn.id)
        recover = recover_segment_ledger
        opened: list[int] = []

        async def recover_while_another_opens(client: Client, ledger_id: int) -> tuple[int, int]:
            if not opened:  # the commit is under way: another process adds a segment
                segment = await elsewhere.open_segment()
                await segment.append(b"late")
                opened.append(segment.ledger_id)
            return await recover(client, ledger_id)

        monkeypatch.setattr(
            pora.streams.transaction, "recover_segment_ledger", recover_while_another_opens
        )
        assert await txn.commit() == 1
        assert [p for _, p in await read_all(stream)] == [b"first", b"late"]


async def test_aborting_a_transaction_committed_elsewhere_deletes_nothing(
    tmp_path: Path,
) -> None:
    async with (
        local_cluster(tmp_path) as cluster,
        client_on(cluster) as one,
        client_on(cluster) as two,
    ):
        stream = await one.create_stream("events", segment_bytes_max=SMALL)
        with pytest.raises(RuntimeError, match="late failure"):
            async with stream.begin() as txn:
                await (await txn.open_segment()).append(b"kept")
                resumed = await (await two.open_stream("events")).resume(txn.id)
                assert await resumed.commit() == 1
                raise RuntimeError("late failure")  # the block aborts: nothing to abort
        assert [p for _, p in await read_all(stream)] == [b"kept"]
