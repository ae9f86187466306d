"""Group commit for the SQLite metadata store: one writer thread per store takes every
queued write, runs them in one `BEGIN IMMEDIATE` transaction, each inside its own
SAVEPOINT (a refused write, a conflict or an existing id, rolls back alone and gets its
own error while the others commit), and commits once: one fsync for the whole batch.

A write's outcome is always known to its caller:
- a write still queued when its caller gives up (call timeout, cancellation) is
  withdrawn: the writer skips it, so it did not happen (`MetadataTimeout` says so);
- the writer waits for SQLite's write lock (another process's transaction) before it
  starts a batch, at most the busy timeout, which ends before the call timeout: a batch
  refused for a held lock fails every write in it, none of which happened;
- a write that started (its batch holds the write lock) is waited for until its batch
  commits or rolls back, and its caller gets that outcome even past the call timeout:
  no lock wait is left, only the statements and the commit's fsync.

Before it commits, the writer checks (`check`) that the store's path still names the
file it writes: a batch bound for a deleted or replaced file rolls back, and every
write in it fails with the check's error.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import anyio
import trio

from pora.meta.errors import MetadataError

R = TypeVar("R")

#: writes one transaction runs at most, so a batch's latency stays bounded
WRITE_BATCH_MAX = 256

Schedule = Callable[[Callable[[], None]], object]
Operation = Callable[[sqlite3.Connection], R]


def _loop_scheduler() -> Schedule:
    """A thread-safe, non-blocking way to run a function on the calling event loop."""
    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:  # not asyncio: trio, anyio's other backend
        return trio.lowlevel.current_trio_token().run_sync_soon


class _State(enum.Enum):
    QUEUED = "queued"
    WITHDRAWN = "withdrawn"
    STARTED = "started"
    DONE = "done"


class Write(Generic[R]):
    """One queued write: the operation, and the outcome its caller waits for."""

    def __init__(self, operation: Operation[R]) -> None:
        self.operation = operation
        self.done = anyio.Event()
        self._schedule = _loop_scheduler()
        self._lock = threading.Lock()
        self._state = _State.QUEUED
        self._result: R | None = None
        self._error: BaseException | None = None

    def withdraw(self) -> bool:
        """Take the write back if it has not started; False if it has (or ended)."""
        with self._lock:
            if self._state is _State.QUEUED:
                self._state = _State.WITHDRAWN
                return True
            return False

    def start(self) -> bool:
        with self._lock:
            if self._state is _State.QUEUED:
                self._state = _State.STARTED
                return True
            return False

    def resolve(self, result: R | None, error: BaseException | None) -> None:
        with self._lock:
            if self._state in (_State.DONE, _State.WITHDRAWN):
                return
            self._state = _State.DONE
            self._result, self._error = result, error
        with contextlib.suppress(Exception):  # the caller's event loop has ended: nobody waits
            self._schedule(self.done.set)

    def outcome(self) -> R:
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


class _Stop:
    pass


_STOP = _Stop()


class BatchWriter:
    """The writer thread and its queue. `connect` opens the writer's connection (in the
    writer thread); `failure` turns an sqlite3 error into the store's error."""

    def __init__(
        self,
        name: str,
        connect: Callable[[], sqlite3.Connection],
        failure: Callable[[sqlite3.Error], MetadataError],
        check: Callable[[], None],
    ) -> None:
        self._connect = connect
        self._failure = failure
        self._check = check
        self._queue: queue.SimpleQueue[Write[object] | _Stop] = queue.SimpleQueue()
        self._conn: sqlite3.Connection | None = None
        self._stop_lock = threading.Lock()
        self._stopping = False
        #: transactions committed and writes they held (how well writes share commits)
        self.commits = 0
        self.committed_writes = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, write: Write[R]) -> bool:
        """Queue `write`; False once the writer is stopping (the store is closing)."""
        with self._stop_lock:
            if self._stopping:
                return False
            self._queue.put(write)  # type: ignore[arg-type]
            return True

    def stop(self) -> None:
        """Finish what is queued, then end the thread (blocking: run it in a thread)."""
        with self._stop_lock:
            self._stopping = True
            self._queue.put(_STOP)
        self._thread.join()

    def _run(self) -> None:
        try:
            while True:
                batch, stopping = self._next_batch()
                if batch:
                    self._commit(batch)
                if stopping:
                    return
        finally:
            if self._conn is not None:
                self._conn.close()

    def _next_batch(self) -> tuple[list[Write[object]], bool]:
        """Everything queued now (waiting for the first), up to WRITE_BATCH_MAX."""
        first = self._queue.get()
        if isinstance(first, _Stop):
            return [], True
        batch = [first]
        while len(batch) < WRITE_BATCH_MAX:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Stop):
                return batch, True
            batch.append(item)
        return batch, False

    def _begin(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._connect()
        self._conn.execute("BEGIN IMMEDIATE")
        return self._conn

    def _commit(self, batch: list[Write[object]]) -> None:
        try:
            conn = self._begin()
        except (sqlite3.Error, MetadataError) as error:
            # refused for a held lock (or no file): nothing of the batch happened
            failure = error if isinstance(error, MetadataError) else self._failure(error)
            for write in batch:
                write.resolve(None, failure)
            return
        started = [write for write in batch if write.start()]
        outcomes: list[tuple[object, BaseException | None]] = []
        try:
            outcomes = [self._run_one(conn, write) for write in started]
            self._check()  # under the write lock: the file others open is this one
            conn.execute("COMMIT")
        except (sqlite3.Error, MetadataError) as error:
            # the transaction as a whole failed: none of it is in the file
            self._abandon(conn)
            failure = error if isinstance(error, MetadataError) else self._failure(error)
            for write in started:
                write.resolve(None, failure)
            return
        except BaseException as error:
            # the thread ends: no started write's caller may wait for it forever
            self._abandon(conn)
            for write in started:
                write.resolve(None, MetadataError(f"the metadata writer failed: {error!r}"))
            raise
        self.commits += 1
        self.committed_writes += len(started)
        for write, (result, refusal) in zip(started, outcomes, strict=True):
            write.resolve(result, refusal)

    def _run_one(
        self, conn: sqlite3.Connection, write: Write[object]
    ) -> tuple[object, BaseException | None]:
        conn.execute("SAVEPOINT write")
        try:
            result = write.operation(conn)
        except Exception as error:
            if isinstance(error, sqlite3.Error) and not conn.in_transaction:
                raise  # SQLite rolled the whole transaction back
            conn.execute("ROLLBACK TO write")
            conn.execute("RELEASE write")
            if isinstance(error, sqlite3.Error):
                return None, self._failure(error)
            return None, error
        conn.execute("RELEASE write")
        return result, None

    def _abandon(self, conn: sqlite3.Connection) -> None:
        """Roll back what is left and drop the connection: the next batch opens anew."""
        with contextlib.suppress(sqlite3.Error):
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        conn.close()
        self._conn = None
