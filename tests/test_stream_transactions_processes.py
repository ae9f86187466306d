"""Transactions from several processes against real `pora serve` nodes (issue 27),
with SQLite and ZooKeeper metadata: three processes (tests/stream_transaction_process.py)
commit and abort concurrently while a subscriber here follows the stream. The
subscriber sees whole commits only, each committed transaction's entries exactly
once; a second commit with a recorded key returns the first's commit number and
adds nothing; aborted and skipped transactions' ledgers are gone."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio
from cluster_process import pora_cluster_process
from zookeeper_support import fresh_zk_url

import pora
from pora import Position

SCRIPT = Path(__file__).with_name("stream_transaction_process.py")
PROCESSES = 3
TRANSACTIONS = 6
WAIT_S = 120.0


def parse_log(path: Path) -> dict[str, list[list[str]]]:
    lines: dict[str, list[list[str]]] = {}
    for line in path.read_text(encoding="ascii").split("\n")[:-1]:
        words = line.split(" ")
        lines.setdefault(words[0], []).append(words[1:])
    return lines


def expected_payloads(prefix: str) -> list[bytes]:
    return [f"{prefix}.{s}.{e}".encode() for s in range(2) for e in range(3)]


async def concurrent_transactions(url: str, folder: Path) -> None:
    async with pora.connect(url) as client:
        stream = await client.create_stream("jobs", segment_bytes_max=64 << 10)
        seen: list[tuple[Position, bytes]] = []
        logs = [folder / f"p{k}.log" for k in range(PROCESSES)]
        committed = PROCESSES * sum(1 for i in range(TRANSACTIONS) if i % 3 != 2)

        async def subscribe() -> None:
            async for item in stream.subscribe():
                seen.append(item)
                if len(seen) == committed * 6:
                    return

        processes = []
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(subscribe)
                for k, log in enumerate(logs):
                    command = [sys.executable, str(SCRIPT), url, "jobs", str(log), f"p{k}"]
                    processes.append(
                        await trio.lowlevel.open_process(
                            [*command, str(TRANSACTIONS)], env=os.environ
                        )
                    )
                with trio.fail_after(WAIT_S):
                    for process in processes:
                        assert await process.wait() == 0
                    # the subscriber returns once it has every committed entry
        finally:
            for process in processes:
                if process.returncode is None:
                    process.kill()
                    await process.wait()

        parsed = [parse_log(log) for log in logs]
        assert [p.get("error", []) for p in parsed] == [[]] * PROCESSES
        assert all("done" in p for p in parsed)
        positions = [position for position, _ in seen]
        assert positions == sorted(set(positions))
        # whole commits only, each once, none of an aborted or a skipped transaction
        payloads = [payload for _, payload in seen]
        commit_of: dict[str, int] = {}
        for p in parsed:
            for prefix, commit in p["commit"]:
                commit_of[prefix] = int(commit)
            for prefix, commit, ledger in p["again"]:
                assert int(commit) == commit_of[prefix]
                with pytest.raises(pora.NoSuchLedger):
                    await client.open_ledger(int(ledger), recover=False)
            for _prefix, *ledgers in p["aborted"]:
                for ledger in ledgers:
                    with pytest.raises(pora.NoSuchLedger):
                        await client.open_ledger(int(ledger), recover=False)
        assert len(commit_of) == committed
        assert len(set(commit_of.values())) == committed  # one commit number each
        by_commit = sorted(commit_of, key=commit_of.__getitem__)
        assert payloads == [
            payload for prefix in by_commit for payload in expected_payloads(prefix)
        ]
        info = await stream.info()
        assert info.commit == committed
        # as of each commit: exactly the commits up to it
        middle = commit_of[by_commit[len(by_commit) // 2]]
        snapshot = [payload async for _, payload in stream.read(as_of_commit=middle)]
        assert snapshot == [
            payload
            for prefix in by_commit[: len(by_commit) // 2 + 1]
            for payload in expected_payloads(prefix)
        ]


@pytest.mark.slow
@pytest.mark.parametrize("metadata", ["sqlite", "zk"])
def test_transactions_from_several_processes(
    tmp_path: Path, metadata: str, request: pytest.FixtureRequest
) -> None:
    url = fresh_zk_url(request) if metadata == "zk" else None
    with pora_cluster_process(tmp_path / "cluster", nodes=3, metadata=url) as url:
        trio.run(concurrent_transactions, url, tmp_path)
