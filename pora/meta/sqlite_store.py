"""The embedded metadata store: one SQLite file that many processes on one machine
share (WAL mode, SQLite's own locking). Reads run in worker threads on pooled
connections (WAL readers never wait for the writer); writes go to one writer thread
that commits whatever is queued in one `BEGIN IMMEDIATE` transaction
(pora/meta/sqlite_writer.py, which says what a caller that timed out knows); every
compare-and-set is a conditional statement inside it. docs/metadata.md gives the
schema."""

from __future__ import annotations

from pathlib import Path

from pora.meta.config import MetadataConfig
from pora.meta.sqlite_documents import SqliteDocuments
from pora.meta.sqlite_file import sqlite_path
from pora.meta.sqlite_identity import SqliteClusterIdentity
from pora.meta.sqlite_ledgers import SqliteLedgerRecords
from pora.meta.sqlite_locks import SqliteLocks
from pora.meta.sqlite_nodes import SqliteNodeRegistry
from pora.meta.sqlite_writer import BatchWriter


class SqliteMetadataStore(
    SqliteLedgerRecords, SqliteNodeRegistry, SqliteClusterIdentity, SqliteDocuments, SqliteLocks
):
    """The `MetadataStore` on one SQLite file: the file (pora.meta.sqlite_file),
    ledger records (pora.meta.sqlite_ledgers), node registrations
    (pora.meta.sqlite_nodes), the cluster id and node marks
    (pora.meta.sqlite_identity), documents (pora.meta.sqlite_documents), locks
    (pora.meta.sqlite_locks). Make one
    with `open`."""

    @classmethod
    async def open(
        cls, url: str, path: Path, config: MetadataConfig, *, create: bool
    ) -> SqliteMetadataStore:
        store = cls(url, path, config)
        await store._open(create)
        store._writer = BatchWriter(
            f"pora-meta-writer {url}", store._connect, store._sqlite_failure, store._check_file
        )
        return store


__all__ = ["SqliteMetadataStore", "sqlite_path"]
