"""Spare journal segments: files of written blocks, ready to become the next segment.

Why: `posix_fallocate` reserves blocks as *unwritten* extents. The first write into
one makes the next `fdatasync` also commit the extent's conversion to written,
a metadata change in the filesystem's own journal: on ext4 that about doubles
the append + fdatasync of a group commit (figures: docs/performance.md,
`scripts/bench_zerofill.py`).
PostgreSQL zero-fills new WAL files for the same reason (`wal_init_zero`).

The cheapest spare is a recycled one: a segment the trimmer no longer needs, given
a spare name instead of being deleted (`recycle`, as RocksDB's
`recycle_log_file_num` and PostgreSQL's recycled WAL files). Its old batches stay
in it: the writer ends each batch with a zero block in a segment made from a
spare, and readers take no batch below a segment's first seq (docs/formats.md).

Otherwise zeros are written ahead, off the critical path: once the open segment is
a quarter full, the journal first asks the node to trim (which may recycle one),
and only if no spare is ready then is one of `segment_bytes` zero-filled in a
worker thread, synced, and renamed into place. The next roll takes it (header
written and synced under the spare name, then a link to the segment's name and an
unlink of the spare): no zeros on the hot path. A node that writes little never
makes one. Without a spare ready, a roll preallocates as before and never waits.

Files: `spare-<created_ms>-<n>.spare` when complete; `.spare-partial` while being
made (a crash leaves one; the next start deletes it). Neither ends in
`.journal`, so nothing that reads the journal ever sees them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from pathlib import Path
from typing import Final

from journal import fileio
from journal.fileio import fsync_directory, pwrite_all

SPARE_SUFFIX: Final = ".spare"
PARTIAL_SUFFIX: Final = ".spare-partial"
#: bytes of zeros per write while making a spare: few calls, a small buffer
_ZERO_CHUNK_BYTES: Final = 1 << 20


class SpareSegments:
    """The spare segments of one journal directory. Thread-safe: spares are made in
    one worker thread and taken by the segment writer in another."""

    def __init__(self, directory: Path, *, segment_bytes: int, spares_max: int, fsync: bool):
        self._directory = directory
        self._segment_bytes = segment_bytes
        self._spares_max = spares_max
        self._fsync = fsync
        self._lock = threading.Lock()
        self._ready: list[Path] = []
        self._stopping = threading.Event()
        self.made = 0
        self.taken = 0
        self.recycled = 0

    # --- state ---------------------------------------------------------------------------

    @property
    def ready_count(self) -> int:
        with self._lock:
            return len(self._ready)

    def wanted(self) -> bool:
        """Whether one more spare should be made now."""
        with self._lock:
            return len(self._ready) < self._spares_max and not self._stopping.is_set()

    def take(self) -> Path | None:
        """A ready spare for the next segment (now the caller's to rename), or None."""
        with self._lock:
            if not self._ready:
                return None
            self.taken += 1
            return self._ready.pop(0)

    def recycle(self, segment: Path) -> bool:
        """Make a trimmed segment a spare, bytes and all, if the pool has room and it
        has the spare size (one that grew past it does not); False otherwise, and the
        caller deletes it. Blocking (a link and an unlink); the caller fsyncs the
        directory.

        Its blocks are written already, so it is as good as a zero-filled spare for
        the next segment's syncs, at no cost. Its old batches stay in it: the writer
        ends every batch with a zero block, and readers skip any batch whose seq is
        below its segment's first seq (all of a trimmed segment's are).
        """
        try:
            if os.stat(segment).st_size != self._segment_bytes:
                return False
        except FileNotFoundError:
            return False
        with self._lock:
            if len(self._ready) >= self._spares_max or self._stopping.is_set():
                return False
            created_ms = time.time_ns() // 1_000_000
            for number in itertools.count():
                stem = f"spare-{created_ms}-{number}"
                spare = self._directory / f"{stem}{SPARE_SUFFIX}"
                if spare.with_name(f"{stem}{PARTIAL_SUFFIX}").exists():
                    continue  # the name a spare being made will get
                try:
                    # a link never replaces a file; a crash before the unlink leaves
                    # it linked twice, and the next start deletes the spare name
                    os.link(segment, spare)
                except FileExistsError:
                    continue
                break
            os.unlink(segment)
            self._ready.append(spare)
            self.recycled += 1
        return True

    def stop(self) -> None:
        """Make `make_one` give up soon (at shutdown); what is ready stays for next time."""
        self._stopping.set()

    # --- files ---------------------------------------------------------------------------

    def adopt(self) -> None:
        """At startup: keep the complete spares of the right size (up to the maximum),
        delete the rest: partial ones a crash left, ones of another segment size, and
        ones a crash left linked under a segment's name too (already taken)."""
        try:
            names = sorted(os.listdir(self._directory))
        except FileNotFoundError:
            return
        doomed: list[Path] = []
        for name in names:
            path = self._directory / name
            if name.endswith(PARTIAL_SUFFIX):
                doomed.append(path)
            elif name.endswith(SPARE_SUFFIX):
                status = path.stat()
                usable = status.st_size == self._segment_bytes and status.st_nlink == 1
                if usable and len(self._ready) < self._spares_max:
                    self._ready.append(path)
                else:
                    doomed.append(path)
        for path in doomed:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if doomed and self._fsync:
            fsync_directory(self._directory)

    def make_one(self) -> bool:
        """Zero-fill one spare and make it durable (blocking: run it in a thread).

        Returns False when stopped part way (the partial file is deleted). An
        OSError (a full disk) propagates, with the partial file deleted: the
        journal goes on without a spare.
        """
        fd, partial, finished = self._create_partial()
        zeros = memoryview(bytes(_ZERO_CHUNK_BYTES))
        complete = False
        try:
            offset = 0
            while offset < self._segment_bytes:
                if self._stopping.is_set():
                    return False
                length = min(_ZERO_CHUNK_BYTES, self._segment_bytes - offset)
                pwrite_all(fd, zeros[:length], offset)
                offset += length
            if self._fsync:
                fileio.fsync(fd)  # fsync, not fdatasync: the size must be durable too
            os.rename(partial, finished)
            if self._fsync:
                fsync_directory(self._directory)
            complete = True
        finally:
            os.close(fd)
            if not complete:
                with contextlib.suppress(FileNotFoundError):
                    partial.unlink()
        with self._lock:
            self._ready.append(finished)
            self.made += 1
        return True

    def _create_partial(self) -> tuple[int, Path, Path]:
        """A new partial spare, open, and the name it gets when complete: a name that
        neither it nor a complete spare has (two can be made in one millisecond)."""
        created_ms = time.time_ns() // 1_000_000
        with self._lock:  # `recycle` picks names too
            for number in itertools.count():
                stem = f"spare-{created_ms}-{number}"
                finished = self._directory / f"{stem}{SPARE_SUFFIX}"
                if finished.exists():
                    continue
                partial = finished.with_name(f"{stem}{PARTIAL_SUFFIX}")
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                try:
                    return os.open(partial, flags, 0o644), partial, finished
                except FileExistsError:
                    continue
        raise AssertionError("unreachable: itertools.count() never ends")


def usable_spares(directory: Path, segment_bytes: int) -> int:
    """How many complete spares of `segment_bytes` `directory` holds (what `adopt`
    would keep, before its maximum): space the journal has already set aside."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    count = 0
    for name in names:
        if name.endswith(SPARE_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                status = (directory / name).stat()
                count += status.st_size == segment_bytes and status.st_nlink == 1
    return count
