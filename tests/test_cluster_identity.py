"""A cluster knows its own metadata store, and a node knows when its data dir went back
in time: the store's cluster id and per-instance marks on both backends, `pora serve`
joining a new store, refusing another cluster's (or a missing or empty one) with exit
status 2, and a data dir behind its instance's mark starting as a new instance."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import pytest
import trio
from test_node_registration import metadata_url
from zookeeper_support import fresh_zk_url

import pora
from pora.meta.backends import open_metadata
from pora.meta.errors import InvalidMetadata
from pora.meta.store import MetadataStore
from pora.node.datadir import CLUSTER_NAME, open_data_dir, read_cluster_id
from pora.server.membership import ForeignMetadataStore, check_mark, join_cluster
from pora.server.node_mark import NodeMark
from pora.server.registration import NodeRegistrar, NodeState

SERVE_TIMEOUT_S = 60.0
__all__ = ["metadata_url"]  # the fixture: each test on SQLite and on ZooKeeper


@pytest.fixture
def other_url(request: pytest.FixtureRequest, metadata_url: str, tmp_path: Path) -> str:
    """A second, separate store of the same backend."""
    if metadata_url.startswith("zk://"):
        return fresh_zk_url(request)
    return f"sqlite://{tmp_path}/other.db"


# --- the store: one cluster id, marks that never go back


async def test_a_new_store_has_no_cluster_id_until_set_up_and_racers_share_one(
    metadata_url: str,
) -> None:
    async with open_metadata(metadata_url) as first, open_metadata(metadata_url) as second:
        assert await first.cluster_id() is None
        ids: list[str] = []

        async def set_up(store: MetadataStore) -> None:
            ids.append(await store.initialize_cluster())

        async with trio.open_nursery() as nursery:
            for store in (first, second, first, second):
                nursery.start_soon(set_up, store)
        assert len(set(ids)) == 1
        assert await first.cluster_id() == await second.cluster_id() == ids[0]
        assert await first.initialize_cluster() == ids[0]  # set up once, for good


async def test_two_stores_get_two_cluster_ids(metadata_url: str, other_url: str) -> None:
    async with open_metadata(metadata_url) as one, open_metadata(other_url) as two:
        assert await one.initialize_cluster() != await two.initialize_cluster()


async def test_a_node_mark_only_goes_up(metadata_url: str) -> None:
    async with open_metadata(metadata_url) as store:
        assert await store.node_mark("abc123") is None
        await store.advance_node_mark("abc123", 10)
        await store.advance_node_mark("abc123", 7)
        assert await store.node_mark("abc123") == 10
        await store.advance_node_mark("abc123", 12)
        assert await store.node_mark("abc123") == 12
        assert await store.node_mark("other") is None
        for instance_id, mark in (("", 1), ("a/b", 1), ("abc123", -1)):
            with pytest.raises(InvalidMetadata):
                await store.advance_node_mark(instance_id, mark)


# --- the node's side, in process


async def test_a_fresh_data_dir_sets_up_a_fresh_store_and_refuses_another_after(
    tmp_path: Path, metadata_url: str, other_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    directory = open_data_dir(tmp_path / "data")
    caplog.set_level(logging.INFO, "pora.membership")
    async with open_metadata(metadata_url) as store:
        cluster_id = await join_cluster(store, directory)
        assert await store.cluster_id() == cluster_id
        assert await join_cluster(store, directory) == cluster_id  # the same, again
    assert read_cluster_id(directory.root) == cluster_id
    assert json.loads((directory.root / CLUSTER_NAME).read_text())["metadata"] == metadata_url
    assert f"set it up as cluster {cluster_id}" in caplog.text
    assert f"joined cluster {cluster_id}" in caplog.text

    # another cluster's store, and a store never set up: refused, naming both ids
    async with open_metadata(other_url) as other:
        with pytest.raises(ForeignMetadataStore, match=f"belongs to cluster {cluster_id}") as empty:
            await join_cluster(other, directory)
        assert empty.value.found is None
        assert "has no cluster id" in str(empty.value)
        assert await other.cluster_id() is None  # a refused node sets nothing up
        other_id = await other.initialize_cluster()
        with pytest.raises(ForeignMetadataStore) as foreign:
            await join_cluster(other, directory)
        assert (foreign.value.expected, foreign.value.found) == (cluster_id, other_id)
        assert f"the metadata store {other_url} belongs to cluster {other_id}" in str(foreign.value)


async def test_a_second_fresh_data_dir_joins_the_cluster_already_set_up(
    tmp_path: Path, metadata_url: str
) -> None:
    async with open_metadata(metadata_url) as store:
        first = await join_cluster(store, open_data_dir(tmp_path / "a"))
        assert await join_cluster(store, open_data_dir(tmp_path / "b")) == first


async def test_a_data_dir_behind_its_mark_starts_as_a_new_instance(
    tmp_path: Path, metadata_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    live, copy = tmp_path / "data", tmp_path / "copy"
    async with open_metadata(metadata_url) as store:
        async with pora.open_node(live) as node:
            instance = node.data_dir.instance_id
            assert await check_mark(store, node.data_dir, _position(node)) == node.data_dir
        shutil.copytree(live, copy)  # the operator's copy, before the writes below
        async with pora.open_node(live) as node:
            for entry_id in range(20):
                await node.add_entry(1, entry_id, b"acknowledged")
            await store.advance_node_mark(instance, _position(node))
        # the live dir itself is not behind: same instance
        async with pora.open_node(live) as node:
            assert await check_mark(store, node.data_dir, _position(node)) == node.data_dir
        mark = await store.node_mark(instance)
        assert mark is not None

        shutil.rmtree(live)
        shutil.move(copy, live)  # put back from the copy
        caplog.set_level(logging.ERROR, "pora.membership")
        async with pora.open_node(live) as node:
            behind = _position(node)
            assert behind < mark
            renewed = await check_mark(store, node.data_dir, behind)
        assert renewed.instance_id != instance
        assert open_data_dir(live).instance_id == renewed.instance_id  # durably
        marker = json.loads((live / "PORA").read_text())
        assert marker["replaced_instance_id"] == instance
        assert await store.node_mark(renewed.instance_id) == behind
        assert await store.node_mark(instance) == mark  # a second put-back is caught too
        (record,) = caplog.records
        fields = record.__dict__["fields"]
        assert fields == {
            "expected_mark": mark,
            "found_mark": behind,
            "old_instance_id": instance,
            "new_instance_id": renewed.instance_id,
        }
        assert f"is behind what node instance {instance} acknowledged" in record.getMessage()


def _position(node: pora.Node) -> int:
    return node.statistics().journal.dispatched_seq


# --- `pora serve`: what an operator sees


async def _serve_refused(data_dir: Path, url: str) -> str:
    command = [
        sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(data_dir),
        "--listen", "127.0.0.1:0", "--metadata", url, "--log-format", "logfmt",
    ]  # fmt: skip
    with trio.fail_after(SERVE_TIMEOUT_S):
        result = await trio.run_process(command, capture_stderr=True, check=False)
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    errors = [line for line in stderr.splitlines() if "level=error" in line]
    assert len(errors) == 1, stderr
    return errors[0]


async def test_serve_refuses_a_missing_sqlite_store_file_and_does_not_create_it(
    tmp_path: Path,
) -> None:
    directory = open_data_dir(tmp_path / "data")
    url = f"sqlite://{tmp_path}/meta.db"
    async with open_metadata(url) as store:
        cluster_id = await join_cluster(store, directory)
    (tmp_path / "meta.db").unlink()
    error = await _serve_refused(directory.root, url)
    assert f"belongs to cluster {cluster_id}" in error
    assert "does not exist" in error
    assert not (tmp_path / "meta.db").exists()


async def test_serve_refuses_another_clusters_store_and_an_empty_one(
    tmp_path: Path, metadata_url: str, other_url: str
) -> None:
    directory = open_data_dir(tmp_path / "data")
    async with open_metadata(metadata_url) as store:
        cluster_id = await join_cluster(store, directory)
    async with open_metadata(other_url) as other:
        assert await other.cluster_id() is None  # a store that exists, never set up
    error = await _serve_refused(directory.root, other_url)
    assert f"belongs to cluster {cluster_id}" in error
    assert "has no cluster id" in error
    async with open_metadata(other_url) as other:
        other_id = await other.initialize_cluster()
        assert await other.list_nodes() == []  # never registered
    error = await _serve_refused(directory.root, other_url)
    assert f"belongs to cluster {cluster_id}, but the metadata store" in error
    assert f"belongs to cluster {other_id}" in error
    assert "Point --metadata at the store of cluster" in error


async def test_the_registrar_raises_the_mark_as_the_journal_moves_and_at_the_stop(
    metadata_url: str,
) -> None:
    position = [5]
    async with open_metadata(metadata_url) as store:
        mark = NodeMark(store)
        mark.start("instance1", lambda: position[0], None)  # the store holds none yet
        registrar = NodeRegistrar(
            store,
            "127.0.0.1:4000",
            "instance1",
            None,
            30.0,
            lambda: NodeState(read_only=False, free_bytes=1 << 30),
            mark,
        )
        await registrar.register()
        await registrar.tick()
        assert await store.node_mark("instance1") == 5
        position[0] = 9
        await registrar.tick()
        assert await store.node_mark("instance1") == mark.mark == 9
        position[0] = 12  # written after the drain: a copy taken before it is caught
        await registrar.unregister()
        assert await store.node_mark("instance1") == 12
        assert mark.failures == 0
