"""Ledger ids and ledger metadata in the SQLite metadata store: every
compare-and-set is a conditional statement inside the writer's transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import aclosing
from functools import partial
from pathlib import Path

import anyio

from pora.meta.config import MetadataConfig
from pora.meta.errors import (
    LedgerExists,
    MetadataError,
    MetadataVersionConflict,
    NoSuchLedgerMetadata,
)
from pora.meta.records import LedgerMetadata, Versioned
from pora.meta.sqlite_file import SqliteFile, poll_versions


class SqliteLedgerRecords(SqliteFile):
    """The ledger ids and ledger records of a `SqliteMetadataStore`."""

    def __init__(self, url: str, path: Path, config: MetadataConfig) -> None:
        super().__init__(url, path, config)
        self._id_lock = anyio.Lock()
        self._next_id = 0
        self._block_end = 0

    # --- ledger ids

    async def allocate_ledger_id(self) -> int:
        async with self._id_lock:
            if self._next_id >= self._block_end:
                block = self._config.id_block_size
                start = await self._write(partial(self._reserve_ids, block))
                self._next_id, self._block_end = start, start + block
            ledger_id = self._next_id
            self._next_id += 1
            return ledger_id

    @staticmethod
    def _reserve_ids(block: int, conn: sqlite3.Connection) -> int:
        (start,) = conn.execute("SELECT next_id FROM id_blocks WHERE name = 'ledger'").fetchone()
        conn.execute("UPDATE id_blocks SET next_id = next_id + ? WHERE name = 'ledger'", (block,))
        return int(start)

    # --- ledger metadata

    async def create_ledger(self, meta: LedgerMetadata) -> Versioned[LedgerMetadata]:
        record = meta.encode(self._config.record_bytes_max)

        def create(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(
                    "INSERT INTO ledgers (ledger_id, version, record) VALUES (?, 0, ?)",
                    (meta.ledger_id, record),
                )
            except sqlite3.IntegrityError:
                raise LedgerExists(meta.ledger_id) from None

        await self._write(create)
        return Versioned(meta, 0)

    async def read_ledger(self, ledger_id: int) -> Versioned[LedgerMetadata]:
        def read(conn: sqlite3.Connection) -> tuple[int, bytes] | None:
            return conn.execute(  # type: ignore[no-any-return]
                "SELECT version, record FROM ledgers WHERE ledger_id = ?", (ledger_id,)
            ).fetchone()

        row = await self._call(read)
        if row is None:
            raise NoSuchLedgerMetadata(ledger_id)
        return Versioned(LedgerMetadata.decode(row[1]), row[0])

    @staticmethod
    def _conflict(conn: sqlite3.Connection, ledger_id: int, expected: int) -> MetadataError:
        row = conn.execute("SELECT version FROM ledgers WHERE ledger_id = ?", (ledger_id,))
        found = row.fetchone()
        if found is None:
            return NoSuchLedgerMetadata(ledger_id)
        return MetadataVersionConflict(f"ledger {ledger_id}", expected, int(found[0]))

    async def update_ledger(
        self, meta: LedgerMetadata, expected_version: int
    ) -> Versioned[LedgerMetadata]:
        record = meta.encode(self._config.record_bytes_max)

        def update(conn: sqlite3.Connection) -> None:
            changed = conn.execute(
                "UPDATE ledgers SET version = version + 1, record = ?"
                " WHERE ledger_id = ? AND version = ?",
                (record, meta.ledger_id, expected_version),
            ).rowcount
            if changed != 1:
                raise self._conflict(conn, meta.ledger_id, expected_version)

        await self._write(update)
        return Versioned(meta, expected_version + 1)

    async def delete_ledger(self, ledger_id: int, expected_version: int) -> None:
        def delete(conn: sqlite3.Connection) -> None:
            changed = conn.execute(
                "DELETE FROM ledgers WHERE ledger_id = ? AND version = ?",
                (ledger_id, expected_version),
            ).rowcount
            if changed != 1:
                raise self._conflict(conn, ledger_id, expected_version)

        await self._write(delete)

    async def list_ledgers(
        self, after_id: int = -1, limit: int = 1000
    ) -> list[Versioned[LedgerMetadata]]:
        def page(conn: sqlite3.Connection) -> list[tuple[int, bytes]]:
            return conn.execute(
                "SELECT version, record FROM ledgers WHERE ledger_id > ?"
                " ORDER BY ledger_id LIMIT ?",
                (after_id, limit),
            ).fetchall()

        return [Versioned(LedgerMetadata.decode(r), v) for v, r in await self._call(page)]

    async def watch_ledger(
        self, ledger_id: int, after_version: int | None = None
    ) -> AsyncIterator[Versioned[LedgerMetadata]]:
        def poll(seen: int, conn: sqlite3.Connection) -> tuple[int, bytes | None] | None:
            return conn.execute(  # type: ignore[no-any-return]
                "SELECT version, CASE WHEN version > ? THEN record END"
                " FROM ledgers WHERE ledger_id = ?",
                (seen, ledger_id),
            ).fetchone()

        changes = poll_versions(self, poll, after_version, lambda: NoSuchLedgerMetadata(ledger_id))
        # closed with the watch, not left to the garbage collector
        async with aclosing(changes):
            async for version, record in changes:
                yield Versioned(LedgerMetadata.decode(record), version)


__all__ = ["SqliteLedgerRecords"]
