"""The embedded metadata store: one SQLite file that many processes on one machine
share (WAL mode, SQLite's own locking). Reads run in worker threads on pooled
connections (WAL readers never wait for the writer); writes go to one writer thread
that commits whatever is queued in one `BEGIN IMMEDIATE` transaction
(pora/meta/sqlite_writer.py, which says what a caller that timed out knows); every
compare-and-set is a conditional statement inside it. docs/metadata.md gives the
schema."""

from __future__ import annotations

import queue
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread

from pora.meta.errors import (
    LedgerExists,
    MetadataError,
    MetadataTimeout,
    MetadataUnavailable,
    MetadataVersionConflict,
    NodeAddressTaken,
    NoSuchLedgerMetadata,
    RegistrationLost,
)
from pora.meta.records import LedgerMetadata, NodeRegistration, Versioned
from pora.meta.sqlite_writer import BatchWriter, Write
from pora.meta.store import DEFAULT_LEASE_S, MetadataConfig

R = TypeVar("R")

SCHEMA_VERSION = 1
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS id_blocks (name TEXT PRIMARY KEY, next_id INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ledgers (ledger_id INTEGER PRIMARY KEY,"
    " version INTEGER NOT NULL, record BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS nodes (address TEXT PRIMARY KEY, instance_id TEXT NOT NULL,"
    " read_only INTEGER NOT NULL, free_bytes INTEGER NOT NULL, rack TEXT,"
    " last_seen_ms INTEGER NOT NULL, lease_expires_ms INTEGER NOT NULL,"
    " version INTEGER NOT NULL)",
    # the streams layer's named records (a name -> a versioned document), reserved
    "CREATE TABLE IF NOT EXISTS streams (name TEXT PRIMARY KEY,"
    " version INTEGER NOT NULL, record BLOB NOT NULL)",
    "INSERT OR IGNORE INTO id_blocks (name, next_id) VALUES ('ledger', 0)",
)
BUSY_SHARE_OF_TIMEOUT = 0.8
#: writes queued at most per store; more callers wait for room (within their timeout)
NO_RECORD_NEWER = 2**62
WAL_RETRY_S = 0.005
UNAVAILABLE_HINT = (
    "check that the folder exists and is writable and that the file is a Pora SQLite "
    "metadata database"
)


def sqlite_path(url: str) -> Path:
    """`sqlite:///abs/path.db` -> /abs/path.db; `sqlite:relative/path.db` -> relative."""
    rest = url.removeprefix("sqlite:")
    if rest.startswith("//"):
        rest = rest[2:]
        if not rest.startswith("/"):
            raise MetadataUnavailable(url, "a sqlite:// URL needs an absolute path", "sqlite:///")
    if not rest:
        raise MetadataUnavailable(url, "no database path", "sqlite:relative/path.db")
    return Path(rest)


def _now_ms() -> int:
    return int(time.time() * 1000)


@contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """A write transaction that takes the file's write lock at once, so two processes'
    read-check-write sequences never interleave."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _enable_wal(conn: sqlite3.Connection, deadline: float) -> None:
    """Switch the file to WAL (kept in the file once set). While another process creates
    or converts the same file, SQLite refuses at once with "locked" instead of waiting
    on the busy timeout, so the switch is retried until the deadline."""
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                raise
            time.sleep(WAL_RETRY_S)
        else:
            return


class SqliteMetadataStore:
    def __init__(self, url: str, path: Path, config: MetadataConfig) -> None:
        self._url = url
        self._path = path
        self._config = config
        # the writer thread holds one of the store's threads_max connections
        self._limiter = anyio.CapacityLimiter(max(1, config.threads_max - 1))
        self._write_room = anyio.Semaphore(config.write_queue_max)
        self._writer: BatchWriter | None = None
        self._idle: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._closed = False
        self._closed_lock = threading.Lock()
        self._id_lock = anyio.Lock()
        self._next_id = 0
        self._block_end = 0

    @property
    def url(self) -> str:
        return self._url

    @classmethod
    async def open(cls, url: str, path: Path, config: MetadataConfig) -> SqliteMetadataStore:
        store = cls(url, path, config)
        await store._call(store._create_schema)
        store._writer = BatchWriter(
            f"pora-meta-writer {url}", store._connect, store._sqlite_failure
        )
        return store

    # --- threads and connections

    def _connect(self) -> sqlite3.Connection:
        # a wait for another process's write lock gives up before the call's timeout,
        # so a write refused for a held lock is known not to have happened
        busy_timeout_s = self._config.call_timeout_s * BUSY_SHARE_OF_TIMEOUT
        conn = sqlite3.connect(
            self._path,
            timeout=busy_timeout_s,
            isolation_level=None,  # transactions are explicit
            check_same_thread=False,  # one thread at a time, through the pool
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            _enable_wal(conn, time.monotonic() + busy_timeout_s)
            conn.execute("PRAGMA synchronous = FULL")  # a committed close survives power loss
        except BaseException:
            conn.close()
            raise
        return conn

    def _in_thread(self, operation: Callable[[sqlite3.Connection], R]) -> R:
        try:
            conn = self._idle.get_nowait()
        except queue.Empty:
            conn = self._connect_or_raise()
        reusable = False
        try:
            result = operation(conn)
        except MetadataError:
            reusable = True  # a refusal (conflict, exists): the transaction rolled back
            raise
        except sqlite3.Error as error:
            raise self._sqlite_failure(error) from error
        else:
            reusable = True
            return result
        finally:
            self._give_back(conn, reusable)

    def _connect_or_raise(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.Error as error:
            raise self._sqlite_failure(error) from error

    def _sqlite_failure(self, error: sqlite3.Error) -> MetadataUnavailable:
        if "locked" in str(error) or "busy" in str(error):
            return MetadataTimeout(
                self._url,
                f"{error} (busy timeout {self._config.call_timeout_s * BUSY_SHARE_OF_TIMEOUT:g} s)",
                "another process holds the write lock too long",
            )
        return MetadataUnavailable(self._url, str(error), UNAVAILABLE_HINT)

    def _give_back(self, conn: sqlite3.Connection, reusable: bool) -> None:
        with self._closed_lock:
            if reusable and not self._closed:
                self._idle.put(conn)
                return
        conn.close()

    async def _call(self, operation: Callable[[sqlite3.Connection], R]) -> R:
        if self._closed:
            raise MetadataError(f"metadata store {self._url} is closed")
        timeout = self._config.call_timeout_s
        try:
            with anyio.fail_after(timeout):
                # abandoned on timeout: the thread finishes on its own, bounded by the
                # busy timeout; the caller learns the outcome is unknown
                return await anyio.to_thread.run_sync(
                    self._in_thread, operation, limiter=self._limiter, abandon_on_cancel=True
                )
        except TimeoutError:
            raise MetadataTimeout(
                self._url, f"no answer within {timeout} s", "is the disk or the file stuck?"
            ) from None

    async def _write(self, operation: Callable[[sqlite3.Connection], R]) -> R:
        """Run `operation` in the writer's next transaction, inside its own savepoint."""
        writer = self._writer
        if self._closed or writer is None:
            raise MetadataError(f"metadata store {self._url} is closed")
        timeout = self._config.call_timeout_s
        write = Write(operation)
        with anyio.move_on_after(timeout) as waiting:
            await self._write_room.acquire()
        if waiting.cancelled_caught:
            raise MetadataTimeout(
                self._url,
                f"the write queue stayed full for {timeout} s; nothing was written",
                "the file's disk is slower than the writers: write less or use a faster disk",
            )
        try:
            await self._submit_and_wait(writer, write, waiting.deadline)
        except BaseException:
            write.withdraw()  # cancelled: a write not started yet never happens
            raise
        finally:
            self._write_room.release()
        return write.outcome()

    async def _submit_and_wait(self, writer: BatchWriter, write: Write[R], deadline: float) -> None:
        if not writer.submit(write):
            raise MetadataError(f"metadata store {self._url} is closed")
        with anyio.move_on_after(deadline - anyio.current_time()):
            await write.done.wait()
        if write.done.is_set():
            return
        if write.withdraw():
            raise MetadataTimeout(
                self._url,
                f"no answer within {self._config.call_timeout_s} s; the write had not "
                "started and was withdrawn, so it did not happen",
                "is the disk or the file stuck?",
            )
        with anyio.CancelScope(shield=True):
            # started: its transaction waits on no lock, only on the disk
            await write.done.wait()

    async def aclose(self) -> None:
        with self._closed_lock:
            self._closed = True
        if self._writer is not None:
            writer, self._writer = self._writer, None
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(writer.stop)
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return

    # --- schema

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        with _immediate(conn):
            for statement in SCHEMA:
                conn.execute(statement)
            row = conn.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                conn.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
            elif row[0] != SCHEMA_VERSION:
                raise MetadataUnavailable(
                    self._url,
                    f"schema version {row[0]} is not {SCHEMA_VERSION}",
                    "use the Pora version that wrote it",
                )

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
        # the row's version is the change counter: polling it is one primary-key lookup,
        # and the record is read only when the version moved
        def poll(seen: int, conn: sqlite3.Connection) -> tuple[int, bytes | None] | None:
            return conn.execute(  # type: ignore[no-any-return]
                "SELECT version, CASE WHEN version > ? THEN record END"
                " FROM ledgers WHERE ledger_id = ?",
                (seen, ledger_id),
            ).fetchone()

        # the first look needs only the version: no record is newer than NO_RECORD_NEWER
        first = await self._call(partial(poll, NO_RECORD_NEWER))
        if first is None:
            raise NoSuchLedgerMetadata(ledger_id)
        seen = first[0] if after_version is None else after_version
        pause = self._config.watch_poll_min_s
        while True:
            row = await self._call(partial(poll, int(seen)))
            if row is None:
                return
            version, record = row
            if record is not None and version > seen:
                seen = version
                pause = self._config.watch_poll_min_s
                yield Versioned(LedgerMetadata.decode(record), version)
                continue
            await anyio.sleep(pause)
            pause = min(pause * 2, self._config.watch_poll_max_s)

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
