"""Documents in the SQLite metadata store: one table, made by the first write that
needs it, so that a store opened only to read never has to create it and a file of
the current schema version gets it without an upgrade step (docs/metadata.md). Every
compare-and-set is a conditional statement inside the writer's transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import aclosing
from functools import partial

from pora.meta.documents import (
    check_document_data,
    check_document_key,
    check_page,
    check_version,
    document_key,
)
from pora.meta.errors import (
    DocumentExists,
    MetadataError,
    MetadataVersionConflict,
    NoSuchDocument,
)
from pora.meta.records import Versioned
from pora.meta.sqlite_file import SqliteFile, poll_versions

# BINARY collation (the default) compares TEXT with memcmp on its UTF-8: the primary
# key's order is the bytewise order listings promise
DOCUMENTS_TABLE = (
    "CREATE TABLE IF NOT EXISTS documents (space TEXT NOT NULL, name TEXT NOT NULL,"
    " version INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (space, name))"
)


def _missing_table(error: sqlite3.OperationalError) -> bool:
    return "no such table" in str(error)


class SqliteDocuments(SqliteFile):
    """The documents of a `SqliteMetadataStore`."""

    async def create_document(self, space: str, name: str, data: bytes) -> Versioned[bytes]:
        check_document_key(space, name)
        data = check_document_data(space, name, data, self._config.record_bytes_max)

        def create(conn: sqlite3.Connection) -> None:
            conn.execute(DOCUMENTS_TABLE)
            try:
                conn.execute(
                    "INSERT INTO documents (space, name, version, data) VALUES (?, ?, 0, ?)",
                    (space, name, data),
                )
            except sqlite3.IntegrityError:
                raise DocumentExists(space, name) from None

        await self._write(create)
        return Versioned(data, 0)

    @staticmethod
    def _select(space: str, name: str, conn: sqlite3.Connection) -> tuple[int, bytes] | None:
        try:
            return conn.execute(  # type: ignore[no-any-return]
                "SELECT version, data FROM documents WHERE space = ? AND name = ?",
                (space, name),
            ).fetchone()
        except sqlite3.OperationalError as error:
            if _missing_table(error):
                return None  # no document was ever created in this store
            raise

    async def read_document(self, space: str, name: str) -> Versioned[bytes]:
        check_document_key(space, name)
        row = await self._call(partial(self._select, space, name))
        if row is None:
            raise NoSuchDocument(space, name)
        return Versioned(bytes(row[1]), int(row[0]))

    @classmethod
    def _refusal(
        cls, conn: sqlite3.Connection, space: str, name: str, expected: int
    ) -> MetadataError:
        found = cls._select(space, name, conn)
        if found is None:
            return NoSuchDocument(space, name)
        return MetadataVersionConflict(document_key(space, name), expected, int(found[0]))

    async def update_document(
        self, space: str, name: str, data: bytes, expected_version: int
    ) -> Versioned[bytes]:
        check_document_key(space, name)
        data = check_document_data(space, name, data, self._config.record_bytes_max)
        expected = check_version(space, name, expected_version)

        def update(conn: sqlite3.Connection) -> None:
            conn.execute(DOCUMENTS_TABLE)
            changed = conn.execute(
                "UPDATE documents SET version = version + 1, data = ?"
                " WHERE space = ? AND name = ? AND version = ?",
                (data, space, name, expected),
            ).rowcount
            if changed != 1:
                raise self._refusal(conn, space, name, expected)

        await self._write(update)
        return Versioned(data, expected + 1)

    async def delete_document(self, space: str, name: str, expected_version: int) -> None:
        check_document_key(space, name)
        expected = check_version(space, name, expected_version)

        def delete(conn: sqlite3.Connection) -> None:
            conn.execute(DOCUMENTS_TABLE)
            changed = conn.execute(
                "DELETE FROM documents WHERE space = ? AND name = ? AND version = ?",
                (space, name, expected),
            ).rowcount
            if changed != 1:
                raise self._refusal(conn, space, name, expected)

        await self._write(delete)

    async def list_documents(self, space: str, after: str = "", limit: int = 1000) -> list[str]:
        check_page(space, after, limit)

        def page(conn: sqlite3.Connection) -> list[str]:
            try:
                rows = conn.execute(
                    "SELECT name FROM documents WHERE space = ? AND name > ? ORDER BY name LIMIT ?",
                    (space, after, limit),
                ).fetchall()
            except sqlite3.OperationalError as error:
                if _missing_table(error):
                    return []
                raise
            return [str(name) for (name,) in rows]

        return await self._call(page)

    async def watch_document(
        self, space: str, name: str, after_version: int | None = None
    ) -> AsyncIterator[Versioned[bytes]]:
        check_document_key(space, name)

        def poll(seen: int, conn: sqlite3.Connection) -> tuple[int, bytes | None] | None:
            try:
                return conn.execute(  # type: ignore[no-any-return]
                    "SELECT version, CASE WHEN version > ? THEN data END"
                    " FROM documents WHERE space = ? AND name = ?",
                    (seen, space, name),
                ).fetchone()
            except sqlite3.OperationalError as error:
                if _missing_table(error):
                    return None
                raise

        changes = poll_versions(self, poll, after_version, lambda: NoSuchDocument(space, name))
        # closed with the watch, not left to the garbage collector
        async with aclosing(changes):
            async for version, data in changes:
                yield Versioned(bytes(data), version)


__all__ = ["DOCUMENTS_TABLE", "SqliteDocuments"]
