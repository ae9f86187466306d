"""Small file primitives every storage file of a node needs, defined once."""

from __future__ import annotations

import os
from pathlib import Path


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write all of `data` at `offset`, looping on short writes."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        written = os.pwrite(fd, view[done:], offset + done)
        if written <= 0:  # a regular file never does this, but never loop forever
            raise OSError(f"pwrite wrote {written} bytes at offset {offset + done}")
        done += written


def fsync_directory(directory: Path) -> None:
    """Make the creation, renaming or removal of files in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
