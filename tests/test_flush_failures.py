"""A full disk under the entry logs: a failed flush never costs a journal segment.

Real small ext4 filesystems (`small_filesystems`), filled: the whole data dir, or
`ledgers/` alone. Every acknowledged entry must read back, through the failed
flushes, the node's close, a restart on the still-full disk, `pora recover`, and
once space returns.
"""

from __future__ import annotations

import errno
import random
import signal
from pathlib import Path
from typing import Any

import plyvel
import pytest
import trio
from cli_support import run_cli
from fs_faults import SmallFilesystems, fill
from test_crash import tear_journal_tail
from test_serve import Daemon, assert_all_there, serve, stop, write_until_stopped
from waiting import wait_until

import pora
from journal.segment import list_segments
from ledger.errors import FlushFailed, describe_os_error

#: small segments, so the entries below span several; nothing flushes or trims by
#: itself unless a test says so
QUIET: dict[str, Any] = {
    "segment_bytes": 64 * 1024,
    "flush_interval_ms": 3_600_000.0,
    "trim_interval_ms": 3_600_000.0,
    "spare_segments_max": 0,
}
LEDGERS = (1, 2, 3)
ENTRIES = 100
PAYLOAD_BYTES = 1500


def entry_payload(ledger_id: int, entry_id: int) -> bytes:
    return (b"%d/%d " % (ledger_id, entry_id)) * (PAYLOAD_BYTES // 8)


async def add_entries(node: pora.Node, entry_ids: range) -> None:
    for entry_id in entry_ids:
        for ledger_id in LEDGERS:
            await node.add_entry(ledger_id, entry_id, entry_payload(ledger_id, entry_id))


async def assert_entries(node: pora.Node, count: int = ENTRIES) -> None:
    for ledger_id in LEDGERS:
        assert await node.last_entry_id(ledger_id) == count - 1
        for entry_id in range(count):
            got = await node.read_entry(ledger_id, entry_id)
            assert got == entry_payload(ledger_id, entry_id), (ledger_id, entry_id)


def segment_names(data_dir: Path) -> list[str]:
    return [segment.path.name for segment in list_segments(data_dir / "journal")]


async def make_data_dir(data_dir: Path) -> None:
    async with pora.open_node(data_dir, **QUIET):
        pass


def ledgers_on_own_filesystem(data_dir: Path, small_filesystems: SmallFilesystems) -> Path:
    """A fresh data dir whose `ledgers/` is a small filesystem of its own."""
    trio.run(make_data_dir, data_dir)
    return small_filesystems.mount(data_dir / "ledgers", 8)  # made on first use


async def test_a_ledger_whose_flush_fails_holds_its_journal_until_a_retry_succeeds(
    data_dir: Path, small_filesystems: SmallFilesystems, caplog: pytest.LogCaptureFixture
) -> None:
    ledgers = await trio.to_thread.run_sync(ledgers_on_own_filesystem, data_dir, small_filesystems)
    filler = fill(ledgers)
    options = {**QUIET, "flush_interval_ms": 200.0, "idle_retire_ms": 50.0}
    async with pora.open_node(data_dir, **options) as node:
        await add_entries(node, range(ENTRIES))
        registry = node._registry
        await wait_until(lambda: all(registry.active[i].flush_failing for i in LEDGERS), 5.0)
        with pytest.raises(FlushFailed) as failed:
            await registry.flush_all()
        assert failed.value.ledger_ids == list(LEDGERS)
        assert "ENOSPC (No space left on device)" in str(failed.value)
        logged = [r.getMessage() for r in caplog.records if r.name == "pora.ledger"]
        assert any(
            m.startswith(f"flush of ledger 1 failed: ENOSPC (No space left on device) on {ledgers}")
            and "stay in memory and in the journal" in m
            for m in logged
        ), logged
        # failing, idle for longer than idle_retire_ms: the workers stay, holding
        # their oldest undurable seq, and the trimmer deletes none of their segments
        segments_before = segment_names(data_dir)
        assert len(segments_before) > 3
        later = trio.current_time() + 3600.0
        for ledger_id in LEDGERS:
            registry.active[ledger_id].on_tick(later)  # retries, fails: no retirement
        await wait_until(lambda: not any(w._flush_running for w in registry.active.values()), 5.0)
        assert set(registry.active) == set(LEDGERS)
        assert registry.oldest_undurable_seq() == list_segments(data_dir / "journal")[0].first_seq
        assert await node.reclaim_journal() == 0
        assert segment_names(data_dir) == segments_before
        assert set(registry.unflushed_ledgers()) == set(LEDGERS)
        await assert_entries(node)  # served from memory meanwhile

        filler.unlink()  # space comes back: the workers' own retries flush
        await wait_until(lambda: not registry.unflushed_ledgers(), 5.0)
        assert registry.oldest_undurable_seq() is None
        assert await node.reclaim_journal() == len(segments_before) - 1
        await assert_entries(node)
    async with pora.open_node(data_dir, **QUIET) as node:
        await assert_entries(node)
        assert node.statistics().recovery.records_replayed == 0


async def test_closing_on_a_full_disk_keeps_the_journal_and_says_so(
    data_dir: Path, small_filesystems: SmallFilesystems
) -> None:
    small_filesystems.mount(data_dir, 24)
    with pytest.raises(FlushFailed) as failed:
        async with pora.open_node(data_dir, **QUIET) as node:
            await add_entries(node, range(ENTRIES))
            segments = segment_names(data_dir)
            filler = fill(data_dir)
    assert failed.value.ledger_ids == list(LEDGERS)
    message = str(failed.value)
    assert "could not be flushed" in message
    assert f"the journal in {data_dir / 'journal'} is kept" in message
    assert "Free space" in message
    assert "b'" not in message  # paths as text, not bytes reprs
    assert segment_names(data_dir) == segments

    filler.unlink()
    async with pora.open_node(data_dir, **QUIET) as node:
        await assert_entries(node)
        assert node.statistics().recovery.records_replayed >= len(LEDGERS) * ENTRIES
    assert segment_names(data_dir) == []  # a clean close: nothing left to replay


async def test_a_restart_on_a_still_full_disk_serves_from_the_kept_journal(
    data_dir: Path, small_filesystems: SmallFilesystems
) -> None:
    ledgers = await trio.to_thread.run_sync(ledgers_on_own_filesystem, data_dir, small_filesystems)
    filler = fill(ledgers)
    with pytest.raises(FlushFailed):
        async with pora.open_node(data_dir, **QUIET) as node:
            await add_entries(node, range(ENTRIES // 2))
    # and a crash cut the last (unacknowledged) group commit short: the kept journal
    # ends torn, and the node must write its next segments after it
    assert tear_journal_tail(data_dir / "journal", random.Random(18), whole_after=True)
    for restart in range(2):
        # replay cannot flush either: the journal stays, the node serves from memory
        # and takes more writes after the kept segments
        with pytest.raises(FlushFailed):
            async with pora.open_node(data_dir, **QUIET) as node:
                assert node.statistics().recovery.unflushed_ledgers == list(LEDGERS)
                kept = segment_names(data_dir)
                # the replayed ledgers hold the kept segments, older than the journal's
                # new first seq, from the trimmer
                assert await node.reclaim_journal() == 0
                assert segment_names(data_dir) == kept
                await assert_entries(node, ENTRIES // 2 * (restart + 1))
                await add_entries(
                    node, range(ENTRIES // 2 * (restart + 1), ENTRIES // 2 * (restart + 2))
                )
    filler.unlink()
    async with pora.open_node(data_dir, **QUIET) as node:
        assert node.statistics().recovery.unflushed_ledgers == []
        await assert_entries(node, ENTRIES // 2 * 3)
    assert segment_names(data_dir) == []


def test_recover_on_a_still_full_disk_keeps_the_journal_and_fails(
    data_dir: Path, small_filesystems: SmallFilesystems, capsys: pytest.CaptureFixture[str]
) -> None:
    ledgers = ledgers_on_own_filesystem(data_dir, small_filesystems)
    filler = fill(ledgers)

    async def write() -> None:
        async with pora.open_node(data_dir, **QUIET) as node:
            await add_entries(node, range(ENTRIES))

    with pytest.raises(FlushFailed):
        trio.run(write)
    segments = segment_names(data_dir)
    assert segments

    result = run_cli(capsys, "recover", "--data-dir", str(data_dir))
    assert result.status == 1
    assert "could not be flushed" in result.err
    assert "run `pora recover`" in result.err
    assert segment_names(data_dir)[: len(segments)] == segments

    filler.unlink()
    result = run_cli(capsys, "recover", "--data-dir", str(data_dir))
    assert result.status == 0, result.err
    assert segment_names(data_dir) == []

    async def read() -> None:
        async with pora.open_node(data_dir, **QUIET) as node:
            await assert_entries(node)
            assert node.statistics().recovery.records_replayed == 0

    trio.run(read)


# --- `pora serve` on a full disk: SIGTERM, SIGKILL, restarts -----------------------------

#: never read-only (the disk watcher would refuse the adds on these small disks) and
#: small segments
SERVE_OPTIONS = (
    "--read-only-free-bytes-min", "0",
    "--node-option", "segment_bytes=65536",
    "--node-option", "spare_segments_max=0",
)  # fmt: skip


async def write_some(address: str, ledger_id: int, count: int) -> list[int]:
    """Acknowledged adds to `ledger_id` (8 writers) until `count` are in; stops them."""
    acknowledged: list[int] = []
    enough = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(write_until_stopped, address, ledger_id, acknowledged, enough, count)
        await enough.wait()
        nursery.cancel_scope.cancel()
    return acknowledged


def stop_messages(daemon: Daemon) -> list[str]:
    return [str(line["msg"]) for line in daemon.log_lines() if "stopped" in str(line["msg"])]


async def assert_stopped_keeping_the_journal(daemon: Daemon, data_dir: Path) -> None:
    assert await stop(daemon) == 1
    messages = stop_messages(daemon)
    assert not any(m.startswith("stopped cleanly") for m in messages), messages
    assert any("not cleanly" in m and "could not be flushed" in m for m in messages), messages
    assert segment_names(data_dir)


@pytest.mark.slow
async def test_serve_on_a_full_data_dir_stops_with_status_1_and_keeps_every_entry(
    data_dir: Path, tmp_path: Path, small_filesystems: SmallFilesystems
) -> None:
    small_filesystems.mount(data_dir, 32)
    options = (*SERVE_OPTIONS, "--node-option", "flush_interval_ms=3600000")
    async with serve(data_dir, tmp_path, *options) as daemon:
        acknowledged = await write_some(daemon.address, 5, 300)
        filler = await trio.to_thread.run_sync(fill, data_dir)
        await assert_stopped_keeping_the_journal(daemon, data_dir)
    await trio.to_thread.run_sync(filler.unlink)
    async with serve(data_dir, tmp_path, *options) as daemon:
        await assert_all_there(daemon.address, 5, acknowledged)
        assert await stop(daemon) == 0
        assert any(m.startswith("stopped cleanly") for m in stop_messages(daemon))


@pytest.mark.slow
async def test_serve_with_full_entry_logs_survives_sigterm_sigkill_and_restarts(
    data_dir: Path, tmp_path: Path, small_filesystems: SmallFilesystems
) -> None:
    ledgers = await trio.to_thread.run_sync(ledgers_on_own_filesystem, data_dir, small_filesystems)
    filler = await trio.to_thread.run_sync(fill, ledgers)
    # flushes are tried (and fail) while the node serves
    options = (*SERVE_OPTIONS, "--node-option", "flush_interval_ms=100")
    async with serve(data_dir, tmp_path, *options) as daemon:
        first = await write_some(daemon.address, 5, 300)
        await assert_stopped_keeping_the_journal(daemon, data_dir)
    # the disk is still full: the node starts, serves what it replayed from memory,
    # takes more adds, and is killed
    async with serve(data_dir, tmp_path, *options) as daemon:
        await assert_all_there(daemon.address, 5, first)
        second = await write_some(daemon.address, 6, 300)
        assert await stop(daemon, signal.SIGKILL) == -signal.SIGKILL
    async with serve(data_dir, tmp_path, *options) as daemon:
        await assert_all_there(daemon.address, 5, first)
        await assert_all_there(daemon.address, 6, second)
        await assert_stopped_keeping_the_journal(daemon, data_dir)
    await trio.to_thread.run_sync(filler.unlink)
    async with serve(data_dir, tmp_path, *options) as daemon:
        await assert_all_there(daemon.address, 5, first)
        await assert_all_there(daemon.address, 6, second)
        assert await stop(daemon) == 0
        assert any(m.startswith("stopped cleanly") for m in stop_messages(daemon))
    assert segment_names(data_dir) == []


def test_disk_errors_read_as_text() -> None:
    assert describe_os_error(OSError(errno.ENOSPC, "No space left on device", b"/d/x.log")) == (
        "ENOSPC (No space left on device)"
    )
    assert describe_os_error(OSError(errno.EIO, "")) == "EIO (Input/output error)"
    leveldb = plyvel.IOError(b"IO error: /d/index/000005.log: No space left on device")
    assert describe_os_error(leveldb) == "IO error: /d/index/000005.log: No space left on device"
