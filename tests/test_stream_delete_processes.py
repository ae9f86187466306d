"""`delete_stream` against real processes: three `pora serve` nodes, a stream writer
process appending from many tasks (tests/stream_writer_process.py), and the delete
from this process while every node is frozen (SIGSTOP). There is no iptables here:
frozen nodes stand in for a deleting client cut off from the writer's members, since
the delete's fence reaches none of them and the writer, once they are resumed, is
acknowledged again. The delete must fail then (the stream left marked, gone for every
client), and its retry, once the nodes answer, must stop the writer: no append
started after the retry returned is acknowledged, and every task ends with
NoSuchStream."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import trio
from test_node_registration import serve
from test_stream_processes import logged
from waiting import wait_until

import pora
from pora.client.replication.config import ClientConfig
from pora.streams.orphans import ledger_stream

WRITER_SCRIPT = Path(__file__).with_name("stream_writer_process.py")
WRITER_TASKS = 16
WAIT_S = 90.0
#: the nodes renew their registrations far less often than the test freezes them
LEASE_S = 120.0
#: the writer process ends well within this after the delete returned
ENDS_WITHIN_S = 20.0


async def freeze_nodes_for_a_delete(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/meta.db"
    log_path = tmp_path / "writer.log"
    async with contextlib.AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(
                serve(tmp_path / name, tmp_path, url, "--registration-lease-s", str(LEASE_S))
            )
            for name in ("a", "b", "c")
        ]
        # a fence that gives up after 1 s: well within the writer's 10 s node timeout,
        # so the writer's appends wait for the frozen nodes rather than fail
        impatient = ClientConfig(recovery_fence_timeout_s=1.0)
        client = await stack.enter_async_context(pora.connect(url, impatient))
        await client.create_stream("orders")
        command = [sys.executable, str(WRITER_SCRIPT), url, "orders", str(log_path)]
        writer = await trio.lowlevel.open_process([*command, str(WRITER_TASKS)], env=os.environ)
        try:
            await wait_until(lambda: len(logged(log_path)[0]) >= 200, WAIT_S)
            for node in nodes:
                node.process.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(pora.StreamDeleteFailed, match="stream 'orders'"):
                    await client.delete_stream("orders")
            finally:
                for node in nodes:
                    node.process.send_signal(signal.SIGCONT)
            with pytest.raises(pora.NoSuchStream):
                await client.open_stream("orders")
            # unfenced, the writer is acknowledged again until the retry
            count = len(logged(log_path)[0])
            await wait_until(lambda: len(logged(log_path)[0]) >= count + 100, WAIT_S)

            await client.delete_stream("orders")  # the retry
            returned_at = time.monotonic()
            acks_at_return = len(logged(log_path)[0])
            with trio.fail_after(ENDS_WITHIN_S):
                status = await writer.wait()
            took_s = time.monotonic() - returned_at
        finally:
            if writer.returncode is None:
                writer.kill()
            await writer.wait()
        acks, fenced, other = logged(log_path)
        assert status == 0, other
        assert fenced == []
        # every task was told the stream is gone
        assert sorted(line.split(" ")[:3] for line in other) == sorted(
            ["error", str(task), "NoSuchStream"] for task in range(WRITER_TASKS)
        ), (other, took_s)
        # an acknowledgement logged after the retry returned is one each task had
        # before the fence (answered, not yet logged): never an append started after
        assert len(acks) - acks_at_return <= WRITER_TASKS
        left = [ledger async for ledger in client.list_ledgers() if ledger_stream(ledger)]
        assert left == []


@pytest.mark.slow
async def test_a_stream_delete_that_reached_no_member_fails_and_its_retry_stops_the_writer(
    tmp_path: Path,
) -> None:
    await freeze_nodes_for_a_delete(tmp_path)
