"""Small file primitives every storage file of a node needs, defined once."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write all of `data` at `offset`, looping on short writes."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        written = os.pwrite(fd, view[done:], offset + done)
        if written <= 0:  # a regular file never does this, but never loop forever
            raise OSError(f"pwrite wrote {written} bytes at offset {offset + done}")
        done += written


#: buffers per `pwritev` call: Linux takes at most 1024 (IOV_MAX)
_IOVECS_PER_CALL: Final = 1024


def pwritev_all(fd: int, buffers: Sequence[bytes | bytearray], offset: int) -> int:
    """Write `buffers` one after another from `offset` (the kernel gathers them: no
    copy into one big buffer first), looping on short writes. Returns the bytes."""
    position = offset
    for first in range(0, len(buffers), _IOVECS_PER_CALL):
        chunk = buffers[first : first + _IOVECS_PER_CALL]
        wanted = sum(map(len, chunk))  # (a C loop: a flush passes thousands)
        written = os.pwritev(fd, chunk, position)
        if written < wanted:  # rare (a regular file writes all or fails): finish plainly
            pwrite_all(fd, memoryview(b"".join(chunk))[written:], position + written)
        position += wanted
    return position - offset


def fsync_directory(directory: Path) -> None:
    """Make the creation, renaming or removal of files in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
