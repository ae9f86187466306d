"""A 5-node cluster of real `pora serve` processes for the re-replication tests: the
ledgers and streams written to it, a node SIGKILLed with its data dir deleted, the
`pora audit` / `pora rereplicate` CLI run as processes, and every replica checked
byte for byte (docs/rereplication.md)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from test_node_registration import LEASE_S, Node, nodes_in, serve, stop
from waiting import wait_until_true

import pora
from pora.client.replication.core.entry_format import decode_entry
from pora.cluster_ops.fragments import entries_held, fragments_of
from pora.cluster_ops.session import cluster_session
from pora.meta.backends import open_metadata
from pora.meta.records import LedgerMetadata

NODES = 5


@dataclass
class Cluster:
    url: str
    folder: Path
    nodes: dict[str, Node] = field(default_factory=dict)
    data_dirs: dict[str, Path] = field(default_factory=dict)

    async def kill_and_wipe(self, address: str) -> None:
        """SIGKILL the node at `address` and delete its data dir; back once its
        registration is gone."""
        assert await stop(self.nodes.pop(address), signal.SIGKILL) == -signal.SIGKILL
        shutil.rmtree(self.data_dirs[address])

        async def gone() -> bool:
            return address not in await nodes_in(self.url)

        await wait_until_true(gone, LEASE_S * 20)


@contextlib.asynccontextmanager
async def five_nodes(tmp_path: Path, url: str) -> AsyncIterator[Cluster]:
    """`NODES` `pora serve` processes on `url`, started side by side (each start is
    mostly a Python process's own start-up), every one ready and registered before
    the cluster is given; each is stopped (as `serve` stops it) at the end."""
    cluster = Cluster(url, tmp_path)
    started: dict[int, Node] = {}
    all_started, done = trio.Event(), trio.Event()

    async def run_node(index: int) -> None:
        async with serve(tmp_path / f"node{index}", tmp_path, url) as node:
            started[index] = node
            if len(started) == NODES:
                all_started.set()
            await done.wait()

    async with trio.open_nursery() as nursery:
        for index in range(NODES):
            nursery.start_soon(run_node, index)
        await all_started.wait()
        for index, node in sorted(started.items()):
            cluster.nodes[node.address] = node
            cluster.data_dirs[node.address] = tmp_path / f"node{index}"
        try:
            yield cluster
        finally:
            done.set()


def pora_cli(*argv: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pora.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=os.environ,
        check=False,
    )


def start_cli(*argv: str) -> subprocess.Popen[str]:
    """`pora ARGV...` started, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "pora.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ,
    )


def audit_json(url: str) -> tuple[int, dict[str, Any]]:
    done = pora_cli("audit", "--metadata", url, "--json")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def records(url: str) -> dict[int, LedgerMetadata]:
    async with open_metadata(url, create=False) as store:
        return {v.value.ledger_id: v.value for v in await store.list_ledgers()}


def fragments_naming(found: dict[int, LedgerMetadata], address: str) -> set[tuple[int, int]]:
    """(ledger, first entry) of every non-empty fragment with a member at `address`."""
    return {
        (ledger_id, fragment.first_entry_id)
        for ledger_id, record in found.items()
        for fragment in fragments_of(record)
        if any(m.address == address for m in fragment.ensemble.members)
    }


async def check_every_replica(url: str, written: dict[int, dict[int, bytes]]) -> int:
    """Every entry of `written` (ledger -> entry -> payload) is on every member of its
    write set in the record, byte for byte, up to each ledger's closed end or the
    entries written; returns how many copies were read."""
    copies = 0
    found = await records(url)
    async with cluster_session(url) as cluster:
        for ledger_id, payloads in written.items():
            record = found[ledger_id]
            e, qw = record.ensemble_size, record.write_quorum
            for fragment in fragments_of(record):
                end = fragment.last_entry_id
                if end is None:
                    end = max(payloads, default=-1)
                end = min(end, max(payloads, default=-1))
                for position, member in enumerate(fragment.ensemble.members):
                    wanted = set(entries_held(fragment.first_entry_id, end, position, e, qw))
                    if not wanted:
                        continue
                    channel = await cluster.channel_for(member.address)
                    got: dict[int, bytes] = {}
                    start = fragment.first_entry_id
                    while start <= end:
                        answer = await channel.read_range(
                            ledger_id, start, end, instance_id=member.instance_id
                        )
                        for entry_id, data in answer.entries:
                            got[entry_id] = decode_entry(
                                ledger_id, entry_id, data, token=record.token
                            ).payload
                        start = answer.complete_through + 1
                    for entry_id in wanted:
                        assert got.get(entry_id) == payloads[entry_id], (
                            f"ledger {ledger_id} entry {entry_id} on {member.address}"
                        )
                        copies += 1
    return copies


async def closed_ledgers_on(
    url: str, victim: str | None, count: int, entries: int
) -> tuple[str, dict[int, dict[int, bytes]]]:
    """`count` closed ledgers (E=Qw=3, Qa=2) of `entries` entries, each with a member
    at `victim` (the first ledger's first member when None)."""
    written: dict[int, dict[int, bytes]] = {}
    async with pora.connect(url) as client:
        while len(written) < count:
            ledger = await client.create_ledger(3, 3, 2)
            members = {m.address for m in ledger.metadata.ensembles[0].members}
            victim = victim or ledger.metadata.ensembles[0].members[0].address
            if victim in members:
                payloads = [os.urandom(200) for _ in range(entries)]
                ids = await ledger.append_many(payloads)
                written[ledger.ledger_id] = dict(zip(ids, payloads, strict=True))
            await ledger.close()
    assert victim is not None
    return victim, written
