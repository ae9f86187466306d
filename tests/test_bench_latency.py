"""The per-hop tracing behind scripts/bench_latency.py (`pora.tracing`): off, it
writes nothing; on, one append through a node served in this process leaves a
record of every hop, and the script's join finds them all."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import trio

import pora
from pora import tracing
from pora.meta import open_metadata
from pora.meta.records import NodeRegistration
from pora.node.node import Node
from pora.server.server import Server, ServerConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_latency  # found through the line above


async def _run_node(data_dir: Path, *, task_status: trio.TaskStatus[Node]) -> None:
    async with pora.open_node(data_dir) as node:
        task_status.started(node)
        await trio.sleep_forever()


async def _append_through_a_node(directory: Path) -> list[bench_latency.Append]:
    """A node and its server in this process, an E1 ledger, three appends timed."""
    url = f"sqlite://{directory / 'meta.db'}"
    appends = []
    async with trio.open_nursery() as nursery:
        node = await nursery.start(_run_node, directory / "node")
        server = Server(node, ServerConfig(port=0))
        host, port = await nursery.start(server.run)
        address = f"{host}:{port}"
        async with pora.connect_node(address) as one:
            identity = await one.identity()
        async with open_metadata(url) as store:
            await store.register_node(NodeRegistration(address, identity.instance_id), 600)
        async with pora.connect(url) as client:
            ledger = await client.create_ledger(1, 1, 1)
            for _ in range(3):
                called_ns = time.monotonic_ns()
                entry_id = await ledger.append(b"x" * 100)
                appends.append(
                    bench_latency.Append(
                        ledger.ledger_id, entry_id, called_ns, called_ns, time.monotonic_ns()
                    )
                )
            await ledger.close()
        await server.shutdown(drain_timeout_s=1.0)
        nursery.cancel_scope.cancel()
    return appends


def test_tracing_off_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tracing.TRACE_ENV, raising=False)
    assert tracing.current() is None
    trio.run(_append_through_a_node, tmp_path)
    assert list(tmp_path.glob("trace*")) == []


def test_tracing_on_records_every_hop_of_an_append(tmp_path: Path) -> None:
    prefix = tmp_path / "trace"
    tracing.enable(str(prefix))
    try:
        appends = trio.run(_append_through_a_node, tmp_path)
    finally:
        tracing.disable()
    traces = bench_latency.read_traces(prefix)
    for append in appends:
        hops = bench_latency.hops_of(append, traces, ack_quorum=1)
        assert hops is not None, f"entry {append.entry_id} lacks a record"
        assert set(hops) == {bench_latency.WHOLE, *bench_latency.HOPS}
        assert hops["fdatasync"] > 0
