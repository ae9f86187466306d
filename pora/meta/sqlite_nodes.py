"""The node registry in the SQLite metadata store: one row per node address, held
by one node instance while its lease lasts.

Leases are wall-clock times: the renewing process writes `last_seen_ms` and
`lease_expires_ms` from its clock, and a reader compares them with its own. Every
process sharing the file runs on one machine (WAL needs shared memory), so they share
its clock unless one is faked or set apart (faketime, a container's own clock). A
reader does not trust a renewal stamped further in its future than the lease it
grants: such a row (a node whose clock runs ahead, alive or long dead) is neither
listed nor allowed to hold its address, and the reader logs it."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

from pora.meta.config import DEFAULT_LEASE_S, MetadataConfig
from pora.meta.documents import NODE_DRAINING_SPACE
from pora.meta.errors import MetadataError, NodeAddressTaken, RegistrationLost
from pora.meta.records import NodeRegistration
from pora.meta.sqlite_file import SqliteFile

_log = logging.getLogger("pora.meta")

#: how often a store says again that it distrusts registrations from the future
DISTRUST_LOG_INTERVAL_S = 30.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _from_the_future(now_ms: int, last_seen_ms: int, lease_expires_ms: int) -> bool:
    """A renewal stamped further ahead of `now_ms` than the lease it grants: written
    by a clock ahead of this one by more than a lease, so its expiry says nothing."""
    return last_seen_ms - now_ms > lease_expires_ms - last_seen_ms


class SqliteNodeRegistry(SqliteFile):
    """The node registrations of a `SqliteMetadataStore`."""

    def __init__(self, url: str, path: Path, config: MetadataConfig) -> None:
        super().__init__(url, path, config)
        self._distrust_logged_at = float("-inf")

    def _distrust(self, address: str, instance_id: str, ahead_ms: int) -> None:
        now = time.monotonic()
        if now - self._distrust_logged_at < DISTRUST_LOG_INTERVAL_S:
            return
        self._distrust_logged_at = now
        _log.warning(
            "metadata store %s: the registration of %s (instance %s) was renewed %.1f s "
            "ahead of this process's clock; it is not taken as live. The processes "
            "sharing this SQLite file must read the same clock: check for faketime or "
            "a container clock on that node or on this process",
            self._url,
            address,
            instance_id,
            ahead_ms / 1000,
        )

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
                "SELECT instance_id, lease_expires_ms, version, last_seen_ms FROM nodes"
                " WHERE address = ?",
                (registration.address,),
            ).fetchone()
            if held is not None and held[0] != registration.instance_id and held[1] > now:
                if not _from_the_future(now, held[3], held[1]):
                    raise NodeAddressTaken(registration.address, held[0], (held[1] - now) / 1000)
                self._distrust(registration.address, held[0], held[3] - now)
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
        now = _now_ms()

        def live(conn: sqlite3.Connection) -> list[tuple[str, str, int, int, str | None, int, int]]:
            return conn.execute(
                "SELECT address, instance_id, read_only, free_bytes, rack, last_seen_ms,"
                " lease_expires_ms FROM nodes WHERE lease_expires_ms > ? AND (read_only = 0 OR ?)"
                " ORDER BY address",
                (now, int(not writable_only)),
            ).fetchall()

        def draining(conn: sqlite3.Connection) -> set[str]:
            try:
                rows = conn.execute(
                    "SELECT name FROM documents WHERE space = ?", (NODE_DRAINING_SPACE,)
                ).fetchall()
            except sqlite3.OperationalError as error:
                if "no such table" in str(error):
                    return set()  # no document was ever created in this store
                raise
            return {row[0] for row in rows}

        def both(
            conn: sqlite3.Connection,
        ) -> tuple[list[tuple[str, str, int, int, str | None, int, int]], set[str]]:
            return live(conn), draining(conn)

        nodes = []
        rows, marked = await self._call(both)
        for address, instance, read_only, free, rack, seen, expires in rows:
            if _from_the_future(now, seen, expires):
                self._distrust(address, instance, seen - now)
                continue
            if writable_only and address in marked:
                continue
            nodes.append(
                NodeRegistration(
                    address, instance, bool(read_only), free, rack, seen, address in marked
                )
            )
        return nodes


__all__ = ["SqliteNodeRegistry"]
