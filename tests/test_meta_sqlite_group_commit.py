"""The SQLite store's group commit: writes queued together share one transaction, a
refused write rolls back alone, and a write whose caller gave up either did not happen
or is resolved."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import anyio
import pytest
import trio
from test_meta_store import ledger
from waiting import wait_until

from pora.meta import (
    LedgerExists,
    MetadataConfig,
    MetadataError,
    MetadataTimeout,
    MetadataVersionConflict,
    NodeRegistration,
    NoSuchLedgerMetadata,
    open_metadata,
)
from pora.meta.sqlite_store import SqliteMetadataStore


def _queued_and_taken(store: SqliteMetadataStore) -> tuple[int, int]:
    """Writes in the writer's queue, and writes submitted but not answered yet."""
    assert store._writer is not None
    return store._writer._queue.qsize(), store._config.write_queue_max - store._write_room.value


def test_writes_queued_together_share_a_commit_and_refusals_stay_alone(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    url = f"sqlite:///{path}"

    async def main() -> None:
        async with open_metadata(url) as opened:
            assert isinstance(opened, SqliteMetadataStore)
            store = opened
            assert store._writer is not None
            contested = await store.create_ledger(ledger(1000))
            outcomes: dict[str, object] = {}

            async def attempt(name: str, write: object) -> None:
                try:
                    outcomes[name] = await write  # type: ignore[misc]
                except (LedgerExists, MetadataVersionConflict) as refusal:
                    outcomes[name] = refusal

            other_process = sqlite3.connect(path, isolation_level=None)
            other_process.execute("BEGIN IMMEDIATE")  # the writer waits for this lock
            commits_before = store._writer.commits
            async with trio.open_nursery() as nursery:
                nursery.start_soon(attempt, "first", store.create_ledger(ledger(1)))
                # the writer took the first write alone and waits in BEGIN for the lock
                await wait_until(lambda: _queued_and_taken(store) == (0, 1), 5)
                for k in range(2, 12):
                    nursery.start_soon(attempt, f"create {k}", store.create_ledger(ledger(k)))
                nursery.start_soon(attempt, "duplicate", store.create_ledger(ledger(5)))
                update = contested.value.closed(3, 30)
                nursery.start_soon(attempt, "cas a", store.update_ledger(update, 0))
                nursery.start_soon(attempt, "cas b", store.update_ledger(update, 0))
                # the other 13 queue behind it
                await wait_until(lambda: _queued_and_taken(store) == (13, 14), 5)
                other_process.execute("ROLLBACK")
            other_process.close()

            assert store._writer.commits - commits_before == 2
            fives = [outcomes["create 5"], outcomes["duplicate"]]
            assert sum(isinstance(o, LedgerExists) for o in fives) == 1
            cas = [outcomes["cas a"], outcomes["cas b"]]
            assert sum(isinstance(o, MetadataVersionConflict) for o in cas) == 1
            for k in range(1, 12):
                assert (await store.read_ledger(k)).version == 0
            assert (await store.read_ledger(1000)).version == 1

    trio.run(main)


def test_writes_queued_behind_a_held_lock_time_out_and_did_not_happen(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    url = f"sqlite:///{path}"

    async def main() -> None:
        async with open_metadata(url, MetadataConfig(call_timeout_s=0.5)) as store:
            node = NodeRegistration("127.0.0.1:3181", "instance-a")
            other_process = sqlite3.connect(path, isolation_level=None)
            other_process.execute("BEGIN IMMEDIATE")
            failures: list[str] = []

            async def create(ledger_id: int) -> None:
                with pytest.raises(MetadataTimeout) as error:
                    await store.create_ledger(ledger(ledger_id))
                failures.append(str(error.value))

            async def register() -> None:
                with pytest.raises(MetadataTimeout) as error:
                    await store.register_node(node)
                failures.append(str(error.value))

            try:
                async with anyio.create_task_group() as group:
                    for ledger_id in range(5):
                        group.start_soon(create, ledger_id)
                    group.start_soon(register)
            finally:
                other_process.execute("ROLLBACK")
                other_process.close()
            assert len(failures) == 6
            # refused for the lock, or withdrawn before they started: none happened
            assert all("locked" in f or "did not happen" in f for f in failures), failures
            for ledger_id in range(5):
                with pytest.raises(NoSuchLedgerMetadata):
                    await store.read_ledger(ledger_id)
            assert await store.list_nodes() == []
            await store.create_ledger(ledger(0))  # the writer goes on

    asyncio.run(main())


def test_close_answers_every_queued_write(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/meta.db"

    async def main() -> None:
        created: list[int] = []
        async with open_metadata(url) as store:

            async def create(ledger_id: int) -> None:
                await store.create_ledger(ledger(ledger_id))
                created.append(ledger_id)

            async with trio.open_nursery() as nursery:
                for ledger_id in range(50):
                    nursery.start_soon(create, ledger_id)
        assert sorted(created) == list(range(50))
        with pytest.raises(MetadataError, match="is closed"):
            await store.create_ledger(ledger(50))
        async with open_metadata(url) as store:
            assert len(await store.list_ledgers()) == 50

    trio.run(main)
