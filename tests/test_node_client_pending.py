"""Every kind of call of the per-node client waits the same way (a
`PendingOperation` in the connection's pending map, its room taken from the
client's budgets): against a node that takes frames and never answers, each kind
times out on its own deadline and a lost connection fails them all with
ConnectionLost; and `inflight_bytes_max` bounds the bytes of every kind."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio

import pora
from netio.codec import encode_response
from netio.messages import Info, InfoResponse
from netio.request_codec import RequestDecoder
from pora.client.node_channel import AddRequest
from pora.client.node_client import NodeClient, connect_node

KEY = b"k" * 20


class SilentNode:
    """A node that says who it is, reads every other request and answers none:
    `seen` gets a value per request read, `drop` closes its connections."""

    def __init__(self) -> None:
        self.seen_send, self.seen = trio.open_memory_channel[None](1000)
        self.drop = trio.Event()

    async def serve(self, stream: trio.SocketStream) -> None:
        decoder = RequestDecoder()
        async with trio.open_nursery() as nursery:

            async def drop() -> None:
                await self.drop.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(drop)
            while data := await stream.receive_some(65536):
                decoder.receive_data(data)
                for request in decoder.next_requests(1000):
                    if isinstance(request, Info):
                        info = InfoResponse(
                            request.request_id, 4, None, 1 << 24, 1 << 20, 0, "t", "i"
                        )
                        await stream.send_all(encode_response(info, decoder.version or 4))
                    else:
                        self.seen_send.send_nowait(None)
        await stream.aclose()


@asynccontextmanager
async def silent_node() -> AsyncIterator[tuple[SilentNode, str]]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    node = SilentNode()
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, node.serve, listeners)
        yield node, f"127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


def every_kind(client: NodeClient, timeout_s: Callable[[int], float]) -> list[Awaitable[object]]:
    """One call of each kind, the n-th with timeout `timeout_s(n)`, each to its own
    ledger (so that no two share a frame)."""
    return [
        client.read_entry(1, 0, timeout_s=timeout_s(0)),
        client.add_entry(2, 0, b"a", master_key=KEY, timeout_s=timeout_s(1)),
        client.add_coalesced(3, [(0, b"b"), (1, b"c")], master_key=KEY, timeout_s=timeout_s(2)),
        client.add_batches_many([AddRequest(4, [(0, b"d")], KEY, -1)], timeout_s=timeout_s(3)),
        client.add_entries(5, [(0, b"e"), (2, b"f")], master_key=KEY, timeout_s=timeout_s(4)),
    ]


async def test_every_kind_of_call_times_out_on_its_own_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with silent_node() as (_node, address), connect_node(address, timeout_s=5) as client:
        started = trio.current_time()
        ended: dict[int, float] = {}

        async def run(index: int, call: Awaitable[object]) -> None:
            with pytest.raises(pora.RequestTimeout, match="may or may not"):
                await call
            ended[index] = trio.current_time() - started

        calls = every_kind(client, lambda n: 0.2 + 0.15 * n)
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                for index, call in enumerate(calls):
                    nursery.start_soon(run, index, call)
        assert sorted(ended, key=ended.__getitem__) == [0, 1, 2, 3, 4]
        for index, elapsed in ended.items():
            # never before its own deadline, and before the next call's: each ended on its
            # own (in trio's virtual time: in real time a loaded machine's late wake-up
            # could end two in one sweep, in either order)
            assert 0.2 + 0.15 * index <= elapsed < 0.2 + 0.15 * (index + 1)
        # the client goes on: the next call is sent, and times out in its turn
        with trio.fail_after(5), pytest.raises(pora.RequestTimeout):
            await client.last_add_confirmed(1, timeout_s=0.1)


async def test_a_lost_connection_fails_every_kind_of_call_in_flight() -> None:
    async with silent_node() as (node, address), connect_node(address, timeout_s=30) as client:
        failed: list[str] = []

        async def run(call: Awaitable[object]) -> None:
            with pytest.raises(pora.ConnectionLost) as raised:
                await call
            failed.append(str(raised.value))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for call in every_kind(client, lambda n: 30.0):
                    nursery.start_soon(run, call)
                for _ in range(6):  # a request of each read (add_entries sends two runs)
                    await node.seen.receive()
                node.drop.set()
        assert len(failed) == 5
        assert all("lost" in message for message in failed), failed
        # the next call reconnects
        node.drop = trio.Event()
        with trio.fail_after(5), pytest.raises(pora.RequestTimeout):
            await client.last_add_confirmed(1, timeout_s=0.1)
        assert client.reconnects == 1


async def test_inflight_bytes_max_bounds_every_kind_of_add_first_come_first_served() -> None:
    async with (
        silent_node() as (node, address),
        connect_node(address, timeout_s=5, inflight_bytes_max=1000) as client,
        trio.open_nursery() as holder,
    ):
        # one add holds 800 of the 1000 bytes (the node never answers it)
        holder.start_soon(lambda: client.add_entry(1, 0, b"x" * 800, timeout_s=2.0))
        await node.seen.receive()
        no_room = "no room to send .* inflight_bytes_max"
        for call in (
            client.add_entry(2, 0, b"y" * 300, timeout_s=0.2),
            client.add_coalesced(3, [(0, b"z" * 300)], timeout_s=0.2),
            client.add_batches_many([AddRequest(4, [(0, b"w" * 300)], KEY, -1)], timeout_s=0.2),
            client.add_run(5, 0, [b"v" * 300], timeout_s=0.2),
        ):
            with trio.fail_after(5), pytest.raises(pora.RequestTimeout, match=no_room):
                await call
        # what fits goes: a small add is sent (and, unanswered, times out)
        with trio.fail_after(5), pytest.raises(pora.RequestTimeout, match="may or may not"):
            await client.add_entry(6, 0, b"u" * 100, timeout_s=0.2)
        holder.cancel_scope.cancel()
