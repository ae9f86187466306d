"""The nodes' ledger garbage collection with real `pora serve --metadata` processes, on
SQLite and ZooKeeper: a ledger deleted while one of its nodes was stopped is removed
from that node once the grace since its creation there has passed, while a ledger
the store knows stays; and with the store unreachable (ZooKeeper stopped, the SQLite
file moved away and an empty store put in its place) nothing is deleted."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
import trio
from serve_helpers import http_get, samples
from test_node_registration import Node, serve, stop
from waiting import wait_until
from zookeeper_support import fresh_zk_url

import pora
from pora.meta.backends import open_metadata
from pora.meta.local_zookeeper import LocalZooKeeper

GRACE_S = 3.0
INTERVAL_S = 0.2
GC_OPTIONS = ("--ledger-gc-interval-s", str(INTERVAL_S), "--ledger-gc-grace-s", str(GRACE_S))


@pytest.fixture(params=["sqlite", "zk"])
def metadata_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "zk":
        return fresh_zk_url(request)
    return f"sqlite://{tmp_path}/meta.db"


def stored_ledgers(data_dir: Path) -> list[int]:
    """The ledgers a stopped node's data dir holds (`pora ledger list`)."""
    result = subprocess.run(
        [sys.executable, "-m", "pora.cli", "ledger", "list", "--data-dir", str(data_dir),
         "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [row["ledger_id"] for row in json.loads(result.stdout)["ledgers"]]


def gc_deletions(node: Node) -> list[dict[str, object]]:
    """The deletions the node logged (one JSON line each)."""
    lines = [json.loads(line) for line in node.log_path.read_text().splitlines() if line]
    return [
        line for line in lines if line.get("logger") == "pora.ledger_gc" and "ledger_id" in line
    ]


async def gc_figures(node: Node) -> dict[str, float]:
    values = samples((await http_get(node.metrics_port, "/metrics"))[1])
    return {k: v for k, v in values.items() if k.startswith("pora_ledger_gc_")}


async def write_closed(client: pora.Client, entries: int, e: int = 3, qa: int = 2) -> int:
    ledger = await client.create_ledger(e, e, qa, password="pw")
    for i in range(entries):
        await ledger.append(b"entry %d" % i)
    await ledger.close()
    return ledger.ledger_id


@pytest.mark.slow
async def test_a_ledger_deleted_while_its_node_was_stopped_goes_after_the_grace(
    tmp_path: Path, metadata_url: str
) -> None:
    async with AsyncExitStack() as stack:
        a, b, c = [
            await stack.enter_async_context(
                serve(tmp_path / name, tmp_path, metadata_url, *GC_OPTIONS)
            )
            for name in "abc"
        ]
        async with pora.connect(metadata_url) as client:
            gone = await write_closed(client, 5)
            kept = await write_closed(client, 5)
        assert await stop(c) == 0
        async with pora.connect(metadata_url) as client:
            await client.delete_ledger(gone, "pw")  # a and b delete theirs; c is down
        c = await stack.enter_async_context(
            serve(tmp_path / "c", tmp_path, metadata_url, *GC_OPTIONS, "--listen", c.address)
        )
        await wait_until(lambda: bool(gc_deletions(c)), 30)
        (deletion,) = gc_deletions(c)
        assert deletion["ledger_id"] == gone
        # not before the grace from its creation on the node
        logged_ms = _log_ms(str(deletion["ts"]))
        assert logged_ms >= int(str(deletion["created_ms"])) + GRACE_S * 1000
        # a few more passes delete nothing more: the kept ledger is the store's
        await passes_after(c, 3)
        figures = await gc_figures(c)
        assert figures["pora_ledger_gc_deleted_ledgers_total"] == 1
        # the node's payload: the application's bytes in the replicated entry format
        assert figures["pora_ledger_gc_deleted_bytes_total"] > sum(
            len(b"entry %d" % i) for i in range(5)
        )
        for node in (a, b, c):
            assert await stop(node) == 0
    assert stored_ledgers(tmp_path / "c") == [kept]
    assert stored_ledgers(tmp_path / "a") == [kept]


def _log_ms(ts: str) -> int:
    return int(datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000)


async def passes_after(node: Node, count: int, counter: str = "passes") -> dict[str, float]:
    """Wait for `count` more passes (or skipped passes) of the node's collection."""
    name = f"pora_ledger_gc_{counter}_total"
    start = (await gc_figures(node))[name]
    with trio.fail_after(30):
        while (figures := await gc_figures(node))[name] < start + count:  # noqa: ASYNC110 - a scrape has no event
            await trio.sleep(INTERVAL_S)
    return figures


def move_away(db: Path) -> None:
    """The SQLite file and its WAL files renamed, as an operator's mistake might."""
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{db}{suffix}").exists():
            os.rename(f"{db}{suffix}", f"{db}{suffix}.moved")


@asynccontextmanager
async def store_of(
    backend: str, tmp_path: Path
) -> AsyncIterator[tuple[str, LocalZooKeeper | None]]:
    """A metadata store this test may take down: its own ZooKeeper, or an SQLite file."""
    if backend == "sqlite":
        yield f"sqlite://{tmp_path}/meta.db", None
        return
    with LocalZooKeeper(tmp_path / "zookeeper", force_sync=False) as server:
        yield server.url("/gc"), server


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "zk"])
async def test_nothing_is_deleted_while_the_store_is_unreachable(
    tmp_path: Path, backend: str
) -> None:
    options = ("--ledger-gc-interval-s", str(INTERVAL_S), "--ledger-gc-grace-s", "0")
    async with (
        store_of(backend, tmp_path) as (url, zookeeper),
        serve(tmp_path / "a", tmp_path, url, *options) as node,
    ):
        async with pora.connect(url) as client:
            kept = await write_closed(client, 5, e=1, qa=1)
        await passes_after(node, 2)  # with no grace, seen and spared: the store knows it
        if zookeeper is not None:
            await trio.to_thread.run_sync(zookeeper.stop)
        else:
            # moved away, and an empty store in its place: a store that knows no
            # ledger (and no cluster) must not be taken at its word
            move_away(tmp_path / "meta.db")
            async with open_metadata(url):
                pass
        figures = await passes_after(node, 3, "passes_skipped")
        assert figures["pora_ledger_gc_deleted_ledgers_total"] == 0
        if zookeeper is not None:  # back: passes run to their end and spare it
            await trio.to_thread.run_sync(zookeeper.start)
            skipped = figures["pora_ledger_gc_passes_skipped_total"]
            await passes_after(node, 3)
            figures = await gc_figures(node)
            assert figures["pora_ledger_gc_deleted_ledgers_total"] == 0
            assert figures["pora_ledger_gc_passes_total"] >= skipped + 3
        assert not gc_deletions(node)
        assert await stop(node) == 0
    assert stored_ledgers(tmp_path / "a") == [kept]
