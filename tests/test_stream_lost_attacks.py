"""Ways a live segment's ledger could look deleted to a takeover (docs/streams.md,
"Lost segments"), each tried on an in-process cluster: a segment is LOST only when
its ledger was deleted outside the stream, never because of the stream's own
writer, a store that did not answer, or a node that does not hold the ledger."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from replication_support import local_cluster
from test_stream_lost_segments import rolled_and_stopped
from writer_support import client_on

from pora import Position
from pora.meta.errors import MetadataTimeout
from pora.meta.records import Versioned
from pora.streams import writer as writer_module
from pora.streams.document import StreamDocument
from pora.streams.ledger_client import LedgerClient
from pora.streams.records import StreamRecord
from pora.streams.stream import Stream

#: segments roll past this many payload bytes
SMALL = 64 * 1024


async def read_all(stream: Stream) -> list[tuple[Position, bytes]]:
    return [item async for item in stream.read()]


def lose_reply_and_next_read(
    monkeypatch: pytest.MonkeyPatch, when: Callable[[StreamDocument], bool]
) -> list[int]:
    """The first document write for which `when` holds takes, but its reply is lost
    (MetadataTimeout) and so is the writer's re-read right after (the store
    unreachable for a moment): the writer cannot tell whether its write took. The
    list gets that write's next_seq."""
    write, read = StreamRecord.write, StreamRecord.read
    lost: list[int] = []
    failing_reads = [0]

    async def write_then_time_out(
        self: StreamRecord, doc: StreamDocument, expected_version: int
    ) -> Versioned[StreamDocument]:
        written = await write(self, doc, expected_version)
        if when(doc) and not lost:
            lost.append(doc.next_seq)
            failing_reads[0] = 1
            raise MetadataTimeout("test:", "no answer", "the reply was lost")
        return written

    async def read_or_time_out(self: StreamRecord) -> Versioned[StreamDocument]:
        if failing_reads[0]:
            failing_reads[0] -= 1
            raise MetadataTimeout("test:", "no answer", "the store is unreachable")
        return await read(self)

    monkeypatch.setattr(StreamRecord, "write", write_then_time_out)
    monkeypatch.setattr(StreamRecord, "read", read_or_time_out)
    return lost


async def test_a_takeover_unsure_its_segment_was_added_leaves_no_lost_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The takeover's compare-and-set adding its segment takes, but the writer cannot
    tell: it fails to open without deleting the ledger the document may name, and the
    next writer finds that segment empty, not LOST."""
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("unsure")
        async with stream.open_writer() as writer:
            await writer.append(b"kept")
        lost = lose_reply_and_next_read(monkeypatch, lambda doc: doc.writer_segment == 1)
        with pytest.raises(MetadataTimeout):
            async with stream.open_writer():
                pass
        assert lost == [2]
        monkeypatch.undo()
        async with stream.open_writer() as writer:
            assert await writer.append(b"later") == Position(2, 0)
        assert not any(segment.lost for segment in (await stream.info()).segments)
        assert await read_all(stream) == [(Position(0, 0), b"kept"), (Position(2, 0), b"later")]


async def test_a_rollover_unsure_its_segment_was_added_leaves_no_lost_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rollover's compare-and-set takes but the writer cannot tell: the appends
    to the next segment fail and the writer ends, without deleting the ledger the
    document names; the next writer recovers that segment (not LOST) and every
    acknowledged entry reads back."""
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("rolling", segment_bytes_max=SMALL)
        payload = b"x" * 4096
        acknowledged: list[Position] = []
        lost = lose_reply_and_next_read(monkeypatch, lambda doc: doc.writer_segment == 1)
        with pytest.raises(MetadataTimeout):
            async with stream.open_writer() as writer:
                for _ in range(100):
                    acknowledged.append(await writer.append(payload))
        assert lost == [2] and acknowledged and acknowledged[-1].segment == 0
        monkeypatch.undo()
        async with stream.open_writer() as writer:
            after = await writer.append(b"later")
        segments = (await stream.info()).segments
        assert not any(segment.lost for segment in segments)
        read = dict(await read_all(stream))
        assert [read[position] for position in acknowledged] == [payload] * len(acknowledged)
        assert read[after] == b"later"


async def test_a_transaction_segment_unsure_it_was_recorded_does_not_block_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`open_segment`'s compare-and-set records the segment but the process cannot
    tell: its ledger is kept (closed, empty), so the transaction that names it still
    commits, with what the other segments hold."""
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("txn")
        txn = stream.begin()
        await txn.begin()
        await (await txn.open_segment()).append(b"first")
        lost = lose_reply_and_next_read(
            monkeypatch, lambda doc: sum(len(t.segments) for t in doc.transactions) == 2
        )
        with pytest.raises(MetadataTimeout):
            await txn.open_segment()
        assert lost
        monkeypatch.undo()
        await (await txn.open_segment()).append(b"third")
        assert await txn.commit() == 1
        assert [payload for _, payload in await read_all(stream)] == [b"first", b"third"]
        assert not any(segment.lost for segment in (await stream.info()).segments)


async def test_a_truncation_during_the_takeover_neither_fails_it_nor_loses_a_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that rolled over and stopped before closing its old segment's ledger;
    the next takeover, about to recover that ledger, races a truncation that removes
    the segment and deletes the ledger: the takeover goes on (the segment is
    truncated, not LOST) and what the stream holds reads back."""
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("rolled")
        old = await rolled_and_stopped(client, "rolled")
        recover = writer_module.recover_segment_ledger

        async def truncated_first(client_: LedgerClient, ledger_id: int) -> tuple[int, int]:
            if ledger_id == old.ledger_id:
                assert await stream.truncate(Position(1, 0)) == Position(1, 0)
            return await recover(client_, ledger_id)

        monkeypatch.setattr(writer_module, "recover_segment_ledger", truncated_first)
        async with stream.open_writer() as writer:
            assert await writer.append(b"after") == Position(2, 0)
        monkeypatch.undo()
        assert not any(segment.lost for segment in (await stream.info()).segments)
        assert await read_all(stream) == [(Position(1, 0), b"kept"), (Position(2, 0), b"after")]
