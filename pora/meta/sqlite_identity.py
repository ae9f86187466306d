"""The cluster's identity and the nodes' marks in the SQLite metadata store: two
tables of their own, made by the first write that needs them, so that a store
opened only to read never has to create them (docs/metadata.md)."""

from __future__ import annotations

import sqlite3
import time

from pora.meta.identity import check_node_mark, new_cluster_id
from pora.meta.sqlite_file import SqliteFile

IDENTITY_SCHEMA = (
    # one row at most (id = 0): the cluster id made when the store was set up
    "CREATE TABLE IF NOT EXISTS cluster (id INTEGER PRIMARY KEY CHECK (id = 0),"
    " cluster_id TEXT NOT NULL, created_ms INTEGER NOT NULL)",
    # how far each node instance's data dir has come (its journal's durable seq)
    "CREATE TABLE IF NOT EXISTS node_marks (instance_id TEXT PRIMARY KEY,"
    " mark INTEGER NOT NULL, updated_ms INTEGER NOT NULL)",
)


def _missing_table(error: sqlite3.OperationalError) -> bool:
    return "no such table" in str(error)


class SqliteClusterIdentity(SqliteFile):
    """The cluster id and node marks of a `SqliteMetadataStore`."""

    async def cluster_id(self) -> str | None:
        def read(conn: sqlite3.Connection) -> str | None:
            try:
                row = conn.execute("SELECT cluster_id FROM cluster WHERE id = 0").fetchone()
            except sqlite3.OperationalError as error:
                if _missing_table(error):
                    return None  # never set up
                raise
            return None if row is None else str(row[0])

        return await self._call(read)

    async def initialize_cluster(self) -> str:
        candidate = new_cluster_id()

        def initialize(conn: sqlite3.Connection) -> str:
            for statement in IDENTITY_SCHEMA:
                conn.execute(statement)
            # the writer's transaction holds the file's write lock: of two processes
            # setting the store up at once, the second finds the first one's row
            conn.execute(
                "INSERT OR IGNORE INTO cluster (id, cluster_id, created_ms) VALUES (0, ?, ?)",
                (candidate, int(time.time() * 1000)),
            )
            return str(conn.execute("SELECT cluster_id FROM cluster WHERE id = 0").fetchone()[0])

        return await self._write(initialize)

    async def node_mark(self, instance_id: str) -> int | None:
        def read(conn: sqlite3.Connection) -> int | None:
            try:
                row = conn.execute(
                    "SELECT mark FROM node_marks WHERE instance_id = ?", (instance_id,)
                ).fetchone()
            except sqlite3.OperationalError as error:
                if _missing_table(error):
                    return None
                raise
            return None if row is None else int(row[0])

        return await self._call(read)

    async def advance_node_mark(self, instance_id: str, mark: int) -> None:
        check_node_mark(instance_id, mark)

        def advance(conn: sqlite3.Connection) -> None:
            conn.execute(IDENTITY_SCHEMA[1])
            conn.execute(
                "INSERT INTO node_marks (instance_id, mark, updated_ms) VALUES (?, ?, ?)"
                " ON CONFLICT (instance_id) DO UPDATE SET"
                " mark = max(mark, excluded.mark), updated_ms = excluded.updated_ms",
                (instance_id, mark, int(time.time() * 1000)),
            )

        await self._write(advance)


__all__ = ["IDENTITY_SCHEMA", "SqliteClusterIdentity"]
