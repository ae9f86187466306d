"""The journal watermark: the first seq the journal must still hold.

Every record below it is durable in entry logs and index; every record from it on
may not be, so the segments on disk must hold them all, without a gap. Without
it, a lost oldest segment looks like a journal that simply starts later.

It lives in the journal directory, as `WATERMARK`, not in the index: the index can
be lost and rebuilt from the entry logs (`pora verify --rebuild-index`), and the
check is about the journal's own files, which `pora journal verify` reads without
an index. It is written before any segment is deleted (`journal.trim`): replaced
atomically (a temp file, fdatasync, rename, fsync of the folder), so a crash leaves
the old one or the new one, and the new one is durable before the first unlink.

The file is one fixed-size record (docs/formats.md, "Journal watermark")::

    watermark := magic "PORAJWM\\0" | version u16 | state u16 | first_seq u64 | crc32c u32

`state` says what the journal holds from `first_seq` on:
  EMPTY: nothing. The node stopped cleanly, or recovery replayed everything and
    deleted the journal; the next record gets a seq >= first_seq. No segment is
    required (segments a crash left before they were deleted are all below it).
  HOLDING: every record from first_seq on, up to the journal's end. The segments
    must start at or below first_seq and reach it, each following the last.
"""

from __future__ import annotations

import enum
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import crc32c

from journal import fileio
from journal.errors import JournalFormatError
from journal.fileio import fsync_directory

WATERMARK_NAME: Final = "WATERMARK"
_TEMP_NAME: Final = WATERMARK_NAME + ".tmp"
WATERMARK_MAGIC: Final = b"PORAJWM\x00"
WATERMARK_VERSION: Final = 1
# magic, version, state, first_seq, crc32c (of the fields before it)
WATERMARK_RECORD: Final = struct.Struct("<8sHHQI")
_CRC_START: Final = WATERMARK_RECORD.size - 4


class JournalState(enum.IntEnum):
    """What the journal holds from the watermark on. Values are on disk: never reuse."""

    EMPTY = 0
    HOLDING = 1


@dataclass(frozen=True, slots=True)
class Watermark:
    state: JournalState
    #: the first seq the journal must still hold (HOLDING), or the least seq the
    #: next record may get (EMPTY)
    first_seq: int

    def __post_init__(self) -> None:
        if self.first_seq < 0:
            raise ValueError(f"a watermark's first_seq must be >= 0, not {self.first_seq}")


def watermark_path(directory: Path) -> Path:
    return directory / WATERMARK_NAME


def encode_watermark(watermark: Watermark) -> bytes:
    fields = WATERMARK_RECORD.pack(
        WATERMARK_MAGIC, WATERMARK_VERSION, watermark.state, watermark.first_seq, 0
    )
    crc = crc32c.crc32c(fields[:_CRC_START])
    return fields[:_CRC_START] + struct.pack("<I", crc)


def decode_watermark(path: Path, data: bytes) -> Watermark:
    """The watermark in `data` (the bytes of `path`); raises JournalFormatError."""
    restore = (
        "The journal's gap check needs it: restore the file from a backup of this "
        "node, or see docs/operations.md, 'The journal watermark is missing or damaged'"
    )
    if len(data) != WATERMARK_RECORD.size:
        raise JournalFormatError(
            path, f"a watermark has {WATERMARK_RECORD.size} bytes, this file {len(data)}. {restore}"
        )
    magic, version, state, first_seq, crc = WATERMARK_RECORD.unpack(data)
    if magic != WATERMARK_MAGIC:
        raise JournalFormatError(path, f"not a journal watermark (magic {magic!r}). {restore}")
    expected = int(crc32c.crc32c(data[:_CRC_START]))
    if crc != expected:
        raise JournalFormatError(
            path,
            f"the watermark's crc is {crc:#010x}, its bytes give {expected:#010x}: the file "
            f"is damaged. {restore}",
        )
    if version != WATERMARK_VERSION:
        raise JournalFormatError(
            path,
            f"watermark format version {version}; this build reads version "
            f"{WATERMARK_VERSION}. Use a Pora release that reads it",
        )
    if state not in JournalState._value2member_map_:
        raise JournalFormatError(path, f"unknown journal state {state} in the watermark")
    return Watermark(JournalState(state), int(first_seq))


def read_watermark(directory: Path) -> Watermark | None:
    """The watermark of the journal in `directory`, or None if it has none."""
    path = watermark_path(directory)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return decode_watermark(path, data)


def write_watermark(directory: Path, watermark: Watermark, *, fsync: bool = True) -> None:
    """Replace the watermark of `directory` atomically, durably (unless `fsync` is
    off, as for journals that never sync), creating the directory if need be."""
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        if fsync:
            fsync_directory(directory.parent)
    temp = directory / _TEMP_NAME
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        data = encode_watermark(watermark)
        if os.write(fd, data) != len(data):  # 24 bytes to a regular file: all or an error
            raise OSError(f"short write of {temp}")
        if fsync:
            fileio.fdatasync(fd)
    finally:
        os.close(fd)
    os.replace(temp, watermark_path(directory))
    if fsync:
        fsync_directory(directory)
