"""Journal syncs through io_uring: the ring itself, and the journal using it.

These run only where the kernel gives io_uring to this process (x86-64 Linux,
not disabled): elsewhere the journal syncs in threads, which the other journal
tests cover, and `test_the_journal_falls_back_to_threads_without_a_ring` checks
that fallback everywhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from journal.format import RecordKind
from journal.reader import JournalScanner
from journal.request import Request
from journal.segment import SegmentWriter
from journal.syncs import OnEnd, RingSyncStarter, Sync, Syncable, SyncInThread
from journal.task import GroupCommitConfig, Journal
from journal.uring import (
    _SYS_IO_URING_REGISTER,
    _SYS_IO_URING_SETUP,
    FdatasyncRing,
)

RING = FdatasyncRing.open(2)
needs_ring = pytest.mark.skipif(RING is None, reason="io_uring is not available here")
if RING is not None:
    RING.close()


async def wait_for_completions(ring: FdatasyncRing, count: int) -> list[tuple[int, int]]:
    done: list[tuple[int, int]] = []
    with trio.fail_after(10):
        while len(done) < count:
            await trio.lowlevel.wait_readable(ring.event_fd)
            done += ring.completions()
    return done


@needs_ring
async def test_a_ring_syncs_and_reports_each_sync_by_its_tag(tmp_path: Path) -> None:
    ring = FdatasyncRing.open(2)
    assert ring is not None
    fd = os.open(tmp_path / "file", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for round_number in range(20):  # the ring's indexes wrap many times over
            os.pwrite(fd, b"x" * 4096, round_number * 4096)
            ring.submit_fdatasync(fd, 2 * round_number)
            ring.submit_fdatasync(fd, 2 * round_number + 1)
            assert ring.in_flight == 2
            done = await wait_for_completions(ring, 2)
            assert sorted(done) == [(2 * round_number, 0), (2 * round_number + 1, 0)]
            assert ring.in_flight == 0
        with pytest.raises(RuntimeError, match="the ring holds 2"):
            for tag in range(3):
                ring.submit_fdatasync(fd, tag)
        await wait_for_completions(ring, 2)
    finally:
        os.close(fd)
        ring.close()


@needs_ring
async def test_a_failed_sync_comes_back_as_its_errno(tmp_path: Path) -> None:
    ring = FdatasyncRing.open(1)
    assert ring is not None
    fd = os.open(tmp_path / "file", os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(fd)  # a descriptor that is no longer open
    ring.submit_fdatasync(fd, 7)
    assert await wait_for_completions(ring, 1) == [(7, -errno.EBADF)]
    ring.close()


async def _complete_unread(ring: FdatasyncRing, fd: int, tags: range) -> None:
    """Run syncs to their end without reading their completions, past what the
    ring admits in flight; returns once each is posted or overflowed."""
    for tag in tags:
        ring.submit_fdatasync(fd, tag)
        ring.in_flight = 0  # (more than the ring admits: that is the point here)
    await _until(lambda: ring.posted >= min(len(tags), 2) and (len(tags) <= 2 or ring.overflowed))


async def _until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(10):
        # kernel state that nothing signals (that is what is tested): look again
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.001)


@needs_ring
async def test_completions_held_in_the_kernels_overflow_list_are_flushed(
    tmp_path: Path,
) -> None:
    ring = FdatasyncRing.open(1)  # a completion queue of two
    assert ring is not None
    fd = os.open(tmp_path / "file", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        # three syncs end with none read: the kernel keeps one in its overflow list
        await _complete_unread(ring, fd, range(3))
        assert ring.overflowed
        assert sorted(ring.completions()) == [(0, 0), (1, 0), (2, 0)]
        assert not ring.overflowed and ring.overflow_flushes == 1
        ring.in_flight = 0
        ring.submit_fdatasync(fd, 3)  # the ring goes on as before
        assert await wait_for_completions(ring, 1) == [(3, 0)]
    finally:
        os.close(fd)
        ring.close()


@needs_ring
async def test_the_reaper_finds_a_sync_whose_end_was_never_signalled(tmp_path: Path) -> None:
    syncs = RingSyncStarter.open(1)
    assert syncs is not None
    ring = syncs._ring
    fd = os.open(tmp_path / "other", os.O_WRONLY | os.O_CREAT, 0o644)
    writer = SegmentWriter(tmp_path, segment_bytes=4096, first_seq=0)
    try:
        await _complete_unread(ring, fd, range(1000, 1002))  # the queue is full
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(ring.event_fd)  # their signal, taken: none is left
        ended = trio.Event()
        sync = syncs.start(writer, ended.set)
        await _until(lambda: ring.overflowed)  # where its completion went, with no signal
        with pytest.raises(BlockingIOError):
            os.eventfd_read(ring.event_fd)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(syncs.reap)
            with trio.move_on_after(5):
                await ended.wait()
            if not ended.is_set():
                syncs._pending.clear()  # (the reaper is shielded for it: let it end)
            syncs.stop()
        assert ended.is_set(), "the reaper never delivered the sync's end"
        assert sync.outcome() >= 0
        assert ring.overflow_flushes == 1
    finally:
        os.close(fd)
        writer.close()
    syncs.close()


class ClosedFile:
    """A segment whose descriptor was closed under the journal: its sync fails."""

    def __init__(self, directory: Path) -> None:
        self.sync_fd = os.open(directory / "gone", os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(self.sync_fd)

    def sync(self) -> None:
        os.fdatasync(self.sync_fd)


async def _ended(start: Callable[[Syncable, OnEnd], Sync], writer: Syncable) -> float:
    """Start a sync, wait for its `on_end` call, and return its outcome."""
    ended = trio.Event()
    sync = start(writer, ended.set)
    assert not sync.ended
    await ended.wait()
    assert sync.ended
    return sync.outcome()


@needs_ring
async def test_ring_syncs_raise_a_failed_sync_as_oserror(tmp_path: Path) -> None:
    syncs = RingSyncStarter.open(2)
    assert syncs is not None
    writer = SegmentWriter(tmp_path, segment_bytes=4096, first_seq=0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(syncs.reap)
        writer.write_batch([Request(RecordKind.ENTRY, 1, 0, b"kept")], 0)
        assert await _ended(syncs.start, writer) >= 0
        with pytest.raises(OSError) as caught:
            await _ended(syncs.start, ClosedFile(tmp_path))
        assert caught.value.errno == errno.EBADF
        syncs.stop()
    syncs.close()
    writer.close()


@needs_ring
async def test_a_ring_that_cannot_be_read_fails_its_syncs_and_is_not_used_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs = RingSyncStarter.open(2)
    assert syncs is not None
    writer = SegmentWriter(tmp_path, segment_bytes=4096, first_seq=0)
    writer.write_batch([Request(RecordKind.ENTRY, 1, 0, b"kept")], 0)

    def unreadable() -> list[tuple[int, int]]:  # what a failed overflow flush raises
        raise OSError(errno.EBADF, "io_uring_enter failed")

    monkeypatch.setattr(syncs._ring, "completions", unreadable)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(syncs.reap)
        with pytest.raises(OSError) as caught:
            await _ended(syncs.start, writer)
        assert caught.value.errno == errno.EBADF
        assert syncs.failed
        # the next sync runs in a thread, and ends well
        assert await _ended(syncs.start, writer) >= 0
        syncs.stop()
    syncs.close()
    writer.close()


async def test_thread_syncs_report_their_end_and_a_failure(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, segment_bytes=4096, first_seq=0)
    writer.write_batch([Request(RecordKind.ENTRY, 1, 0, b"kept")], 0)
    assert await _ended(SyncInThread, writer) >= 0
    with pytest.raises(OSError) as caught:
        await _ended(SyncInThread, ClosedFile(tmp_path))
    assert caught.value.errno == errno.EBADF
    writer.close()


def entries(ledger_id: int, count: int) -> list[Request]:
    return [Request(RecordKind.ENTRY, ledger_id, i, bytes([i % 256]) * 300) for i in range(count)]


async def run_journal_to_the_end(directory: Path, config: GroupCommitConfig) -> list[int]:
    """Submit 200 entries in 20 batches; the seqs of the groups the ledgers got."""
    dispatched: list[int] = []

    async def dispatch(group: list[Request]) -> None:
        for request in group:
            dispatched.append(request.seq)
            request.complete()

    journal = Journal(directory, config, first_seq=0, dispatch=dispatch)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            batch = entries(3, 200)
            for start in range(0, 200, 10):
                await journal.submit(batch[start : start + 10])
            journal.close_input()  # the run ends once every group is handed over
    return dispatched


@needs_ring
async def test_the_journal_syncs_through_the_ring_and_acks_in_order(tmp_path: Path) -> None:
    config = GroupCommitConfig(segment_bytes=16 * 1024)  # rolls, which wait for syncs
    assert await run_journal_to_the_end(tmp_path, config) == list(range(200))
    records = [r for batch in JournalScanner(tmp_path).batches() for r in batch]
    assert [(r.ledger_id, r.entry_id) for r in records] == [(3, i) for i in range(200)]


async def test_the_journal_falls_back_to_threads_without_a_ring(tmp_path: Path) -> None:
    config = GroupCommitConfig(segment_bytes=16 * 1024, sync_with_io_uring=False)
    assert await run_journal_to_the_end(tmp_path, config) == list(range(200))


@needs_ring
async def test_a_cancelled_journal_still_waits_for_its_ring_syncs(tmp_path: Path) -> None:
    journal = Journal(tmp_path, GroupCommitConfig(), first_seq=0, dispatch=_complete_all)
    batch = entries(4, 50)
    with trio.move_on_after(5) as deadline:
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            await journal.submit(batch)
            # no event marks a written group: look once per turn of the loop
            while journal.statistics().next_seq < 50:
                await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()  # the group is written, its sync in flight
    assert not deadline.cancelled_caught, "the journal did not end"
    # every sync delivered: each request ended one way or the other, none hangs
    assert journal.statistics().next_seq == 50


async def _complete_all(group: list[Request]) -> None:
    for request in group:
        request.complete()


_LIBC = ctypes.CDLL(None, use_errno=True)


class _Syscall:
    """libc's `syscall` as `FdatasyncRing.open` sees it, with some system calls failing
    as a kernel without io_uring, or one that forbids it, makes them fail."""

    def __init__(self, failing: dict[int, int]) -> None:
        self._syscall = _LIBC.syscall
        self._syscall.restype = ctypes.c_long
        self._failing = failing
        self.restype: object = ctypes.c_long

    def __call__(self, number: int, *args: object) -> int:
        error = self._failing.get(number)
        if error is not None:
            ctypes.set_errno(error)
            return -1
        result: int = self._syscall(number, *args)
        return result


class _Libc:
    def __init__(self, failing: dict[int, int]) -> None:
        self.syscall = _Syscall(failing)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (_SYS_IO_URING_SETUP, errno.ENOSYS),  # a kernel without io_uring
        (_SYS_IO_URING_SETUP, errno.EPERM),  # seccomp, kernel.io_uring_disabled
        (_SYS_IO_URING_REGISTER, errno.EINVAL),  # a ring made, its eventfd refused
    ],
)
async def test_a_ring_the_kernel_refuses_leaves_the_journal_syncing_in_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: int, error: int
) -> None:
    monkeypatch.setattr(ctypes, "CDLL", lambda *_a, **_k: _Libc({call: error}))
    fds = _open_fds()
    assert FdatasyncRing.open(2) is None
    assert RingSyncStarter.open(2) is None
    assert _open_fds() == fds, "a refused ring left descriptors open"
    config = GroupCommitConfig(segment_bytes=16 * 1024, sync_with_io_uring=True)
    assert await run_journal_to_the_end(tmp_path, config) == list(range(200))


def test_no_ring_off_x86_64(monkeypatch: pytest.MonkeyPatch) -> None:
    # the ring's memory order relies on x86-64's: elsewhere syncs run in threads
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert FdatasyncRing.open(2) is None


@needs_ring
async def test_a_ring_that_refuses_a_submission_syncs_in_threads_from_then_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs = RingSyncStarter.open(2)
    assert syncs is not None
    writer = SegmentWriter(tmp_path, segment_bytes=4096, first_seq=0)
    writer.write_batch([Request(RecordKind.ENTRY, 1, 0, b"kept")], 0)
    submitted: list[int] = []

    def refused(fd: int, tag: int) -> None:
        submitted.append(tag)
        raise OSError(errno.EIO, "io_uring_enter submitted 0, not 1")

    monkeypatch.setattr(syncs._ring, "submit_fdatasync", refused)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(syncs.reap)
        assert await _ended(syncs.start, writer) >= 0  # in a thread instead
        assert syncs.failed
        assert await _ended(syncs.start, writer) >= 0
        assert len(submitted) == 1, "the ring was tried again"
        syncs.stop()
    syncs.close()
    writer.close()
