"""Locks in the SQLite metadata store (docs/rereplication.md, A4): one row per held
lock with a wall-clock lease, as node registrations have (pora/meta/sqlite_nodes.py
says why every process sharing the file shares its clock). The table is made by the
first write that needs it, as the documents' is, so a file of the current schema
version gets it without an upgrade step."""

from __future__ import annotations

import sqlite3
import time

from pora.meta.config import DEFAULT_LEASE_S
from pora.meta.errors import LockLost
from pora.meta.locks import check_lock
from pora.meta.sqlite_file import SqliteFile

LOCKS_TABLE = (
    "CREATE TABLE IF NOT EXISTS locks (name TEXT PRIMARY KEY, holder TEXT NOT NULL,"
    " lease_expires_ms INTEGER NOT NULL)"
)


def _now_ms() -> int:
    return int(time.time() * 1000)


class SqliteLocks(SqliteFile):
    """The locks of a `SqliteMetadataStore`."""

    async def acquire_lock(self, name: str, holder: str, lease_s: float = DEFAULT_LEASE_S) -> bool:
        check_lock(name, holder, lease_s)

        def acquire(conn: sqlite3.Connection) -> bool:
            conn.execute(LOCKS_TABLE)
            now = _now_ms()
            # taken when free, expired, or already this holder's (a renewal)
            return (
                conn.execute(
                    "INSERT INTO locks (name, holder, lease_expires_ms) VALUES (?, ?, ?)"
                    " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,"
                    " lease_expires_ms = excluded.lease_expires_ms"
                    " WHERE locks.holder = excluded.holder OR locks.lease_expires_ms <= ?",
                    (name, holder, now + int(lease_s * 1000), now),
                ).rowcount
                == 1
            )

        return bool(await self._write(acquire))

    async def renew_lock(self, name: str, holder: str, lease_s: float = DEFAULT_LEASE_S) -> None:
        check_lock(name, holder, lease_s)

        def renew(conn: sqlite3.Connection) -> int:
            conn.execute(LOCKS_TABLE)
            now = _now_ms()
            # a lapsed lease is lost even if nobody took it yet: the holder was
            # stopped that long, and another worker may have started and gone
            return conn.execute(
                "UPDATE locks SET lease_expires_ms = ? WHERE name = ? AND holder = ?"
                " AND lease_expires_ms > ?",
                (now + int(lease_s * 1000), name, holder, now),
            ).rowcount

        if await self._write(renew) != 1:
            raise LockLost(name, holder)

    async def release_lock(self, name: str, holder: str) -> None:
        check_lock(name, holder)

        def release(conn: sqlite3.Connection) -> None:
            conn.execute(LOCKS_TABLE)
            conn.execute("DELETE FROM locks WHERE name = ? AND holder = ?", (name, holder))

        await self._write(release)


__all__ = ["SqliteLocks"]
