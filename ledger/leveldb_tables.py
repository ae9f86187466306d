"""Checks the block checksums of LevelDB's table files (`.ldb`), for the inspection
commands.

Why not let LevelDB do it: an iterator that meets a block whose checksum fails skips
the block and records the error in a status that plyvel never looks at, so a damaged
table reads as missing keys (ledgers not listed, entries "not indexed") instead of
failing. So before an index is inspected, every block of every table is checked
here, against LevelDB's documented table format (doc/table_format.md):

    table  := block* metaindex-block index-block footer
    block  := contents type:u8 masked_crc32c(contents ++ type):u32le
    footer := metaindex-handle index-handle padding (to 40 bytes) magic:u64le
    handle := offset:varint64 size:varint64

The index block maps keys to the handles of the data blocks; the metaindex block to
the filter block. A block's checksum covers its stored (possibly compressed) bytes,
so only those two small blocks are ever decompressed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import crc32c

__all__ = ["TableDamage", "check_tables"]

_FOOTER_SIZE: Final = 48
_MAGIC: Final = 0xDB4775248B80FB57
_TRAILER_SIZE: Final = 5  # type byte and masked crc
_MASK_DELTA: Final = 0xA282EAD8
_NO_COMPRESSION: Final = 0
_SNAPPY: Final = 1
_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
_TABLE_SUFFIXES: Final = (".ldb", ".sst")


@dataclass(frozen=True, slots=True)
class TableDamage:
    path: Path
    offset: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path} at byte {self.offset}: {self.reason}"


class _Damaged(Exception):
    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason


def check_tables(index_dir: Path) -> list[TableDamage]:
    """The first damage found in each table file of `index_dir` (empty: all intact)."""
    found: list[TableDamage] = []
    for path in sorted(index_dir.iterdir()):
        if not path.name.endswith(_TABLE_SUFFIXES):
            continue
        try:
            _check_table(path.read_bytes())
        except _Damaged as damage:
            found.append(TableDamage(path, damage.offset, damage.reason))
    return found


def _check_table(data: bytes) -> None:
    if len(data) < _FOOTER_SIZE:
        raise _Damaged(0, f"{len(data)} bytes, shorter than a table's footer")
    footer_at = len(data) - _FOOTER_SIZE
    (magic,) = _U64.unpack_from(data, len(data) - 8)
    if magic != _MAGIC:
        raise _Damaged(len(data) - 8, "not a LevelDB table (bad magic number)")
    metaindex, at = _handle(data, footer_at, footer_at)
    index, _ = _handle(data, at, footer_at)
    for handle in (metaindex, index):
        _check_block(data, handle)
    for block in (metaindex, index):
        for value in _block_values(data, block):
            handle, _ = _handle(value, 0, block[0])
            _check_block(data, handle)


def _check_block(data: bytes, handle: tuple[int, int]) -> None:
    offset, size = handle
    end = offset + size + _TRAILER_SIZE
    if end > len(data):
        raise _Damaged(offset, f"a block of {size} bytes runs past the end of the table")
    (stored,) = _U32.unpack_from(data, offset + size + 1)
    computed = _mask(crc32c.crc32c(memoryview(data)[offset : offset + size + 1]))
    if computed != stored:
        raise _Damaged(
            offset, f"block checksum mismatch (stored 0x{stored:08x}, computed 0x{computed:08x})"
        )


def _block_values(data: bytes, handle: tuple[int, int]) -> list[bytes]:
    """The values of a (checked) index or metaindex block: block handles."""
    offset, size = handle
    kind = data[offset + size]
    raw = data[offset : offset + size]
    if kind == _SNAPPY:
        raw = _snappy_decompress(raw, offset)
    elif kind != _NO_COMPRESSION:
        raise _Damaged(offset, f"unknown block compression {kind}")
    if len(raw) < 4:
        raise _Damaged(offset, "a block too short for its restart count")
    (restarts,) = _U32.unpack_from(raw, len(raw) - 4)
    entries_end = len(raw) - 4 * (restarts + 1)
    if entries_end < 0:
        raise _Damaged(offset, f"a block claims {restarts} restart points")
    values: list[bytes] = []
    at = 0
    while at < entries_end:
        _shared, at = _varint(raw, at, offset)
        non_shared, at = _varint(raw, at, offset)
        value_length, at = _varint(raw, at, offset)
        at += non_shared
        values.append(raw[at : at + value_length])
        at += value_length
    if at != entries_end:
        raise _Damaged(offset, "a block's entries overrun its restart array")
    return values


def _handle(data: bytes, at: int, where: int) -> tuple[tuple[int, int], int]:
    offset, at = _varint(data, at, where)
    size, at = _varint(data, at, where)
    return (offset, size), at


def _varint(data: bytes, at: int, where: int) -> tuple[int, int]:
    value = 0
    for shift in range(0, 64, 7):
        if at >= len(data):
            raise _Damaged(where, "a varint runs past its block")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
    raise _Damaged(where, "a varint longer than 10 bytes")


def _mask(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def _snappy_decompress(data: bytes, where: int) -> bytes:
    """Raw snappy (LevelDB's block compression), for the small index blocks only."""
    length, at = _varint(data, 0, where)
    out = bytearray()
    while at < len(data):
        tag = data[at]
        at += 1
        kind = tag & 3
        if kind == 0:  # literal
            count = tag >> 2
            if count >= 60:
                extra = count - 59
                count = int.from_bytes(data[at : at + extra], "little")
                at += extra
            count += 1
            out += data[at : at + count]
            at += count
            continue
        if kind == 1:
            count = ((tag >> 2) & 7) + 4
            distance = ((tag >> 5) << 8) | data[at]
            at += 1
        elif kind == 2:
            count = (tag >> 2) + 1
            distance = int.from_bytes(data[at : at + 2], "little")
            at += 2
        else:
            count = (tag >> 2) + 1
            distance = int.from_bytes(data[at : at + 4], "little")
            at += 4
        if not 0 < distance <= len(out):
            raise _Damaged(where, "a compressed block refers before its start")
        start = len(out) - distance
        for index in range(count):  # copies may overlap what they produce
            out.append(out[start + index])
    if len(out) != length:
        raise _Damaged(where, f"a compressed block gives {len(out)} bytes, not {length}")
    return bytes(out)
