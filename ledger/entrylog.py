"""One ledger's entry log: a preallocated, self-describing file of checksummed records.

The format is in `ledger.entrylog_format` (constants) and docs/formats.md
(grammar). Everything here is blocking: call it from worker threads.

Where valid data ends is not derived from the file: the caller keeps it
(`LedgerMeta.log_end`) and passes it to `write_records`. Writes are positioned, so
replaying a flush after a crash rewrites the same bytes at the same place, and bytes a
crashed flush left past `log_end` are simply overwritten by the next one.

Threads: `os.pread` and `os.pwrite` do not share a file offset, so any number of
threads may read records while one thread writes (reads are of ranges the index
already points at, which a writer never rewrites with different bytes). Only one
thread may call `write_records` / `sync` at a time; the ledger's worker guarantees it.
Closing while another thread uses the log is the caller's business (`FileCache`
pins prevent it).
"""

from __future__ import annotations

import bisect
import itertools
import os
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

import crc32c

from journal import fileio
from journal.fileio import fsync_directory, pwrite_all, pwritev_all
from journal.format import RecordBody
from ledger.entrylog_format import (
    FIRST_CHUNK_BYTES,
    FIRST_RECORD_OFFSET,
    FORMAT_VERSION,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    RECORD_PAYLOAD_MAX,
    STATE_ENTRY_ID,
    ZERO_RECORD_HEADER,
    header_crc,
    record_crc,
)
from ledger.errors import StorageCorruption, UnindexedEntryLog

__all__ = ["EntryLog", "ScannedRecord"]

_ID_LIMIT: Final = 2**63  # ledger and entry ids are non-negative i64
_CRC_FIELD: Final = struct.Struct("<I")
#: a run of records `read_records` fetches with one pread is at most this long
_READ_RUN_BYTES_MAX: Final = 4 << 20
#: `read_records` reads across a gap of unwanted bytes up to this long rather than
#: paying for another system call
_READ_GAP_BYTES_MAX: Final = 4096
#: `scan` reads the file in windows of at least this size
_SCAN_WINDOW_BYTES: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class ScannedRecord:
    """A record header met by `EntryLog.scan`.

    `crc_ok` is False when the record's checksum fails or its length cannot be right
    (past the end of the scanned range, or above RECORD_PAYLOAD_MAX); its other
    fields are then what the damaged header says, to be reported, not trusted.
    """

    offset: int
    entry_id: int
    ledger_id: int
    record_length: int
    payload_length: int
    crc_ok: bool
    #: the last-add-confirmed the entry carried (-1: none)
    lac: int = -1


class EntryLog:
    """One open entry log. Create with `create` (new ledger) or `open` (existing)."""

    __slots__ = (
        "_allocated_bytes",
        "_chunk_bytes",
        "_fd",
        "_fsync",
        "_unindexed",
        "created_ms",
        "ledger_id",
        "path",
    )

    def __init__(
        self,
        path: Path,
        ledger_id: int,
        fd: int,
        *,
        created_ms: int,
        prealloc_chunk_bytes: int,
        allocated_bytes: int,
        fsync: bool,
    ) -> None:
        """Internal: use `create` or `open`."""
        self.path = path
        self.ledger_id = ledger_id
        self.created_ms = created_ms
        self._fd = fd
        self._chunk_bytes = prealloc_chunk_bytes
        self._allocated_bytes = allocated_bytes
        self._fsync = fsync
        #: records found in a file `create` reused, which the first write must write
        #: again byte for byte (None: nothing to check)
        self._unindexed: list[ScannedRecord] | None = None

    # --- opening ------------------------------------------------------------------

    @classmethod
    def create(
        cls, path: Path, ledger_id: int, *, prealloc_chunk_bytes: int, fsync: bool = True
    ) -> EntryLog:
        """A new, empty entry log for `ledger_id`, durable (header and name) on return.

        Never truncates or overwrites an existing file: the index not knowing a log
        does not mean the file holds nothing (a lost index does not either). A file
        of that name is reused only if it holds nothing (a crash cut an earlier
        create short) or only records that the first write will write again, byte
        for byte, at the same place (a crash cut the first flush short, after its
        write and before the index recorded it; the journal replays that flush):
        `write_bodies` checks that. Any other file raises UnindexedEntryLog.
        """
        _check_id("ledger id", ledger_id)
        _check_chunk(prealloc_chunk_bytes)
        created_dirs = _make_parent_dirs(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            return cls._reuse(path, ledger_id, prealloc_chunk_bytes, fsync)
        first_chunk_bytes = min(prealloc_chunk_bytes, FIRST_CHUNK_BYTES)
        try:
            fileio.posix_fallocate(fd, 0, first_chunk_bytes)
            created_ms = _write_header(fd, ledger_id, fsync)
            if fsync:
                # the new name, and any directory made for it, must survive a crash too
                for directory in (*created_dirs, path.parent):
                    fsync_directory(directory)
        except BaseException:
            os.close(fd)
            # ours, and nothing in it yet: a retry must not find it in its way
            path.unlink(missing_ok=True)
            raise
        return cls(
            path,
            ledger_id,
            fd,
            created_ms=created_ms,
            prealloc_chunk_bytes=prealloc_chunk_bytes,
            allocated_bytes=first_chunk_bytes,
            fsync=fsync,
        )

    @classmethod
    def _reuse(cls, path: Path, ledger_id: int, prealloc_chunk_bytes: int, fsync: bool) -> EntryLog:
        """`create` met an existing file: reuse it if that cannot lose an entry."""
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if _holds_only_zeros(fd, size):
                # a create cut short before its header reached the disk
                created_ms = _write_header(fd, ledger_id, fsync)
            else:
                try:
                    created_ms = _validate_header(path, fd, size, ledger_id)
                except StorageCorruption as error:
                    raise UnindexedEntryLog(
                        path, ledger_id, f"is not an empty log of this ledger ({error.reason})"
                    ) from error
        except BaseException:
            os.close(fd)
            raise
        log = cls(
            path,
            ledger_id,
            fd,
            created_ms=created_ms,
            prealloc_chunk_bytes=prealloc_chunk_bytes,
            allocated_bytes=size,
            fsync=fsync,
        )
        try:
            records = list(log.scan())
        except BaseException:
            log.close()
            raise
        # checked against the first write (see `_check_rewrite`)
        log._unindexed = records
        return log

    @classmethod
    def open(
        cls, path: Path, ledger_id: int, *, prealloc_chunk_bytes: int, fsync: bool = True
    ) -> EntryLog:
        """The existing entry log of `ledger_id`, its header validated.

        A missing file raises FileNotFoundError; a header that is not a valid header
        of this ledger's log raises StorageCorruption at offset 0.
        """
        _check_id("ledger id", ledger_id)
        _check_chunk(prealloc_chunk_bytes)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            created_ms = _validate_header(path, fd, size, ledger_id)
        except BaseException:
            os.close(fd)
            raise
        return cls(
            path,
            ledger_id,
            fd,
            created_ms=created_ms,
            prealloc_chunk_bytes=prealloc_chunk_bytes,
            allocated_bytes=size,
            fsync=fsync,
        )

    # --- writing ------------------------------------------------------------------

    def write_records(
        self, entries: Sequence[tuple[int, bytes]], position: int
    ) -> list[tuple[int, int, int]]:
        """Writes `(entry_id, payload)` pairs as records starting at `position`.

        Returns `(entry_id, offset, record_length)` per entry, in the order given.
        The first record of a log goes at FIRST_RECORD_OFFSET. Does not sync: call
        `sync` before the index may point at these records.
        """
        fd = self._fd
        if fd < 0:
            raise ValueError(f"{self.path}: entry log is closed")
        if position < FIRST_RECORD_OFFSET:
            raise ValueError(
                f"{self.path}: write position {position} is inside the {HEADER_SIZE}-byte "
                f"header; the first record goes at FIRST_RECORD_OFFSET ({FIRST_RECORD_OFFSET})"
            )
        if not entries:
            return []
        total = 0
        for entry_id, payload in entries:
            if not 0 <= entry_id < _ID_LIMIT:
                raise ValueError(f"{self.path}: entry id {entry_id} is not in 0..2**63-1")
            if len(payload) > RECORD_PAYLOAD_MAX:
                raise ValueError(
                    f"{self.path}: payload of {len(payload)} bytes for entry {entry_id} "
                    f"exceeds RECORD_PAYLOAD_MAX ({RECORD_PAYLOAD_MAX})"
                )
            total += RECORD_HEADER_SIZE + len(payload)

        # One buffer, one positioned write: per-entry syscalls are what would limit us.
        buf = bytearray(total)
        view = memoryview(buf)
        pack_header = RECORD_HEADER.pack_into
        pack_crc = _CRC_FIELD.pack_into
        checksum = crc32c.crc32c
        ledger_id = self.ledger_id
        positions: list[tuple[int, int, int]] = []
        cursor = 0
        for entry_id, payload in entries:
            payload_start = cursor + RECORD_HEADER_SIZE
            end = payload_start + len(payload)
            pack_header(buf, cursor, 0, len(payload), ledger_id, entry_id, -1)
            buf[payload_start:end] = payload
            pack_crc(buf, cursor, checksum(view[cursor + 4 : end]))
            positions.append((entry_id, position + cursor, end - cursor))
            cursor = end
        assert cursor == total

        if self._unindexed is not None:
            self._check_rewrite([view], position)
        self._ensure_allocated(position + total)
        pwrite_all(fd, view, position)
        return positions

    def write_bodies(self, bodies: Sequence[RecordBody], position: int) -> list[int]:
        """Writes already-encoded records (journal bodies) back to back from `position`.

        The records were checksummed when they were journalled and are copied as they
        are: the flush's hot path. Returns each record's length (the first starts at
        `position`, each next one where the one before it ends). Does not sync.
        """
        fd = self._fd
        if fd < 0:
            raise ValueError(f"{self.path}: entry log is closed")
        if position < FIRST_RECORD_OFFSET:
            raise ValueError(
                f"{self.path}: write position {position} is inside the {HEADER_SIZE}-byte header"
            )
        # C loops (map, sum), not a Python step per record: a flush holds thousands,
        # and this runs in a thread that holds the GIL the event loop is waiting for
        lengths = list(map(len, bodies))
        if self._unindexed is not None:
            self._check_rewrite(bodies, position)
        self._ensure_allocated(position + sum(lengths))
        # gathered by the kernel: joining them first would copy megabytes while
        # holding the GIL
        pwritev_all(fd, bodies, position)
        return lengths

    def _check_rewrite(
        self, chunks: Sequence[bytes | bytearray | memoryview], position: int
    ) -> None:
        """Before the first write to a file `create` reused: every entry record in it
        must be written again here, the same bytes at the same offset, so that writing
        loses nothing. State records may go (the flush writes the ledger's state anew);
        a damaged record is what a cut flush leaves, if this write covers its place."""
        records = self._unindexed
        assert records is not None
        starts = list(itertools.accumulate((len(chunk) for chunk in chunks), initial=position))
        end = starts[-1]
        for record in records:
            if record.crc_ok and record.entry_id == STATE_ENTRY_ID:
                continue
            record_end = record.offset + record.record_length
            if not record.crc_ok:
                if position <= record.offset < end:
                    continue
                why = f"holds a damaged record at byte {record.offset}"
            elif position <= record.offset and record_end <= end:
                stored = os.pread(self._fd, record.record_length, record.offset)
                if stored == _gather(chunks, starts, record.offset, record_end):
                    continue
                why = (
                    f"holds entry {record.entry_id} at byte {record.offset}, with other "
                    "bytes than this write puts there"
                )
            else:
                why = f"holds entry {record.entry_id} at byte {record.offset}"
            raise UnindexedEntryLog(self.path, self.ledger_id, why)
        self._unindexed = None

    def sync(self) -> None:
        """Makes every earlier write durable (fdatasync), unless built with fsync=False."""
        if self._fd < 0:
            raise ValueError(f"{self.path}: entry log is closed")
        if self._fsync:
            fileio.fdatasync(self._fd)

    def _ensure_allocated(self, end: int) -> None:
        """Grows the preallocated space until `end` fits in it.

        Growth is geometric: each step doubles the file, from FIRST_CHUNK_BYTES up to
        the configured chunk size, so a node with 10,000 small ledgers does not
        reserve 10,000 full chunks, while a busy ledger soon grows in big ones.
        """
        if end <= self._allocated_bytes:
            return
        target = self._allocated_bytes
        while target < end:
            target += min(max(target, FIRST_CHUNK_BYTES), self._chunk_bytes)
        # fallocate reserves the blocks (no fragmentation, no ENOSPC mid-flush) and
        # extends the size; fdatasync later persists the new size with the data.
        fileio.posix_fallocate(self._fd, self._allocated_bytes, target - self._allocated_bytes)
        self._allocated_bytes = target

    # --- reading ------------------------------------------------------------------

    def read_record(self, offset: int, record_length: int, entry_id: int) -> bytes:
        """The payload of the record the index places at `offset`, verified.

        Any disagreement (checksum, ledger id, entry id, length) raises
        StorageCorruption naming this file and `offset`.
        """
        fd = self._fd
        if fd < 0:
            raise ValueError(f"{self.path}: entry log is closed")
        self._check_position(offset, record_length)
        data = os.pread(fd, record_length, offset)
        if len(data) != record_length:
            raise StorageCorruption(
                self.path,
                offset,
                f"record of {record_length} bytes runs past the end of the file "
                f"(only {len(data)} bytes there)",
            )
        return self._verified_payload(data, 0, offset, record_length, entry_id)

    def read_records(self, positions: Sequence[tuple[int, int, int]]) -> list[bytes]:
        """The payloads of `(entry_id, offset, record_length)` positions sorted by offset.

        Neighbouring records are fetched together, so a range read costs a few preads.
        """
        fd = self._fd
        if fd < 0:
            raise ValueError(f"{self.path}: entry log is closed")
        payloads: list[bytes] = []
        count = len(positions)
        run_start_index = 0
        while run_start_index < count:
            # grow a run while the next record is close and the run stays bounded
            _, run_offset, first_length = positions[run_start_index]
            self._check_position(run_offset, first_length)
            run_end = run_offset + first_length
            next_index = run_start_index + 1
            while next_index < count:
                _, offset, record_length = positions[next_index]
                if offset < run_end:
                    raise ValueError(
                        f"{self.path}: positions must be sorted by offset and not overlap; "
                        f"offset {offset} comes after a record ending at {run_end}"
                    )
                self._check_position(offset, record_length)
                if (
                    offset - run_end > _READ_GAP_BYTES_MAX
                    or offset + record_length - run_offset > _READ_RUN_BYTES_MAX
                ):
                    break
                run_end = offset + record_length
                next_index += 1
            data = os.pread(fd, run_end - run_offset, run_offset)
            for entry_id, offset, record_length in positions[run_start_index:next_index]:
                at = offset - run_offset
                if at + record_length > len(data):
                    raise StorageCorruption(
                        self.path,
                        offset,
                        f"record of {record_length} bytes runs past the end of the file",
                    )
                payloads.append(self._verified_payload(data, at, offset, record_length, entry_id))
            run_start_index = next_index
        return payloads

    def scan(self, start: int = HEADER_SIZE, end: int | None = None) -> Iterator[ScannedRecord]:
        """Walks the records from `start`, for `pora verify` and index rebuild.

        Stops at an all-zero record header (preallocated space), at `end` (default:
        the file size), or where a header would run past it. A record whose checksum
        fails, or whose length runs past the range, is yielded with crc_ok=False and
        ends the scan: lengths after it cannot be trusted. The caller compares where
        the last good record ends with where it expected the log to end.
        """
        fd = self._fd
        if fd < 0:
            raise ValueError(f"{self.path}: entry log is closed")
        if start < FIRST_RECORD_OFFSET:
            raise ValueError(f"{self.path}: scan start {start} is inside the header")
        file_size = os.fstat(fd).st_size
        limit = file_size if end is None else min(end, file_size)
        window = _ReadWindow(fd, limit)
        offset = start
        while offset + RECORD_HEADER_SIZE <= limit:
            header = window.read(offset, RECORD_HEADER_SIZE)
            if len(header) < RECORD_HEADER_SIZE:  # the file shrank under us
                return
            if header == ZERO_RECORD_HEADER:
                return
            stored_crc, payload_length, ledger_id, entry_id, lac = RECORD_HEADER.unpack(header)
            record_length = RECORD_HEADER_SIZE + payload_length
            record = b""
            if payload_length <= RECORD_PAYLOAD_MAX and offset + record_length <= limit:
                record = window.read(offset, record_length)
            crc_ok = (
                len(record) == record_length and record_crc(record, 0, record_length) == stored_crc
            )
            yield ScannedRecord(
                offset, entry_id, ledger_id, record_length, payload_length, crc_ok, lac
            )
            if not crc_ok:
                return
            offset += record_length

    def _check_position(self, offset: int, record_length: int) -> None:
        # an index entry that cannot describe a record is itself damage: report it as such
        if offset < FIRST_RECORD_OFFSET or not (
            RECORD_HEADER_SIZE <= record_length <= RECORD_HEADER_SIZE + RECORD_PAYLOAD_MAX
        ):
            raise StorageCorruption(
                self.path,
                offset,
                f"the index places a record of {record_length} bytes at offset {offset}, "
                f"which no valid record can be (records start at {FIRST_RECORD_OFFSET} and "
                f"are {RECORD_HEADER_SIZE}..{RECORD_HEADER_SIZE + RECORD_PAYLOAD_MAX} bytes)",
            )

    def _verified_payload(
        self, buf: bytes, at: int, offset: int, record_length: int, entry_id: int
    ) -> bytes:
        """The payload of the record at `buf[at:]` after checking it is the one expected."""
        header = buf[at : at + RECORD_HEADER_SIZE]
        if header == ZERO_RECORD_HEADER:
            raise StorageCorruption(
                self.path, offset, "no record here, only zero fill (the index points past the data)"
            )
        stored_crc, payload_length, ledger_id, stored_entry_id, _lac = RECORD_HEADER.unpack(header)
        if RECORD_HEADER_SIZE + payload_length != record_length:
            raise StorageCorruption(
                self.path,
                offset,
                f"record header gives a payload of {payload_length} bytes but the index a "
                f"record of {record_length} bytes (header {RECORD_HEADER_SIZE} + payload)",
            )
        computed_crc = record_crc(buf, at, at + record_length)
        if computed_crc != stored_crc:
            raise StorageCorruption(
                self.path,
                offset,
                f"record checksum mismatch (stored 0x{stored_crc:08x}, "
                f"computed 0x{computed_crc:08x})",
            )
        if ledger_id != self.ledger_id:
            raise StorageCorruption(
                self.path,
                offset,
                f"record belongs to ledger {ledger_id}, but this is ledger {self.ledger_id}'s log",
            )
        if stored_entry_id != entry_id:
            raise StorageCorruption(
                self.path,
                offset,
                f"record holds entry {stored_entry_id}, but the index says entry {entry_id}",
            )
        return buf[at + RECORD_HEADER_SIZE : at + record_length]

    # --- lifetime -----------------------------------------------------------------

    @property
    def allocated_bytes(self) -> int:
        """Bytes preallocated so far (the file's size)."""
        return self._allocated_bytes

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        """Closes the file. Idempotent. Does not sync."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> EntryLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._fd < 0 else f"{self._allocated_bytes} bytes allocated"
        return f"<EntryLog ledger {self.ledger_id} at {self.path}, {state}>"


class _ReadWindow:
    """Reads a file through a sliding buffer so a scan costs few preads."""

    __slots__ = ("_data", "_fd", "_limit", "_start")

    def __init__(self, fd: int, limit: int) -> None:
        self._fd = fd
        self._limit = limit
        self._start = 0
        self._data = b""

    def read(self, offset: int, length: int) -> bytes:
        """`length` bytes at `offset` (fewer only if the file shrank meanwhile)."""
        at = offset - self._start
        if at < 0 or at + length > len(self._data):
            read_length = min(max(length, _SCAN_WINDOW_BYTES), self._limit - offset)
            self._data = os.pread(self._fd, read_length, offset)
            self._start = offset
            at = 0
        return self._data[at : at + length]


def _write_header(fd: int, ledger_id: int, fsync: bool) -> int:
    """Writes a new header block at offset 0 (and syncs it); returns its created_ms."""
    created_ms = time.time_ns() // 1_000_000
    pwrite_all(fd, _encode_header(ledger_id, created_ms), 0)
    if fsync:
        fileio.fdatasync(fd)
    return created_ms


def _holds_only_zeros(fd: int, size: int) -> bool:
    """Whether the file is no bigger than a new log's first chunk and all zeros: what
    a crash leaves between a create's open and its header reaching the disk."""
    if size > FIRST_CHUNK_BYTES:
        return False
    return os.pread(fd, size, 0).count(0) == size


def _gather(
    chunks: Sequence[bytes | bytearray | memoryview], starts: list[int], begin: int, end: int
) -> bytes:
    """The bytes from file offset `begin` to `end` of chunks written back to back,
    chunks[i] at file offset starts[i]."""
    at = bisect.bisect_right(starts, begin) - 1
    parts: list[bytes] = []
    while begin < end:
        chunk = chunks[at]
        take = min(end, starts[at + 1]) - begin
        parts.append(bytes(chunk[begin - starts[at] : begin - starts[at] + take]))
        begin += take
        at += 1
    return b"".join(parts)


def _encode_header(ledger_id: int, created_ms: int) -> bytes:
    block = bytearray(HEADER_SIZE)
    HEADER.pack_into(block, 0, MAGIC, FORMAT_VERSION, 0, ledger_id, created_ms, 0)
    HEADER.pack_into(block, 0, MAGIC, FORMAT_VERSION, 0, ledger_id, created_ms, header_crc(block))
    return bytes(block)


def _validate_header(path: Path, fd: int, size: int, ledger_id: int) -> int:
    """Checks the header block of an entry log; returns its created_ms."""
    if size < HEADER_SIZE:
        raise StorageCorruption(
            path, 0, f"file is {size} bytes, shorter than the {HEADER_SIZE}-byte header"
        )
    raw = os.pread(fd, HEADER.size, 0)
    magic, version, _reserved, stored_ledger_id, created_ms, stored_crc = HEADER.unpack(raw)
    if magic != MAGIC:
        raise StorageCorruption(
            path, 0, f"magic is {magic!r}, expected {MAGIC!r}: not a Pora entry log"
        )
    # the version decides the layout of what follows, so it is checked before the crc
    if version != FORMAT_VERSION:
        raise StorageCorruption(
            path,
            0,
            f"entry log format version {version} is unknown; this build reads version "
            f"{FORMAT_VERSION} (was the file written by a newer Pora?)",
        )
    computed_crc = header_crc(raw)
    if computed_crc != stored_crc:
        raise StorageCorruption(
            path,
            0,
            f"header checksum mismatch (stored 0x{stored_crc:08x}, computed 0x{computed_crc:08x})",
        )
    if stored_ledger_id != ledger_id:
        raise StorageCorruption(
            path, 0, f"header says ledger {stored_ledger_id}, expected ledger {ledger_id}"
        )
    return int(created_ms)


def _make_parent_dirs(path: Path) -> list[Path]:
    """Makes the missing parents of `path`; returns the directories whose entries
    changed (the parent of each new directory), outermost first, for fsync."""
    missing: list[Path] = []
    directory = path.parent
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    path.parent.mkdir(parents=True, exist_ok=True)
    return [new.parent for new in reversed(missing)]


def _check_id(what: str, value: int) -> None:
    if not 0 <= value < _ID_LIMIT:
        raise ValueError(f"{what} {value} is not in 0..2**63-1")


def _check_chunk(prealloc_chunk_bytes: int) -> None:
    if prealloc_chunk_bytes < HEADER_SIZE:
        raise ValueError(
            f"prealloc_chunk_bytes {prealloc_chunk_bytes} is smaller than the "
            f"{HEADER_SIZE}-byte header"
        )
