"""A stream delete attacked where it can be cut (docs/streams.md, "Deleting a
stream"), on an in-process cluster: a deleter that stops between its steps leaves
the stream marked, a retry finishes it, and a stream created again under the name
starts clean: none of the deleted stream's cursors carries over."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import trio
from replication_support import local_cluster
from writer_support import client_on

import pora
from pora import Position
from pora.client.replication.client import Client
from pora.streams import deletion, transaction
from pora.streams.cursors import CursorRecord
from pora.streams.ledger_client import LedgerClient
from pora.streams.stream import Stream
from pora.streams.writer import recover_segment_ledger


class Killed(BaseException):
    """The deleting process stopping at this point (as SIGKILL would)."""


async def delete_to_the_end(client: Client, name: str) -> None:
    """What an operator does after a delete stopped: delete again (`pora stream
    delete`), where NoSuchStream says it was finished."""
    with contextlib.suppress(pora.NoSuchStream):
        await client.delete_stream(name)


async def test_a_delete_stopped_at_the_cursors_leaves_none_to_a_stream_created_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("orders")
        async with stream.open_writer() as writer:
            await writer.append_many([b"a", b"b", b"c"])
        cursor = await stream.cursor("billing")
        await cursor.move_to(Position(0, 3))

        async def killed_there(client: Client, name: str) -> None:
            raise Killed

        monkeypatch.setattr(deletion, "_delete_cursors", killed_there)
        with pytest.raises(Killed):
            await client.delete_stream("orders")
        monkeypatch.undo()
        await delete_to_the_end(client, "orders")

        again = await client.create_stream("orders")
        async with again.open_writer() as writer:
            await writer.append_many([b"new 1", b"new 2"])
        assert await again.cursors() == []
        fresh = await again.cursor("billing")
        assert await fresh.position() == Position(0, 0)
        assert [payload async for _, payload in fresh.read()] == [b"new 1", b"new 2"]


async def test_two_deletes_at_once_both_end_and_leave_nothing(tmp_path: Path) -> None:
    """Both mark (the second takes the mark as it is), both fence; one deletes the
    document and the other gets NoSuchStream; no cursor nor document is left."""
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("twice")
        await stream.cursor("a")
        await stream.cursor("b")
        async with stream.open_writer() as writer:
            await writer.append(b"x")
            outcomes: list[str] = []

            async def delete() -> None:
                try:
                    await client.delete_stream("twice")
                    outcomes.append("deleted")
                except pora.NoSuchStream:
                    outcomes.append("gone")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(delete)
                nursery.start_soon(delete)
        assert "deleted" in outcomes and len(outcomes) == 2
        assert [info.name async for info in client.list_streams()] == []
        again = await client.create_stream("twice")
        assert await again.cursors() == []


async def test_a_cursor_made_while_its_stream_is_deleted_is_not_left_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stream.cursor()` read the document before the delete marked it and creates
    the cursor after the delete listed the cursors: it raises NoSuchStream and leaves
    no cursor for a stream created again under the name."""
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("racing")
        async with stream.open_writer() as writer:
            await writer.append_many([b"a", b"b"])
        await stream.truncate(Position(1, 0))
        create = CursorRecord.create

        async def deleted_first(self: CursorRecord, start: Position) -> int | None:
            await client.delete_stream("racing")
            return await create(self, start)

        monkeypatch.setattr(CursorRecord, "create", deleted_first)
        with pytest.raises(pora.NoSuchStream):
            await stream.cursor("late")
        monkeypatch.undo()
        again = await client.create_stream("racing")
        assert await again.cursors() == []


async def test_a_cursor_made_across_a_delete_and_create_starts_in_the_new_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream deleted and created again between `stream.cursor()`'s read of the
    document and its creating the cursor: the cursor starts where the new stream
    does, not at the old stream's first held position."""
    async with local_cluster(tmp_path) as cluster, client_on(cluster) as client:
        stream = await client.create_stream("reborn")
        async with stream.open_writer() as writer:
            await writer.append_many([b"a", b"b"])
        async with stream.open_writer() as writer:
            await writer.append(b"c")
        await stream.truncate(Position(1, 0))
        create = CursorRecord.create
        recreated: list[Stream] = []

        async def recreated_first(self: CursorRecord, start: Position) -> int | None:
            if not recreated:
                await client.delete_stream("reborn")
                recreated.append(await client.create_stream("reborn"))
            return await create(self, start)

        monkeypatch.setattr(CursorRecord, "create", recreated_first)
        cursor = await stream.cursor("billing")
        monkeypatch.undo()
        async with recreated[0].open_writer() as writer:
            await writer.append(b"new")
        assert await cursor.position() == Position(0, 0)
        assert [payload async for _, payload in cursor.read()] == [b"new"]


async def test_a_commit_racing_a_delete_raises_no_such_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delete fences the pending transaction's segments while the committer
    recovers them: the commit raises NoSuchStream (the stream is gone), not the
    ledger's NoSuchLedger, and nothing of it is visible anywhere."""
    async with (
        local_cluster(tmp_path) as cluster,
        client_on(cluster) as client,
        client_on(cluster) as other,
    ):
        stream = await client.create_stream("doomed")
        txn = stream.begin()
        await txn.begin()
        await (await txn.open_segment()).append(b"pending")
        committer = await (await other.open_stream("doomed")).resume(txn.id)
        recover = recover_segment_ledger

        async def deleted_first(client_: LedgerClient, ledger_id: int) -> tuple[int, int]:
            await client.delete_stream("doomed")
            return await recover(client_, ledger_id)

        monkeypatch.setattr(transaction, "recover_segment_ledger", deleted_first)
        with pytest.raises(pora.NoSuchStream):
            await committer.commit()
