"""`pora node decommission` and `pora rereplicate --watch` with real processes
(docs/rereplication.md, A13, A14): a draining node gets nothing new and loses every
copy it held to other nodes; a watching worker waits `--lost-after-s` before it
repairs a lost node's fragments, then repairs them. On SQLite and ZooKeeper."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio
from rereplication_support import (
    audit_json,
    check_every_replica,
    closed_ledgers_on,
    five_nodes,
    fragments_naming,
    json_lines,
    pora_cli,
    records,
    start_cli,
)
from test_node_registration import metadata_url  # noqa: F401 - the fixture
from waiting import wait_until_true

import pora
from pora.meta.backends import open_metadata


@pytest.mark.slow
async def test_a_decommissioned_node_gets_nothing_new_and_holds_nothing_needed(
    tmp_path: Path,
    metadata_url: str,  # noqa: F811
) -> None:
    url = metadata_url
    async with five_nodes(tmp_path, url):
        leaving, written = await closed_ledgers_on(url, None, count=3, entries=200)
        done = pora_cli("node", "decommission", leaving, "--metadata", url, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        final = json_lines(done.stdout)[-1]
        assert (final["event"], final["may_stop"], final["fragments_left"]) == (
            "decommission", True, [],
        )  # fmt: skip
        assert fragments_naming(await records(url), leaving) == set()
        async with open_metadata(url, create=False) as store:
            listed = {n.address: n for n in await store.list_nodes()}
            assert listed[leaving].draining  # still registered, marked
            writable = {n.address for n in await store.list_nodes(writable_only=True)}
            assert leaving not in writable
        async with pora.connect(url) as client:
            for _ in range(10):  # placement puts nothing new on it
                ledger = await client.create_ledger(3, 3, 2)
                assert leaving not in {m.address for m in ledger.metadata.ensembles[0].members}
                await ledger.close()
        status, report = audit_json(url)
        assert (status, report["under_replicated"]) == (0, [])
        await check_every_replica(url, written)
        undone = pora_cli("node", "decommission", leaving, "--metadata", url, "--undo")
        assert undone.returncode == 0, undone.stderr
        async with open_metadata(url, create=False) as store:
            assert leaving in {n.address for n in await store.list_nodes(writable_only=True)}


@pytest.mark.slow
async def test_a_watching_worker_waits_for_the_delay_then_repairs(
    tmp_path: Path,
    metadata_url: str,  # noqa: F811
) -> None:
    url = metadata_url
    async with five_nodes(tmp_path, url) as cluster:
        victim, written = await closed_ledgers_on(url, None, count=2, entries=200)
        before = await records(url)
        watcher = start_cli(
            "rereplicate", "--metadata", url, "--json",
            "--watch", "--lost-after-s", "4", "--interval-s", "0.2",
        )  # fmt: skip
        try:
            await cluster.kill_and_wipe(victim)
            await trio.sleep(1.0)  # within the delay: a restart would cost nothing
            assert await records(url) == before

            async def clean() -> bool:
                return audit_json(url)[0] == 0

            await wait_until_true(clean, 60.0)
        finally:
            watcher.send_signal(signal.SIGTERM)  # a service manager's stop
            try:
                out, err = await trio.to_thread.run_sync(watcher.communicate, None, 30.0)
            finally:
                if watcher.poll() is None:
                    watcher.kill()
        assert watcher.returncode == 0, err
        repaired = [e for e in json_lines(out) if e["event"] == "repaired"]
        assert {e["ledger"] for e in repaired} == set(written), err
        await check_every_replica(url, written)
