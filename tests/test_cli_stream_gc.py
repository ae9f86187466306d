"""`pora stream gc` through the CLI against a real `pora cluster` on SQLite and on
ZooKeeper: abandoned transactions aborted, orphan ledgers (a transaction's segment
never recorded, a dead writer's ledger, a deleted stream's) deleted, while what the
stream holds, what is younger than the grace period and what may be the live
writer's next segment stay; --dry-run changes nothing; `show` prints the pending
transactions, cursors and attributes."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import trio
from cli_support import run_cli
from cluster_process import pora_cluster_process
from zookeeper_support import fresh_zk_url

import pora
from pora.client.replication.client import Client

Capsys = pytest.CaptureFixture[str]
T = TypeVar("T")


@pytest.fixture(params=["sqlite", "zk"], scope="module")
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    metadata = fresh_zk_url(request) if request.param == "zk" else None
    with pora_cluster_process(tmp_path_factory.mktemp("cluster"), 3, metadata) as url:
        yield url


async def _ledger_ids(client: Client) -> set[int]:
    return {ledger.ledger_id async for ledger in client.list_ledgers()}


async def _ledger(client: Client, custom: dict[str, bytes]) -> int:
    """A closed ledger with this custom metadata, recorded by no stream."""
    writer = await client.create_ledger(3, 3, 2, custom_metadata=custom)
    await writer.append(b"lost")
    await writer.close()
    return writer.ledger_id


def run(url: str, body: Callable[[Client], Awaitable[T]]) -> T:
    async def main() -> T:
        async with pora.connect(url) as client:
            return await body(client)

    return trio.run(main)


@pytest.mark.slow
def test_gc_aborts_abandoned_transactions_and_deletes_orphan_ledgers(
    cluster: str, capsys: Capsys
) -> None:
    name = f"gc-{cluster.rsplit('/', 1)[-1][:20]}".replace("_", "-")

    async def setup(client: Client) -> dict[str, str | int]:
        stream = await client.create_stream(name, segment_bytes_max=64 << 10)
        async with stream.open_writer() as writer:
            await writer.append(b"kept")
        abandoned = stream.begin()
        await abandoned.begin()
        segment = await abandoned.open_segment()
        await segment.append(b"never visible")
        await segment.close()
        # a process that died between creating its segment's ledger and recording it
        unrecorded = await _ledger(
            client, {"pora.stream": name.encode(), "pora.txn": abandoned.id.encode()}
        )
        # a writer that died holding the ledger of its next segment
        dead_spare = await _ledger(client, {"pora.stream": name.encode()})
        # a stream deleted while a node was away, and a ledger of no stream
        gone = await _ledger(client, {"pora.stream": f"{name}-deleted".encode()})
        other = await _ledger(client, {})
        await stream.set_attributes({"schema": "s" * 100, "owner": "billing\nteam"})
        await (await stream.cursor("audit")).ack(pora.Position(0, 0))
        return {
            "txn": abandoned.id,
            "txn_ledger": segment.ledger_id,
            "unrecorded": unrecorded,
            "dead_spare": dead_spare,
            "gone": gone,
            "other": other,
            "held": (await stream.info()).segments[0].ledger_id,
        }

    made = run(cluster, setup)
    base = ("stream", "gc", "--metadata", cluster)

    shown = run_cli(capsys, "stream", "show", name, "--metadata", cluster)
    assert shown.status == 0, shown.err
    assert str(made["txn"]) in shown.out and str(made["txn_ledger"]) in shown.out
    assert "audit  0:1" in shown.out  # a cursor: name, next position
    assert f"schema  {'s' * 80}... (100 characters)" in shown.out
    assert "owner   billing\\nteam" in shown.out
    details = run_cli(capsys, "stream", "show", name, "--metadata", cluster, "--json").json()
    assert details["cursors"][0]["name"] == "audit"
    assert details["cursors"][0]["next_position"] == "0:1"
    assert details["attributes"]["schema"] == "s" * 100
    assert details["transactions"][0]["id"] == made["txn"]

    # young ledgers and a transaction active a moment ago: nothing to do
    young = run_cli(capsys, *base, name, "--json")
    assert young.status == 0, young.err
    assert young.json_lines() == [
        {
            "summary": {
                "streams": 1,
                "transactions_aborted": 0,
                "ledgers_deleted": 0,
                "ledgers_not_deleted": 0,
                "dry_run": False,
            }
        }
    ]

    dry = run_cli(capsys, *base, name, "--idle-s", "0", "--grace-s", "0", "--dry-run", "--json")
    assert dry.status == 0, dry.err
    lines = dry.json_lines()
    assert [
        line.get("transaction") for line in lines if line.get("action") == "abort_transaction"
    ] == [made["txn"]]
    assert [line["ledger_id"] for line in lines if line.get("action") == "delete_ledger"] == sorted(
        [made["unrecorded"], made["dead_spare"]]
    )
    assert all(line.get("dry_run", True) for line in lines)
    everything = {v for k, v in made.items() if k != "txn"}
    assert everything <= run(cluster, _ledger_ids)

    done = run_cli(capsys, *base, name, "--idle-s", "0", "--grace-s", "0")
    assert done.status == 0, done.err
    assert f"stream {name!r}: abort abandoned transaction {made['txn']}" in done.out
    assert f"delete orphan ledger {made['unrecorded']} (of {made['txn']}," in done.out
    assert f"delete orphan ledger {made['dead_spare']} (a writer's," in done.out
    assert "1 stream(s): abort 1 transaction(s), delete 2 orphan ledger(s)" in done.out
    left = run(cluster, _ledger_ids)
    assert {made["held"], made["gone"], made["other"]} <= left
    assert not {made["txn_ledger"], made["unrecorded"], made["dead_spare"]} & left

    # without names: every stream, and the ledgers of streams that no longer exist
    every = run_cli(capsys, *base, "--grace-s", "0", "--json")
    assert every.status == 0, every.err
    deleted = [
        (line["stream"], line["ledger_id"]) for line in every.json_lines() if "ledger_id" in line
    ]
    assert (f"{name}-deleted", made["gone"]) in deleted
    left = run(cluster, _ledger_ids)
    assert {made["held"], made["other"]} <= left and made["gone"] not in left

    shown = run_cli(capsys, "stream", "show", name, "--metadata", cluster)
    assert "pending transactions: none" in shown.out


@pytest.mark.slow
def test_gc_spares_the_live_writers_next_segment(cluster: str) -> None:
    name = f"live-{cluster.rsplit('/', 1)[-1][:20]}".replace("_", "-")

    async def body(client: Client) -> tuple[int, set[int]]:
        stream = await client.create_stream(name)
        async with stream.open_writer() as writer:
            await writer.append(b"live")
            # what the writer makes ahead of a rollover: named by no document yet
            spare = await _ledger(client, {"pora.stream": name.encode()})
            # the real command in its own process, while this one's writer is live
            argv = ["stream", "gc", name, "--metadata", cluster, "--grace-s", "0"]
            result = await trio.run_process(
                [sys.executable, "-m", "pora.cli", *argv], capture_stdout=True, check=False
            )
            assert result.returncode == 0, result
            assert b"delete 0 orphan ledger(s)" in result.stdout, result.stdout
        return spare, await _ledger_ids(client)

    spare, left = run(cluster, body)
    assert spare in left


def test_gc_refusals(tmp_path: Path, capsys: Capsys) -> None:
    url = f"sqlite:///{tmp_path}/missing.db"
    for argv, words in [
        (("--idle-s", "-1"), "--idle-s must be"),
        (("--grace-s", "nan"), "--grace-s must be"),
        (("bad/name",), "not a stream name"),
    ]:
        result = run_cli(capsys, "stream", "gc", "--metadata", url, *argv)
        assert result.status == 2, result
        assert words in result.err
