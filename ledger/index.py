"""The node's index: one LevelDB (plyvel) holding entry positions and ledger metadata.

Key layout (big-endian, so LevelDB's bytewise order is (ledger, entry) order; the
grammar is in docs/formats.md)::

    b"r" ledger_id u64 last_entry_id u64  ->  offset u64 (end u32 little-endian)*count
    b"m" ledger_id u64                    ->  LedgerMeta.encode()
    b"n" name (utf-8)                     ->  node-level value (format version, ...)

Positions are stored by *run*: entries with consecutive ids whose records lie back
to back in the entry log (what one flush writes) share one key, named by the run's
last entry id; its value is the first record's offset and each record's end
relative to it. A flush of thousands of entries is one put rather than thousands
(per-entry puts and their compactions cost a served node about a fifth of its CPU
per add); a lookup is one seek, to the first run ending at or after the entry.

Everything here is blocking: call it from worker threads. plyvel's DB is safe to use
from several threads at once (LevelDB serialises writers itself).

Durability: a write with sync=False is in LevelDB's log file in the kernel, so it
survives a process crash but not a power loss. `sync()` (or sync=True) makes every
earlier write survive a power loss too; see `sync` for why it does more than one
sync=True write.
"""

from __future__ import annotations

import array
import contextlib
import itertools
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import plyvel

from journal.errors import PoraError
from ledger.leveldb_tables import check_tables
from ledger.state import LedgerMeta

__all__ = ["Index", "IndexDamaged", "IndexOpenError", "IndexWritesStopped"]

RUN_PREFIX: Final = b"r"
META_PREFIX: Final = b"m"
NODE_PREFIX: Final = b"n"
#: a deleted ledger's tombstone: ledger ids are never reused, so a node refuses to
#: create a ledger again once it deleted one of that id (late adds of its writer)
DELETED_PREFIX: Final = b"d"

_ID_LIMIT: Final = 2**63  # ledger and entry ids are non-negative i64
_RUN_KEY: Final = struct.Struct(">1sQQ")  # b"r", ledger_id, the run's last entry id
_LEDGER_KEY: Final = struct.Struct(">1sQ")  # b"r", b"m" or b"d", ledger_id
_RUN_OFFSET: Final = struct.Struct(">Q")  # a run value starts with its first offset
_RUN_END: Final = struct.Struct("<I")  # then each record's end, relative to that offset
_RUN_ENDS_AT: Final = _RUN_OFFSET.size
_META_KEY_SIZE: Final = _LEDGER_KEY.size  # 9
#: the records of one run span fewer bytes than this (its ends are u32)
_RUN_BYTES_LIMIT: Final = 2**32
_BIG_ENDIAN_HOST: Final = sys.byteorder == "big"
#: the node value rewritten with sync=True by `sync`
SYNC_MARKER_NAME: Final = "sync_marker"


class IndexOpenError(PoraError):
    """The index DB cannot be opened (locked, missing, damaged)."""

    def __init__(self, path: Path, cause: str, advice: str) -> None:
        self.path = path
        self.cause = cause
        super().__init__(f"cannot open the index at {path}: {cause}; {advice}")


class IndexDamaged(IndexOpenError):
    """LevelDB found the index damaged (a bad checksum in its log or tables).

    Raised at open rather than let LevelDB drop what it cannot read: with
    `paranoid_checks` it refuses, where it would otherwise discard a damaged log and
    forget every write in it (entries acknowledged and intact in their entry logs).
    """


class IndexWritesStopped(OSError, PoraError):
    """An earlier write to the index failed; the index takes no more until reopened.

    LevelDB appends a write to its log before applying it, and when that append
    fails part way (a full disk) it leaves the part on disk and goes on appending
    the next writes after it: the log is then damaged in its middle and the next
    open refuses it (or, without paranoid checks, drops every write after it). Once
    reopened, the part is at the log's end, where LevelDB reads it as the torn end
    of a crash. An OSError, so a flush that meets it fails like one that meets the
    full disk: its entries stay in memory and in the journal.
    """

    def __init__(self, path: Path, cause: str) -> None:
        self.path = path
        self.cause = cause
        self.message = (
            f"the index at {path} takes no more writes since one failed ({cause}): "
            "LevelDB may have kept part of that write in its log, and writing after it "
            "would damage the log. Free space on that disk (or fix it), then restart the "
            "node: it reopens the index, and the journal keeps every entry until then"
        )
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class Index:
    """The LevelDB index of one node. Open it once per data directory."""

    def __init__(
        self,
        path: Path,
        *,
        cache_bytes: int = 64 << 20,
        bloom_bits: int = 10,
        create: bool = True,
        paranoid_checks: bool = True,
    ) -> None:
        """Opens (or with `create`, creates) the DB at `path`.

        `paranoid_checks`: refuse (IndexDamaged) a DB LevelDB finds damaged, rather
        than open it without what it could not read. Only a rebuild, which writes a
        new index from the entry logs, has a reason to turn it off.
        """
        if cache_bytes < 0 or bloom_bits < 0:
            raise ValueError(
                f"cache_bytes ({cache_bytes}) and bloom_bits ({bloom_bits}) must be >= 0"
            )
        self.path = path
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = plyvel.DB(
                str(path),
                create_if_missing=create,
                lru_cache_size=cache_bytes,
                bloom_filter_bits=bloom_bits,
                paranoid_checks=paranoid_checks,
            )
        except plyvel.Error as error:
            raise _open_error(path, error, create=create) from error
        self._sync_count = 0
        #: what made a write fail; set, no more writes go to this DB (IndexWritesStopped)
        self._write_failure: str | None = None
        #: the private copy `open_copy` made, removed by `close`
        self._copy_dir: Path | None = None
        #: whether reads check LevelDB's block checksums (plyvel.CorruptionError when
        #: one fails): the inspection commands do, so that damage in a table file is
        #: reported as such rather than read as wrong positions
        self._verify_checksums = False

    @classmethod
    def open_copy(cls, path: Path, *, cache_bytes: int = 8 << 20) -> Index:
        """The existing index at `path`, opened on a private copy that `close` removes.

        For the inspection commands, which must change nothing: LevelDB writes at
        every open (its LOG and LOCK files, a log file recovered into a table, files
        it finds obsolete or damaged deleted), and plyvel has no read-only mode. The
        copy hard-links the table files (LevelDB never changes one once written, it
        only deletes them) where the file system allows, and copies the rest.
        Raises IndexOpenError like the constructor (path named as the original's).
        The caller holds the data dir's lock (a copy left by a killed inspection is
        removed).
        """
        if not (path / "CURRENT").exists():
            raise IndexOpenError(
                path, "it has no LevelDB CURRENT file", "the index is missing or incomplete"
            )
        copy_dir = _copy_of_index(path)
        try:
            index = cls(copy_dir, cache_bytes=cache_bytes, create=False, paranoid_checks=True)
        except IndexOpenError as error:
            shutil.rmtree(copy_dir, ignore_errors=True)
            if isinstance(error, IndexDamaged):
                raise IndexDamaged(path, error.cause, _DAMAGED_ADVICE) from error
            raise IndexOpenError(path, error.cause, "it cannot be read") from error
        index._copy_dir = copy_dir
        index._verify_checksums = True
        index.path = path
        # the tables left once LevelDB opened the copy are the live ones
        damage = check_tables(copy_dir)
        if damage:
            index.close()
            first = damage[0]
            raise IndexDamaged(
                path,
                f"its table {path / first.path.name} fails at byte {first.offset}: {first.reason}",
                _DAMAGED_ADVICE,
            )
        return index

    # --- entry positions ------------------------------------------------------------

    def get_position(self, ledger_id: int, entry_id: int) -> tuple[int, int] | None:
        """`(offset, record_length)` of an entry in its ledger's entry log, if indexed."""
        _check_id("ledger id", ledger_id)
        _check_id("entry id", entry_id)
        start = _RUN_KEY.pack(RUN_PREFIX, ledger_id, entry_id)
        stop = _LEDGER_KEY.pack(RUN_PREFIX, ledger_id + 1)
        with self._db.iterator(
            start=start, stop=stop, verify_checksums=self._verify_checksums
        ) as runs:
            for key, value in runs:  # the first run ending at or after entry_id
                first = _RUN_KEY.unpack(key)[2] - _run_count(value) + 1
                if entry_id < first:
                    return None  # it falls in a gap before this run
                return _run_position(value, entry_id - first)
        return None

    def iter_positions(
        self, ledger_id: int, from_entry: int = 0, to_entry: int | None = None
    ) -> Iterator[tuple[int, int, int]]:
        """`(entry_id, offset, record_length)` of the ledger's indexed entries from
        `from_entry` to `to_entry` (inclusive; default: the last), ascending."""
        _check_id("ledger id", ledger_id)
        _check_id("from_entry", from_entry)
        if to_entry is None:
            to_entry = _ID_LIMIT - 1
        else:
            _check_id("to_entry", to_entry)
            if to_entry < from_entry:
                return iter(())
        # arguments are checked above, now; the walk itself is lazy
        return self._walk_positions(ledger_id, from_entry, to_entry)

    def _walk_positions(
        self, ledger_id: int, from_entry: int, to_entry: int
    ) -> Iterator[tuple[int, int, int]]:
        start = _RUN_KEY.pack(RUN_PREFIX, ledger_id, from_entry)
        stop = _LEDGER_KEY.pack(RUN_PREFIX, ledger_id + 1)
        for key, value in self._db.iterator(
            start=start, stop=stop, verify_checksums=self._verify_checksums
        ):
            last = _RUN_KEY.unpack(key)[2]
            first = last - _run_count(value) + 1
            if first > to_entry:
                return
            for position in _expand_run(first, value):
                if from_entry <= position[0] <= to_entry:
                    yield position

    def ledgers_with_positions(self) -> Iterator[int]:
        """The ids of ledgers that have at least one indexed entry, ascending.

        Jumps from ledger to ledger (one seek each) rather than walking every key;
        for `pora verify`, which looks for positions whose ledger has no metadata.
        """
        start = _LEDGER_KEY.pack(RUN_PREFIX, 0)
        stop = _LEDGER_KEY.pack(RUN_PREFIX, 2**63)
        with self._db.iterator(
            start=start, stop=stop, include_value=False, verify_checksums=self._verify_checksums
        ) as keys:
            for key in keys:
                ledger_id: int = _LEDGER_KEY.unpack_from(key)[1]
                yield ledger_id
                keys.seek(_LEDGER_KEY.pack(RUN_PREFIX, ledger_id + 1))

    def count_positions(self, ledger_id: int) -> int:
        """How many entries of the ledger are indexed (walks its runs)."""
        _check_id("ledger id", ledger_id)
        prefix = _LEDGER_KEY.pack(RUN_PREFIX, ledger_id)
        return sum(
            _run_count(value)
            for _, value in self._db.iterator(
                prefix=prefix, verify_checksums=self._verify_checksums
            )
        )

    def apply_flush(
        self,
        ledger_id: int,
        positions: Sequence[tuple[int, int, int]],
        meta: LedgerMeta,
        *,
        sync: bool = False,
    ) -> None:
        """Installs `(entry_id, offset, record_length)` positions and the ledger's
        metadata in one atomic batch: a reader or a restart sees all of it or none.

        An entry indexed again gets its new position (the runs it was in are cut).
        """
        self._install(ledger_id, _runs(positions), meta, sync)

    def apply_back_to_back(
        self,
        ledger_id: int,
        entry_ids: Sequence[int],
        offset: int,
        lengths: Sequence[int],
        meta: LedgerMeta,
    ) -> None:
        """`apply_flush` for records written back to back from `offset` (a flush):
        entry_ids[i]'s record has lengths[i] bytes and starts where the one before
        it ends. Consecutive ids, the flush's case, are checked and packed with list
        operations, without a Python step per entry."""
        if len(entry_ids) != len(lengths):
            raise ValueError(f"{len(entry_ids)} entry ids for {len(lengths)} record lengths")
        runs: list[tuple[int, int, bytes]] = []
        if entry_ids:
            ends = list(itertools.accumulate(lengths))
            run = _one_run(list(entry_ids), offset, lengths, ends)
            if run is not None:
                runs = [run]
            else:
                starts = [offset, *[offset + end for end in ends[:-1]]]
                runs = _runs(list(zip(entry_ids, starts, lengths, strict=True)))
        self._install(ledger_id, runs, meta, False)

    def _install(
        self, ledger_id: int, runs: list[tuple[int, int, bytes]], meta: LedgerMeta, sync: bool
    ) -> None:
        _check_id("ledger id", ledger_id)
        if meta.ledger_id != ledger_id:
            raise ValueError(f"metadata of ledger {meta.ledger_id} given for ledger {ledger_id}")
        # transaction=True: if anything below raises, nothing of the batch is written
        with self._writing(), self._db.write_batch(transaction=True, sync=sync) as batch:
            if runs:
                self._cut_runs_overlapping(batch, ledger_id, runs)
            for _, last, value in runs:
                batch.put(_RUN_KEY.pack(RUN_PREFIX, ledger_id, last), value)
            batch.put(_LEDGER_KEY.pack(META_PREFIX, ledger_id), meta.encode())
        if sync:
            self._fsync_log_files()

    def _cut_runs_overlapping(
        self, batch: Any, ledger_id: int, runs: list[tuple[int, int, bytes]]
    ) -> None:
        """Take the entries of `runs` out of the stored runs that hold any of them,
        keeping their other entries as runs of their own (put before the new runs, so
        those win). One seek that finds nothing, normally: an entry is indexed twice
        only by a rebuild or a flush done again."""
        lowest, highest = runs[0][0], runs[-1][1]
        start = _RUN_KEY.pack(RUN_PREFIX, ledger_id, lowest)
        stop = _LEDGER_KEY.pack(RUN_PREFIX, ledger_id + 1)
        new_ids: set[int] | None = None
        for key, value in self._db.iterator(
            start=start, stop=stop, verify_checksums=self._verify_checksums
        ):
            run_first = _RUN_KEY.unpack(key)[2] - _run_count(value) + 1
            if run_first > highest:
                return
            if new_ids is None:
                new_ids = {e for first, last, _ in runs for e in range(first, last + 1)}
            batch.delete(key)
            kept = [p for p in _expand_run(run_first, value) if p[0] not in new_ids]
            for _, kept_last, kept_value in _runs(kept):
                batch.put(_RUN_KEY.pack(RUN_PREFIX, ledger_id, kept_last), kept_value)

    # --- ledger metadata --------------------------------------------------------------

    def is_empty(self) -> bool:
        """Whether the index holds no ledger metadata and no entry position."""
        for prefix in (META_PREFIX, RUN_PREFIX):
            with self._db.iterator(
                prefix=prefix, include_value=False, verify_checksums=self._verify_checksums
            ) as keys:
                for _ in keys:
                    return False
        return True

    def put_meta(self, meta: LedgerMeta, *, sync: bool = False) -> None:
        _check_id("ledger id", meta.ledger_id)
        with self._writing():
            self._db.put(_LEDGER_KEY.pack(META_PREFIX, meta.ledger_id), meta.encode(), sync=sync)
            if sync:
                self._fsync_log_files()

    def get_meta(self, ledger_id: int) -> LedgerMeta | None:
        """The ledger's metadata; ValueError if it is stored in a version we cannot read."""
        _check_id("ledger id", ledger_id)
        value = self._db.get(
            _LEDGER_KEY.pack(META_PREFIX, ledger_id), verify_checksums=self._verify_checksums
        )
        return None if value is None else LedgerMeta.decode(ledger_id, value)

    def load_all_meta(self) -> dict[int, LedgerMeta]:
        """Every ledger's metadata, by ledger id: one pass over the b"m" keys."""
        metas: dict[int, LedgerMeta] = {}
        decode = LedgerMeta.decode
        for key, value in self._db.iterator(
            prefix=META_PREFIX, verify_checksums=self._verify_checksums
        ):
            if len(key) != _META_KEY_SIZE:
                raise ValueError(
                    f"index {self.path}: metadata key {key!r} is not b'm' + a u64 ledger id"
                )
            ledger_id = int.from_bytes(key[1:], "big")
            metas[ledger_id] = decode(ledger_id, value)
        return metas

    def delete_ledger(self, ledger_id: int, *, sync: bool = False) -> None:
        """Removes every position of the ledger and its metadata and leaves its
        tombstone (`is_deleted`), in one batch."""
        _check_id("ledger id", ledger_id)
        prefix = _LEDGER_KEY.pack(RUN_PREFIX, ledger_id)
        # the iterator reads a snapshot, so deleting while walking it is safe
        with self._writing(), self._db.write_batch(transaction=True, sync=sync) as batch:
            for key in self._db.iterator(
                prefix=prefix, include_value=False, verify_checksums=self._verify_checksums
            ):
                batch.delete(key)
            batch.delete(_LEDGER_KEY.pack(META_PREFIX, ledger_id))
            batch.put(_LEDGER_KEY.pack(DELETED_PREFIX, ledger_id), b"")
        if sync:
            self._fsync_log_files()

    def is_deleted(self, ledger_id: int) -> bool:
        """Whether this node deleted a ledger of this id (its tombstone): one lookup,
        made when a request would create the ledger, never per entry."""
        _check_id("ledger id", ledger_id)
        key = _LEDGER_KEY.pack(DELETED_PREFIX, ledger_id)
        return self._db.get(key, verify_checksums=self._verify_checksums) is not None

    # --- node values ----------------------------------------------------------------

    def get_node_value(self, name: str) -> bytes | None:
        value: bytes | None = self._db.get(_node_key(name), verify_checksums=self._verify_checksums)
        return value

    def put_node_value(self, name: str, value: bytes, *, sync: bool = False) -> None:
        with self._writing():
            self._db.put(_node_key(name), value, sync=sync)
            if sync:
                self._fsync_log_files()

    # --- durability and lifetime ----------------------------------------------------

    def sync(self) -> None:
        """Makes every earlier write durable, power loss included.

        One sync=True write of a marker key fsyncs LevelDB's current log file, and
        the log is sequential, so everything written to that file before it is on
        disk too. But when LevelDB switches to a new log file (its memtable filled
        up), it closes the old one without fsync and relies on the memtable
        compaction that follows; until that compaction ends, writes that are only
        in the old log are not durable. So we also fsync every log file in the
        directory (cheap when already clean; a log deleted meanwhile was compacted
        into a synced table) and the directory (a new log file's name).
        """
        self._sync_count += 1
        with self._writing():
            marker = self._sync_count.to_bytes(8, "big")
            self._db.put(_node_key(SYNC_MARKER_NAME), marker, sync=True)
            self._fsync_log_files()

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Around every write: refuse it once one has failed (IndexWritesStopped), and
        remember a failure of this one."""
        if self._write_failure is not None:
            raise IndexWritesStopped(self.path, self._write_failure)
        try:
            yield
        except OSError as error:  # plyvel.IOError is one (errno None), fsync's too
            self._write_failure = _describe_write_error(error)
            raise

    def _fsync_log_files(self) -> None:
        with os.scandir(self.path) as entries:
            log_names = [entry.path for entry in entries if entry.name.endswith(".log")]
        for name in log_names:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # compacted and deleted since the listing: its data is in a table
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        directory_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(directory_fd)
        finally:
            os.close(directory_fd)

    @property
    def closed(self) -> bool:
        closed: bool = self._db.closed
        return closed

    def close(self) -> None:
        """Closes the DB (releases its lock). Idempotent."""
        self._db.close()
        copy_dir, self._copy_dir = self._copy_dir, None
        if copy_dir is not None:
            shutil.rmtree(copy_dir, ignore_errors=True)

    def __enter__(self) -> Index:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Index at {self.path}{' (closed)' if self.closed else ''}>"


def _check_id(what: str, value: int) -> None:
    if not 0 <= value < _ID_LIMIT:
        raise ValueError(f"{what} {value} is not in 0..2**63-1")


def _run_count(value: bytes) -> int:
    """How many entries a run value holds."""
    return (len(value) - _RUN_ENDS_AT) // _RUN_END.size


def _run_ends(value: bytes) -> array.array[int]:
    ends = array.array("I", value[_RUN_ENDS_AT:])
    if _BIG_ENDIAN_HOST:  # the ends are little-endian on disk
        ends.byteswap()
    return ends


def _run_position(value: bytes, index: int) -> tuple[int, int]:
    """`(offset, record_length)` of the run's `index`th entry (0: its first)."""
    offset = _RUN_OFFSET.unpack_from(value)[0]
    at = _RUN_ENDS_AT + index * _RUN_END.size
    begin = _RUN_END.unpack_from(value, at - _RUN_END.size)[0] if index else 0
    return offset + begin, _RUN_END.unpack_from(value, at)[0] - begin


def _expand_run(first: int, value: bytes) -> list[tuple[int, int, int]]:
    """Every `(entry_id, offset, record_length)` of a run starting at entry `first`."""
    offset = _RUN_OFFSET.unpack_from(value)[0]
    ends = _run_ends(value)
    begins = [0, *ends[:-1]]
    return [
        (first + index, offset + begin, end - begin)
        for index, (begin, end) in enumerate(zip(begins, ends, strict=True))
    ]


def _runs(positions: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, bytes]]:
    """`(first_entry_id, last_entry_id, value)` of the runs that hold `positions`.

    The flush's case, entries with consecutive ids written back to back, is checked
    with list operations and becomes one run without a Python step per entry; anything
    else (gaps, unordered or repeated ids, records apart) is split entry by entry.
    """
    if not positions:
        return []
    entry_ids = [position[0] for position in positions]
    offsets = [position[1] for position in positions]
    lengths = [position[2] for position in positions]
    base = offsets[0]
    ends = list(itertools.accumulate(lengths))
    if [base + end for end in ends[:-1]] == offsets[1:]:  # back to back
        run = _one_run(entry_ids, base, lengths, ends)
        if run is not None:
            return [run]
    by_entry = {entry_id: (offset, length) for entry_id, offset, length in positions}
    runs: list[tuple[int, int, bytes]] = []
    run_first = run_base = run_next_offset = -1
    run_ends: list[int] = []
    for entry_id in sorted(by_entry):
        _check_id("entry id", entry_id)
        offset, length = by_entry[entry_id]
        if not 0 <= length < _RUN_BYTES_LIMIT or not 0 <= offset < 2**64:
            raise ValueError(f"entry {entry_id}: position ({offset}, {length}) is out of range")
        joins = (
            run_ends
            and entry_id == run_first + len(run_ends)
            and offset == run_next_offset
            and run_ends[-1] + length < _RUN_BYTES_LIMIT
        )
        if not joins:
            if run_ends:
                runs.append(
                    (run_first, run_first + len(run_ends) - 1, _run_value(run_base, run_ends))
                )
            run_first, run_base, run_ends = entry_id, offset, []
        run_ends.append((run_ends[-1] if run_ends else 0) + length)
        run_next_offset = offset + length
    runs.append((run_first, run_first + len(run_ends) - 1, _run_value(run_base, run_ends)))
    return runs


def _one_run(
    entry_ids: list[int], offset: int, lengths: Sequence[int], ends: list[int]
) -> tuple[int, int, bytes] | None:
    """The one run of records written back to back from `offset` (`ends` accumulate
    `lengths`), if their ids are consecutive and every value fits a run; else None.
    List operations only: this is the flush's case, thousands of entries at a time."""
    first, last = entry_ids[0], entry_ids[-1]
    if (
        first >= 0
        and last < _ID_LIMIT
        and last - first == len(entry_ids) - 1
        and entry_ids == list(range(first, last + 1))
        and ends[-1] < _RUN_BYTES_LIMIT
        and min(lengths) >= 0
        and 0 <= offset < 2**64
    ):
        return (first, last, _run_value(offset, ends))
    return None


def _run_value(offset: int, ends: list[int]) -> bytes:
    packed = array.array("I", ends)
    if _BIG_ENDIAN_HOST:
        packed.byteswap()
    return _RUN_OFFSET.pack(offset) + packed.tobytes()


def _node_key(name: str) -> bytes:
    if not name:
        raise ValueError("a node value needs a non-empty name")
    return NODE_PREFIX + name.encode("utf-8")


_DAMAGED_ADVICE: Final = (
    "the index is damaged (the entries it locates are in the entry logs); with the node "
    "stopped, rebuild it with `pora verify --rebuild-index` (it keeps the damaged index, "
    "renamed index.damaged-<time>)"
)
#: files LevelDB never changes once written (its sorted tables): `open_copy` links them
_TABLE_SUFFIXES: Final = (".ldb", ".sst")


def _copy_of_index(path: Path) -> Path:
    """A copy of the index directory `path`, next to it if possible (so table files can
    be hard links), else in the system's temp dir."""
    prefix = f"{path.name}.inspect-"
    # left by an inspection that was killed: the caller holds the data dir's lock, so
    # no other inspection is using one
    for stale in path.parent.glob(prefix + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    try:
        copy_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
    except OSError:  # a data dir we may not write to: copy elsewhere
        copy_dir = Path(tempfile.mkdtemp(prefix="pora-index-copy-"))
    try:
        with os.scandir(path) as entries:
            names = [entry.name for entry in entries if entry.is_file(follow_symlinks=False)]
        for name in names:
            if name != "LOCK":  # the original's lock file is not the copy's business
                _link_or_copy(path / name, copy_dir / name)
    except BaseException:
        shutil.rmtree(copy_dir, ignore_errors=True)
        raise
    return copy_dir


def _link_or_copy(source: Path, target: Path) -> None:
    """A table file is hard-linked if the file system allows; anything else is copied.
    A file gone meanwhile is skipped (LevelDB deletes obsolete files)."""
    if source.name.endswith(_TABLE_SUFFIXES):
        with contextlib.suppress(OSError):  # another file system, or no links: copy
            os.link(source, target)
            return
    with contextlib.suppress(FileNotFoundError):
        shutil.copy2(source, target)


def _open_error(path: Path, error: plyvel.Error, *, create: bool) -> IndexOpenError:
    """Turns plyvel's error into one that says what happened and what to do."""
    raw = error.args[0] if error.args else error
    cause = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    if not create and not path.exists():
        advice = (
            "it does not exist; check --data-dir (`pora serve` creates the index on first start)"
        )
    elif "LOCK" in cause and ("held" in cause or "unavailable" in cause or "again" in cause):
        # "already held by process" (this process) or EAGAIN from fcntl (another one)
        advice = (
            "another process, or another Index in this process, has this index open; "
            "stop the other Pora node using this data directory, or give this one its "
            "own --data-dir"
        )
    elif isinstance(error, plyvel.CorruptionError):
        return IndexDamaged(path, cause, _DAMAGED_ADVICE)
    else:
        advice = "check that the directory exists, is writable and the disk is not full"
    return IndexOpenError(path, cause, advice)


def _describe_write_error(error: OSError) -> str:
    if error.errno is None:  # LevelDB's own: its message names the file
        text = error.args[0] if error.args else str(error)
        return text.decode(errors="replace") if isinstance(text, bytes) else str(text)
    return f"{error.strerror} on {error.filename}" if error.filename else str(error)
