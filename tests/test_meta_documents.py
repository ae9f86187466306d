"""Documents in the metadata store, one suite for both backends (SQLite, and
ZooKeeper with a chroot per test) under asyncio and trio: versions and
compare-and-set, listing in pages with odd names, the limits on names and sizes, the
watch, two stores racing on one document, and what only one backend has (SQLite's
write lock and missing table, ZooKeeper's znode names)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_meta_sqlite_file import HOLDER
from test_meta_store import Runner, runner, with_store
from zookeeper_support import fresh_zk_url

from pora.meta import (
    DocumentExists,
    InvalidMetadata,
    MetadataConfig,
    MetadataError,
    MetadataRecordTooLarge,
    MetadataStore,
    MetadataStoreGone,
    MetadataTimeout,
    MetadataVersionConflict,
    NoSuchDocument,
    Versioned,
    open_metadata,
)
from pora.meta.documents import check_document_key, key_of_znode, znode_name
from pora.meta.zk_store import ZooKeeperMetadataStore

#: names a stream layer may well use, and ones that need escaping in ZooKeeper
ODD_NAMES = [
    "plain",
    "with space",
    "tab\there",
    "ünïcødé",
    "日本語",
    "emoji-😀",
    "100%",
    "%41",
    "%",
    ".",
    "..",
    "...",
    "a.b",
    "-",
    "_",
    "slash/inside/name",
    "Zebra",
    "zebra",
    "~tilde",
    "\x7f",
]


def utf8_order(names: list[str]) -> list[str]:
    return sorted(names, key=lambda name: name.encode())


@pytest.fixture(params=["sqlite", "zk"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "zk":
        return fresh_zk_url(request)
    return f"sqlite:///{tmp_path}/meta.db"


@pytest.fixture(params=["asyncio", "trio"])
def run(request: pytest.FixtureRequest) -> Runner:
    return runner(request.param)


def test_create_read_update_delete_with_versions(run: Runner, store_url: str) -> None:
    async def body(store: MetadataStore) -> None:
        created = await store.create_document("streams", "events", b"v0")
        assert created == Versioned(b"v0", 0)
        with pytest.raises(DocumentExists, match="'events' in space 'streams'"):
            await store.create_document("streams", "events", b"other")
        assert await store.read_document("streams", "events") == created
        # the same name in another space is another document
        assert await store.create_document("cursors", "events", b"c") == Versioned(b"c", 0)

        updated = await store.update_document("streams", "events", b"v1", 0)
        assert updated == Versioned(b"v1", 1)
        with pytest.raises(MetadataVersionConflict) as conflict:
            await store.update_document("streams", "events", b"stale", 0)
        assert (conflict.value.expected_version, conflict.value.actual_version) == (0, 1)
        assert await store.read_document("streams", "events") == updated
        assert await store.update_document("streams", "events", b"", 1) == Versioned(b"", 2)

        with pytest.raises(MetadataVersionConflict):
            await store.delete_document("streams", "events", 1)
        await store.delete_document("streams", "events", 2)
        with pytest.raises(NoSuchDocument, match="'events' in space 'streams'"):
            await store.read_document("streams", "events")
        with pytest.raises(NoSuchDocument):
            await store.update_document("streams", "events", b"x", 2)
        with pytest.raises(NoSuchDocument):
            await store.delete_document("streams", "events", 2)
        assert await store.read_document("cursors", "events") == Versioned(b"c", 0)
        # a deleted name is free again, from version 0
        assert await store.create_document("streams", "events", b"again") == Versioned(b"again", 0)
        assert await store.list_documents("streams") == ["events"]

    with_store(run, store_url, body)


def test_missing_documents_and_spaces(run: Runner, store_url: str) -> None:
    async def body(store: MetadataStore) -> None:
        # in a store where no document was ever created, too
        with pytest.raises(NoSuchDocument):
            await store.read_document("streams", "nothing")
        assert await store.list_documents("streams") == []
        with pytest.raises(NoSuchDocument):
            await store.update_document("streams", "nothing", b"x", 0)
        with pytest.raises(NoSuchDocument):
            await store.delete_document("streams", "nothing", 0)
        with pytest.raises(NoSuchDocument):
            async for _ in store.watch_document("streams", "nothing"):
                pass
        await store.create_document("streams", "one", b"")
        assert await store.list_documents("other") == []

    with_store(run, store_url, body)


def test_listing_in_pages_with_odd_names(run: Runner, store_url: str) -> None:
    async def body(store: MetadataStore) -> None:
        for name in reversed(ODD_NAMES):
            await store.create_document("odd space", name, name.encode())
        await store.create_document("elsewhere", "plain", b"")
        for name in ODD_NAMES:  # each one reads back as itself
            assert await store.read_document("odd space", name) == Versioned(name.encode(), 0)

        seen: list[str] = []
        after = ""
        while page := await store.list_documents("odd space", after=after, limit=3):
            assert len(page) <= 3
            seen += page
            after = page[-1]
        assert seen == utf8_order(ODD_NAMES)
        assert await store.list_documents("odd space", after="a", limit=2) == ["a.b", "emoji-😀"]
        assert await store.list_documents("odd space", after="\U0010ffff") == []
        assert await store.list_documents("elsewhere") == ["plain"]

    with_store(run, store_url, body)


def test_names_and_sizes_are_checked_before_anything_is_written(
    run: Runner, store_url: str
) -> None:
    limit = 4096

    async def body(store: MetadataStore) -> None:
        bad_keys: list[tuple[object, object, str]] = [
            ("", "n", "space must not be empty"),
            ("s", "", "name must not be empty"),
            ("a/b", "n", "holds a '/'"),
            ("s", "nul\x00", "NUL"),
            ("s\x00", "n", "NUL"),
            ("s", "é" * 101, "202 bytes in UTF-8, over the limit of 200"),
            ("s" * 201, "n", "201 bytes"),
            ("s", "\ud800", "not valid Unicode"),
            ("s", 7, "must be a str, not int"),
            (None, "n", "must be a str, not NoneType"),
        ]
        for space, name, message in bad_keys:
            with pytest.raises(InvalidMetadata, match=message):
                await store.create_document(space, name, b"x")  # type: ignore[arg-type]
            with pytest.raises(InvalidMetadata, match=message):
                await store.read_document(space, name)  # type: ignore[arg-type]
        assert await store.create_document("s", "é" * 100, b"") == Versioned(b"", 0)
        with pytest.raises(InvalidMetadata, match="holds a '/'"):
            await store.list_documents("a/b")
        with pytest.raises(InvalidMetadata, match="holds a '/'"):
            async for _ in store.watch_document("a/b", "n"):
                pass
        with pytest.raises(InvalidMetadata, match="positive int"):
            await store.list_documents("s", limit=0)
        with pytest.raises(InvalidMetadata, match="data must be bytes, not str"):
            await store.create_document("s", "n", "text")  # type: ignore[arg-type]

        with pytest.raises(MetadataRecordTooLarge) as too_large:
            await store.create_document("s", "big", bytes(limit + 1))
        assert (too_large.value.size, too_large.value.limit) == (limit + 1, limit)
        with pytest.raises(NoSuchDocument):
            await store.read_document("s", "big")  # nothing was written
        created = await store.create_document("s", "big", bytes(limit))
        with pytest.raises(MetadataRecordTooLarge):
            await store.update_document("s", "big", bytes(limit + 1), created.version)
        assert await store.read_document("s", "big") == created
        with pytest.raises(InvalidMetadata, match="negative"):
            await store.update_document("s", "big", b"", -1)

    with_store(run, store_url, body, MetadataConfig(record_bytes_max=limit))


def test_watch_sees_updates_and_ends_on_delete(run: Runner, store_url: str) -> None:
    async def body(store: MetadataStore) -> None:
        created = await store.create_document("streams", "events", b"v0")
        seen: list[Versioned[bytes]] = []
        changed = anyio.Event()
        ended = anyio.Event()

        async def watch() -> None:
            async for document in store.watch_document("streams", "events", created.version):
                seen.append(document)
                changed.set()
            ended.set()

        async with anyio.create_task_group() as group:
            group.start_soon(watch)
            first = await store.update_document("streams", "events", b"v1", 0)
            with anyio.fail_after(10):
                while first not in seen:
                    await changed.wait()
                    changed = anyio.Event()
            second = await store.update_document("streams", "events", b"v2", 1)
            with anyio.fail_after(10):
                while second not in seen:
                    await changed.wait()
                    changed = anyio.Event()
            await store.delete_document("streams", "events", 2)
            with anyio.fail_after(10):
                await ended.wait()
        assert seen == [first, second]

    with_store(run, store_url, body)


def test_watch_from_the_current_version_yields_only_later_ones(run: Runner, store_url: str) -> None:
    async def body(store: MetadataStore) -> None:
        await store.create_document("s", "d", b"v0")
        current = await store.update_document("s", "d", b"v1", 0)
        got: list[Versioned[bytes]] = []

        async def watch_once() -> None:
            async for document in store.watch_document("s", "d"):
                got.append(document)
                return

        # the watch starts from whichever version it finds first: update until it
        # has seen one, which is never the version current before it started
        async with anyio.create_task_group() as group:
            group.start_soon(watch_once)
            with anyio.fail_after(10):
                while not got:
                    current = await store.update_document(
                        "s", "d", b"v%d" % (current.version + 1), current.version
                    )
                    await anyio.sleep(0.05)
        assert got[0].version >= 2
        assert got[0].value == b"v%d" % got[0].version

    with_store(run, store_url, body)


def test_two_stores_racing_on_one_document_exactly_one_wins(run: Runner, store_url: str) -> None:
    rounds, tasks_per_store = 4, 3

    async def main() -> None:
        async with open_metadata(store_url) as first, open_metadata(store_url) as second:
            await first.create_document("streams", "contended", b"0")
            for round_ in range(rounds):
                read = await second.read_document("streams", "contended")
                wins: list[bytes] = []
                refusals: list[MetadataError] = []

                async def attempt(store: MetadataStore, tag: bytes, read: Versioned[bytes] = read,
                                  wins: list[bytes] = wins,
                                  refusals: list[MetadataError] = refusals) -> None:  # fmt: skip
                    try:
                        await store.update_document("streams", "contended", tag, read.version)
                    except MetadataVersionConflict as error:
                        refusals.append(error)
                        return
                    wins.append(tag)

                async with anyio.create_task_group() as group:
                    for task in range(tasks_per_store):
                        for which, store in enumerate((first, second)):
                            group.start_soon(attempt, store, f"{which}.{task}".encode())
                assert len(wins) == 1
                assert len(refusals) == 2 * tasks_per_store - 1
                assert await first.read_document("streams", "contended") == Versioned(
                    wins[0], round_ + 1
                )
            # and of two creates of one name, one wins
            outcomes: list[str] = []

            async def create(store: MetadataStore) -> None:
                try:
                    await store.create_document("streams", "new", b"")
                except DocumentExists:
                    outcomes.append("exists")
                else:
                    outcomes.append("created")

            async with anyio.create_task_group() as group:
                group.start_soon(create, first)
                group.start_soon(create, second)
            assert sorted(outcomes) == ["created", "exists"]

    run(main)


@given(st.text(min_size=1, max_size=60).filter(lambda t: "\x00" not in t))
def test_every_valid_name_makes_one_znode_name_and_back(name: str) -> None:
    try:
        check_document_key("space", name)
    except InvalidMetadata:
        return  # a lone surrogate: refused before any path is made
    escaped = znode_name(name)
    assert escaped not in (".", "..")
    assert all(c.isascii() and (c.isalnum() or c in "._-%") for c in escaped)
    assert key_of_znode(escaped) == name


def test_znode_names_escape_all_but_a_safe_set() -> None:
    assert znode_name("plain-name_1.2") == "plain-name_1.2"
    assert znode_name("a b/c%") == "a%20b%2Fc%25"
    assert znode_name("é") == "%C3%A9"
    assert znode_name(".") == "%2E"
    assert znode_name("..") == "%2E%2E"
    assert znode_name("...") == "..."
    for name in ODD_NAMES:
        assert key_of_znode(znode_name(name)) == name
    for foreign in ("%4", "%zz", "a b", "%C3"):
        with pytest.raises(InvalidMetadata, match="not a document name escaped by Pora"):
            key_of_znode(foreign)


async def test_zookeeper_keeps_documents_under_their_space(
    request: pytest.FixtureRequest,
) -> None:
    url = fresh_zk_url(request)
    async with open_metadata(url) as opened:
        store = cast("ZooKeeperMetadataStore", opened)
        root = store.paths.root
        assert not store.client.exists(f"{root}/documents")  # made on demand, not at open
        await store.create_document("streams", "a b", b"one")
        await store.create_document("streams", "..", b"two")
        await store.update_document("streams", "a b", b"three", 0)
        assert sorted(store.client.get_children(f"{root}/documents/streams")) == [
            "%2E%2E",
            "a%20b",
        ]
        data, stat = store.client.get(f"{root}/documents/streams/a%20b")
        assert (data, stat.version) == (b"three", 1)


@contextmanager
def process_holding_the_write_lock(path: Path) -> Iterator[None]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.kill()
        holder.wait()


def test_sqlite_reads_need_no_write_lock(run: Runner, tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    url = f"sqlite:///{path}"
    config = MetadataConfig(call_timeout_s=1.0)

    async def set_up(store: MetadataStore) -> None:
        await store.create_document("streams", "events", b"v0")

    with_store(run, url, set_up)
    with process_holding_the_write_lock(path):

        async def body(store: MetadataStore) -> None:
            assert await store.read_document("streams", "events") == Versioned(b"v0", 0)
            assert await store.list_documents("streams") == ["events"]
            with pytest.raises(MetadataTimeout, match="locked"):
                await store.update_document("streams", "events", b"v1", 0)

        with_store(run, url, body, config)

    async def after(store: MetadataStore) -> None:
        # the write refused for the held lock did not happen
        assert await store.read_document("streams", "events") == Versioned(b"v0", 0)

    with_store(run, url, after)


def test_sqlite_file_without_the_documents_table(run: Runner, tmp_path: Path) -> None:
    """A file of the current schema version made before documents existed: reads need
    no table (nor the write lock to make one); the first write makes it."""
    path = tmp_path / "meta.db"
    url = f"sqlite:///{path}"

    async def set_up(store: MetadataStore) -> None:
        await store.list_ledgers()

    with_store(run, url, set_up)
    with sqlite3.connect(path) as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    assert "documents" not in tables
    with process_holding_the_write_lock(path):

        async def read_only(store: MetadataStore) -> None:
            assert await store.list_documents("streams") == []
            with pytest.raises(NoSuchDocument):
                await store.read_document("streams", "events")
            with pytest.raises(NoSuchDocument):
                async for _ in store.watch_document("streams", "events"):
                    pass

        with_store(run, url, read_only, MetadataConfig(call_timeout_s=1.0))

    async def write(store: MetadataStore) -> None:
        await store.create_document("streams", "events", b"v0")
        assert await store.list_documents("streams") == ["events"]

    with_store(run, url, write)


def test_sqlite_document_calls_notice_a_removed_file(run: Runner, tmp_path: Path) -> None:
    path = tmp_path / "meta.db"

    async def body(store: MetadataStore) -> None:
        await store.create_document("streams", "events", b"v0")
        os.remove(path)
        with pytest.raises(MetadataStoreGone):
            await store.read_document("streams", "events")
        with pytest.raises(MetadataStoreGone):
            await store.update_document("streams", "events", b"v1", 0)

    with_store(run, f"sqlite:///{path}", body)
