"""The node registry in the SQLite metadata store: one row per node address, held
by one node instance while its lease lasts."""

from __future__ import annotations

import sqlite3
import time

from pora.meta.errors import MetadataError, NodeAddressTaken, RegistrationLost
from pora.meta.records import NodeRegistration
from pora.meta.sqlite_file import SqliteFile
from pora.meta.store import DEFAULT_LEASE_S


def _now_ms() -> int:
    return int(time.time() * 1000)


class SqliteNodeRegistry(SqliteFile):
    """The node registrations of a `SqliteMetadataStore`."""

    # --- node registry

    async def register_node(
        self, registration: NodeRegistration, lease_s: float = DEFAULT_LEASE_S
    ) -> None:
        registration.validate()
        if lease_s <= 0:
            raise MetadataError(f"a lease must be positive, not {lease_s} s")

        def register(conn: sqlite3.Connection) -> None:
            now = _now_ms()
            held = conn.execute(
                "SELECT instance_id, lease_expires_ms, version FROM nodes WHERE address = ?",
                (registration.address,),
            ).fetchone()
            if held is not None and held[0] != registration.instance_id and held[1] > now:
                raise NodeAddressTaken(registration.address, held[0], (held[1] - now) / 1000)
            conn.execute(
                "INSERT OR REPLACE INTO nodes (address, instance_id, read_only, free_bytes,"
                " rack, last_seen_ms, lease_expires_ms, version)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    registration.address,
                    registration.instance_id,
                    int(registration.read_only),
                    registration.free_bytes,
                    registration.rack,
                    now,
                    now + int(lease_s * 1000),
                    0 if held is None else held[2] + 1,
                ),
            )

        await self._write(register)

    async def renew_node(
        self, address: str, instance_id: str, lease_s: float = DEFAULT_LEASE_S
    ) -> None:
        def renew(conn: sqlite3.Connection) -> int:
            now = _now_ms()
            return conn.execute(
                "UPDATE nodes SET last_seen_ms = ?, lease_expires_ms = ?, version = version + 1"
                " WHERE address = ? AND instance_id = ?",
                (now, now + int(lease_s * 1000), address, instance_id),
            ).rowcount

        if await self._write(renew) != 1:
            raise RegistrationLost(address, instance_id)

    async def update_registration(self, registration: NodeRegistration) -> None:
        registration.validate()

        def update(conn: sqlite3.Connection) -> int:
            return conn.execute(
                "UPDATE nodes SET read_only = ?, free_bytes = ?, rack = ?, last_seen_ms = ?,"
                " version = version + 1 WHERE address = ? AND instance_id = ?",
                (
                    int(registration.read_only),
                    registration.free_bytes,
                    registration.rack,
                    _now_ms(),
                    registration.address,
                    registration.instance_id,
                ),
            ).rowcount

        if await self._write(update) != 1:
            raise RegistrationLost(registration.address, registration.instance_id)

    async def unregister_node(self, address: str, instance_id: str) -> None:
        def delete(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM nodes WHERE address = ? AND instance_id = ?", (address, instance_id)
            )

        await self._write(delete)

    async def list_nodes(self, writable_only: bool = False) -> list[NodeRegistration]:
        def live(conn: sqlite3.Connection) -> list[tuple[str, str, int, int, str | None, int]]:
            return conn.execute(
                "SELECT address, instance_id, read_only, free_bytes, rack, last_seen_ms"
                " FROM nodes WHERE lease_expires_ms > ? AND (read_only = 0 OR ?)"
                " ORDER BY address",
                (_now_ms(), int(not writable_only)),
            ).fetchall()

        return [
            NodeRegistration(address, instance, bool(read_only), free, rack, seen)
            for address, instance, read_only, free, rack, seen in await self._call(live)
        ]


__all__ = ["SqliteNodeRegistry"]
