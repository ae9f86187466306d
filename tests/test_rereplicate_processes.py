"""Audit and re-replication with real processes (docs/rereplication.md): five
`pora serve` nodes, ledgers at E=3 Qw=3 Qa=2 (closed, open with a live writer, open
and abandoned) and a stream with a live writer and a subscriber; one node SIGKILLed
and its data dir deleted; `pora audit` lists exactly the fragments that named it,
`pora rereplicate` puts three copies back, a second audit is clean, every replica of
the new ensembles holds every entry byte for byte, and the live writers and the
subscriber never saw an error. On SQLite and on ZooKeeper."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from rereplication_support import (
    Cluster,
    audit_json,
    check_every_replica,
    five_nodes,
    fragments_naming,
    json_lines,
    pora_cli,
    records,
)
from test_node_registration import metadata_url  # noqa: F401 - the fixture
from waiting import wait_until_true

import pora
from pora.client.replication.config import ClientConfig
from pora.meta.records import LedgerState

#: after the node loss, the subscriber's catch-up waits out the speculative delay
#: (R24) on about every entry before a second replica is asked: at the default 50 ms
#: it took seconds
CONFIG = ClientConfig(
    node_timeout_s=3.0, ensemble_change_timeout_s=30.0, speculative_read_delay_s=0.005
)


def payload(ledger_id: int, entry_id: int) -> bytes:
    return b"%d:%d:" % (ledger_id, entry_id) + os.urandom(64)


@pytest.mark.slow
async def test_a_lost_node_is_audited_and_its_copies_put_back(
    tmp_path: Path,
    metadata_url: str,  # noqa: F811
) -> None:
    url = metadata_url
    written: dict[int, dict[int, bytes]] = {}
    async with five_nodes(tmp_path, url) as cluster:
        victim = await write_then_lose_a_node(cluster, url, written)
        # no error reached the writers or the subscriber; the lost node's copies are back
        status, report = audit_json(url)
        assert (status, report["under_replicated"]) == (0, [])
        assert fragments_naming(await records(url), victim) == set()
        assert await check_every_replica(url, written) > 0


async def write_then_lose_a_node(
    cluster: Cluster, url: str, written: dict[int, dict[int, bytes]]
) -> str:
    async with pora.connect(url, CONFIG) as client:
        stream = await client.create_stream("events")
        subscribed: list[tuple[pora.Position, bytes]] = []
        appended: list[tuple[pora.Position, bytes]] = []
        async with stream.open_writer() as stream_writer:
            appended.append((await stream_writer.append(b"first"), b"first"))
            segment = (await stream.info()).segments[-1]
            victim = (await records(url))[segment.ledger_id].ensembles[0].members[0].address

            async def ledger_with_victim() -> pora.LedgerWriter:
                while True:
                    ledger = await client.create_ledger(3, 3, 2)
                    if any(m.address == victim for m in ledger.metadata.ensembles[0].members):
                        return ledger
                    await ledger.close()  # closed empty: never under-replicated (A3)

            for _ in range(3):  # closed ledgers
                ledger = await ledger_with_victim()
                written[ledger.ledger_id] = {}
                for entry_id in range(300):
                    data = payload(ledger.ledger_id, entry_id)
                    written[ledger.ledger_id][await ledger.append(data)] = data
                await ledger.close()
            live = await ledger_with_victim()
            written[live.ledger_id] = {}
            for entry_id in range(50):
                data = payload(live.ledger_id, entry_id)
                written[live.ledger_id][await live.append(data)] = data
            async with pora.connect(url, CONFIG) as other:  # a writer that goes away
                abandoned = await other.create_ledger(3, 3, 2)
                while not any(m.address == victim for m in abandoned.metadata.ensembles[0].members):
                    await abandoned.close()
                    abandoned = await other.create_ledger(3, 3, 2)
                written[abandoned.ledger_id] = {}
                for entry_id in range(40):
                    data = payload(abandoned.ledger_id, entry_id)
                    written[abandoned.ledger_id][await abandoned.append(data)] = data

            stop_writing, stopped = trio.Event(), trio.Event()

            async def keep_writing() -> None:
                while not stop_writing.is_set():
                    data = payload(live.ledger_id, len(written[live.ledger_id]))
                    written[live.ledger_id][await live.append(data)] = data
                    item = os.urandom(32)
                    appended.append((await stream_writer.append(item), item))
                    await trio.sleep(0.01)
                stopped.set()

            async def subscribe() -> None:
                async for position, item in stream.subscribe():
                    subscribed.append((position, item))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(keep_writing)
                nursery.start_soon(subscribe)
                await cluster.kill_and_wipe(victim)

                async def writers_moved_off() -> bool:
                    found = await records(url)
                    lasts = [found[live.ledger_id], found[segment.ledger_id]]
                    return all(
                        victim not in {m.address for m in r.ensembles[-1].members} for r in lasts
                    )

                await wait_until_true(writers_moved_off, 30.0)
                naming = fragments_naming(await records(url), victim)
                status, report = audit_json(url)
                assert status == 1
                listed = {
                    (f["ledger"], f["fragment"]["first_entry"]) for f in report["under_replicated"]
                }
                assert listed == naming
                assert {f["node"] for f in report["under_replicated"]} == {victim}
                assert all(f["copies_left"] == 2 for f in report["under_replicated"])

                done = pora_cli("rereplicate", "--metadata", url, "--json", "--open-grace-s", "1")
                assert done.returncode == 0, done.stdout + done.stderr
                events = json_lines(done.stdout)
                assert events[-1]["event"] == "summary"
                assert events[-1]["failed"] == 0
                recovered = [e["ledger"] for e in events if e["event"] == "recovered"]
                assert recovered == [abandoned.ledger_id]

                stop_writing.set()
                await stopped.wait()

                async def caught_up() -> bool:
                    return len(subscribed) >= len(appended)

                await wait_until_true(caught_up, 60.0)
                nursery.cancel_scope.cancel()
        await live.close()
        assert (await records(url))[live.ledger_id].state is LedgerState.CLOSED

    # the stream's subscriber saw the appended entries, in order
    assert subscribed[: len(appended)] == appended
    return victim
