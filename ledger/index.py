"""The node's index: one LevelDB (plyvel) holding entry positions and ledger metadata.

Key layout (big-endian, so LevelDB's bytewise order is (ledger, entry) order; the
grammar is in docs/formats.md)::

    b"e" ledger_id u64 entry_id u64  ->  offset u64 record_length u32
    b"m" ledger_id u64               ->  LedgerMeta.encode()
    b"n" name (utf-8)                ->  node-level value (format version, instance id, ...)

Everything here is blocking: call it from worker threads. plyvel's DB is safe to use
from several threads at once (LevelDB serialises writers itself).

Durability: a write with sync=False is in LevelDB's log file in the kernel, so it
survives a process crash but not a power loss. `sync()` (or sync=True) makes every
earlier write survive a power loss too; see `sync` for why it does more than one
sync=True write.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final

import plyvel

from journal.errors import PoraError
from ledger.state import LedgerMeta

__all__ = ["Index", "IndexOpenError"]

ENTRY_PREFIX: Final = b"e"
META_PREFIX: Final = b"m"
NODE_PREFIX: Final = b"n"

_ID_LIMIT: Final = 2**63  # ledger and entry ids are non-negative i64
_ENTRY_KEY: Final = struct.Struct(">1sQQ")  # b"e", ledger_id, entry_id
_LEDGER_KEY: Final = struct.Struct(">1sQ")  # b"e" or b"m", ledger_id
_ENTRY_ID: Final = struct.Struct(">Q")
_POSITION: Final = struct.Struct(">QI")  # offset, record_length
_ENTRY_ID_AT: Final = 9  # in an entry key, after b"e" and the ledger id
_META_KEY_SIZE: Final = _LEDGER_KEY.size  # 9
#: the node value rewritten with sync=True by `sync`
SYNC_MARKER_NAME: Final = "sync_marker"


class IndexOpenError(PoraError):
    """The index DB cannot be opened (locked, missing, damaged)."""

    def __init__(self, path: Path, cause: str, advice: str) -> None:
        self.path = path
        self.cause = cause
        super().__init__(f"cannot open the index at {path}: {cause}; {advice}")


class Index:
    """The LevelDB index of one node. Open it once per data directory."""

    def __init__(
        self, path: Path, *, cache_bytes: int = 64 << 20, bloom_bits: int = 10, create: bool = True
    ) -> None:
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
            )
        except plyvel.Error as error:
            raise _open_error(path, error, create=create) from error
        self._sync_count = 0

    # --- entry positions ------------------------------------------------------------

    def get_position(self, ledger_id: int, entry_id: int) -> tuple[int, int] | None:
        """`(offset, record_length)` of an entry in its ledger's entry log, if indexed."""
        _check_id("ledger id", ledger_id)
        _check_id("entry id", entry_id)
        value = self._db.get(_ENTRY_KEY.pack(ENTRY_PREFIX, ledger_id, entry_id))
        if value is None:
            return None
        offset, record_length = _POSITION.unpack(value)
        return offset, record_length

    def iter_positions(
        self, ledger_id: int, from_entry: int = 0, to_entry: int | None = None
    ) -> Iterator[tuple[int, int, int]]:
        """`(entry_id, offset, record_length)` of the ledger's indexed entries from
        `from_entry` to `to_entry` (inclusive; default: the last), ascending."""
        _check_id("ledger id", ledger_id)
        _check_id("from_entry", from_entry)
        start = _ENTRY_KEY.pack(ENTRY_PREFIX, ledger_id, from_entry)
        if to_entry is None:
            # every key of this ledger sorts below the first key of the next ledger id
            stop = _LEDGER_KEY.pack(ENTRY_PREFIX, ledger_id + 1)
        else:
            _check_id("to_entry", to_entry)
            if to_entry < from_entry:
                return iter(())
            stop = _ENTRY_KEY.pack(ENTRY_PREFIX, ledger_id, to_entry + 1)
        # arguments are checked above, now; the walk itself is lazy
        return self._walk_positions(start, stop)

    def _walk_positions(self, start: bytes, stop: bytes) -> Iterator[tuple[int, int, int]]:
        unpack_entry_id = _ENTRY_ID.unpack_from
        unpack_position = _POSITION.unpack
        for key, value in self._db.iterator(start=start, stop=stop):
            offset, record_length = unpack_position(value)
            yield unpack_entry_id(key, _ENTRY_ID_AT)[0], offset, record_length

    def ledgers_with_positions(self) -> Iterator[int]:
        """The ids of ledgers that have at least one indexed entry, ascending.

        Jumps from ledger to ledger (one seek each) rather than walking every key;
        for `pora verify`, which looks for positions whose ledger has no metadata.
        """
        start = _LEDGER_KEY.pack(ENTRY_PREFIX, 0)
        stop = _LEDGER_KEY.pack(ENTRY_PREFIX, 2**63)
        with self._db.iterator(start=start, stop=stop, include_value=False) as keys:
            for key in keys:
                ledger_id: int = _LEDGER_KEY.unpack_from(key)[1]
                yield ledger_id
                keys.seek(_LEDGER_KEY.pack(ENTRY_PREFIX, ledger_id + 1))

    def count_positions(self, ledger_id: int) -> int:
        """How many entries of the ledger are indexed (walks its keys)."""
        _check_id("ledger id", ledger_id)
        prefix = _LEDGER_KEY.pack(ENTRY_PREFIX, ledger_id)
        return sum(1 for _ in self._db.iterator(prefix=prefix, include_value=False))

    def apply_flush(
        self,
        ledger_id: int,
        positions: Sequence[tuple[int, int, int]],
        meta: LedgerMeta,
        *,
        sync: bool = False,
    ) -> None:
        """Installs `(entry_id, offset, record_length)` positions and the ledger's
        metadata in one atomic batch: a reader or a restart sees all of it or none."""
        _check_id("ledger id", ledger_id)
        if meta.ledger_id != ledger_id:
            raise ValueError(f"metadata of ledger {meta.ledger_id} given for ledger {ledger_id}")
        pack_key = _ENTRY_KEY.pack
        pack_position = _POSITION.pack
        put_position: Callable[[bytes, bytes], None]
        # transaction=True: if anything below raises, nothing of the batch is written.
        # Entry ids are not checked one by one (the hot path of every flush): the node
        # checked them on the way in, and a negative one fails to pack anyway.
        with self._db.write_batch(transaction=True, sync=sync) as batch:
            put_position = batch.put
            for entry_id, offset, record_length in positions:
                put_position(
                    pack_key(ENTRY_PREFIX, ledger_id, entry_id),
                    pack_position(offset, record_length),
                )
            batch.put(_LEDGER_KEY.pack(META_PREFIX, ledger_id), meta.encode())
        if sync:
            self._fsync_log_files()

    # --- ledger metadata --------------------------------------------------------------

    def put_meta(self, meta: LedgerMeta, *, sync: bool = False) -> None:
        _check_id("ledger id", meta.ledger_id)
        self._db.put(_LEDGER_KEY.pack(META_PREFIX, meta.ledger_id), meta.encode(), sync=sync)
        if sync:
            self._fsync_log_files()

    def get_meta(self, ledger_id: int) -> LedgerMeta | None:
        """The ledger's metadata; ValueError if it is stored in a version we cannot read."""
        _check_id("ledger id", ledger_id)
        value = self._db.get(_LEDGER_KEY.pack(META_PREFIX, ledger_id))
        return None if value is None else LedgerMeta.decode(ledger_id, value)

    def load_all_meta(self) -> dict[int, LedgerMeta]:
        """Every ledger's metadata, by ledger id: one pass over the b"m" keys."""
        metas: dict[int, LedgerMeta] = {}
        decode = LedgerMeta.decode
        for key, value in self._db.iterator(prefix=META_PREFIX):
            if len(key) != _META_KEY_SIZE:
                raise ValueError(
                    f"index {self.path}: metadata key {key!r} is not b'm' + a u64 ledger id"
                )
            ledger_id = int.from_bytes(key[1:], "big")
            metas[ledger_id] = decode(ledger_id, value)
        return metas

    def delete_ledger(self, ledger_id: int, *, sync: bool = False) -> None:
        """Removes every position of the ledger and its metadata, in one batch."""
        _check_id("ledger id", ledger_id)
        prefix = _LEDGER_KEY.pack(ENTRY_PREFIX, ledger_id)
        # the iterator reads a snapshot, so deleting while walking it is safe
        with self._db.write_batch(transaction=True, sync=sync) as batch:
            for key in self._db.iterator(prefix=prefix, include_value=False):
                batch.delete(key)
            batch.delete(_LEDGER_KEY.pack(META_PREFIX, ledger_id))
        if sync:
            self._fsync_log_files()

    # --- node values ----------------------------------------------------------------

    def get_node_value(self, name: str) -> bytes | None:
        value: bytes | None = self._db.get(_node_key(name))
        return value

    def put_node_value(self, name: str, value: bytes, *, sync: bool = False) -> None:
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
        self._db.put(_node_key(SYNC_MARKER_NAME), self._sync_count.to_bytes(8, "big"), sync=True)
        self._fsync_log_files()

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


def _node_key(name: str) -> bytes:
    if not name:
        raise ValueError("a node value needs a non-empty name")
    return NODE_PREFIX + name.encode("utf-8")


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
        advice = "the index is damaged; stop the node and inspect it with `pora verify`"
    else:
        advice = "check that the directory exists, is writable and the disk is not full"
    return IndexOpenError(path, cause, advice)
