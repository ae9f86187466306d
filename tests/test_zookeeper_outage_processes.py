"""A ZooKeeper outage under a writer that needs the store, against real processes: a
ZooKeeper server of the test's own, a 4-node `pora cluster` on it (1 s sessions), a
writer process (E=3 Qw=3 Qa=2, 64 tasks). The ZooKeeper process is SIGSTOPped (every
session outlives its timeout meanwhile) and a member of the writer's ensemble
SIGKILLed, so the writer's ensemble change (R9..R11) meets a store that does not
answer; ZooKeeper resumed, the change lands, the writer goes on on the new ensemble
(its store session, and the nodes' registrations, come back after the expiry), and a
recovery after the writer is killed holds every acknowledged entry."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio
from test_cli_cluster import cluster
from test_recovery_processes import stop
from test_replication_processes import (
    a_member_after_acks,
    node_pids_by_address,
    recovered_with_every_ack,
    writer_process,
    writes_past_an_ensemble_change,
)

from pora.meta.local_zookeeper import LocalZooKeeper

NODES = 4
#: how long ZooKeeper stays stopped: past the 1 s sessions of the nodes and the
#: writer, well within the writer's ensemble_change_timeout_s (30 s)
OUTAGE_S = 4.0


@pytest.mark.slow
async def test_a_writer_goes_on_through_a_zookeeper_outage_and_loses_nothing(
    tmp_path: Path,
) -> None:
    with LocalZooKeeper(tmp_path / "zookeeper", force_sync=False) as zookeeper:
        url = zookeeper.url("/outage")
        zk_pid = zookeeper.pid
        assert zk_pid is not None
        async with cluster(tmp_path, NODES, url) as running:
            await running.wait_for_line(f"ready: {NODES} nodes")
            log_path = tmp_path / "writer.log"
            async with writer_process(url, log_path) as writer:
                ledger_id, victim = await a_member_after_acks(url, log_path, writer)
                await stop(zk_pid)
                try:
                    os.kill(node_pids_by_address(running.folder)[victim], signal.SIGKILL)
                    # the outage: the writer's change waits on a store that does not
                    # answer; no event marks the sessions' timeouts passing
                    await trio.sleep(OUTAGE_S)
                finally:
                    os.kill(zk_pid, signal.SIGCONT)
                # the change lands once the store answers and the spare registered
                # again (its session expired in the outage: until then the writer
                # goes on on the members left, Qa of them, R9)
                await writes_past_an_ensemble_change(url, ledger_id, victim, log_path, writer)
                writer.kill()
                await writer.wait()
            await recovered_with_every_ack(url, ledger_id, log_path, {victim})
