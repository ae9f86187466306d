"""The per-node client past its `inflight_max`: every caller gets its turn, in order,
and the wait for room counts against the call's timeout."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import anyio
import pytest
import trio
import trio.testing
from net_helpers import serving

import pora
from pora.client.node_client import connect_node


async def test_callers_past_inflight_max_all_complete(data_dir: Path) -> None:
    async with (
        serving(data_dir) as (_node, _server, address),
        connect_node(address, inflight_max=4, timeout_s=20.0) as client,
    ):
        done: list[int] = []

        async def add(entry_id: int) -> None:
            await client.add_entry(1, entry_id, b"x%d" % entry_id)
            done.append(entry_id)

        with trio.fail_after(15):
            async with trio.open_nursery() as nursery:
                for entry_id in range(200):
                    nursery.start_soon(add, entry_id)
        assert sorted(done) == list(range(200))
        assert len(await client.read_range(1, 0, 199)) == 200


async def test_waiting_for_room_times_out_with_the_call() -> None:
    # a node that reads requests and never answers: the first caller fills the
    # client's one slot, the second can never get room and must time out
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def swallow(stream: trio.SocketStream) -> None:
        while await stream.receive_some(65536):
            pass

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, swallow, listeners)
        async with connect_node(f"127.0.0.1:{port}", inflight_max=1, timeout_s=0.3) as client:
            outcomes: list[str] = []

            async def call(entry_id: int) -> None:
                try:
                    await client.add_entry(1, entry_id, b"x")
                except pora.RequestTimeout as error:
                    outcomes.append(str(error))

            with trio.fail_after(5):
                async with trio.open_nursery() as callers:
                    for entry_id in range(3):
                        callers.start_soon(call, entry_id)
            assert len(outcomes) == 3
            assert any("inflight_max" in message for message in outcomes)
        nursery.cancel_scope.cancel()


def _asyncio_many_callers(address: str) -> int:
    async def main() -> int:
        async with connect_node(address, inflight_max=4, timeout_s=20.0) as client:
            with anyio.fail_after(15):
                async with anyio.create_task_group() as tasks:
                    for entry_id in range(200):
                        tasks.start_soon(client.add_entry, 5, entry_id, b"a")
            return len(await client.read_range(5, 0, 199))

    return anyio.run(main, backend="asyncio")


async def test_callers_past_inflight_max_all_complete_under_asyncio(data_dir: Path) -> None:
    async with serving(data_dir) as (_node, _server, address):
        assert await trio.to_thread.run_sync(_asyncio_many_callers, address) == 200


@pytest.mark.parametrize("inflight_max", [1, 3])
async def test_room_is_given_in_arrival_order(data_dir: Path, inflight_max: int) -> None:
    async with (
        serving(data_dir) as (_node, _server, address),
        connect_node(address, inflight_max=inflight_max) as client,
    ):
        order: list[int] = []

        async def add(entry_id: int) -> None:
            await client.add_entry(2, entry_id, b"y")
            order.append(entry_id)

        async with trio.open_nursery() as nursery:
            for entry_id in range(60):
                nursery.start_soon(add, entry_id)
                await trio.testing.wait_all_tasks_blocked()
        # nobody overtakes by more than the slots in flight
        overtaken = [abs(at - entry_id) for at, entry_id in enumerate(order)]
        assert max(overtaken) <= inflight_max


async def test_a_reset_connection_says_what_was_lost_and_what_to_do() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]

    async def read_then_reset(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        # a close with linger 0 sends RST: the client's read fails with no message
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        stream.socket.close()

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, read_then_reset, listeners)
        async with connect_node(f"127.0.0.1:{port}", reconnect_attempts=1) as client:
            with pytest.raises(pora.ConnectionLost) as lost:
                await client.add_entry(1, 0, b"x")
        nursery.cancel_scope.cancel()
    message = str(lost.value)
    assert f"connection to node 127.0.0.1:{port} lost (" in message
    assert ": ;" not in message and "()" not in message
    assert "1 requests in flight" in message
    assert "retry" in message
