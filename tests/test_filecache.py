"""The open-file cache: LRU order, capacity, pins, discard, statistics, shutdown."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
import trio.testing

from ledger.entrylog import EntryLog
from ledger.filecache import (
    FileCache,
    FileCacheClosed,
    FileCacheStatistics,
    FilePinned,
)


@dataclass
class FakeFile:
    name: str
    closed: bool = False


@dataclass
class Files:
    """Opens fake files and records the order they are closed in."""

    opened: dict[str, FakeFile] = field(default_factory=dict)
    closed_order: list[str] = field(default_factory=list)

    def opener(self, name: str) -> FakeFile:
        assert name not in self.opened or self.opened[name].closed, f"{name} opened twice"
        file = FakeFile(name)
        self.opened[name] = file
        return file

    def close(self, file: FakeFile) -> None:
        assert not file.closed, f"{file.name} closed twice"
        file.closed = True
        self.closed_order.append(file.name)


def make_cache(capacity: int) -> tuple[FileCache[str, FakeFile], Files]:
    files = Files()
    return FileCache(capacity, files.close), files


def use(cache: FileCache[str, FakeFile], files: Files, name: str) -> FakeFile:
    """Acquire and release at once: a short read."""
    file = cache.acquire(name, lambda: files.opener(name))
    cache.release(name)
    return file


def test_least_recently_used_is_closed_first() -> None:
    cache, files = make_cache(3)
    for name in "abc":
        use(cache, files, name)
    use(cache, files, "a")  # a is now the most recent; b the least
    use(cache, files, "d")
    assert files.closed_order == ["b"]
    use(cache, files, "e")
    assert files.closed_order == ["b", "c"]
    use(cache, files, "a")  # still open: a hit
    use(cache, files, "f")
    assert files.closed_order == ["b", "c", "d"]
    assert sorted(name for name, file in files.opened.items() if not file.closed) == [
        "a",
        "e",
        "f",
    ]


def test_capacity_is_respected() -> None:
    cache, files = make_cache(4)
    for _ in range(10):
        for name in "abcdefghij":
            use(cache, files, name)
            assert len(cache) <= 4
        assert sum(not file.closed for file in files.opened.values()) == len(cache)
    assert len(cache) == 4


def test_a_hit_returns_the_same_file_without_opening() -> None:
    cache, files = make_cache(2)
    first = use(cache, files, "a")

    def must_not_open() -> FakeFile:
        raise AssertionError("opened on a hit")

    assert cache.acquire("a", must_not_open) is first
    cache.release("a")


def test_pinned_files_are_never_closed() -> None:
    cache, files = make_cache(2)
    a = cache.acquire("a", lambda: files.opener("a"))
    b = cache.acquire("b", lambda: files.opener("b"))
    c = cache.acquire("c", lambda: files.opener("c"))
    # all three in use: the cache stays over capacity rather than close one under its user
    assert not (a.closed or b.closed or c.closed)
    assert len(cache) == 3
    assert cache.statistics().over_capacity

    cache.release("b")  # now b may go, and it is the only unpinned one
    assert files.closed_order == ["b"]
    assert len(cache) == 2
    assert not cache.statistics().over_capacity
    cache.release("a")
    cache.release("c")
    assert files.closed_order == ["b"]


def test_pins_are_counted() -> None:
    cache, files = make_cache(1)
    cache.acquire("a", lambda: files.opener("a"))
    cache.acquire("a", lambda: files.opener("a"))
    cache.release("a")
    use(cache, files, "b")  # a still pinned once, so b goes instead
    assert files.closed_order == ["b"]
    cache.release("a")
    use(cache, files, "c")
    assert files.closed_order == ["b", "a"]
    with pytest.raises(RuntimeError, match="not pinned"):
        cache.release("c")


def test_a_failing_opener_leaves_the_cache_unchanged() -> None:
    cache, files = make_cache(2)
    use(cache, files, "a")

    def broken() -> FakeFile:
        raise OSError("no such file")

    with pytest.raises(OSError, match="no such file"):
        cache.acquire("b", broken)
    assert len(cache) == 1
    assert "b" not in cache
    assert cache.statistics() == FileCacheStatistics(
        open=1, pinned=0, capacity=2, hits=0, misses=1, evictions=0, over_capacity=False
    )


def test_a_failing_close_during_eviction_takes_no_pin() -> None:
    def failing_close(file: FakeFile) -> None:
        raise OSError(f"close of {file.name} failed")

    cache: FileCache[str, FakeFile] = FileCache(1, failing_close)
    cache.acquire("a", lambda: FakeFile("a"))
    cache.release("a")
    with pytest.raises(OSError, match="close of a failed"):
        cache.acquire("b", lambda: FakeFile("b"))
    assert cache.statistics().pinned == 0
    assert "a" not in cache  # forgotten even though its close failed
    assert "b" in cache  # opened, and kept for the next acquire


def test_discard_closes_and_forgets() -> None:
    cache, files = make_cache(3)
    use(cache, files, "a")
    use(cache, files, "b")
    cache.discard("a")
    assert files.closed_order == ["a"]
    assert "a" not in cache
    assert len(cache) == 1
    cache.discard("never-opened")  # nothing to do
    reopened = use(cache, files, "a")  # a new ledger with the same id opens afresh
    assert not reopened.closed
    assert cache.statistics().misses == 3


def test_discard_of_a_pinned_file_is_refused() -> None:
    cache, files = make_cache(3)
    file = cache.acquire("a", lambda: files.opener("a"))
    with pytest.raises(FilePinned, match="pinned 1 time"):
        cache.discard("a")
    assert not file.closed
    cache.release("a")
    cache.discard("a")
    assert file.closed


async def test_a_discard_waits_for_the_last_release_and_wakes_once() -> None:
    cache, files = make_cache(3)
    file = cache.acquire("a", lambda: files.opener("a"))
    cache.acquire("a", lambda: files.opener("a"))  # two readers
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cache.discard_when_released, "a")
        await trio.testing.wait_all_tasks_blocked()
        cache.release("a")
        await trio.testing.wait_all_tasks_blocked()
        assert not file.closed  # one reader still holds it
        cache.release("a")
    assert file.closed
    assert "a" not in cache


async def test_a_discard_of_an_unpinned_file_does_not_wait() -> None:
    cache, files = make_cache(3)
    file = use(cache, files, "a")
    with trio.testing.assert_no_checkpoints():
        await cache.discard_when_released("a")
    assert file.closed


def test_statistics_count_what_happened() -> None:
    cache, files = make_cache(2)
    use(cache, files, "a")  # miss
    use(cache, files, "a")  # hit
    use(cache, files, "b")  # miss
    use(cache, files, "c")  # miss, evicts a
    cache.acquire("b", lambda: files.opener("b"))  # hit, pinned
    cache.discard("c")  # not an eviction
    assert cache.statistics() == FileCacheStatistics(
        open=1, pinned=1, capacity=2, hits=2, misses=3, evictions=1, over_capacity=False
    )


def test_close_all_closes_now_or_at_last_release() -> None:
    cache, files = make_cache(3)
    use(cache, files, "a")
    in_use = cache.acquire("b", lambda: files.opener("b"))
    cache.close_all()
    assert files.closed_order == ["a"]
    assert not in_use.closed  # a worker thread may still be reading it
    with pytest.raises(FileCacheClosed):
        cache.acquire("c", lambda: files.opener("c"))
    cache.release("b")
    assert in_use.closed
    assert len(cache) == 0


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        FileCache(0, lambda file: None)


def opener_of(log: EntryLog) -> Callable[[], EntryLog]:
    return lambda: log


def test_caches_real_entry_logs(tmp_path: Path) -> None:
    cache: FileCache[int, EntryLog] = FileCache(2, EntryLog.close)
    logs = [
        EntryLog.create(tmp_path / f"{ledger_id}.log", ledger_id, prealloc_chunk_bytes=4096)
        for ledger_id in range(3)
    ]
    for log in logs:
        assert cache.acquire(log.ledger_id, opener_of(log)) is log
        cache.release(log.ledger_id)
    assert [log.closed for log in logs] == [True, False, False]
    cache.close_all()
    assert all(log.closed for log in logs)
