"""A CPU-starved `pora serve` process in a writer's ensemble (R8, the writer's
"Bounds"): E=3 Qw=3 Qa=2 on four real nodes, one member held to about 5% of a CPU
by SIGSTOP/SIGCONT, 64 tasks appending 8 KiB entries. The starved node answers, late;
what the writer keeps for it stays within `node_backlog_bytes_max` beyond its pending
bytes, the node is replaced, and the appends keep completing with no error."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import pytest
import trio
from test_node_registration import Node, serve
from test_writer_backlog import queued_bytes

import pora
from pora.client.replication.config import ClientConfig

ENTRY = 8 << 10
TASKS = 64
BACKLOG_MAX = 4 << 20
CALL_MAX = 1 << 20


async def starve(node: Node, running_s: float = 0.005, stopped_s: float = 0.095) -> None:
    """Hold `node` to about running_s / (running_s + stopped_s) of a CPU until
    cancelled; it is left running."""
    try:
        while True:
            node.process.send_signal(signal.SIGSTOP)
            await trio.sleep(stopped_s)
            node.process.send_signal(signal.SIGCONT)
            await trio.sleep(running_s)
    finally:
        with contextlib.suppress(ProcessLookupError):
            node.process.send_signal(signal.SIGCONT)


@pytest.mark.slow
async def test_a_starved_node_is_replaced_and_the_writer_stays_bounded(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/meta.db"
    config = ClientConfig(
        node_timeout_s=30.0,  # the starved node answers, late: the bound, not R8's timeout
        node_backlog_bytes_max=BACKLOG_MAX,
        add_call_bytes_max=CALL_MAX,
    )
    async with contextlib.AsyncExitStack() as stack:
        nodes = [
            await stack.enter_async_context(serve(tmp_path / n, tmp_path, url)) for n in "abcd"
        ]
        client = await stack.enter_async_context(pora.connect(url, config))
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password="pw"
        )
        laggard = writer.metadata.ensembles[0].members[0]
        (starved,) = [node for node in nodes if node.address == laggard.address]
        pending = client._context.pending_bytes
        worst = 0
        acknowledged: list[int] = []
        replaced = trio.Event()
        after_replacement = 0

        async def watch() -> None:
            nonlocal worst
            while True:
                worst = max(worst, queued_bytes(client, laggard) - pending.used)
                if laggard not in writer.metadata.ensembles[-1].members:
                    replaced.set()
                await trio.sleep(0.005)

        async def appender(task: int) -> None:
            nonlocal after_replacement
            k = 0
            # until 2000 appends after the replacement (or, with no bound, until the
            # backlog is far past it)
            while after_replacement < 2000 and worst <= 4 * BACKLOG_MAX:
                payload = bytes([task]) * (ENTRY - 4) + k.to_bytes(4, "big")
                acknowledged.append(await writer.append(payload))
                after_replacement += replaced.is_set()
                k += 1

        async with trio.open_nursery() as background:
            background.start_soon(watch)
            background.start_soon(starve, starved)
            with trio.fail_after(120):
                async with trio.open_nursery() as appenders:
                    for task in range(TASKS):
                        appenders.start_soon(appender, task)
            background.cancel_scope.cancel()

        assert replaced.is_set(), "the starved node was never replaced"
        assert worst <= BACKLOG_MAX, f"{worst} bytes queued for the starved node"
        assert sorted(acknowledged) == list(range(len(acknowledged)))
        await writer.close()
        assert writer.metadata.last_entry_id == len(acknowledged) - 1
