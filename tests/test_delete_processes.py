"""R26 against real processes: three `pora serve` nodes, a writer process appending
from 64 tasks (tests/replication_writer_process.py, E=3 Qw=3 Qa=2) and a tail in this
process; a delete with the ledger's password stops the writer (every append fails with
LedgerDeleted), ends the tail with NoSuchLedger, and leaves the nodes refusing the
ledger, across a restart."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest
import trio
from test_node_registration import serve, stop
from waiting import wait_until

import pora
from pora.meta.backends import open_metadata
from pora.meta.errors import NoSuchLedgerMetadata

WRITER_SCRIPT = Path(__file__).with_name("replication_writer_process.py")
WRITER_TASKS = 64
WAIT_S = 90.0


def parse(log_path: Path) -> tuple[int | None, int, list[list[str]], bool, list[str]]:
    """(ledger id, acknowledgements, fenced lines split, done, other lines) of the
    writer's log, complete lines only."""
    text = log_path.read_text(encoding="ascii") if log_path.exists() else ""
    ledger_id, acks, fenced, done, other = None, 0, [], False, []
    for line in text.split("\n")[:-1]:
        words = line.split(" ")
        if words[0] == "ledger":
            ledger_id = int(words[1])
        elif words[0] == "ack":
            acks += 1
        elif words[0] == "fenced":
            fenced.append(words)
        elif words[0] == "done":
            done = True
        else:
            other.append(line)
    return ledger_id, acks, fenced, done, other


@pytest.mark.slow
async def test_a_delete_stops_a_writer_process_and_the_nodes_refuse_the_ledger(
    tmp_path: Path,
) -> None:
    url = f"sqlite://{tmp_path}/meta.db"
    log_path = tmp_path / "writer.log"
    async with contextlib.AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(serve(tmp_path / name, tmp_path, url))
            for name in ("a", "b", "c")
        ]
        command = [sys.executable, str(WRITER_SCRIPT), url, str(log_path), str(WRITER_TASKS)]
        writer = await trio.lowlevel.open_process(command, env=os.environ)
        try:

            def enough() -> bool:
                assert writer.poll() is None, log_path.read_text()
                return parse(log_path)[1] >= 500

            await wait_until(enough, WAIT_S)
            ledger_id = parse(log_path)[0]
            assert ledger_id is not None
            tail_end: list[BaseException] = []
            tailed: list[int] = []
            async with pora.connect(url) as client:
                reader = await client.open_ledger(ledger_id, password="pw", recover=False)

                async def follow() -> None:
                    try:
                        async for entry_id, _ in reader.tail():
                            tailed.append(entry_id)
                    except Exception as error:  # the test asserts on its type
                        tail_end.append(error)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(follow)
                    await wait_until(lambda: len(tailed) >= 50, WAIT_S)
                    await client.delete_ledger(ledger_id, password="pw")
                    acks_at_delete = parse(log_path)[1]
                    await wait_until(lambda: parse(log_path)[3] and tail_end != [], WAIT_S)
            _, acks, fenced, _, other = parse(log_path)
            assert other == []
            # each task may have logged one acknowledgement it had before the fence
            assert acks - acks_at_delete <= WRITER_TASKS
            assert len(fenced) == 2 * WRITER_TASKS  # "pending" and "later" per task
            assert {words[3] for words in fenced} == {"LedgerDeleted"}
            assert isinstance(tail_end[0], pora.NoSuchLedger), repr(tail_end[0])
            assert await writer.wait() == 0
        finally:
            if writer.poll() is None:
                writer.kill()
            await writer.wait()

        async with open_metadata(url) as store:
            with pytest.raises(NoSuchLedgerMetadata):
                await store.read_ledger(ledger_id)
        for node in nodes:
            async with pora.connect_node(node.address) as node_client:
                assert await node_client.list_ledgers() == []
                with pytest.raises(pora.LedgerFenced):  # FENCED on the wire
                    await node_client.add_entry(ledger_id, 10**6, b"late", password="pw")
                assert await node_client.list_ledgers() == []
        # a node restarted on its data dir still refuses the ledger
        a = nodes[0]
        assert await stop(a, signal.SIGKILL) == -signal.SIGKILL
        again = await stack.enter_async_context(
            serve(tmp_path / "a", tmp_path, url, "--listen", a.address)
        )
        async with pora.connect_node(again.address) as node_client:
            with pytest.raises(pora.LedgerFenced):
                await node_client.add_entry(ledger_id, 0, b"late", password="pw")
            with pytest.raises(pora.LedgerFenced):
                await node_client.fence_ledger(ledger_id, password="pw")
            assert await node_client.list_ledgers() == []
