"""A second recovery after one that replaced a member and was SIGKILLed before it
closed, against real processes: a 4-node `pora cluster`, a writer process with many
tasks (E=3 Qw=3 Qa=3) SIGKILLed before it told the nodes its last LAC, one member X
SIGSTOPped, recovery 1 in a process of its own (tests/recovery_process.py) that
replaces X by the fourth node R and is killed once the record names R, then recovery
2 from this process. Every entry the writer was told is durable must be read back."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import trio
from test_cli_cluster import cluster
from test_replication_processes import (
    WAIT_S,
    check_replicas,
    ledger_record,
    node_pids_by_address,
    process_state,
    read_log,
    recover,
    writer_process,
)
from waiting import wait_until
from zookeeper_support import fresh_zk_url

from pora.client.replication.config import ClientConfig
from pora.meta.backends import open_metadata
from pora.meta.records import LedgerState

RECOVERY_SCRIPT = Path(__file__).with_name("recovery_process.py")
WRITER_SCRIPT = Path(__file__).with_name("replication_writer_process.py")
NODES = 4
WRITER_TASKS = 200
#: appends the writer makes, then idles (its last LAC never sent) until killed
APPENDS = 600
#: recovery 1 waits this long for X's re-adds before it replaces X
RECOVERY_NODE_TIMEOUT_S = 2.0
#: recovery 1 runs in slices this long, stopped between them to look at the record: a
#: slice is far shorter than re-adding the writer's in-flight tail, so the record is
#: seen naming R long before recovery 1 could close
SLICE_S = 0.003
#: recovery 2, and the reads back: X (SIGSTOPped) is the only member a range read of
#: its ensemble asks (E=3 Qw=3), so each range read waits the node timeout and each
#: entry is then read alone, the next member asked after the speculative delay. The
#: same node timeout as recovery 1's and a short delay: every entry is still read
#: back through the reader, from the members that answer
RECOVERY_2_CONFIG = ClientConfig(
    node_timeout_s=RECOVERY_NODE_TIMEOUT_S, speculative_read_delay_s=0.005
)


async def stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    await wait_until(lambda: process_state(pid) == "T", WAIT_S)


async def recovery_killed_after_it_replaced_a_member(tmp_path: Path, metadata: str | None) -> None:
    async with cluster(tmp_path, NODES, metadata) as running:
        url = (await running.wait_for_line("metadata URL: ")).split(": ", 1)[1]
        await running.wait_for_line(f"ready: {NODES} nodes")
        log_path = tmp_path / "writer.log"
        command = [sys.executable, str(WRITER_SCRIPT), url, str(log_path), str(WRITER_TASKS)]
        async with writer_process(url, log_path, [*command, "3,3,3", str(APPENDS)]) as writer:
            await wait_until(lambda: read_log(log_path).idle, WAIT_S)
            writer.kill()
            await writer.wait()
        written = read_log(log_path)
        assert written.ledger_id is not None and written.errors == []
        assert sorted(written.acks) == list(range(APPENDS))
        ledger_id = written.ledger_id
        writers = (await ledger_record(url, ledger_id)).ensembles[-1]
        x = writers.members[0].address
        pids = node_pids_by_address(running.folder)
        (r,) = set(pids) - {m.address for m in writers.members}
        await stop(pids[x])
        timeout = str(RECOVERY_NODE_TIMEOUT_S)
        try:
            async with open_metadata(url) as store:
                recovery = await trio.lowlevel.open_process(
                    [sys.executable, str(RECOVERY_SCRIPT), url, str(ledger_id), timeout],
                    env=os.environ,
                )
                try:
                    with trio.fail_after(WAIT_S):
                        while True:
                            await stop(recovery.pid)
                            record = (await store.read_ledger(ledger_id)).value
                            assert record.state is not LedgerState.CLOSED, (
                                "recovery 1 closed the ledger within one slice"
                            )
                            if r in {m.address for m in record.ensembles[-1].members}:
                                break
                            assert recovery.poll() is None, "recovery 1 ended"
                            os.kill(recovery.pid, signal.SIGCONT)
                            # a slice of recovery 1's work: no event to wait on
                            await trio.sleep(SLICE_S)
                finally:
                    recovery.kill()
                    await recovery.wait()
            died = await ledger_record(url, ledger_id)
            replaced = died.ensembles[-1]
            assert replaced.first_entry_id <= max(written.acks), "recovery 1 re-added all"
            record, recovered = await recover(url, ledger_id, RECOVERY_2_CONFIG)
            assert record.last_entry_id >= max(written.acks)
            await check_replicas(record, recovered, written.acks, dead={x})
        finally:
            os.kill(pids[x], signal.SIGCONT)


@pytest.mark.slow
async def test_a_recovery_killed_after_it_replaced_a_member_loses_nothing(tmp_path: Path) -> None:
    await recovery_killed_after_it_replaced_a_member(tmp_path, None)


@pytest.mark.slow
async def test_a_recovery_killed_after_it_replaced_a_member_on_zookeeper_metadata(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    await recovery_killed_after_it_replaced_a_member(tmp_path, fresh_zk_url(request))
