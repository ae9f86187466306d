"""The replicating client's Prometheus metrics (`pora.connect(..., metrics=registry)`),
read back from the registry over in-process nodes: appends and their bytes, the
acknowledgement latency, an ensemble change when a member fails, a recovery, the
writer it fenced, a speculative read, the pending bytes; and a client without metrics
never imports prometheus_client."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from replication_support import Fault, local_cluster
from serve_helpers import samples
from waiting import wait_until

import pora
from pora.client.node_channel import NodeChannel
from pora.client.replication.config import ClientConfig

CONFIG = ClientConfig(
    node_timeout_s=5.0, speculative_read_delay_s=0.05, ensemble_change_timeout_s=30.0
)


def scrape(registry: CollectorRegistry) -> dict[str, float]:
    return samples(generate_latest(registry).decode())


async def test_the_client_counts_what_an_operator_graphs(tmp_path: Path) -> None:
    registry = CollectorRegistry()

    @asynccontextmanager
    async def open_channel(address: str) -> AsyncIterator[NodeChannel]:
        yield await cluster.channel_for(address)

    async with (
        local_cluster(tmp_path, nodes=4) as cluster,
        pora.connect(
            cluster.store.url, CONFIG, open_channel=open_channel, metrics=registry
        ) as client,
    ):
        ledger = await client.create_ledger(3, 3, 2, password="pw")
        for _ in range(10):
            await ledger.append(b"x" * 100)
        await ledger.append_many([b"y" * 10] * 5)
        values = scrape(registry)
        assert values["pora_client_appends_total"] == 15
        assert values["pora_client_appended_bytes_total"] == 10 * 100 + 5 * 10
        # one observation per scheduler turn: ten single appends and one append_many
        assert values["pora_client_ack_seconds_count"] == 11
        assert values["pora_client_ack_seconds_sum"] > 0
        assert values["pora_client_pending_bytes"] == 0
        assert values["pora_client_pending_bytes_max"] == CONFIG.pending_bytes_max
        assert values["pora_client_ensemble_changes_total"] == 0

        # a member fails: the writer replaces it (R9) and goes on
        cluster.set_fault(ledger.metadata.ensembles[-1].members[0].address, Fault.FAIL)
        for _ in range(5):
            await ledger.append(b"z")
        # the appends are acknowledged by the two others (Qa=2) while the change's
        # record is written: on a loaded machine it may end after them. A statistic:
        # no event to wait on
        await wait_until(lambda: scrape(registry)["pora_client_ensemble_changes_total"] > 0, 30)
        assert scrape(registry)["pora_client_ensemble_changes_total"] == 1
        await ledger.close()

        # a recovery fences an open ledger's writer, whose next append fails
        open_one = await client.create_ledger(3, 3, 2, password="pw")
        for _ in range(3):
            await open_one.append(b"w")
        reader = await client.open_ledger(open_one.ledger_id, "pw")
        with pytest.raises(pora.LedgerFenced):
            await open_one.append(b"too late")
        values = scrape(registry)
        assert values["pora_client_recoveries_total"] == 1
        assert values["pora_client_writers_stopped_total{error=LedgerFenced}"] == 1

        # the first replica of entry 0 hangs: a speculative read asks the next one
        first = reader.metadata.ensembles[0].members[0].address
        cluster.set_fault(first, Fault.HANG)
        assert await reader.read(0) == b"w"
        assert scrape(registry)["pora_client_speculative_reads_total"] >= 1


def test_a_client_without_metrics_never_imports_prometheus_client(tmp_path: Path) -> None:
    program = f"""
import sys, trio, pora
async def main():
    try:
        async with pora.connect("sqlite:///{tmp_path}/none.db"):
            pass
    except pora.MetadataUnavailable:
        pass
trio.run(main)
assert "prometheus_client" not in sys.modules, "imported"
"""
    subprocess.run([sys.executable, "-c", program], check=True)
