"""The SQLite file under the embedded metadata store: its connections, its threads
and its schema. Reads run in worker threads on pooled connections (WAL readers never
wait for the writer); writes go to one writer thread that commits whatever is queued
in one `BEGIN IMMEDIATE` transaction (pora/meta/sqlite_writer.py, which says what a
caller that timed out knows). Opening a store whose schema is in place only reads, so
a process holding the write lock delays no one's opening; only the node's path
(`create=True`) creates a missing file or schema. Every read and every commit first
checks that the path still names the file this store opened: a process never goes on
writing to a file that was deleted or replaced under it. docs/metadata.md gives the
schema."""

from __future__ import annotations

import os
import queue
import sqlite3
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread

from pora.meta.config import MetadataConfig
from pora.meta.errors import (
    MetadataError,
    MetadataStoreGone,
    MetadataTimeout,
    MetadataUnavailable,
)
from pora.meta.sqlite_writer import BatchWriter, Write

R = TypeVar("R")

#: a version no record reaches: a poll that asks for records newer than it reads the
#: version alone
NO_RECORD_NEWER = 2**62
#: one poll of a watched row: given the version last seen, the row's version and its
#: record if newer than that (else None); None for no row
Poll = Callable[[int, sqlite3.Connection], "tuple[int, bytes | None] | None"]

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
WAL_RETRY_S = 0.005
UNAVAILABLE_HINT = (
    "check that the folder exists and is writable and that the file is a Pora SQLite "
    "metadata database"
)
SET_UP_HINT = (
    "a store is set up by the nodes: `pora cluster` or `pora serve --metadata URL`; "
    "check the URL's path"
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
    on the busy timeout, so the switch is retried until the deadline. A file already in
    WAL is left as it is: reading the mode takes no lock."""
    (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
    if str(mode).lower() == "wal":
        return
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                raise
            time.sleep(WAL_RETRY_S)
        else:
            return


class SqliteFile:
    """One store's file: `_call` runs a read on a pooled connection in a worker
    thread, `_write` runs a write in the writer thread's next transaction."""

    def __init__(self, url: str, path: Path, config: MetadataConfig) -> None:
        self._url = url
        # fixed at the opening: a later chdir does not move the store
        self._absolute = path.absolute()
        # a URI, so that a connection can be told never to create the file (mode=rw)
        self._uri = self._absolute.as_uri()
        self._config = config
        #: (st_dev, st_ino) of the file this store opened; the path must keep naming it
        self._identity: tuple[int, int] | None = None
        #: set once the file is found removed or replaced: every later call fails so
        self._gone: MetadataStoreGone | None = None
        # the writer thread holds one of the store's threads_max connections
        self._limiter = anyio.CapacityLimiter(max(1, config.threads_max - 1))
        self._write_room = anyio.Semaphore(config.write_queue_max)
        self._writer: BatchWriter | None = None
        self._idle: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        self._closed = False
        self._closed_lock = threading.Lock()

    @property
    def url(self) -> str:
        return self._url

    # --- threads and connections

    def _connect(self, *, create: bool = False) -> sqlite3.Connection:
        """A connection to the store's file. Only the opening of a store asked to create
        may create the file: every later connection (pool, writer) opens it `mode=rw`,
        so a file deleted meanwhile is an error, never a fresh empty store."""
        if not create:
            self._check_file()
        # a wait for another process's write lock gives up before the call's timeout,
        # so a write refused for a held lock is known not to have happened
        busy_timeout_s = self._config.call_timeout_s * BUSY_SHARE_OF_TIMEOUT
        conn = sqlite3.connect(
            f"{self._uri}?mode={'rwc' if create else 'rw'}",
            uri=True,
            timeout=busy_timeout_s,
            isolation_level=None,  # transactions are explicit
            check_same_thread=False,  # one thread at a time, through the pool
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            if create:
                _enable_wal(conn, time.monotonic() + busy_timeout_s)
            conn.execute("PRAGMA synchronous = FULL")  # a committed close survives power loss
        except BaseException:
            conn.close()
            raise
        return conn

    # --- the file under the path

    def _check_file(self) -> None:
        """Raise MetadataStoreGone if the path no longer names the file this store
        opened (deleted, or another file put in its place): what this process would
        write there, no process opening the path would see. One stat: cheap enough
        for every read and every commit."""
        if self._gone is not None:
            raise self._gone
        if self._identity is None:
            return  # still opening
        try:
            stat = os.stat(self._absolute)
        except FileNotFoundError:
            what = "removed"
        else:
            if (stat.st_dev, stat.st_ino) == self._identity:
                return
            what = "replaced by another file"
        self._gone = MetadataStoreGone(
            self._url,
            f"the file {self._absolute} was {what} since this process opened it; this "
            "process writes nothing more to it",
            "stop this process; restore the store's file from where it was moved, or "
            "set up the cluster again, and restart the processes on it",
        )
        raise self._gone

    def _open_file(self, create: bool) -> None:
        """Open the file and check its schema with a read; create what is missing only
        when asked to (the node's path). Runs in a worker thread."""
        if not create and not self._absolute.exists():
            raise MetadataUnavailable(self._url, f"no store at {self._absolute}", SET_UP_HINT)
        conn = self._connect(create=create)
        try:
            self._ensure_schema(conn, create)
            stat = os.stat(self._absolute)
            self._identity = (stat.st_dev, stat.st_ino)
        except BaseException:
            conn.close()
            raise
        self._give_back(conn, reusable=True)

    def _in_thread(self, operation: Callable[[sqlite3.Connection], R]) -> R:
        try:
            conn = self._idle.get_nowait()
        except queue.Empty:
            conn = self._connect_or_raise()
        reusable = False
        try:
            result = operation(conn)
            # what a removed file answers is what no other process sees any more
            self._check_file()
        except MetadataStoreGone:
            raise
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

    async def _open(self, create: bool) -> None:
        def open_file() -> None:
            try:
                self._open_file(create)
            except sqlite3.Error as error:
                raise self._sqlite_failure(error) from error

        await self._in_worker(open_file)

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
        if self._gone is not None:
            raise self._gone
        return await self._in_worker(partial(self._in_thread, operation))

    async def _in_worker(self, work: Callable[[], R]) -> R:
        timeout = self._config.call_timeout_s
        try:
            with anyio.fail_after(timeout):
                # abandoned on timeout: the thread finishes on its own, bounded by the
                # busy timeout; the caller learns the outcome is unknown
                return await anyio.to_thread.run_sync(
                    work, limiter=self._limiter, abandon_on_cancel=True
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
        if self._gone is not None:
            raise self._gone
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

    def _ensure_schema(self, conn: sqlite3.Connection, create: bool) -> None:
        if self._schema_in_place(conn):
            return
        if not create:
            raise MetadataUnavailable(
                self._url, f"{self._absolute} holds no Pora metadata schema", SET_UP_HINT
            )
        self._create_schema(conn)

    def _schema_in_place(self, conn: sqlite3.Connection) -> bool:
        """Whether the schema is there (a read: no write lock); MetadataUnavailable if
        it is another version's."""
        try:
            row = conn.execute("SELECT version FROM schema_version").fetchone()
        except sqlite3.OperationalError as error:
            if "no such table" in str(error):
                return False
            raise
        if row is None:
            return False  # a file being set up by another process: finish it
        if row[0] != SCHEMA_VERSION:
            raise MetadataUnavailable(
                self._url,
                f"schema version {row[0]} is not {SCHEMA_VERSION}",
                "use the Pora version that wrote it",
            )
        return True

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


async def poll_versions(
    file: SqliteFile,
    poll: Poll,
    after_version: int | None,
    missing: Callable[[], MetadataError],
) -> AsyncGenerator[tuple[int, bytes], None]:
    """A watch on one row (`watch_ledger`, `watch_document`): yield (version, record)
    each time the row's version moves past the last one yielded, from `after_version`
    or the version current at the start; end when the row is gone; `missing()` if it
    is absent at the start. The row's version is the change counter: polling it is one
    primary-key lookup, the record is read only when the version moved, and the pause
    between polls doubles from watch_poll_min_s to watch_poll_max_s while nothing
    changes."""
    # the first look needs only the version: no record is newer than NO_RECORD_NEWER
    first = await file._call(partial(poll, NO_RECORD_NEWER))
    if first is None:
        raise missing()
    seen = first[0] if after_version is None else after_version
    pause = file._config.watch_poll_min_s
    while True:
        row = await file._call(partial(poll, int(seen)))
        if row is None:
            return
        version, record = row
        if record is not None and version > seen:
            seen = version
            pause = file._config.watch_poll_min_s
            yield version, record
            continue
        await anyio.sleep(pause)
        pause = min(pause * 2, file._config.watch_poll_max_s)


__all__ = [
    "NO_RECORD_NEWER",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SqliteFile",
    "poll_versions",
    "sqlite_path",
]
