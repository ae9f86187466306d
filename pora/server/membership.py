"""A node's two checks against its metadata store before it serves (docs/operations.md,
"Cluster identity" and "A data dir restored from an older copy"):

- *Cluster identity* (BookKeeper's cookie): a store gets a random cluster id when it is
  first set up; a data dir records the id of the store it first joins (CLUSTER, beside
  the PORA marker) and from then on refuses any store that holds another id, or none.
  Without that, a node pointed at a new or wrong store would serve its old ledgers
  under ledger ids the store hands out again.
- *The mark*: the store keeps, per node instance id, how far the instance's data dir
  had come (its journal's durable seq, which only grows, across restarts and journal
  trims). A data dir found behind its instance's mark was restored from an older copy:
  it no longer holds entries its instance acknowledged, so it starts as a new instance
  (a fresh instance id), and everything that names the old instance counts its answers
  as another node's (docs/replication.md, R27).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from pora.meta.errors import MetadataError
from pora.meta.sqlite_file import sqlite_path
from pora.meta.store import MetadataStore
from pora.node.datadir import DataDir, new_instance, read_cluster_id, record_cluster_id
from pora.server.node_mark import NodeMark
from pora.server.registration import RegistrationRefused
from pora.server.settings import Settings

if TYPE_CHECKING:
    from pora.node.node import Node

_log = logging.getLogger("pora.membership")


class ForeignMetadataStore(RegistrationRefused):
    """The data dir belongs to another cluster than the store's (or the store was never
    set up): `pora serve` exits 2 with this line."""

    def __init__(self, data_dir: DataDir, url: str, expected: str, found: str | None) -> None:
        self.expected = expected
        self.found = found
        what = (
            "has no cluster id: it is a new or emptied store, not the one this data dir joined"
            if found is None
            else f"belongs to cluster {found}"
        )
        super().__init__(
            f"data dir {data_dir.root} belongs to cluster {expected}, but the metadata "
            f"store {url} {what}. Serving there would offer this node's ledgers under ids "
            "the store may hand out again. Point --metadata at the store of cluster "
            f"{expected}; or, to make this node a new, empty member of another cluster, "
            "start it on a new data dir"
        )


def refuse_missing_store(settings: Settings) -> None:
    """Refuse, before the store is opened (which would create an SQLite file), an
    SQLite store whose file is gone while the data dir belongs to a cluster: the file
    was deleted or the URL is wrong, and a new file is not that cluster's store."""
    url = settings.metadata
    if url is None or not url.startswith("sqlite:"):
        return
    expected = read_cluster_id(settings.data_dir.absolute())
    if expected is None:
        return
    path = sqlite_path(url)
    if not path.exists():
        raise RegistrationRefused(
            f"data dir {settings.data_dir.absolute()} belongs to cluster {expected}, but "
            f"the metadata store file {path.absolute()} does not exist (--metadata {url}): "
            f"it was deleted or the URL is wrong. Point --metadata at the store of cluster "
            f"{expected}, or restore its file; a new file is not that cluster's store"
        )


async def join_cluster(store: MetadataStore, directory: DataDir) -> str:
    """Check (or make) the data dir's membership of the store's cluster; returns the
    cluster id. ForeignMetadataStore if the dir belongs to another cluster."""
    expected = await trio.to_thread.run_sync(read_cluster_id, directory.root)
    found = await _store_cluster_id(store)
    if expected is not None:
        if found != expected:
            raise ForeignMetadataStore(directory, store.url, expected, found)
        return expected
    if found is None:
        try:
            found = await store.initialize_cluster()
        except MetadataError as error:
            raise RegistrationRefused(
                f"cannot set up the metadata store {store.url} as a new cluster: {error}"
            ) from None
        _log.warning(
            "the metadata store %s had no cluster id: set it up as cluster %s",
            store.url,
            found,
            extra={"fields": {"cluster_id": found, "metadata": store.url}},
        )
    await trio.to_thread.run_sync(record_cluster_id, directory, found, store.url)
    _log.info(
        "data dir %s joined cluster %s (metadata store %s)",
        directory.root,
        found,
        store.url,
        extra={"fields": {"cluster_id": found, "metadata": store.url}},
    )
    return found


async def _store_cluster_id(store: MetadataStore) -> str | None:
    try:
        return await store.cluster_id()
    except MetadataError as error:
        raise RegistrationRefused(
            f"cannot read the cluster id of the metadata store {store.url}: {error}"
        ) from None


async def check_mark(store: MetadataStore, directory: DataDir, position: int) -> DataDir:
    """Compare the data dir's journal position (the seq its next record gets) with
    the mark its instance left in the store: a dir behind it gets a new instance id.
    Then record the position as the (possibly new) instance's mark. Returns the data
    dir as the node must serve it."""
    try:
        mark = await store.node_mark(directory.instance_id)
    except MetadataError as error:
        raise RegistrationRefused(
            f"cannot read the mark of node instance {directory.instance_id} in "
            f"{store.url}: {error}. A node must not serve before it knows its data dir "
            "is not behind what it acknowledged; check the store (--metadata)"
        ) from None
    if mark is not None and position < mark:
        old = directory.instance_id
        directory = await trio.to_thread.run_sync(new_instance, directory)
        _log.error(
            "data dir %s is behind what node instance %s acknowledged: its journal is at "
            "seq %d, the instance's mark in %s is %d. It was restored from an older copy "
            "(or lost writes): it starts as the new instance %s, and every ledger that "
            "names %s counts this node's answers as another node's",
            directory.root,
            old,
            position,
            store.url,
            mark,
            directory.instance_id,
            old,
            extra={
                "fields": {
                    "expected_mark": mark,
                    "found_mark": position,
                    "old_instance_id": old,
                    "new_instance_id": directory.instance_id,
                }
            },
        )
    try:
        await store.advance_node_mark(directory.instance_id, position)
    except MetadataError as error:
        raise RegistrationRefused(
            f"cannot write the mark of node instance {directory.instance_id} in "
            f"{store.url}: {error}. Check the store (--metadata)"
        ) from None
    return directory


async def start_mark(mark: NodeMark, node: Node, journal_position: Callable[[], int]) -> None:
    """Before the node listens: check its data dir against its instance's mark (a dir
    behind it starts as a new instance), record the start's position as the mark,
    and start `mark`, which the node's fences wait behind (`open_node(fence_barrier=
    mark.cover)`) until it is past each."""
    start = journal_position()
    node.data_dir = await check_mark(mark.store, node.data_dir, start)
    mark.start(node.data_dir.instance_id, journal_position, start)
