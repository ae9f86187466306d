"""Re-replication workers side by side and killed (docs/rereplication.md, A4..A7),
with real processes on SQLite and ZooKeeper: two workers at once copy nothing twice,
and a worker SIGKILLed in the middle of a ledger leaves the record as it was, for
another worker to finish (reusing what the first one copied)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import trio
from rereplication_support import (
    audit_json,
    check_every_replica,
    closed_ledgers_on,
    five_nodes,
    json_lines,
    pora_cli,
    records,
    start_cli,
)
from test_node_registration import metadata_url  # noqa: F401 - the fixture
from waiting import wait_until_true

import pora
from pora.cluster_ops.session import cluster_session


def finish(worker: subprocess.Popen[str]) -> tuple[str, str]:
    return worker.communicate(timeout=120)


def start_worker(url: str, *extra: str) -> subprocess.Popen[str]:
    return start_cli("rereplicate", "--metadata", url, "--json", *extra)


@pytest.mark.slow
async def test_two_workers_at_once_copy_nothing_twice(
    tmp_path: Path,
    metadata_url: str,  # noqa: F811
) -> None:
    url = metadata_url
    async with five_nodes(tmp_path, url) as cluster:
        victim, written = await closed_ledgers_on(url, None, count=6, entries=400)
        await cluster.kill_and_wipe(victim)
        _, report = audit_json(url)
        at_risk = sum(f["entries_at_risk"] for f in report["under_replicated"])
        assert at_risk == 6 * 400
        workers = [start_worker(url), start_worker(url)]
        outputs = [await trio.to_thread.run_sync(finish, w) for w in workers]
        events = [e for out, _ in outputs for e in json_lines(out)]
        repaired = [(e["ledger"], e["first_entry"]) for e in events if e["event"] == "repaired"]
        assert sorted(repaired) == sorted(set(repaired))
        assert {ledger for ledger, _ in repaired} == set(written)
        copied = sum(e["entries_copied"] for e in events if e["event"] == "summary")
        assert copied == at_risk
        status, report = audit_json(url)
        assert (status, report["under_replicated"]) == (0, [])
        await check_every_replica(url, written)


async def entries_on_other_nodes(url: str, ledger_id: int, addresses: list[str]) -> int:
    """How many entries of the ledger the nodes at `addresses` hold (range reads)."""
    found = 0
    async with cluster_session(url) as cluster:
        for address in addresses:
            channel = await cluster.channel_for(address)
            try:
                answer = await channel.read_range(ledger_id, 0, 10_000)
            except pora.NoSuchLedger:
                continue
            found += len(answer.entries)
    return found


@pytest.mark.slow
async def test_a_worker_killed_mid_ledger_is_finished_by_another(
    tmp_path: Path,
    metadata_url: str,  # noqa: F811
) -> None:
    url = metadata_url
    async with five_nodes(tmp_path, url) as cluster:
        victim, written = await closed_ledgers_on(url, None, count=1, entries=600)
        (ledger_id,) = written
        before = (await records(url))[ledger_id]
        members = {m.address for m in before.ensembles[0].members}
        await cluster.kill_and_wipe(victim)
        others = [a for a in cluster.nodes if a not in members]
        slow = start_worker(url, "--entries-per-s", "200", "--batch-entries", "50",
                            "--lock-lease-s", "2")  # fmt: skip

        async def some_copied() -> bool:
            return await entries_on_other_nodes(url, ledger_id, others) >= 100

        await wait_until_true(some_copied, 30.0)
        slow.send_signal(signal.SIGKILL)
        await trio.to_thread.run_sync(slow.wait)
        # nothing half-applied: the record is as it was
        assert (await records(url))[ledger_id] == before

        resumed: list[dict[str, object]] = []

        async def finished_once() -> bool:
            done = pora_cli("rereplicate", "--metadata", url, "--json")
            assert done.returncode == 0, done.stdout + done.stderr
            resumed[:] = json_lines(done.stdout)
            return resumed[-1]["fragments_repaired"] == 1

        # the dead worker's lock lapses (its lease, or its ZooKeeper session)
        await wait_until_true(finished_once, 60.0)
        summary = resumed[-1]
        assert isinstance(summary["entries_copied"], int)
        assert summary["entries_copied"] <= 600 - 100  # what the first one copied stays
        status, report = audit_json(url)
        assert (status, report["under_replicated"]) == (0, [])
        await check_every_replica(url, written)
