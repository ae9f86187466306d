"""`index/` alone on a small filesystem that fills: LevelDB's own ENOSPC.

A LevelDB write whose log append fails part way leaves the part in the log, and
LevelDB appends the next writes after it: a log damaged in its middle, which the
next start refuses as a damaged index. After its first failed write the index takes
no more writes (IndexWritesStopped, saying to restart) until the node reopens it,
where the part lies at the log's end and reads as a torn tail.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio
from cli_support import run_cli
from fs_faults import SmallFilesystems, fill
from test_flush_failures import LEDGERS, QUIET, add_entries, assert_entries, make_data_dir
from waiting import wait_until

import pora
from journal.segment import list_segments
from ledger.errors import FlushFailed

ROUND = 100
#: rounds of adds the full index disk may still take before one of its writes fails
ROUNDS_TO_FILL_MAX = 20


def index_on_own_filesystem(data_dir: Path, small_filesystems: SmallFilesystems) -> Path:
    trio.run(make_data_dir, data_dir)
    return small_filesystems.mount(data_dir / "index", 16, move_contents=True)


# how much free space is left decides whether LevelDB's failed append writes a part
@pytest.mark.parametrize("leave_bytes", [0, 1000, 3000])
async def test_a_full_index_disk_stops_index_writes_until_a_restart_and_loses_nothing(
    data_dir: Path,
    small_filesystems: SmallFilesystems,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    leave_bytes: int,
) -> None:
    index = await trio.to_thread.run_sync(index_on_own_filesystem, data_dir, small_filesystems)
    options = {**QUIET, "flush_interval_ms": 50.0}
    with pytest.RaisesGroup(FlushFailed, allow_unwrapped=True, flatten_subgroups=True):
        async with pora.open_node(data_dir, **options) as node:
            registry = node._registry
            filler = fill(index, leave_bytes)
            # which index writes still fit in the last free bytes and the log file's
            # last block is up to their sizes and timing: add rounds until one fails,
            # which is what shuts the index

            def one_failing() -> bool:
                workers = [registry.active.get(i) for i in LEDGERS]
                return any(w is not None and w.flush_failing for w in workers)

            added = 0
            while not one_failing():
                assert added < ROUNDS_TO_FILL_MAX * ROUND, "the full index disk took every write"
                await add_entries(node, range(added, added + ROUND))
                added += ROUND
                with trio.move_on_after(1.0):  # no failure within a second: another round
                    await wait_until(one_failing, 2.0)
            filler.unlink()  # space is back, but the index stays shut until a restart
            await add_entries(node, range(added, added + ROUND))
            added += ROUND
            await wait_until(
                lambda: any("takes no more writes" in r.getMessage() for r in caplog.records), 5.0
            )
            # every ledger has entries after the shut: none of them can flush them
            await wait_until(lambda: set(registry.unflushed_ledgers()) == set(LEDGERS), 5.0)
            await assert_entries(node, added)  # served from memory meanwhile
    stopped = [r.getMessage() for r in caplog.records if "takes no more writes" in r.getMessage()]
    assert f"the index at {index}" in stopped[0] and "restart the node" in stopped[0]

    # the restart: the index opens (no damage), the journal brings back the rest
    async with pora.open_node(data_dir, **QUIET) as node:
        await assert_entries(node, added)
    verified = run_cli(capsys, "verify", "--data-dir", str(data_dir))
    assert verified.status == 0, verified.out + verified.err
    # all of it is in the entry logs and the index now
    assert list_segments(data_dir / "journal") == []


async def test_the_trimmer_meeting_a_full_index_disk_puts_the_trim_off_and_the_node_serves(
    data_dir: Path, small_filesystems: SmallFilesystems, caplog: pytest.LogCaptureFixture
) -> None:
    index = await trio.to_thread.run_sync(index_on_own_filesystem, data_dir, small_filesystems)
    options = {**QUIET, "flush_interval_ms": 50.0}
    with pytest.RaisesGroup(FlushFailed, allow_unwrapped=True, flatten_subgroups=True):
        async with pora.open_node(data_dir, **options) as node:
            registry = node._registry
            await add_entries(node, range(ROUND))
            await wait_until(lambda: not registry.unflushed_ledgers(), 5.0)
            filler = fill(index, 3000)
            await add_entries(node, range(ROUND, 2 * ROUND))  # a new segment, flushes fail
            await wait_until(lambda: all(registry.active[i].flush_failing for i in LEDGERS), 5.0)
            segments = list_segments(data_dir / "journal")
            assert await node.trim_journal() == 0  # segments 0.. could go, but no sync
            assert list_segments(data_dir / "journal") == segments
            put_off = [r.getMessage() for r in caplog.records if "trim put off" in r.getMessage()]
            assert put_off and "the index could not be synced" in put_off[0]
            await add_entries(node, range(2 * ROUND, 3 * ROUND))  # the node serves on
            await assert_entries(node, 3 * ROUND)
            filler.unlink()
    async with pora.open_node(data_dir, **QUIET) as node:
        await assert_entries(node, 3 * ROUND)


def test_serve_on_a_full_index_disk_is_a_refusal_with_status_2(
    data_dir: Path, small_filesystems: SmallFilesystems
) -> None:
    index = index_on_own_filesystem(data_dir, small_filesystems)
    fill(index)
    served = subprocess.run(
        [sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(data_dir),
         "--listen", "127.0.0.1:0", "--log-format", "logfmt"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert "cannot serve: cannot open the index" in served.stderr, served.stderr
    assert "No space left on device" in served.stderr
    assert "Traceback" not in served.stderr
    assert served.returncode == 2
