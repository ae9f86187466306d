"""Streams on an in-process cluster (SQLite metadata): create, open, list, delete;
a live writer rolling over many segments with a reader and a subscriber seeing every
acknowledged entry once, in order; a takeover fencing the earlier writer; seal."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from replication_support import local_cluster
from writer_support import client_on

import pora
import pora.streams.document
import pora.streams.writer
from pora import Position
from pora.client.replication.client import Client
from pora.meta.records import LedgerState
from pora.streams.document import SegmentState, StreamState
from pora.streams.records import StreamRecord
from pora.streams.stream import Stream

SMALL = 64 * 1024


async def collect(
    stream: Stream, count: int, from_: Position | None = None
) -> list[tuple[Position, bytes]]:
    seen: list[tuple[Position, bytes]] = []
    async for item in stream.subscribe(from_=from_):
        seen.append(item)
        if len(seen) == count:
            break
    return seen


async def test_create_open_list_delete(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("events", segment_bytes_max=SMALL)
        assert stream.name == "events"
        with pytest.raises(pora.StreamExists, match="'events' already exists"):
            await client.create_stream("events")
        await client.create_stream("audit.log-2")
        with pytest.raises(pora.NoSuchStream, match="'nope' does not exist"):
            await client.open_stream("nope")
        for bad in ["", ".x", "a/b", "x" * 129]:
            with pytest.raises(pora.InvalidArgument, match="stream name"):
                await client.create_stream(bad)
        with pytest.raises(pora.InvalidArgument, match="64 KiB"):
            await client.create_stream("tiny", segment_bytes_max=1024)
        with pytest.raises(pora.InvalidArgument, match="E >= Qw"):
            await client.create_stream("q", ensemble_size=2)

        opened = await client.open_stream("events")
        async with opened.open_writer() as writer:
            assert await writer.append(b"one") == Position(0, 0)
        infos = [info async for info in client.list_streams()]
        assert [info.name for info in infos] == ["audit.log-2", "events"]
        events = infos[1]
        assert events.config.segment_bytes_max == SMALL
        assert events.state is StreamState.ACTIVE
        [segment] = events.segments
        assert (segment.state, segment.last_entry_id, segment.byte_length) == (
            SegmentState.CLOSED,
            0,
            3,
        )

        await client.delete_stream("events")
        with pytest.raises(pora.NoSuchStream):
            await client.open_stream("events")
        with pytest.raises(pora.NoSuchStream):
            await client.delete_stream("events")
        with pytest.raises(pora.NoSuchLedger):  # its ledgers went with it
            await client.open_ledger(segment.ledger_id)
        assert [info.name async for info in client.list_streams()] == ["audit.log-2"]


async def test_rollover_reader_and_subscriber_see_each_entry_once(tmp_path: Path) -> None:
    count = 600
    payloads = [b"%05d" % k + bytes(1000) for k in range(count)]  # ~600 KB: ~18 segments
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("rolling", segment_bytes_max=SMALL)
        subscribed: list[tuple[Position, bytes]] = []
        positions: list[Position] = []

        async def subscribe() -> None:
            subscribed.extend(await collect(stream, count))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(subscribe)
            async with stream.open_writer() as writer:
                for k in range(0, count, 10):
                    positions.extend(await writer.append_many(payloads[k : k + 5]))
                    for payload in payloads[k + 5 : k + 10]:
                        positions.append(await writer.append(payload))
        assert positions == sorted(positions) and len(set(positions)) == count
        assert subscribed == list(zip(positions, payloads, strict=True))
        read = [item async for item in stream.read()]
        assert read == subscribed

        info = await stream.info()
        assert len(info.segments) > 8
        assert [s.seq for s in info.segments] == list(range(len(info.segments)))
        assert all(s.state is SegmentState.CLOSED for s in info.segments)
        assert info.commit == len(info.segments)
        for segment in info.segments:  # each ledger closed where the document says
            record = await client.store.read_ledger(segment.ledger_id)
            assert record.value.state is LedgerState.CLOSED
            assert record.value.last_entry_id == segment.last_entry_id
            assert segment.byte_length <= SMALL + 2 * 5 * 1005

        # ranges: from a position, up to one (exclusive), from the end
        middle = positions[count // 2]
        assert [p async for p, _ in stream.read(from_=middle, to=positions[-1])] == positions[
            count // 2 : -1
        ]
        assert [item async for item in stream.read(from_="end")] == []
        after_last = Position(positions[-1].segment, positions[-1].entry + 1)
        assert [item async for item in stream.read(from_=after_last)] == []


async def takeover(client: Client, other: Client) -> None:
    stream = await client.create_stream("taken", segment_bytes_max=SMALL)
    subscribed: list[tuple[Position, bytes]] = []
    acknowledged: list[tuple[Position, bytes]] = []

    async def subscribe() -> None:
        subscribed.extend(await collect(stream, 40))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(subscribe)
        async with stream.open_writer() as first:
            for k in range(20):
                acknowledged.append((await first.append(b"a%d" % k), b"a%d" % k))
            second_stream = await other.open_stream("taken")
            async with second_stream.open_writer() as second:
                assert second.epoch == first.epoch + 1
                with pytest.raises(pora.WriterFenced, match="fenced by a newer writer"):
                    await first.append(b"late")
                with pytest.raises(pora.WriterFenced):
                    await first.append_many([b"later"])
                for k in range(20):
                    acknowledged.append((await second.append(b"b%d" % k), b"b%d" % k))
        # leaving the fenced writer's block is quiet: it has nothing to close
    assert subscribed == acknowledged
    info = await stream.info()
    assert [(s.seq, s.last_entry_id) for s in info.segments] == [(0, 19), (1, 19)]
    assert [item async for item in stream.read()] == acknowledged


async def test_takeover_fences_the_earlier_writer(tmp_path: Path) -> None:
    async with (
        local_cluster(tmp_path) as cluster,
        client_on(cluster) as client,
        client_on(cluster) as other,
    ):
        await takeover(client, other)


async def test_seal(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("sealed")
        async with stream.open_writer() as writer:
            await writer.append(b"x")
            await stream.seal()
            with pytest.raises(pora.StreamSealed, match="'sealed' is sealed"):
                await writer.append(b"y")
        await stream.seal()  # again: nothing changes
        with pytest.raises(pora.StreamSealed):
            async with stream.open_writer():
                pass
        info = await stream.info()
        assert info.state is StreamState.SEALED
        assert [item async for item in stream.read()] == [(Position(0, 0), b"x")]


async def test_concurrent_appends_across_rollovers(tmp_path: Path) -> None:
    """Appends from many tasks while segments roll: every position is distinct, the
    positions of one task increase, and a subscriber sees exactly what was
    acknowledged, in position order."""
    tasks, each = 16, 60
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("busy", segment_bytes_max=SMALL)
        acknowledged: dict[Position, bytes] = {}
        subscribed: list[tuple[Position, bytes]] = []

        async def subscribe() -> None:
            subscribed.extend(await collect(stream, tasks * each))

        async def append(writer: pora.streams.writer.StreamWriter, task: int) -> None:
            mine: list[Position] = []
            for k in range(each):
                payload = b"%d/%d:" % (task, k) + bytes(900)
                position = await writer.append(payload)
                acknowledged[position] = payload
                mine.append(position)
            assert mine == sorted(mine)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(subscribe)
            async with stream.open_writer() as writer, trio.open_nursery() as appenders:
                for task in range(tasks):
                    appenders.start_soon(append, writer, task)
        assert len(acknowledged) == tasks * each
        assert subscribed == sorted(acknowledged.items())
        assert len((await stream.info()).segments) > 5


async def test_segments_roll_by_age(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("aging", segment_age_s_max=0.2)
        record = StreamRecord(client.store, "aging")
        async with stream.open_writer() as writer:
            assert await writer.append(b"early") == Position(0, 0)
            opened = await record.read()
            with trio.fail_after(30):  # the roll is the document's next change
                rolled = await record.next_change(opened.version)
            assert rolled.value.writer_segment == 1
            assert (await writer.append(b"later")).segment >= 1
        segments = (await stream.info()).segments
        assert segments[0].last_entry_id == 0


async def test_an_idle_writer_adds_no_empty_segments(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("idle", segment_age_s_max=0.05)
        record = StreamRecord(client.store, "idle")
        async with stream.open_writer():
            opened = await record.read()
            with trio.move_on_after(0.5):  # ten times its age limit: no change comes
                await record.next_change(opened.version)
                raise AssertionError("an empty segment rolled over")
        assert len((await stream.info()).segments) == 1


async def test_bad_arguments_and_a_closed_client(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster:
        async with client_on(cluster) as client:
            stream = await client.create_stream("args")
            with pytest.raises(pora.InvalidArgument, match=r"Position\.parse"):
                stream.read(from_="0:0")  # type: ignore[arg-type]
            with pytest.raises(pora.InvalidArgumentType, match="from_"):
                stream.subscribe(from_=3)  # type: ignore[arg-type]
            with pytest.raises(pora.InvalidArgumentType, match="to must be"):
                stream.read(to="end")  # type: ignore[arg-type]
            with pytest.raises(pora.InvalidArgumentType, match="stream name"):
                await client.open_stream(7)  # type: ignore[arg-type]
            async with stream.open_writer() as writer:
                pass
            with pytest.raises(RuntimeError, match="not open"):
                await writer.append(b"after the block")
        with pytest.raises(pora.ClientClosed):
            await client.open_stream("args")
        with pytest.raises(pora.ClientClosed):
            client.list_streams()


async def test_takeovers_in_the_middle_of_rollovers(tmp_path: Path) -> None:
    """Writers on two clients take the stream over from each other five times while
    eight tasks each append across rollovers: each writer's appends fail with
    WriterFenced once the next one took over, and the subscriber sees every
    acknowledged entry once, in order, with the payload that was acknowledged."""
    async with (
        local_cluster(tmp_path) as cluster,
        client_on(cluster) as one,
        client_on(cluster) as two,
    ):
        await one.create_stream("contested", segment_bytes_max=SMALL)
        streams = [await one.open_stream("contested"), await two.open_stream("contested")]
        acknowledged: dict[Position, bytes] = {}
        seen: list[tuple[Position, bytes]] = []
        #: (what the test waits for, the event that tells it)
        waiting: list[tuple[Callable[[], bool], trio.Event]] = []

        async def subscribe() -> None:
            async for item in streams[0].subscribe():
                seen.append(item)
                if waiting and waiting[0][0]():
                    waiting.pop()[1].set()

        async def seen_when(condition: Callable[..., bool]) -> None:
            if not condition():
                waiting.append((condition, trio.Event()))
                with trio.fail_after(60):
                    await waiting[0][1].wait()

        async def append(writer: pora.streams.writer.StreamWriter, turn: int, task: int) -> None:
            for k in range(10_000):
                payload = b"%d/%d/%d:" % (turn, task, k) + bytes(700)
                try:
                    acknowledged[await writer.append(payload)] = payload
                except pora.WriterFenced:
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(subscribe)
            async with contextlib.AsyncExitStack() as writers:
                for turn in range(6):
                    writer = await writers.enter_async_context(streams[turn % 2].open_writer())
                    for task in range(8):
                        nursery.start_soon(append, writer, turn, task)
                    # let it write a few segments' worth (the subscriber keeps up)
                    await seen_when(lambda turn=turn: len(seen) >= (turn + 1) * 300)
                async with streams[0].open_writer():
                    pass  # fences the last of them
            last = max(acknowledged)
            await seen_when(lambda: seen[-1][0] >= last)
            nursery.cancel_scope.cancel()
        positions = [position for position, _ in seen]
        assert positions == sorted(set(positions))
        payloads = dict(seen)
        for position, payload in acknowledged.items():
            assert payloads[position] == payload
        assert len((await streams[0].info()).segments) > 10


async def test_old_segments_are_paged_out_and_still_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a head of at most 4 segments and pages of 3 (1,000 and 500 in use), a
    stream of some 20 segments keeps most in pages: read and subscribe cross them as
    they cross the head's, and delete_stream removes pages and ledgers."""
    monkeypatch.setattr(pora.streams.document, "HEAD_SEGMENTS_MAX", 4)
    monkeypatch.setattr(pora.streams.document, "PAGE_SEGMENTS", 3)
    payloads = [b"%04d" % k + bytes(2000) for k in range(600)]
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("paged", segment_bytes_max=SMALL)
        async with stream.open_writer() as writer:
            positions = [await writer.append(payload) for payload in payloads]
        info = await stream.info()
        assert len(info.pages) >= 4 and len(info.segments) <= 4 + 1
        assert info.pages[0].first_seq == 0
        expected = list(zip(positions, payloads, strict=True))
        assert [item async for item in stream.read()] == expected
        assert await collect(stream, len(payloads)) == expected
        middle = positions[len(positions) // 3]  # in a page
        assert middle.segment < info.segments[0].seq
        assert [item async for item in stream.read(from_=middle)] == expected[len(positions) // 3 :]
        assert await collect(stream, 5, from_=middle) == expected[len(positions) // 3 :][:5]

        ledgers = [s.ledger_id for s in info.segments]
        await client.delete_stream("paged")
        assert await client.store.list_documents("stream-pages") == []
        for ledger_id in ledgers:
            with pytest.raises(pora.NoSuchLedger):
                await client.open_ledger(ledger_id)
        assert [ledger async for ledger in client.list_ledgers()] == []


async def test_a_subscriber_learns_the_stream_was_deleted(tmp_path: Path) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("doomed")
        async with stream.open_writer() as writer:
            await writer.append(b"only")
            subscription = stream.subscribe()
            assert await subscription.__anext__() == (Position(0, 0), b"only")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.delete_stream, "doomed")
                with pytest.raises(pora.NoSuchStream, match="'doomed'"):
                    await subscription.__anext__()
            await subscription.aclose()  # type: ignore[attr-defined]
            with pytest.raises(pora.NoSuchStream):  # its ledger went with it
                await writer.append(b"late")
        # leaving the block is quiet: nothing is left to close


async def test_a_segment_ledger_deleted_outside_the_stream_ends_its_writer_at_once(
    tmp_path: Path,
) -> None:
    """delete_ledger on the writer's OPEN segment (not a takeover, a seal or a stream
    delete): its appends fail with LedgerDeleted at once, without the writer's watch
    of the document for a reason (10 s), and leaving its block is quiet. The next
    writer's takeover marks the segment LOST and writes on after it
    (tests/test_stream_lost_segments.py has the rest)."""
    async with (
        local_cluster(tmp_path) as cluster,
        client_on(cluster) as client,
        client_on(cluster) as other,
    ):
        stream = await client.create_stream("cut")
        async with stream.open_writer() as writer:
            await writer.append(b"before")
            (segment,) = (await stream.info()).segments
            await other.delete_ledger(segment.ledger_id, password="")
            with trio.fail_after(5.0):
                for _ in range(2):
                    with pytest.raises(pora.LedgerDeleted):
                        await writer.append(b"after")
        async with (await other.open_stream("cut")).open_writer() as again:
            assert await again.append(b"again") == Position(1, 0)
        assert [s.lost for s in (await stream.info()).segments] == [True, False]


async def test_a_seal_from_another_client_stops_a_busy_writer(tmp_path: Path) -> None:
    """Eight tasks append while another client seals the stream: each task's append
    fails with StreamSealed (never a bare LedgerFenced), and the stream holds
    everything that was acknowledged."""
    async with (
        local_cluster(tmp_path) as cluster,
        client_on(cluster) as client,
        client_on(cluster) as other,
    ):
        stream = await client.create_stream("busy-seal", segment_bytes_max=SMALL)
        acknowledged: dict[Position, bytes] = {}
        ended: list[BaseException] = []
        enough = trio.Event()

        async def append(writer: pora.StreamWriter, task: int) -> None:
            for k in range(100_000):
                payload = b"%d/%d" % (task, k) + bytes(500)
                try:
                    acknowledged[await writer.append(payload)] = payload
                except pora.PoraError as error:
                    ended.append(error)
                    return
                if len(acknowledged) >= 500:
                    enough.set()

        async with stream.open_writer() as writer, trio.open_nursery() as nursery:
            for task in range(8):
                nursery.start_soon(append, writer, task)
            await enough.wait()
            await (await other.open_stream("busy-seal")).seal()
        assert [type(error) for error in ended] == [pora.StreamSealed] * 8
        read = dict([item async for item in stream.read()])
        assert all(read[position] == payload for position, payload in acknowledged.items())
        assert (await stream.info()).state is StreamState.SEALED
