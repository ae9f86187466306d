"""`open_metadata(url)`: the metadata store a URL names, SQLite or ZooKeeper, and
`check_metadata_url`, which tells a URL that cannot name one before anything is
opened.

Above the backends (sqlite_store.py, zk_store.py), which it imports only when a
URL asks for one: a client of SQLite never loads kazoo.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pora.meta.config import MetadataConfig
from pora.meta.errors import MetadataUnavailable
from pora.meta.store import MetadataStore


def check_metadata_url(url: str) -> None:
    """MetadataUnavailable, saying what a URL looks like, for one that cannot name a
    store (an unknown scheme, a sqlite URL without a path, a zk:// host list with a
    bad port or bracket); nothing is opened. Commands check their `--metadata` with
    it before they start anything."""
    if url.startswith("sqlite:"):
        from pora.meta.sqlite_file import sqlite_path  # noqa: PLC0415

        sqlite_path(url)
    elif url.startswith("zk://"):
        from pora.meta.zk_layout import parse_zk_url  # noqa: PLC0415

        parse_zk_url(url)
    else:
        raise MetadataUnavailable(
            url,
            "unknown URL scheme",
            "use sqlite:///abs/path.db, sqlite:relative/path.db or zk://host:port,.../chroot",
        )


@asynccontextmanager
async def open_metadata(
    url: str, config: MetadataConfig | None = None, *, create: bool = True
) -> AsyncIterator[MetadataStore]:
    """Open the store `url` names: `sqlite:///abs/path.db`, `sqlite:relative/path.db`
    or ZooKeeper's `zk://host:port,.../chroot`.

    `create`: set up a missing store (the SQLite file and schema, ZooKeeper's layout
    under the chroot). False opens only a store already set up and raises
    `MetadataUnavailable`, naming the path, for one that is not: clients
    (`pora.connect`) and the inspection commands pass False, so a mistyped URL never
    leaves a fresh empty store behind for the nodes to find. The default stays True
    because this call is the low-level one the node's path and tools set up stores
    with. Opening a store already set up reads only (no write lock) either way."""
    config = config or MetadataConfig()
    check_metadata_url(url)
    if url.startswith("sqlite:"):
        from pora.meta.sqlite_store import SqliteMetadataStore, sqlite_path  # noqa: PLC0415

        store: MetadataStore = await SqliteMetadataStore.open(
            url, sqlite_path(url), config, create=create
        )
    else:
        from pora.meta.zk_store import ZooKeeperMetadataStore  # noqa: PLC0415

        store = await ZooKeeperMetadataStore.open(url, config, create=create)
    try:
        yield store
    finally:
        await store.aclose()
