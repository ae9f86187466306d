"""The simulation's disk: the real files, through `journal.fileio.use_file_calls`, with
what was written since each file's last sync remembered, so that a crash can lose it.
What a sync makes durable is this disk's to say (the machine never crashes), so no
sync reaches the OS: it would only cost wall time.

Under the seam are the journal's segments, its spares and its watermark's sync, and
the entry logs (journal/fileio.py). For each such file the disk keeps, from its last
fdatasync or fsync on, the size it had when that sync started and every write since
(where, how long, and the bytes it replaced). A sync makes durable what was written
before it started, not what a concurrent write adds meanwhile; a sync in a thread
that does nothing else (the journal's group commit) only once the event loop
learns it ended, a seeded disk latency later (`SyncJob`, clock.counted_threads).

`crash(root)` is the power going out under the node whose data dir is `root`:
- from then on every write and sync under `root` fails with EIO (the node's own
  shutdown, which runs in-process, changes nothing on disk);
- `lose_unsynced(root)` then puts every file back as its last syncs left it: the
  unsynced writes reverted, newest first, and the file cut back to its synced size;
  or, for some files (the seed decides), a torn tail: a prefix of the unsynced
  writes, in the order they were made, kept up to a byte the seed draws, which may
  fall inside a write.

What stays: LevelDB's files (plyvel writes them itself, outside the seam: the index
is as the node's shutdown left it, which docs/formats.md lets a node rebuild from
the journal and entry logs), directory entries (a file made or renamed since its
folder's fsync stays), and files written outside the seam (the data dir's marker and
lock, the watermark's temp file before its sync).

`fail(root, errno, kinds)` makes writes (`"write"`), syncs (`"sync"`) or both under
`root` fail with `errno` (ENOSPC: a full disk; EIO: a failing one) until `mend(root)`.

Workers call the disk from threads (the journal's syncs, the entry logs' flushes):
one lock orders its records. Callers change a node's faults only while no thread is
at work (`SimTime.quiet`), so whether a call meets a fault depends on the seed alone.
"""

from __future__ import annotations

import errno as errnos
import os
import random
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from journal.fileio import OS_CALLS

WRITE = "write"
SYNC = "sync"


@dataclass
class _Write:
    seq: int
    offset: int
    length: int
    #: the bytes the write replaced, within the file's size at the time
    before: bytes


@dataclass
class _Unsynced:
    """One file's writes since its last sync."""

    synced_size: int
    writes: list[_Write] = field(default_factory=list)


@dataclass
class SyncJob:
    """One worker thread's calls. A thread that only synced (the journal's group
    commit) returns straight to the event loop with nothing else depending on the
    sync: its syncs become durable when the loop learns of its end (`settle`),
    which the simulation holds back by a seeded disk latency, and a crash before
    then loses what they covered. A thread that also writes (an entry log's flush,
    which indexes in LevelDB, outside the seam, what it synced) has its syncs
    durable at once."""

    #: (path, writes up to this seq, the file's size, the node's crash count)
    syncs: list[tuple[str, int, int, int]] = field(default_factory=list)
    wrote: bool = False


_thread = threading.local()


@dataclass(frozen=True)
class _Fault:
    errno: int
    kinds: frozenset[str]


class SimDisk:
    """`FileCalls` over the real OS that can fail, and forget what was not synced."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._lock = threading.Lock()
        self._files: dict[str, _Unsynced] = {}
        self._faults: dict[str, _Fault] = {}
        self._seq = 0
        #: crashes of each data dir (by its prefix): a sync settled after a crash of
        #: its node made nothing durable
        self._crashes: dict[str, int] = {}
        #: what the scenarios report: writes reverted, torn tails left, faults met
        self.reverted_writes = 0
        self.torn_tails = 0
        self.faults_met = 0

    # --- faults ------------------------------------------------------------------------------

    def crash(self, root: Path) -> None:
        """The node on `root` is gone: its writes and syncs fail from now on, and its
        syncs not yet settled never will be."""
        prefix = _prefix(root)
        self._faults[prefix] = _Fault(errnos.EIO, frozenset((WRITE, SYNC)))
        self._crashes[prefix] = self._crashes.get(prefix, 0) + 1

    def fail(self, root: Path, errno: int, kinds: Sequence[str]) -> None:
        self._faults[_prefix(root)] = _Fault(errno, frozenset(kinds))

    def mend(self, root: Path) -> None:
        self._faults.pop(_prefix(root), None)

    def _check(self, fd: int, kind: str) -> str | None:
        """The file's path (None: not one to track); raises the fault it meets."""
        path = _path_of(fd)
        if path is None:
            return None
        for prefix, fault in self._faults.items():
            if kind in fault.kinds and path.startswith(prefix):
                self.faults_met += 1
                raise OSError(fault.errno, os.strerror(fault.errno), path)
        return path

    # --- FileCalls ---------------------------------------------------------------------------

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int, /) -> int:
        path = self._check(fd, WRITE)
        with self._lock:
            if path is not None:
                self._note_write(path, fd, offset, len(data))
            return os.pwrite(fd, data, offset)

    def pwritev(
        self, fd: int, buffers: Sequence[bytes | bytearray | memoryview], offset: int, /
    ) -> int:
        path = self._check(fd, WRITE)
        with self._lock:
            if path is not None:
                self._note_write(path, fd, offset, sum(map(len, buffers)))
            return os.pwritev(fd, buffers, offset)

    def posix_fallocate(self, fd: int, offset: int, length: int, /) -> None:
        path = self._check(fd, WRITE)
        with self._lock:
            if path is not None:
                self._wrote()
                self._unsynced(path, fd)
            OS_CALLS.posix_fallocate(fd, offset, length)

    def fdatasync(self, fd: int, /) -> None:
        self._sync(fd)

    def fsync(self, fd: int, /) -> None:
        self._sync(fd)

    def _sync(self, fd: int) -> None:
        """What the sync makes durable is this disk's to say (the machine itself never
        crashes): the real fdatasync would only cost wall time, so none is made."""
        path = self._check(fd, SYNC)
        with self._lock:
            upto = self._seq
            size = os.fstat(fd).st_size
        if path is None:
            return
        job: SyncJob | None = getattr(_thread, "job", None)
        with self._lock:
            if job is None or job.wrote:
                self._synced(path, upto, size)
            else:
                job.syncs.append((path, upto, size, self._crash_count(path)))

    def _wrote(self) -> None:
        """A write in a worker thread: its syncs so far, and from now on, are durable
        at once (with the lock held)."""
        job: SyncJob | None = getattr(_thread, "job", None)
        if job is None or job.wrote:
            return
        job.wrote = True
        for path, upto, size, _ in job.syncs:
            self._synced(path, upto, size)
        job.syncs.clear()

    def _crash_count(self, path: str) -> int:
        return sum(count for prefix, count in self._crashes.items() if path.startswith(prefix))

    @contextmanager
    def in_job(self, job: SyncJob) -> Iterator[None]:
        """The syncs of this thread, until the block ends, go to `job`."""
        _thread.job = job
        try:
            yield
        finally:
            _thread.job = None

    def settle(self, job: SyncJob) -> bool:
        """The thread's end reached the event loop: its syncs are durable, unless
        their node crashed meanwhile (then False)."""
        settled = True
        with self._lock:
            for path, upto, size, crashes in job.syncs:
                if self._crash_count(path) == crashes:
                    self._synced(path, upto, size)
                else:
                    settled = False
        return settled

    def _synced(self, path: str, upto: int, size: int) -> None:
        unsynced = self._files.get(path)
        if unsynced is None:
            return
        unsynced.writes = [write for write in unsynced.writes if write.seq > upto]
        unsynced.synced_size = max(unsynced.synced_size, size)
        if not unsynced.writes and os.path.exists(path) and os.stat(path).st_size == size:
            del self._files[path]

    def _unsynced(self, path: str, fd: int) -> _Unsynced:
        unsynced = self._files.get(path)
        if unsynced is None:
            unsynced = self._files[path] = _Unsynced(os.fstat(fd).st_size)
        return unsynced

    def _note_write(self, path: str, fd: int, offset: int, length: int) -> None:
        self._wrote()
        unsynced = self._unsynced(path, fd)
        size = os.fstat(fd).st_size
        before = _read(path, offset, max(0, min(length, size - offset)))
        self._seq += 1
        unsynced.writes.append(_Write(self._seq, offset, length, before))

    # --- the crash -----------------------------------------------------------------------------

    def lose_unsynced(self, root: Path) -> None:
        """Put every file under `root` back as its syncs left it (or with a torn tail),
        then let the node's next run write again."""
        prefix = _prefix(root)
        rng = random.Random(f"{self.seed}/disk/{root.name}/{self._crashes.get(prefix, 0)}")
        with self._lock:
            for path in sorted(p for p in self._files if p.startswith(prefix)):
                unsynced = self._files.pop(path)
                if os.path.exists(path):
                    self._put_back(path, unsynced, rng)
        self.mend(root)

    def _put_back(self, path: str, unsynced: _Unsynced, rng: random.Random) -> None:
        writes = unsynced.writes
        total = sum(write.length for write in writes)
        keep = rng.randrange(total) if total and rng.random() < 0.5 else 0
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            kept: list[tuple[int, bytes]] = []
            consumed = 0
            for write in writes:
                length = min(write.length, keep - consumed)
                if length > 0:
                    kept.append((write.offset, os.pread(fd, length, write.offset)))
                consumed += write.length
            for write in reversed(writes):
                os.pwrite(fd, write.before, write.offset)
                self.reverted_writes += 1
            if os.fstat(fd).st_size > unsynced.synced_size:
                os.ftruncate(fd, unsynced.synced_size)
            for offset, data in kept:
                os.pwrite(fd, data, offset)
            if kept:
                self.torn_tails += 1
            os.fsync(fd)
        finally:
            os.close(fd)


def _read(path: str, offset: int, length: int) -> bytes:
    """Bytes of `path` (its writer's fd may be write-only, as a journal segment's is)."""
    if length == 0:
        return b""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


def _prefix(root: Path) -> str:
    return str(root.absolute()) + os.sep


def _path_of(fd: int) -> str | None:
    """The path `fd` was opened at; None once the file was deleted."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return None if path.endswith(" (deleted)") else path
