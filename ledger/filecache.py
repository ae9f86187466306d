"""A capped LRU of open files (entry logs), with pinning.

A node may hold more ledgers than it may hold open files, so entry logs are opened on
demand and the least recently used are closed. A file in use (pinned) is never closed
under its user: the cache may then stay above capacity until pins are released.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import trio

__all__ = ["FileCache", "FileCacheClosed", "FileCacheStatistics", "FilePinned"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class FilePinned(RuntimeError):
    """A pinned file was asked to be discarded: someone still uses it."""


class FileCacheClosed(RuntimeError):
    """`acquire` after `close_all`: the node is stopping."""


@dataclass(frozen=True, slots=True)
class FileCacheStatistics:
    #: files open now (pinned or not)
    open: int
    #: of which pinned (in use, never closed by the cache)
    pinned: int
    capacity: int
    hits: int
    misses: int
    #: files closed to make room (not counting discard and close_all)
    evictions: int
    #: open > capacity because every candidate for eviction is pinned
    over_capacity: bool


class FileCache(Generic[K, V]):
    """Capped LRU of open files (entry logs). Pinned files are never closed.

    Not thread-safe: call from the event-loop thread only; do blocking I/O on what it
    returns in worker threads while it is pinned.

    `acquire` either returns a pinned file or raises with nothing pinned; every
    successful `acquire` is balanced by one `release`.
    """

    def __init__(self, capacity: int, close: Callable[[V], None]) -> None:
        if capacity < 1:
            raise ValueError(f"file cache capacity must be >= 1, not {capacity}")
        self._capacity = capacity
        self._close = close
        # least recently used first
        self._files: OrderedDict[K, V] = OrderedDict()
        self._pins: dict[K, int] = {}
        #: set when the last pin of a key is released: who waits to discard it wakes
        #: once, rather than polling the pins
        self._unpinned: dict[K, trio.Event] = {}
        self._closed = False
        self._hits = 0
        self._misses = 0
        self._evictions = 0

    def acquire(self, key: K, opener: Callable[[], V]) -> V:
        """The file for `key`, pinned; `opener()` opens it on a miss.

        If `opener` raises, the exception propagates and the cache is unchanged.
        """
        if self._closed:
            raise FileCacheClosed("the file cache is closed (the node is stopping)")
        if key in self._files:
            file = self._files[key]
            self._hits += 1
            self._files.move_to_end(key)
        else:
            file = opener()
            self._misses += 1
            self._files[key] = file
        self._pins[key] = self._pins.get(key, 0) + 1
        try:
            self._evict_over_capacity()
        except BaseException:
            # we hand out nothing, so we hold no pin for the caller
            self.release(key)
            raise
        return file

    def release(self, key: K) -> None:
        """Unpins one `acquire` of `key`."""
        count = self._pins.get(key, 0)
        if count <= 0:
            raise RuntimeError(f"release of {key!r}, which is not pinned")
        if count > 1:
            self._pins[key] = count - 1
            return
        del self._pins[key]
        unpinned = self._unpinned.pop(key, None)
        if unpinned is not None:
            unpinned.set()
        if self._closed:
            # close_all left it open for its user; the last user closes it
            self._close(self._files.pop(key))
        else:
            self._evict_over_capacity()

    def discard(self, key: K) -> None:
        """Closes and forgets the file of `key` (its ledger is deleted), if open.

        Raises FilePinned while someone uses it: retry after they release it.
        """
        if key in self._pins:
            raise FilePinned(f"cannot discard {key!r}: pinned {self._pins[key]} time(s)")
        file = self._files.pop(key, None)
        if file is not None:
            self._close(file)

    async def discard_when_released(self, key: K) -> None:
        """`discard`, once every user of the file has released it (a reader may hold
        it for a moment: one pread)."""
        while key in self._pins:
            unpinned = self._unpinned.get(key)
            if unpinned is None:
                unpinned = self._unpinned[key] = trio.Event()
            await unpinned.wait()
        self.discard(key)

    def close_all(self) -> None:
        """Closes every unpinned file now and every pinned one at its last release;
        later `acquire`s raise FileCacheClosed. The first close error is re-raised
        after all files were tried."""
        self._closed = True
        first_error: BaseException | None = None
        for key in [key for key in self._files if key not in self._pins]:
            try:
                self._close(self._files.pop(key))
            except Exception as error:  # every file must get its close, so go on
                first_error = first_error or error
        if first_error is not None:
            raise first_error

    def statistics(self) -> FileCacheStatistics:
        return FileCacheStatistics(
            open=len(self._files),
            pinned=len(self._pins),
            capacity=self._capacity,
            hits=self._hits,
            misses=self._misses,
            evictions=self._evictions,
            over_capacity=len(self._files) > self._capacity,
        )

    def __len__(self) -> int:
        return len(self._files)

    def __contains__(self, key: object) -> bool:
        return key in self._files

    def _evict_over_capacity(self) -> None:
        """Closes least recently used unpinned files while over capacity."""
        excess = len(self._files) - self._capacity
        if excess <= 0:
            return
        victims: list[K] = []
        for key in self._files:  # oldest first
            if key not in self._pins:
                victims.append(key)
                if len(victims) == excess:
                    break
        for key in victims:
            # forget it before closing, so a failing close leaves no closed file behind
            file = self._files.pop(key)
            self._evictions += 1
            self._close(file)
