"""What a stream offers the writers that cooperate on it without talking to each
other (the Spark pipeline's tasks and driver): attributes changed by compare-and-set
on expected values, a transaction begun under an id the cooperating processes derive,
segments tagged with who wrote them, and a commit of some of a transaction's
segments that drops (and deletes) the others."""

from __future__ import annotations

from pathlib import Path

import pytest
from replication_support import local_cluster
from writer_support import client_on

import pora
from pora import Position
from pora.streams.document import decode_document, encode_document
from pora.streams.stream import Stream
from pora.streams.stream_attributes import ATTRIBUTES_BYTES_MAX

SMALL = 64 * 1024


async def read_all(stream: Stream) -> list[tuple[Position, bytes]]:
    return [item async for item in stream.read()]


async def test_attributes_change_only_as_expected(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        assert await stream.attributes() == {}
        after = await stream.set_attributes({"schema": "v1"}, expected={"schema": None})
        assert after == {"schema": "v1"}
        with pytest.raises(pora.AttributesChanged) as raised:
            await stream.set_attributes({"schema": "v2"}, expected={"schema": None})
        assert raised.value.key == "schema" and raised.value.current == "v1"
        assert "another writer" in str(raised.value)
        assert await stream.attributes() == {"schema": "v1"}
        await stream.set_attributes({"schema": "v2", "owner": "etl"}, expected={"schema": "v1"})
        reopened = await client.open_stream("events")
        assert await reopened.attributes() == {"owner": "etl", "schema": "v2"}
        await stream.set_attributes({"owner": None})
        assert await stream.attributes() == {"schema": "v2"}


async def test_attributes_are_bounded_and_typed(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        with pytest.raises(pora.InvalidArgument, match="over the"):
            await stream.set_attributes({"big": "x" * (ATTRIBUTES_BYTES_MAX + 1)})
        with pytest.raises(pora.InvalidArgumentType):
            await stream.set_attributes({"n": 1})  # type: ignore[dict-item]
        with pytest.raises(pora.InvalidArgument):
            await stream.set_attributes({"": "empty key"})
        assert await stream.attributes() == {}


def test_a_document_with_attributes_round_trips() -> None:
    from dataclasses import replace  # noqa: PLC0415

    from pora.streams.document import StreamConfig, new_stream  # noqa: PLC0415

    doc = replace(new_stream("s", StreamConfig(), 0), attributes=(("a", "1"), ("b", "2")))
    assert decode_document(encode_document(doc)) == doc
    bare = new_stream("s", StreamConfig(), 0)
    assert b"attributes" not in encode_document(bare)  # documents without stay as they were


async def test_a_transaction_begun_under_a_chosen_id_is_joined(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        txn_id = "ab" * 16
        one = stream.begin(txn_id)
        two = stream.begin(txn_id)
        await one.begin()
        await two.begin()  # joins: still one pending transaction
        assert [t.id for t in (await stream.info()).transactions] == [txn_id]
        await (await one.open_segment()).append(b"from one")
        await (await two.open_segment()).append(b"from two")
        await one.commit(key="job")
        assert sorted(p for _, p in await read_all(stream)) == [b"from one", b"from two"]
        with pytest.raises(pora.InvalidArgument):
            stream.begin("not-an-id")


async def test_a_commit_of_some_segments_drops_and_deletes_the_others(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        txn = stream.begin()
        await txn.begin()
        winner = await txn.open_segment(tags={"job": "j1", "partition": "0", "attempt": "1"})
        loser = await txn.open_segment(tags={"job": "j1", "partition": "0", "attempt": "0"})
        await winner.append(b"won")
        await loser.append(b"lost")
        # a speculative attempt elsewhere opens one more while the commit is decided
        elsewhere = await stream.resume(txn.id)
        late = await elsewhere.open_segment()
        await late.append(b"late")
        meta = await client.store.read_ledger(winner.ledger_id)
        assert meta.value.custom["tag.attempt"] == b"1"
        await txn.commit(key="job-1", only=[winner.ledger_id])
        assert await read_all(stream) == [(Position(0, 0), b"won")]
        assert (await stream.info()).transactions == ()
        for gone in (loser.ledger_id, late.ledger_id):
            with pytest.raises(pora.NoSuchLedgerMetadata):
                await client.store.read_ledger(gone)
        with pytest.raises((pora.TransactionAborted, pora.PoraError)):
            await late.append(b"after the commit")


async def test_only_must_name_segments_of_the_transaction(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        txn = stream.begin()
        await txn.begin()
        segment = await txn.open_segment()
        with pytest.raises(pora.InvalidArgument, match="only="):
            await txn.commit(only=[segment.ledger_id + 1000])
        with pytest.raises(pora.InvalidArgument, match="only="):
            await txn.commit(only=[segment.ledger_id, segment.ledger_id])
        with pytest.raises(pora.InvalidArgument, match="tag"):
            await txn.open_segment(tags={"k": "v" * 1000})
        assert await txn.commit(only=[]) == 1  # an empty commit: nothing visible
        assert await read_all(stream) == []
