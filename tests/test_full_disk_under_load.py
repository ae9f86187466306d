"""`pora serve` under adds from several connections while the filesystem under the
whole data dir fills up; SIGKILL; starts on the still-full disk; SIGKILLs during the
replay once space is back; then every acknowledged add reads back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio
from fs_faults import SmallFilesystems, fill
from test_flush_failures import SERVE_OPTIONS
from test_serve import (
    START_TIMEOUT_S,
    Daemon,
    assert_all_there,
    serve,
    stop,
    write_until_stopped,
)
from waiting import wait_until

LEDGERS = (5, 6, 7, 8)
OPTIONS = (*SERVE_OPTIONS, "--node-option", "flush_interval_ms=100")


async def add_until_refused(address: str, acked: dict[int, list[int]], budget_s: float) -> None:
    """One connection per ledger, 8 adds in flight on each, until the node refuses."""
    with trio.move_on_after(budget_s):
        async with trio.open_nursery() as nursery:
            for ledger_id in LEDGERS:
                nursery.start_soon(
                    write_until_stopped, address, ledger_id, acked[ledger_id], trio.Event(), 1 << 40
                )


def start_and_kill(data_dir: Path, after_s: float) -> None:
    """`pora serve`, SIGKILLed `after_s` into its start (the replay), if still running."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(data_dir),
         "--listen", "127.0.0.1:0", *OPTIONS],
        stderr=subprocess.DEVNULL, env=dict(os.environ),
    )  # fmt: skip
    time.sleep(after_s)  # a kill at some point of a real process's start: no event to wait on
    process.send_signal(signal.SIGKILL)
    process.wait()


async def start_on_the_full_disk(
    data_dir: Path, tmp_path: Path, acked: dict[int, list[int]]
) -> None:
    """Start `pora serve` on the still-full disk: refused plainly, or serving every
    acknowledged add (then SIGKILLed). One process, watched until it exits or says
    it is ready, whichever comes first."""
    ready = tmp_path / "ready-on-full-disk.json"
    log_path = tmp_path / "serve-on-full-disk.log"
    with log_path.open("wb") as log:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "pora.cli", "serve", "--data-dir", str(data_dir),
             "--listen", "127.0.0.1:0", "--ready-file", str(ready), *OPTIONS],
            stderr=log, env=dict(os.environ),
        )  # fmt: skip
    try:
        # a refusal comes within a second or two; the ready file is another
        # process's, with no event to wait on
        await wait_until(lambda: ready.exists() or process.poll() is not None, START_TIMEOUT_S)
        if not ready.exists():
            stderr = log_path.read_bytes()
            assert process.returncode == 2, stderr
            assert b"cannot serve" in stderr and b"Traceback" not in stderr
            return
        address = json.loads(ready.read_text())["listen"]
        daemon = Daemon(process, address, None, log_path)
        for ledger_id in LEDGERS:
            await assert_all_there(daemon.address, ledger_id, acked[ledger_id])
        assert await stop(daemon, signal.SIGKILL) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
        await process.wait()


@pytest.mark.slow
async def test_a_data_dir_filling_under_load_keeps_every_acknowledged_add(
    data_dir: Path, tmp_path: Path, small_filesystems: SmallFilesystems
) -> None:
    small_filesystems.mount(data_dir, 32)
    acked: dict[int, list[int]] = {ledger_id: [] for ledger_id in LEDGERS}
    async with serve(data_dir, tmp_path, *OPTIONS) as daemon:
        filler = await trio.to_thread.run_sync(fill, data_dir, 512 << 10)
        await add_until_refused(daemon.address, acked, 15.0)
        assert await stop(daemon, signal.SIGKILL) == -signal.SIGKILL
        failures = [line["msg"] for line in daemon.log_lines() if line["level"] == "error"]
        assert any("journal write failed" in str(m) for m in failures), failures[-3:]
    assert all(acked.values())

    # the disk is still full. How full depends on where the journal failed: with
    # less than a segment free the start is refused in one line, status 2; with a
    # segment's room left the node starts and serves what it kept (both are right)
    await start_on_the_full_disk(data_dir, tmp_path, acked)

    await trio.to_thread.run_sync(filler.unlink)
    for after_s in (0.6, 1.0, 1.5):
        await trio.to_thread.run_sync(start_and_kill, data_dir, after_s)
    async with serve(data_dir, tmp_path, *OPTIONS) as daemon:
        for ledger_id in LEDGERS:
            await assert_all_there(daemon.address, ledger_id, acked[ledger_id])
        assert await stop(daemon) == 0
