"""The metadata store's behaviour, one suite for every backend: each test takes a
`store_url` (SQLite, and ZooKeeper on one local server per run, a chroot per test) and a
`run` that runs the test's coroutine under asyncio and under trio."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
import trio
from event_loops import under_asyncio
from zookeeper_support import fresh_zk_url

from pora.meta import (
    Ensemble,
    EnsembleMember,
    InvalidMetadata,
    LedgerExists,
    LedgerMetadata,
    LedgerState,
    MetadataConfig,
    MetadataRecordTooLarge,
    MetadataStore,
    MetadataTimeout,
    MetadataUnavailable,
    MetadataVersionConflict,
    NodeAddressTaken,
    NodeRegistration,
    NoSuchLedgerMetadata,
    RegistrationLost,
    Versioned,
    open_metadata,
)
from pora.meta.local_zookeeper import free_loopback_port

Body = Callable[[MetadataStore], Awaitable[None]]
Runner = Callable[[Callable[[], Awaitable[None]]], None]


@pytest.fixture(params=["sqlite", "zk"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "zk":
        return fresh_zk_url(request)
    return f"sqlite:///{tmp_path}/meta.db"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/meta.db"


def runner(library: str) -> Runner:
    """Something that runs a test's coroutine under `library` (asyncio or trio)."""

    def under_trio(main: Callable[[], Awaitable[None]]) -> None:
        trio.run(main)

    return under_asyncio if library == "asyncio" else under_trio


@pytest.fixture(params=["asyncio", "trio"])
def run(request: pytest.FixtureRequest) -> Runner:
    return runner(request.param)


def with_store(run: Runner, url: str, body: Body, config: MetadataConfig | None = None) -> None:
    async def main() -> None:
        async with open_metadata(url, config) as store:
            await body(store)

    run(main)


def ledger(ledger_id: int, ensemble_size: int = 3, **changes: object) -> LedgerMetadata:
    members = tuple(EnsembleMember(f"127.0.0.1:{3181 + k}", f"i{k}") for k in range(ensemble_size))
    meta = LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=ensemble_size,
        write_quorum=min(2, ensemble_size),
        ack_quorum=min(2, ensemble_size),
        ensembles=(Ensemble(0, members),),
        password_digest=b"\x00digest",
        created_ms=1_700_000_000_000,
        custom={"counter": b"0"},
    )
    return replace(meta, **changes)  # type: ignore[arg-type]


def test_create_read_update_delete(run: Runner, store_url: str) -> None:
    async def body(store: MetadataStore) -> None:
        ledger_id = await store.allocate_ledger_id()
        created = await store.create_ledger(ledger(ledger_id))
        assert created.version == 0
        assert await store.read_ledger(ledger_id) == created
        with pytest.raises(LedgerExists):
            await store.create_ledger(ledger(ledger_id))
        closed = await store.update_ledger(created.value.closed(9, 1234), 0)
        assert (await store.read_ledger(ledger_id)) == closed == Versioned(closed.value, 1)
        with pytest.raises(MetadataVersionConflict) as conflict:
            await store.update_ledger(created.value, 0)  # no blind update
        assert conflict.value.actual_version == 1
        with pytest.raises(MetadataVersionConflict):
            await store.delete_ledger(ledger_id, 0)
        await store.delete_ledger(ledger_id, 1)
        with pytest.raises(NoSuchLedgerMetadata):
            await store.read_ledger(ledger_id)
        with pytest.raises(NoSuchLedgerMetadata):
            await store.update_ledger(created.value, 1)

    with_store(run, store_url, body)


def test_records_are_validated_and_bounded(run: Runner, store_url: str) -> None:
    with pytest.raises(InvalidMetadata, match="E >= Qw >= Qa"):
        ledger(1, write_quorum=1, ack_quorum=2).validate()
    members = ledger(1).ensembles[0].members
    with pytest.raises(InvalidMetadata, match="increase"):
        ledger(1, ensembles=(Ensemble(0, members), Ensemble(0, members))).validate()
    with pytest.raises(InvalidMetadata, match="only once closed"):
        ledger(1, last_entry_id=4).validate()
    meta = ledger(1).with_ensemble(Ensemble(10, members)).closed(20, 99)
    assert LedgerMetadata.decode(meta.encode()) == meta

    async def body(store: MetadataStore) -> None:
        with pytest.raises(MetadataRecordTooLarge):
            await store.create_ledger(ledger(7, custom={"blob": b"x" * 4096}))
        with pytest.raises(NoSuchLedgerMetadata):
            await store.read_ledger(7)

    with_store(run, store_url, body, MetadataConfig(record_bytes_max=2048))


def _count(meta: LedgerMetadata) -> int:
    return int(meta.custom["counter"])


def _incremented(meta: LedgerMetadata) -> LedgerMetadata:
    return replace(meta, custom={"counter": str(_count(meta) + 1).encode()})


def test_cas_rounds_exactly_one_wins(run: Runner, store_url: str) -> None:
    tasks, rounds = 8, 5

    async def body(store: MetadataStore) -> None:
        await store.create_ledger(ledger(1))
        wins_total = 0
        for _ in range(rounds):
            read = await store.read_ledger(1)
            wins: list[int] = []

            async def attempt(
                task: int, read: Versioned[LedgerMetadata] = read, wins: list[int] = wins
            ) -> None:
                try:
                    await store.update_ledger(_incremented(read.value), read.version)
                except MetadataVersionConflict:
                    return
                wins.append(task)

            async with anyio.create_task_group() as group:
                for task in range(tasks):
                    group.start_soon(attempt, task)
            assert len(wins) == 1
            wins_total += 1
        final = await store.read_ledger(1)
        assert _count(final.value) == wins_total == rounds
        assert final.version == rounds

    with_store(run, store_url, body)


def test_cas_no_lost_update_under_contention(run: Runner, store_url: str) -> None:
    tasks, attempts = 8, 15

    async def body(store: MetadataStore) -> None:
        await store.create_ledger(ledger(1))
        successes = 0

        async def worker() -> None:
            nonlocal successes
            for _ in range(attempts):
                read = await store.read_ledger(1)
                try:
                    await store.update_ledger(_incremented(read.value), read.version)
                except MetadataVersionConflict:
                    continue
                successes += 1

        async with anyio.create_task_group() as group:
            for _ in range(tasks):
                group.start_soon(worker)
        final = await store.read_ledger(1)
        assert successes >= 1
        assert _count(final.value) == successes == final.version

    with_store(run, store_url, body)


ALLOCATE = textwrap.dedent(
    """
    import sys, anyio
    from pora.meta import MetadataConfig, open_metadata

    async def main() -> None:
        config = MetadataConfig(id_block_size=int(sys.argv[3]))
        async with open_metadata(sys.argv[1], config) as store:
            for _ in range(int(sys.argv[2])):
                print(await store.allocate_ledger_id())

    anyio.run(main)
    """
)


@pytest.mark.slow  # four Python processes to start: 1.5-5 s a store
def test_ledger_ids_unique_across_processes(store_url: str) -> None:
    def allocate() -> subprocess.Popen[str]:
        command = [sys.executable, "-c", ALLOCATE, store_url, "200", "7"]
        return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)

    # several processes opening a fresh file at once also race to create it and to
    # switch it to WAL
    processes = [allocate() for _ in range(4)]
    outputs = [process.communicate(timeout=60)[0] for process in processes]
    assert [process.returncode for process in processes] == [0] * 4
    ids = [int(line) for output in outputs for line in output.split()]
    assert len(ids) == 800
    assert len(set(ids)) == 800

    async def body(store: MetadataStore) -> None:
        assert await store.allocate_ledger_id() > max(ids)  # never reused

    with_store(anyio.run, store_url, body)


def test_list_ledgers_in_pages(run: Runner, store_url: str) -> None:
    async def body(store: MetadataStore) -> None:
        ids = [await store.allocate_ledger_id() for _ in range(25)]
        for ledger_id in reversed(ids):
            await store.create_ledger(ledger(ledger_id))
        seen: list[int] = []
        after = -1
        while page := await store.list_ledgers(after_id=after, limit=10):
            assert len(page) <= 10
            seen += [record.value.ledger_id for record in page]
            after = page[-1].value.ledger_id
        assert seen == sorted(ids)

    with_store(run, store_url, body)


def test_watch_sees_close_and_delete(run: Runner, store_url: str) -> None:
    async def body(store: MetadataStore) -> None:
        created = await store.create_ledger(ledger(5))
        with pytest.raises(NoSuchLedgerMetadata):
            async for _ in store.watch_ledger(6):
                pass
        seen: list[Versioned[LedgerMetadata]] = []
        first_change = anyio.Event()

        async def watch() -> None:
            async for record in store.watch_ledger(5, after_version=created.version):
                seen.append(record)
                first_change.set()

        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            await anyio.sleep(0.1)
            closed = await store.update_ledger(created.value.closed(3, 30), 0)
            with anyio.fail_after(5):
                await first_change.wait()
            await store.delete_ledger(5, closed.version)  # ends the watch
        assert seen == [closed]
        assert seen[0].value.state is LedgerState.CLOSED

    with_store(run, store_url, body)


def test_registration_lease_takeover_and_refusal(run: Runner, store_url: str) -> None:
    async def body(store: MetadataStore) -> None:
        node = NodeRegistration("127.0.0.1:3181", "instance-a", free_bytes=10, rack="r1")
        # the node registers through a store of its own, which then stops: an SQLite
        # lease runs out unrenewed, a ZooKeeper session ends
        async with AsyncExitStack() as node_side:
            holder = await node_side.enter_async_context(open_metadata(store_url))
            await holder.register_node(node, lease_s=0.4)
            other = replace(node, instance_id="instance-b")
            with pytest.raises(NodeAddressTaken, match="instance-a"):
                await store.register_node(other, lease_s=0.4)
            await holder.register_node(node, lease_s=0.4)  # the same instance takes it back
            await store.register_node(NodeRegistration("127.0.0.1:3182", "c", read_only=True))
            nodes = await store.list_nodes()
            assert [(n.address, n.instance_id, n.rack) for n in nodes] == [
                ("127.0.0.1:3181", "instance-a", "r1"),
                ("127.0.0.1:3182", "c", None),
            ]
            writable = await store.list_nodes(writable_only=True)
            assert [n.address for n in writable] == [node.address]
            await holder.update_registration(replace(node, read_only=True, free_bytes=5))
            assert await store.list_nodes(writable_only=True) == []
            await holder.renew_node(node.address, node.instance_id, lease_s=0.4)
            if store_url.startswith("sqlite:"):
                await anyio.sleep(0.6)  # the lease runs out unrenewed

        assert [n.address for n in await store.list_nodes()] == ["127.0.0.1:3182"]
        await store.register_node(other, lease_s=5)  # gone: another instance may take it
        with pytest.raises(RegistrationLost):
            await store.renew_node(node.address, node.instance_id)
        await store.unregister_node(node.address, node.instance_id)  # not its own: no effect
        assert any(n.instance_id == "instance-b" for n in await store.list_nodes())
        await store.unregister_node(other.address, other.instance_id)
        assert [n.address for n in await store.list_nodes()] == ["127.0.0.1:3182"]

    with_store(run, store_url, body)


def test_unreachable_store_names_the_url(run: Runner, tmp_path: Path) -> None:
    not_a_database = tmp_path / "garbage.db"
    not_a_database.write_bytes(b"this is not an SQLite database, just bytes" * 100)
    urls = [
        f"sqlite:///{tmp_path}/missing-folder/meta.db",
        f"sqlite:///{not_a_database}",
        f"zk://127.0.0.1:{free_loopback_port()}/pora",  # nothing listens there
    ]
    for url in urls:

        async def body(store: MetadataStore) -> None:
            raise AssertionError("opened")

        started = time.monotonic()
        with pytest.raises(MetadataUnavailable) as error:
            with_store(run, url, body, MetadataConfig(call_timeout_s=0.5))
        assert error.value.url == url
        assert url in str(error.value)
        assert time.monotonic() - started < 5


def test_relative_sqlite_url(run: Runner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    async def body(store: MetadataStore) -> None:
        await store.create_ledger(ledger(await store.allocate_ledger_id()))

    with_store(run, "sqlite:sub.db", body)
    assert (tmp_path / "sub.db").is_file()


def test_a_held_write_lock_times_out(run: Runner, sqlite_url: str) -> None:
    store_url = sqlite_url
    path = store_url.removeprefix("sqlite://")

    async def body(store: MetadataStore) -> None:
        created = await store.create_ledger(ledger(1))
        other_process = sqlite3.connect(path, isolation_level=None)
        other_process.execute("BEGIN IMMEDIATE")  # holds the file's write lock
        try:
            started = time.monotonic()
            with pytest.raises(MetadataTimeout) as error:
                await store.update_ledger(created.value.closed(1, 1), created.version)
            # the 0.5 s asked for, not the 10 s default (bounded generously: a loaded
            # machine's slowness must not fail the test)
            assert time.monotonic() - started < 5
            assert error.value.url == store_url
            assert "locked" in str(error.value)
        finally:
            other_process.execute("ROLLBACK")
            other_process.close()
        # the lock wait gave up before the call's timeout: the write did not happen
        assert (await store.read_ledger(1)).version == 0
        await store.update_ledger(created.value.closed(1, 1), created.version)

    with_store(run, store_url, body, MetadataConfig(call_timeout_s=0.5))


def test_opens_while_another_process_holds_a_fresh_file(run: Runner, tmp_path: Path) -> None:
    # switching a file to WAL is refused at once (no busy wait) while another
    # connection holds it, as when processes create the same file together
    path = tmp_path / "meta.db"
    other_process = sqlite3.connect(path, isolation_level=None)
    other_process.execute("CREATE TABLE unrelated (x INTEGER)")
    other_process.execute("BEGIN IMMEDIATE")

    async def main() -> None:
        async def release_soon() -> None:
            await anyio.sleep(0.3)
            other_process.execute("ROLLBACK")

        async with anyio.create_task_group() as group:
            group.start_soon(release_soon)
            async with open_metadata(f"sqlite:///{path}") as store:
                await store.create_ledger(ledger(await store.allocate_ledger_id()))

    try:
        run(main)
    finally:
        other_process.close()


def test_sqlite_schema_reserves_the_streams_table(run: Runner, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/meta.db"

    async def body(store: MetadataStore) -> None:
        await store.list_ledgers()

    with_store(run, url, body)
    with sqlite3.connect(tmp_path / "meta.db") as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
        columns = [row[1] for row in conn.execute("PRAGMA table_info(streams)")]
    assert {"ledgers", "nodes", "id_blocks", "streams"} <= tables
    assert columns == ["name", "version", "record"]
