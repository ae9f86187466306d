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
    ACKS_BETWEEN_FAULTS,
    WAIT_S,
    check_replicas,
    ledger_record,
    node_pids_by_address,
    read_log,
    recover,
    wait_for_acks,
    writer_process,
)
from waiting import wait_until_true

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
                before = await wait_for_acks(log_path, ACKS_BETWEEN_FAULTS, writer)
                assert before.ledger_id is not None
                ledger_id = before.ledger_id
                first = await ledger_record(url, ledger_id)
                victim = first.ensembles[-1].members[1].address
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

                async def ensemble_changed() -> bool:
                    return len((await ledger_record(url, ledger_id)).ensembles) >= 2

                await wait_until_true(ensemble_changed, WAIT_S)
                changed = await ledger_record(url, ledger_id)
                # writes go on past the change, on the new ensemble
                on_new_ensemble = changed.ensembles[-1].first_entry_id + ACKS_BETWEEN_FAULTS
                after = await wait_for_acks(log_path, on_new_ensemble + 1, writer)
                assert victim not in {m.address for m in changed.ensembles[-1].members}
                assert max(after.acks) >= on_new_ensemble
                writer.kill()
                await writer.wait()
            written = read_log(log_path)
            assert written.errors == [] and written.fenced_pending == 0
            record, recovered = await recover(url, ledger_id)
            assert record.last_entry_id >= max(written.acks)
            await check_replicas(record, recovered, written.acks, dead={victim})
