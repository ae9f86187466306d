"""Small file primitives every storage file of a node needs, defined once.

The writes and syncs of the journal's segments, its spares and watermark, and the
entry logs go through `FileCalls`: the real OS by default; a test swaps in a disk
that fails or forgets (`use_file_calls`: the simulation's disk loses what was not
synced when its node crashes, tests/simulation/disk.py). LevelDB (plyvel) writes
its own files and is not behind this seam.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final, Protocol


class FileCalls(Protocol):
    """The file calls a node's storage makes, with `os`'s signatures."""

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int, /) -> int: ...

    def pwritev(
        self, fd: int, buffers: Sequence[bytes | bytearray | memoryview], offset: int, /
    ) -> int: ...

    def fdatasync(self, fd: int, /) -> None: ...

    def fsync(self, fd: int, /) -> None: ...

    def posix_fallocate(self, fd: int, offset: int, length: int, /) -> None: ...


class _OsCalls:
    """The real OS: `os`'s functions, looked up at each call (so a test that patches
    `os.posix_fallocate` and the like still reaches the storage)."""

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int, /) -> int:
        return os.pwrite(fd, data, offset)

    def pwritev(
        self, fd: int, buffers: Sequence[bytes | bytearray | memoryview], offset: int, /
    ) -> int:
        return os.pwritev(fd, buffers, offset)

    def fdatasync(self, fd: int, /) -> None:
        os.fdatasync(fd)

    def fsync(self, fd: int, /) -> None:
        os.fsync(fd)

    def posix_fallocate(self, fd: int, offset: int, length: int, /) -> None:
        os.posix_fallocate(fd, offset, length)


OS_CALLS: Final[FileCalls] = _OsCalls()


class _Route:
    """Where the storage's file calls go (one owner: `use_file_calls`)."""

    calls: FileCalls = OS_CALLS


@contextmanager
def use_file_calls(calls: FileCalls) -> Iterator[None]:
    """Route every storage file call of this process through `calls` for the block
    (tests: a faulty or forgetful disk). Process-wide: not for concurrent users."""
    previous, _Route.calls = _Route.calls, calls
    try:
        yield
    finally:
        _Route.calls = previous


def fdatasync(fd: int) -> None:
    _Route.calls.fdatasync(fd)


def fsync(fd: int) -> None:
    _Route.calls.fsync(fd)


def posix_fallocate(fd: int, offset: int, length: int) -> None:
    _Route.calls.posix_fallocate(fd, offset, length)


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write all of `data` at `offset`, looping on short writes."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        written = _Route.calls.pwrite(fd, view[done:], offset + done)
        if written <= 0:  # a regular file never does this, but never loop forever
            raise OSError(f"pwrite wrote {written} bytes at offset {offset + done}")
        done += written


#: buffers per `pwritev` call: Linux takes at most 1024 (IOV_MAX)
_IOVECS_PER_CALL: Final = 1024


def pwritev_all(fd: int, buffers: Sequence[bytes | bytearray | memoryview], offset: int) -> int:
    """Write `buffers` one after another from `offset` (the kernel gathers them: no
    copy into one big buffer first), looping on short writes. Returns the bytes."""
    position = offset
    for first in range(0, len(buffers), _IOVECS_PER_CALL):
        chunk = buffers[first : first + _IOVECS_PER_CALL]
        wanted = sum(map(len, chunk))  # (a C loop: a flush passes thousands)
        written = _Route.calls.pwritev(fd, chunk, position)
        if written < wanted:  # rare (a regular file writes all or fails): finish plainly
            pwrite_all(fd, memoryview(b"".join(chunk))[written:], position + written)
        position += wanted
    return position - offset


def fsync_directory(directory: Path) -> None:
    """Make the creation, renaming or removal of files in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)  # (directories are not behind the seam: a test disk keeps them)
    finally:
        os.close(fd)
