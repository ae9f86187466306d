"""Recoveries SIGKILLed at each step of R16..R22, one after another on one ledger,
against real processes: a 3-node `pora cluster`, a writer process (E=3 Qw=3 Qa=2,
200 tasks) SIGKILLed before it told the nodes its last LAC (a long tail to recover),
then recovery processes (tests/recovery_process.py) that stop themselves at a step
and are killed there: after the fence covered the ensemble, after the first votes,
after the first window was re-added. Each leaves the record IN_RECOVERY. Then two
recoveries race to the end from two processes: both report the one close, which
holds every acknowledged entry. (A recovery killed after the record named a
replacement: tests/test_recovery_processes.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from test_cli_cluster import cluster
from test_replication_processes import (
    WAIT_S,
    check_replicas,
    ledger_record,
    process_state,
    read_log,
    recover,
    writer_process,
)
from waiting import wait_until

import pora
from pora.client.replication.recovery import READ_AHEAD
from pora.meta.records import LedgerState

RECOVERY_SCRIPT = Path(__file__).with_name("recovery_process.py")
WRITER_SCRIPT = Path(__file__).with_name("replication_writer_process.py")
NODES = 3
WRITER_TASKS = 200
#: appends the writer makes, then idles (its last LAC never sent) until killed
APPENDS = 600
RECOVERY_NODE_TIMEOUT_S = 2.0


class RecoveryProcess:
    """A recovery_process.py run whose stdout lines this test reads."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.pending = b""

    async def line(self) -> str:
        assert self.process.stdout is not None
        while b"\n" not in self.pending:
            chunk = await self.process.stdout.receive_some()
            assert chunk, f"the recovery process ended ({self.process.poll()})"
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()


async def start_recovery(url: str, ledger_id: int, stop_at: str | None) -> RecoveryProcess:
    command = [
        sys.executable, str(RECOVERY_SCRIPT), url, str(ledger_id), str(RECOVERY_NODE_TIMEOUT_S),
        *([] if stop_at is None else [stop_at]),
    ]  # fmt: skip
    process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE, env=os.environ)
    return RecoveryProcess(process)


async def kill_recovery_at(url: str, ledger_id: int, step: str) -> None:
    """Run a recovery until it stops itself at `step`, then SIGKILL it there."""
    recovery = await start_recovery(url, ledger_id, step)
    try:
        with trio.fail_after(WAIT_S):
            assert await recovery.line() == f"at {step}"
            await wait_until(lambda: process_state(recovery.process.pid) == "T", WAIT_S)
    finally:
        recovery.process.kill()
        await recovery.process.wait()
    record = await ledger_record(url, ledger_id)
    assert record.state is LedgerState.IN_RECOVERY, (step, record.state)


async def recoveries_killed_at_each_step(tmp_path: Path) -> None:
    async with cluster(tmp_path, NODES) as running:
        url = (await running.wait_for_line("metadata URL: ")).split(": ", 1)[1]
        await running.wait_for_line(f"ready: {NODES} nodes")
        log_path = tmp_path / "writer.log"
        command = [sys.executable, str(WRITER_SCRIPT), url, str(log_path), str(WRITER_TASKS)]
        async with writer_process(url, log_path, [*command, "3,3,2", str(APPENDS)]) as writer:
            await wait_until(lambda: read_log(log_path).idle, WAIT_S)
            writer.kill()
            await writer.wait()
        written = read_log(log_path)
        assert written.ledger_id is not None and written.errors == []
        assert sorted(written.acks) == list(range(APPENDS))
        ledger_id = written.ledger_id
        # the nodes' LACs are a window or more behind the last acknowledgement, so the
        # recovery killed at "copied" has more of the tail to re-add
        members = (await ledger_record(url, ledger_id)).ensembles[-1].members
        lacs = []
        for member in members:
            async with pora.connect_node(member.address) as node:
                lacs.append(await node.last_add_confirmed(ledger_id))
        assert max(lacs) + READ_AHEAD < max(written.acks), (lacs, max(written.acks))

        for step in ("fenced", "voted", "copied"):
            await kill_recovery_at(url, ledger_id, step)

        # two recoveries race to the end: one closes, the other returns that close
        racing = [await start_recovery(url, ledger_id, None) for _ in range(2)]
        try:
            with trio.fail_after(WAIT_S):
                closes = {await recovery.line() for recovery in racing}
                for recovery in racing:
                    assert await recovery.process.wait() == 0
        finally:
            for recovery in racing:
                if recovery.process.poll() is None:
                    recovery.process.kill()
                await recovery.process.wait()
        record, recovered = await recover(url, ledger_id)
        assert closes == {f"closed {record.last_entry_id}"}
        assert record.last_entry_id >= max(written.acks)
        await check_replicas(record, recovered, written.acks, dead=set())
        assert await ledger_record(url, ledger_id) == record  # a close never moves


@pytest.mark.slow
async def test_recoveries_killed_at_each_step_lose_nothing_and_agree(tmp_path: Path) -> None:
    await recoveries_killed_at_each_step(tmp_path)
